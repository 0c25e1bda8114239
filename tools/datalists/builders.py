"""Datalists built from a DICOM folder, a CSV of a registered layout or a folder of class folders, and split keeping
an archive's official test set.

Builders return ``(items, problems)``, a problem line per file or row left out, and write paths with
``os.path.abspath``, never ``resolve()``, so a link stays the user's path.
"""

from __future__ import annotations

import csv
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scripts.atomic import atomic_write
from scripts.data.boxes import BOXES_KEY
from scripts.data.datalist import normalise_fractions, patient_key, split_by_patient
from scripts.data.errors import CsvRowError, DatalistError
from scripts.enums import LesionClass

from .parsers import (
    CSV_FLAVOURS,
    DATALIST_PARSERS,
    FOLDER_LABELS,
    CsvRow,
    DatalistParser,
    ParsedRow,
    find_datalist_parser,
    normalise_column,
)

__all__ = [
    "OFFICIAL_SPLIT_KEY",
    "split_items",
    "split_choices",
    "path_for_datalist",
    "unique_boxes",
    "items_from_dicom_dir",
    "items_from_folder",
    "detect_csv_flavour",
    "items_from_csv",
]

OFFICIAL_SPLIT_KEY = "official_split"  # set by archives that publish a test set (CBIS-DDSM, VinDr-Mammo)


