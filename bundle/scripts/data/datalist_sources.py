"""Datalist items from what users have on disk: a DICOM folder, a CSV of a known layout, a folder of class folders.

Used by ``tools/make_datalist.py``; re-exported by :mod:`scripts.data.datalist`. The CSV layouts are the row
parsers of :mod:`scripts.data.datalist_parsers`. Every builder returns ``(items, problems)``: an item per usable
image, and one line per file or row left out naming it and why. Paths in items are written relative to
``relative_to`` (the datalist's folder) or absolute, as the user reaches them: symbolic links are not followed, so a
data set whose ``images`` folder is a link keeps its own paths.
"""

from __future__ import annotations

import csv
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write
from ..enums import LesionClass
from ..errors import UsageError
from .boxes import BOXES_KEY, unique_boxes
from .datalist_parsers import (
    CSV_FLAVOURS,
    DATALIST_PARSERS,
    CsvRow,
    CsvRowError,
    DatalistParser,
    ParsedRow,
    find_datalist_parser,
    normalise_column,
)
from .errors import DatalistError

__all__ = [
    "detect_csv_flavour",
    "items_from_csv",
    "items_from_dicom_dir",
    "items_from_folder",
    "FOLDER_LABELS",
    "path_for_datalist",
]

# folder name (lower case) -> [benign, malignant], for a hospital folder sorted by class
FOLDER_LABELS = {
    "normal": [0, 0],
    "negative": [0, 0],
    LesionClass.BENIGN.value: [1, 0],
    LesionClass.MALIGNANT.value: [0, 1],
    "cancer": [0, 1],
}


def path_for_datalist(path: str | os.PathLike, relative_to: str | os.PathLike | None) -> str:
    """``path`` as written in a datalist: relative to ``relative_to`` (the datalist's folder), or absolute when it is
    None. ``os.path.abspath`` only, never ``resolve()``: a symbolic link stays the path the user gave."""
    path = os.path.abspath(path)
    return path if relative_to is None else os.path.relpath(path, os.path.abspath(relative_to))


def _patient_of_dicom(header: Mapping[str, Any]) -> str | None:
    from .cbis_ddsm import cbis_patient_id

    pid = header.get("patient_id")
    return cbis_patient_id(pid) or pid