def split_items(
    items: Iterable[Mapping[str, Any]],
    fractions: Sequence[float] | Mapping[str, float] = (0.7, 0.15, 0.15),
    seed: int = 0,
    stratify: bool = True,
    official: bool = True,
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """:func:`split_by_patient`, keeping an archive's official test set (the items' ``official_split``, then
    removed).

    Every patient with an item in the official test set goes to ``test`` whole; the others are split between training
    and validation in the ratio of their fractions.

    Returns:
        ``(datalist, notes)``.
    """
    fr = normalise_fractions(fractions)
    items = [dict(it) for it in items]
    marks = [it.pop(OFFICIAL_SPLIT_KEY, None) for it in items]
    if not official or not any(marks):
        return split_by_patient(items, fr, seed=seed, stratify=stratify), []
    test_patients = {patient_key(it) for it, mark in zip(items, marks) if mark == "test"}
    mixed = {patient_key(it) for it, mark in zip(items, marks) if mark != "test"} & test_patients
    rest = [it for it in items if patient_key(it) not in test_patients]
    notes = [f"official split kept: {len(test_patients)} patient(s) in the official test set form 'test'"]
    if mixed:
        notes.append(
            f"{len(mixed)} patient(s) have images in both the official training and test sets; all their images "
            f"are in 'test' so that no woman is in two splits (e.g. {sorted(mixed)[0]})"
        )
    train_val = fr["training"] + fr["validation"]
    if train_val <= 0:
        raise ValueError(
            "fractions: training and validation are both 0, but the official split only fixes 'test'; pass "
            "--no-official-split (official=False) to place every item by --fractions"
        )
    out = split_by_patient(rest, (fr["training"] / train_val, fr["validation"] / train_val, 0.0), seed, stratify)
    out["test"] = [it for it in items if patient_key(it) in test_patients]
    return out, notes


def split_choices(n_patients: int) -> str:
    """The ways out of a refused split, for an error line."""
    hint = "--fractions 0.5 0.5 0" if n_patients == 2 else "--fractions 0.6 0.2 0.2"
    return (
        f"choose other fractions ({hint}; at least one patient per split you ask for), give an external "
        "validation list (--val-datalist FILE), or add patients"
    )


def path_for_datalist(path: str | os.PathLike, relative_to: str | os.PathLike | None) -> str:
    """``path`` relative to ``relative_to`` (the datalist's folder), or absolute when it is None."""
    path = os.path.abspath(path)
    return path if relative_to is None else os.path.relpath(path, os.path.abspath(relative_to))


def unique_boxes(boxes: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``boxes`` entries with each (label, box) once, in the order of first appearance."""
    first: dict[tuple[Any, tuple[Any, ...]], Mapping[str, Any]] = {}
    for entry in boxes:
        first.setdefault((entry["label"], tuple(entry["box"])), entry)
    return list(first.values())


def _patient_of_dicom(header: Mapping[str, Any]) -> str | None:
    from scripts.data.header_facts import cbis_patient_id

    pid = header.get("patient_id")
    return cbis_patient_id(pid) or pid


def _image_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def items_from_dicom_dir(
    dicom_dir: str | os.PathLike, relative_to: str | os.PathLike | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Items of every 2-D mammogram under ``dicom_dir`` (recursive), sorted by path, labels unknown.

    ``patient_id`` is the PatientID (CBIS-DDSM's per-view ids reduced to the woman's ``P_nnnnn``), else the study UID.

    Returns:
        ``(items, skipped)``, ``skipped`` naming every file left out and why.
    """
    from scripts.data.dicom_files import read_dicom_header
    from scripts.data.readers import MammogramReadError

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
    """Items labelled by their class folder: ``<root>/<normal|benign|malignant|...>/**/<image>`` (``FOLDER_LABELS``).

    ``patient_id``: the DICOM PatientID, else the first folder below the class folder, else the image itself.

    Returns:
        ``(items, skipped)``.
    """
    from scripts.data.dicom_files import read_dicom_header
    from scripts.data.readers import SUPPORTED_SUFFIXES

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
    """The registered flavour of a CSV header (case, spaces and underscores ignored).

    Raises:
        DatalistError: naming the columns, the known flavours and ``source``, for an unknown layout.
    """
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
    """Items from a CSV of a registered layout; the rows of one image are merged.

    Labels are OR-ed, several ROI masks (or outlines) of one class are unioned into ``mask_dir`` as 0/255 PNG, boxes are
    listed once. Every file is checked to exist.

    Args:
        csv_path: the CSV.
        root: the folder its paths are relative to (default: the CSV's).
        relative_to: the datalist's folder (None: absolute paths).
        mask_dir: where merged masks go (default: ``merged_masks`` beside the CSV).
        notes: receives what the parsers decided, and each box unused because its image has a mask of its class.

    Returns:
        ``(items, problems)``: a row with a problem is left out and named.
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
    """A note per row whose box has a class for which its image has a mask file, which the preprocessing keeps
    instead."""
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
    """Mark a CBIS-DDSM row whose ROI was not found while its image was: a partial mask would call a lesion
    background."""
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


def _read_csv(csv_path: Path) -> tuple[DatalistParser, list[CsvRow]]:
    """The parser of the CSV's layout (from its header alone) and its rows keyed by normalised column, cells
    stripped."""
    if not csv_path.is_file():
        raise DatalistError(f"{csv_path}: CSV file not found")
    # utf-8-sig: spreadsheet exports often start with a byte order mark, which would glue itself to column 1
    with csv_path.open(newline="", encoding="utf-8-sig") as fh:
        header = fh.readline()
        delimiter = ";" if header.count(";") > header.count(",") else ","  # INbreast.csv is ';'-separated
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
    """Fold one row into its image's item: labels OR-ed, fields from the first row that gives them, boxes added.

    Returns:
        a problem per field that disagrees with an earlier row (whose value is kept).
    """
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
    """Set each item's ``mask_<class>``: its one mask file, or the union of its ROIs written to ``out_dir``.

    Returns:
        a problem per class not merged, or with an ROI not found (the item then gets no mask of that class).
    """
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

    from scripts.data.header_facts import parse_case_folder

    path = Path(image)
    named = next((p for p in reversed(path.parts) if parse_case_folder(p)), None)
    return f"{named or path.stem}_{hashlib.sha1(image.encode()).hexdigest()[:8]}_{cls}.png"


def _merge_masks(files: Sequence[Path], outlines: Sequence[Any], out_dir: Path, image: str, cls: str) -> Path:
    """Union of mask files and rasterised outlines of one image and class, written atomically as a 0/255 PNG."""
    from PIL import Image

    from scripts.data.readers import read_mammogram

    union = None
    for p in files:
        arr = np.asarray(read_mammogram(p, mask=True)[0]) > 0
        if union is not None and arr.shape != union.shape:
            raise ValueError(f"{p}: mask size {arr.shape} differs from {files[0]} {union.shape}")
        union = arr if union is None else union | arr
    for outline in outlines:
        arr = outline.rasterise()
        if union is not None and arr.shape != union.shape:
            raise ValueError(f"{outline.source}: image size {arr.shape} differs from the other masks' {union.shape}")
        union = arr if union is None else union | arr
    out = out_dir / _mask_name(image, cls)
    with atomic_write(out, "wb") as fh:
        Image.fromarray(np.where(union, 255, 0).astype(np.uint8)).save(fh, format="PNG")
    return out