def _image_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def items_from_dicom_dir(
    dicom_dir: str | os.PathLike, relative_to: str | os.PathLike | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Items for every 2-D mammogram under ``dicom_dir`` (recursive; any file that parses as DICOM).

    Labels are unknown (no ``label`` key). ``patient_id`` is the PatientID, except CBIS-DDSM's per-view ids
    (``Mass-Test_P_00173_LEFT_CC``), which become the woman's ``P_00173``; else the StudyInstanceUID. Returns
    ``(items, skipped)``: ``skipped`` names every file left out and why; items are sorted by path.
    """
    from .readers import MammogramReadError, read_dicom_header

    root = Path(dicom_dir)
    if not root.is_dir():
        raise DatalistError(f"{root}: DICOM folder not found")
    items, skipped = [], []
    for path in _image_files(root):
        if path.name.upper() == "DICOMDIR":
            continue
        try:
            header = read_dicom_header(path)
        except MammogramReadError as err:
            skipped.append(f"{path}: {getattr(err, 'problem', None) or err}")
            continue
        except Exception as err:  # keep going: one odd file must not stop a folder scan
            skipped.append(f"{path}: cannot be read ({type(err).__name__}: {err})")
            continue
        if not header.get("rows") or not header.get("cols"):
            skipped.append(f"{path}: DICOM without an image (no Rows/Columns)")
            continue
        if (header.get("frames") or 1) > 1:
            skipped.append(f"{path}: multi-frame DICOM ({header['frames']} frames; tomosynthesis is out of scope)")
            continue
        item: dict[str, Any] = {"image": path_for_datalist(path, relative_to)}
        item["patient_id"] = _patient_of_dicom(header) or header.get("study_uid") or f"file:{path.name}"
        for key in ("laterality", "view"):
            if header.get(key):
                item[key] = header[key]
        items.append(item)
    return items, skipped


def items_from_folder(
    root: str | os.PathLike, relative_to: str | os.PathLike | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Items labelled by folder name: ``<root>/<normal|benign|malignant|...>/**/<image>`` (see ``FOLDER_LABELS``).

    Any file the readers accept is an image (DICOM by content, others by suffix). ``patient_id``: the DICOM
    PatientID (CBIS-DDSM ids reduced to ``P_nnnnn``), else the first folder below the class folder
    (``<root>/benign/<patient>/...``), else the image is its own patient. Laterality and view from DICOM headers.
    Files under other top-level folders, and files that are not images, are listed as skipped.
    """
    from .readers import SUPPORTED_SUFFIXES, read_dicom_header

    root = Path(root)
    if not root.is_dir():
        raise DatalistError(f"{root}: folder not found")
    classes = {p.name.lower(): p for p in root.iterdir() if p.is_dir() and p.name.lower() in FOLDER_LABELS}
    if not classes:
        raise DatalistError(
            f"{root}: no class folder found; expected sub-folders named {', '.join(FOLDER_LABELS)} (any case)"
        )
    items, skipped = [], []
    for path in _image_files(root):
        top = path.relative_to(root).parts[0].lower()
        if top not in classes:
            skipped.append(f"{path}: not under a class folder ({', '.join(FOLDER_LABELS)})")
            continue
        try:
            header = read_dicom_header(path)
        except Exception:
            header = None
        if header is None and not path.name.lower().endswith(SUPPORTED_SUFFIXES):
            skipped.append(f"{path}: neither DICOM nor an image file ({', '.join(SUPPORTED_SUFFIXES)})")
            continue
        item: dict[str, Any] = {"image": path_for_datalist(path, relative_to), "label": list(FOLDER_LABELS[top])}
        below = path.relative_to(classes[top]).parts
        item["patient_id"] = (
            (header and _patient_of_dicom(header)) or (below[0] if len(below) > 1 else None) or f"file:{path}"
        )
        for key in ("laterality", "view"):
            if header and header.get(key):
                item[key] = header[key]
        items.append(item)
    return items, skipped


def detect_csv_flavour(columns: Iterable[str], source: str | os.PathLike | None = None) -> str:
    """The registered flavour ('cbis-ddsm', 'vindr-mammo', 'inbreast', 'generic', ...) of a CSV header (case, spaces
    and underscores ignored); see :func:`~scripts.data.datalist_parsers.find_datalist_parser` for which one wins when
    several match. An unknown layout raises :class:`DatalistError` naming the columns found, every known flavour
    and, given ``source``, the file."""
    cols = {normalise_column(c) for c in columns}
    parser = find_datalist_parser(cols)
    if parser is None:
        accepted = "; ".join(f"{k}: {v}" for k, v in CSV_FLAVOURS.items())
        prefix = "" if source is None else f"{source}: "
        raise DatalistError(f"{prefix}unrecognised CSV columns {sorted(cols)}; accepted layouts: {accepted}")
    return parser.name


def items_from_csv(
    csv_path: str | os.PathLike,
    root: str | os.PathLike | None = None,
    relative_to: str | os.PathLike | None = None,
    mask_dir: str | os.PathLike | None = None,
    notes: list[str] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Items from a CSV of a registered layout (``CSV_FLAVOURS``, docs/data.md).

    File paths in the CSV are relative to ``root`` (default: the CSV's folder). Rows of the same image are
    merged: labels are OR-ed; several ROI masks (or outlines) of one class are merged (union) into ``mask_dir`` as
    0/255 PNG; the rows' boxes are listed together in the item's ``boxes`` (a box given twice once). Every image
    and mask file is checked to exist. Returns ``(items, problems)``; a row with a problem is left out and named in
    ``problems``; what parsers decided without an error is appended to ``notes``, and so is each row whose box the
    preprocessing will not use because its image has a mask file of the box's class.
    """
    csv_path = Path(csv_path)
    parser, rows = _read_csv(csv_path)
    base = Path(root) if root is not None else csv_path.parent
    problems: list[str] = []
    merged: dict[str, dict[str, Any]] = {}  # image path -> its item, in order of first appearance
    masks: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))  # image -> class -> ROIs
    failed_masks: dict[str, set[str]] = defaultdict(set)  # image -> classes whose ROI of some row is missing
    box_rows: dict[str, list[tuple[str, str]]] = defaultdict(list)  # image -> (row, class) of each box
    for line, row in enumerate(rows, start=2):  # line 1 is the header
        where = f"{csv_path}:{line}"
        try:
            parsed = parser.parse(row, where, base)
            _check_exists(parsed, where)
        except CsvRowError as err:
            problems.append(str(err))
            _note_failed_masks(parser, row, base, merged, failed_masks)
            continue
        if notes is not None:
            notes.extend(parsed.notes)
        for cls, mask in parsed.masks.items():
            masks[str(parsed.image)][cls].append(mask)
        box_rows[str(parsed.image)] += [(where, box["label"]) for box in parsed.boxes]
        problems += _merge_row(merged, parsed, where, relative_to)
    for item in merged.values():
        if BOXES_KEY in item:
            item[BOXES_KEY] = unique_boxes(item[BOXES_KEY])
    out_dir = Path(mask_dir) if mask_dir else csv_path.parent / "merged_masks"
    problems += _attach_masks(merged, masks, failed_masks, out_dir, relative_to)
    if notes is not None:
        notes += _boxes_beside_masks(merged, box_rows)
    items = [{k: v for k, v in it.items() if v is not None} for it in merged.values()]
    return items, problems


def _boxes_beside_masks(merged: Mapping[str, Mapping[str, Any]], box_rows: Mapping[str, list]) -> list[str]:
    """A note per row whose box has a class for which its image has a mask file: the preprocessing paints boxes
    only into the classes without one (the outline is the finer annotation of the same lesions), so that box is not
    used."""
    notes = []
    for key, rows in box_rows.items():
        item = merged.get(key, {})
        for where, cls in rows:
            if item.get(f"mask_{cls}"):
                notes.append(
                    f"{where}: this row's {cls} box is not used: {Path(key).name} has a {cls} mask file "
                    f"({item[f'mask_{cls}']}), which the preprocessing keeps over the class's boxes (leave "
                    f"mask_{cls} empty to use the boxes)"
                )
    return notes


def _check_exists(parsed: ParsedRow, where: str) -> None:
    if not parsed.image.is_file():
        raise CsvRowError(f"{where}: image file not found: {parsed.image}")
    for cls, mask in parsed.masks.items():
        if isinstance(mask, Path) and not mask.is_file():
            raise CsvRowError(f"{where}: {cls} mask file not found: {mask}")


def _note_failed_masks(parser: DatalistParser, row: CsvRow, base: Path, merged: Mapping, failed: dict) -> None:
    """A CBIS-DDSM row whose ROI could not be resolved while its image was: that image's mask of the row's class
    would miss a lesion, so it gets none (the label still counts the lesion)."""
    if parser.name != "cbis-ddsm":
        return
    from .cbis_ddsm import resolve_cbis_image

    try:
        resolved = resolve_cbis_image(base, row.get("image file path", ""), "")
    except CsvRowError:
        return
    image = resolved if isinstance(resolved, Path) else resolved.path
    pathology = row.get("pathology", "").upper()
    if pathology.startswith(("MALIGNANT", "BENIGN")):
        failed[str(image)].add(LesionClass.MALIGNANT if pathology.startswith("MALIGNANT") else LesionClass.BENIGN)


def _sniff_delimiter(first_line: str) -> str:
    """';' for a header like INbreast.csv's (semicolons, no commas), else ','."""
    return ";" if first_line.count(";") > first_line.count(",") else ","


def _read_csv(csv_path: Path) -> tuple[DatalistParser, list[CsvRow]]:
    """The parser for the CSV's layout and its rows keyed by normalised column name, values stripped.

    The layout is detected before any row is read, so a file of another kind fails on its header alone. Cells are
    stripped of surrounding whitespace and newlines (CBIS-DDSM ends some paths with one).
    """
    if not csv_path.is_file():
        raise DatalistError(f"{csv_path}: CSV file not found")
    # utf-8-sig: spreadsheet exports often start with a byte order mark, which would glue itself to column 1
    with csv_path.open(newline="", encoding="utf-8-sig") as fh:
        delimiter = _sniff_delimiter(fh.readline())
        fh.seek(0)
        reader = csv.DictReader(fh, delimiter=delimiter)
        if reader.fieldnames is None:
            raise DatalistError(f"{csv_path}: empty CSV (no header)")
        parser = DATALIST_PARSERS[detect_csv_flavour(reader.fieldnames, source=csv_path)]
        # key None holds the cells beyond the header of a too-long row; a too-short row's missing cells are None
        rows = [{normalise_column(k): (v or "").strip() for k, v in row.items() if k is not None} for row in reader]
    return parser, rows


def _merge_row(
    merged: dict[str, dict[str, Any]], parsed: ParsedRow, where: str, rel: str | os.PathLike | None
) -> list[str]:
    """Fold one row into its image's item: labels are OR-ed (an unknown label stays unknown only until a row
    knows it), fields come from the first row that gives them, boxes are added. Returns a problem per
    field that disagrees with an earlier row (the earlier value is kept: rows of one image must describe one
    image)."""
    item = merged.setdefault(str(parsed.image), {"image": path_for_datalist(parsed.image, rel)})
    if parsed.label is None:
        item.setdefault("label", None)
    else:
        old = item.get("label") or [0, 0]
        item["label"] = [max(a, b) for a, b in zip(old, parsed.label)]
    problems = []
    for key, value in parsed.fields.items():
        if value:
            if item.get(key) not in (None, value):
                problems.append(
                    f"{where}: {key} {value!r} differs from {item[key]!r} on an earlier row of {parsed.image}"
                )
            item.setdefault(key, value)
    if parsed.boxes:
        item.setdefault(BOXES_KEY, []).extend(parsed.boxes)  # repeats removed once every row is in (items_from_csv)
    if parsed.pixel_spacing is not None and "pixel_spacing" not in item:
        spacing = parsed.pixel_spacing
        item["pixel_spacing"] = list(spacing) if isinstance(spacing, tuple) else spacing
        item["pixel_spacing_source"] = parsed.spacing_source
    return problems


def _attach_masks(
    merged: dict[str, dict[str, Any]],
    masks: Mapping[str, Mapping[str, list[Any]]],
    failed: Mapping[str, set[str]],
    out_dir: Path,
    rel: str | os.PathLike | None,
) -> list[str]:
    """Set each item's ``mask_<class>``: its one ROI mask file, or the union of several ROIs (or any outline)
    written to ``out_dir``. Returns a problem per class whose masks could not be merged or whose ROI on some row
    could not be found (the item then has no mask of that class: a partial mask would call a lesion background)."""
    problems = []
    for key, by_class in masks.items():
        item = merged[key]
        for cls, sources in by_class.items():
            if cls in failed.get(key, ()):
                problems.append(f"{key}: no {cls} mask written: the ROI of one of its rows was not found (above)")
                continue
            files = sorted({s for s in sources if isinstance(s, Path)})
            outlines = [s for s in sources if not isinstance(s, Path)]
            if len(files) == 1 and not outlines:
                item[f"mask_{cls}"] = path_for_datalist(files[0], rel)
                continue
            try:
                out = _merge_masks(files, outlines, out_dir, key, cls)
            except ValueError as err:
                problems.append(f"{key}: {cls} masks not merged: {err}")
                continue
            item[f"mask_{cls}"] = path_for_datalist(out, rel)
    return problems


def _mask_name(image: str, cls: str) -> str:
    """A file name per image and class: the CBIS-DDSM case folder or the image's stem, plus a hash of its path."""
    import hashlib

    from .cbis_ddsm import parse_case_folder

    path = Path(image)
    named = next((p for p in reversed(path.parts) if parse_case_folder(p)), None)
    return f"{named or path.stem}_{hashlib.sha1(image.encode()).hexdigest()[:8]}_{cls}.png"


def _merge_masks(files: Sequence[Path], outlines: Sequence[Any], out_dir: Path, image: str, cls: str) -> Path:
    """Union of mask files and rasterised outlines of one image and class, written atomically as a 0/255 PNG."""
    from PIL import Image

    from .readers import read_mammogram

    union = None
    for p in files:
        arr = np.asarray(read_mammogram(p, mask=True)[0]) > 0
        if union is not None and arr.shape != union.shape:
            raise UsageError(f"{p}: mask size {arr.shape} differs from {files[0]} {union.shape}")
        union = arr if union is None else union | arr
    for outline in outlines:
        arr = outline.rasterise()
        if union is not None and arr.shape != union.shape:
            raise UsageError(f"{outline.source}: image size {arr.shape} differs from the other masks' {union.shape}")
        union = arr if union is None else union | arr
    out = out_dir / _mask_name(image, cls)
    with atomic_write(out, "wb") as fh:
        Image.fromarray(np.where(union, 255, 0).astype(np.uint8)).save(fh, format="PNG")
    return out
