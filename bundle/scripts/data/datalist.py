"""JSON datalists in MONAI's layout and patient-level splitting.

A datalist is ``{"training": [...], "validation": [...], "test": [...]}``; each item is a dict
``{"image": path, "label": [benign, malignant], "mask_benign": path?, "mask_malignant": path?,
"patient_id": str, "laterality": "L"|"R", "view": "CC"|"MLO"|..., "facing": "right"|"left"?}``.
Paths are relative to the datalist's folder (MONAI's ``load_decathlon_datalist`` resolves them against its
``base_dir``, by default that folder) or absolute. A missing ``label`` (or ``null``) means unknown (inference
only); a missing mask key means "not annotated", an all-zero mask means "annotated: no lesion of that class".
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write
from ..enums import CLASS_NAMES, LesionClass
from .datalist_parsers import (
    CSV_FLAVOURS,
    DATALIST_PARSERS,
    CsvRow,
    CsvRowError,
    DatalistParser,
    ParsedRow,
    find_datalist_parser,
    normalise_column,
    register_datalist_parser,
    unregister_datalist_parser,
)

__all__ = [
    "SPLITS",
    "PATH_KEYS",
    "DatalistError",
    "load_datalist",
    "save_datalist",
    "iter_items",
    "resolve_paths",
    "patient_key",
    "normalise_fractions",
    "split_by_patient",
    "check_patient_splits",
    "CSV_FLAVOURS",
    "DATALIST_PARSERS",
    "CsvRowError",
    "register_datalist_parser",
    "unregister_datalist_parser",
    "detect_csv_flavour",
    "items_from_csv",
    "items_from_dicom_dir",
]

SPLITS = ("training", "validation", "test")
PATH_KEYS = ("image", *(f"mask_{cls}" for cls in CLASS_NAMES))


class DatalistError(ValueError):
    """A datalist file or structure that cannot be used; the message names the file/split and the problem."""


def load_datalist(path: str | os.PathLike) -> dict[str, list[dict[str, Any]]]:
    """Read a datalist JSON file: a JSON object whose values are lists of item dicts. Paths stay as written."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DatalistError(f"{path}: datalist file not found") from None
    except OSError as exc:
        raise DatalistError(f"{path}: cannot read datalist ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatalistError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    _validate_structure(data, str(path))
    return data


def _validate_structure(data: Any, where: str) -> None:
    if not isinstance(data, dict):
        raise DatalistError(f"{where}: a datalist must be a JSON object of splits, got {type(data).__name__}")
    for split, items in data.items():
        if not isinstance(items, list):
            raise DatalistError(f"{where}: split {split!r} must be a list of items, got {type(items).__name__}")


def save_datalist(datalist: Mapping[str, Sequence[Mapping[str, Any]]], path: str | os.PathLike) -> Path:
    """Write ``datalist`` as indented JSON atomically (temporary file + os.replace); returns the path."""
    _validate_structure(datalist, "datalist")
    with atomic_write(path, "w") as f:
        f.write(json.dumps(datalist, indent=2) + "\n")
    return Path(path)


def iter_items(datalist: Mapping[str, Sequence[Any]]) -> Iterator[tuple[str, int, Any]]:
    """(split, index, item) for every item of every split, in file order."""
    for split, items in datalist.items():
        for index, item in enumerate(items):
            yield split, index, item


def resolve_paths(
    datalist: Mapping[str, Sequence[Mapping[str, Any]]], base_dir: str | os.PathLike
) -> dict[str, list[dict[str, Any]]]:
    """A copy of ``datalist`` whose relative paths (``PATH_KEYS``) are joined to ``base_dir``."""
    base = Path(base_dir)
    out: dict[str, list[dict[str, Any]]] = {}
    for split, items in datalist.items():
        out[split] = []
        for item in items:
            new = dict(item) if isinstance(item, Mapping) else item
            if isinstance(new, dict):
                for key in PATH_KEYS:
                    value = new.get(key)
                    if isinstance(value, str) and value and not os.path.isabs(value):
                        new[key] = str(base / value)
            out[split].append(new)
    return out


def patient_key(item: Mapping[str, Any]) -> str:
    """The patient an item belongs to: its ``patient_id``, else its image path (an item of its own)."""
    pid = item.get("patient_id")
    if pid is not None and str(pid) != "":
        return str(pid)
    return f"image:{item.get('image')}"


def normalise_fractions(fractions: Sequence[float] | Mapping[str, float]) -> dict[str, float]:
    """(training, validation, test) fractions as a dict; they must be finite, >= 0 and sum to 1."""
    if isinstance(fractions, Mapping):
        unknown = set(fractions) - set(SPLITS)
        if unknown:
            raise ValueError(f"fractions: unknown split(s) {sorted(unknown)}; expected keys from {SPLITS}")
        values = [float(fractions.get(s, 0.0)) for s in SPLITS]
    else:
        values = [float(f) for f in fractions]
        if len(values) != 3:
            raise ValueError(f"fractions must be 3 numbers (training, validation, test), got {list(fractions)}")
    if any(not math.isfinite(v) or v < 0 for v in values) or abs(sum(values) - 1.0) > 1e-6:
        raise ValueError(f"fractions must be non-negative and sum to 1, got {values}")
    return dict(zip(SPLITS, values))


def _stratum(items: Sequence[Mapping[str, Any]]) -> str:
    """A patient's stratum from its items' labels: malignant, benign, normal or unknown."""
    labels = [it.get("label") for it in items]
    if any(lab is None for lab in labels):
        return "unknown"
    try:
        benign = any(int(lab[0]) == 1 for lab in labels)
        malignant = any(int(lab[1]) == 1 for lab in labels)
    except (TypeError, ValueError, IndexError):
        return "unknown"
    return LesionClass.MALIGNANT if malignant else LesionClass.BENIGN if benign else "normal"


def split_by_patient(
    items: Iterable[Mapping[str, Any]],
    fractions: Sequence[float] | Mapping[str, float] = (0.7, 0.15, 0.15),
    seed: int = 0,
    stratify: bool = True,
) -> dict[str, list[dict[str, Any]]]:
    """Split items into training/validation/test so that all items of a patient land in one split.

    ``fractions`` are fractions of patients. With ``stratify`` patients are grouped by their label (any
    malignant / any benign / normal / unknown) and each group is split in proportion, so positives reach every
    split when there are enough of them. Allocation is systematic sampling: a group's k patients, in a
    seeded random order, take the positions (i + u) / k (u one uniform draw per group) on the cumulative
    fractions, so each split receives its fraction up to one patient per group. Items keep their input order.
    """
    fr = normalise_fractions(fractions)
    items = [dict(it) for it in items]
    by_patient: dict[str, list[int]] = defaultdict(list)
    for i, item in enumerate(items):
        by_patient[patient_key(item)].append(i)
    groups: dict[str, list[str]] = defaultdict(list)
    for pid, idx in by_patient.items():
        groups[_stratum([items[i] for i in idx]) if stratify else "all"].append(pid)
    rng = np.random.default_rng(int(seed))
    bounds = np.cumsum([fr[s] for s in SPLITS])
    assignment: dict[str, str] = {}
    for name in sorted(groups):
        pids = sorted(groups[name])
        order = rng.permutation(len(pids))
        offset = rng.random()
        for rank, j in enumerate(order):
            position = (rank + offset) / len(pids)
            # the split whose cumulative interval holds the position: never one with fraction 0, except
            # through rounding at the very top, hence the step back
            k = min(int(np.searchsorted(bounds, position, side="right")), 2)
            while fr[SPLITS[k]] == 0:
                k -= 1
            assignment[pids[j]] = SPLITS[k]
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    for item in items:
        out[assignment[patient_key(item)]].append(item)
    return out


def check_patient_splits(datalist: Mapping[str, Sequence[Mapping[str, Any]]], raise_error: bool = False) -> list[str]:
    """Messages naming every patient that appears in more than one split (empty list if none).

    Items without ``patient_id`` are their own patient (keyed by image path), so an image listed in two splits
    is reported too. ``raise_error=True`` raises :class:`DatalistError` with all messages instead.
    """
    splits_of: dict[str, dict[str, int]] = defaultdict(dict)
    for split, _, item in iter_items(datalist):
        if isinstance(item, Mapping):
            counts = splits_of[patient_key(item)]
            counts[split] = counts.get(split, 0) + 1
    problems = []
    for pid, counts in sorted(splits_of.items()):
        if len(counts) > 1:
            where = ", ".join(f"{s} ({n} item{'s' if n > 1 else ''})" for s, n in counts.items())
            what = f"image {pid[6:]!r}" if pid.startswith("image:") else f"patient {pid!r}"
            problems.append(f"{what} is in more than one split: {where}")
    if problems and raise_error:
        raise DatalistError("; ".join(problems))
    return problems


# ------------------------------------------------------------------------------------------------------------
# building datalists from a DICOM folder or a CSV (used by scripts/make_datalist.py); the CSV layouts themselves
# are in datalist_parsers.py
# ------------------------------------------------------------------------------------------------------------
def _path_for_datalist(path: Path, relative_to: Path | None) -> str:
    """Path as written in the datalist: relative to the datalist's folder, or absolute when ``relative_to`` is
    None."""
    path = path.resolve()
    return str(path) if relative_to is None else os.path.relpath(path, relative_to.resolve())


def items_from_dicom_dir(
    dicom_dir: str | os.PathLike, relative_to: str | os.PathLike | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Items for every 2-D mammogram under ``dicom_dir`` (recursive; any file that parses as DICOM).

    Labels are unknown (no ``label`` key). Returns ``(items, skipped)``: ``skipped`` names every file that was
    left out and why (not DICOM, no image, multi-frame); items are sorted by path.
    """
    from .readers import MammogramReadError, read_dicom_header

    root = Path(dicom_dir)
    if not root.is_dir():
        raise DatalistError(f"{root}: DICOM folder not found")
    rel = None if relative_to is None else Path(relative_to)
    items, skipped = [], []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")):
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
        item: dict[str, Any] = {"image": _path_for_datalist(path, rel)}
        item["patient_id"] = header.get("patient_id") or header.get("study_uid") or f"file:{path.name}"
        for key in ("laterality", "view"):
            if header.get(key):
                item[key] = header[key]
        items.append(item)
    return items, skipped


def detect_csv_flavour(columns: Iterable[str], source: str | os.PathLike | None = None) -> str:
    """The registered flavour ('cbis-ddsm', 'vindr-mammo', 'generic', ...) of a CSV header (case, spaces and
    underscores ignored); see :func:`~scripts.data.datalist_parsers.find_datalist_parser` for which one wins when
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
) -> tuple[list[dict[str, Any]], list[str]]:
    """Items from a CBIS-DDSM-like, VinDr-Mammo-like or generic CSV (see ``CSV_FLAVOURS``, docs/data.md).

    File paths in the CSV are relative to ``root`` (default: the CSV's folder). Rows of the same image are
    merged: labels are OR-ed; several ROI masks of one class are merged (union) into ``mask_dir`` as 0/255 PNG.
    Returns ``(items, problems)``; a row with a problem is left out and named in ``problems``.
    The layout is detected from the header and each row goes to that flavour's registered parser
    (:mod:`scripts.data.datalist_parsers`).
    """
    csv_path = Path(csv_path)
    parser, rows = _read_csv(csv_path)
    base = Path(root) if root is not None else csv_path.parent
    rel = None if relative_to is None else Path(relative_to)
    problems: list[str] = []
    merged: dict[str, dict[str, Any]] = {}  # image path -> its item, in order of first appearance
    masks: dict[str, dict[str, list[Path]]] = defaultdict(lambda: defaultdict(list))  # image -> class -> ROIs
    for line, row in enumerate(rows, start=2):  # line 1 is the header
        where = f"{csv_path}:{line}"
        try:
            parsed = parser.parse(row, where, base)
        except CsvRowError as err:
            problems.append(str(err))
            continue
        for cls, path in parsed.masks.items():
            masks[str(parsed.image)][cls].append(path)
        problems += _merge_row(merged, parsed, where, rel)
    out_dir = Path(mask_dir) if mask_dir else csv_path.parent / "merged_masks"
    problems += _attach_masks(merged, masks, out_dir, rel)
    items = [{k: v for k, v in it.items() if v is not None} for it in merged.values()]
    return items, problems


def _read_csv(csv_path: Path) -> tuple[DatalistParser, list[CsvRow]]:
    """The parser for the CSV's layout and its rows keyed by normalised column name, values stripped.

    The layout is detected before any row is read, so a file of another kind fails on its header alone.
    """
    import csv

    if not csv_path.is_file():
        raise DatalistError(f"{csv_path}: CSV file not found")
    # utf-8-sig: spreadsheet exports often start with a byte order mark, which would glue itself to column 1
    with csv_path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None:
            raise DatalistError(f"{csv_path}: empty CSV (no header)")
        parser = DATALIST_PARSERS[detect_csv_flavour(reader.fieldnames, source=csv_path)]
        # key None holds the cells beyond the header of a too-long row; a too-short row's missing cells are None
        rows = [{normalise_column(k): (v or "").strip() for k, v in row.items() if k is not None} for row in reader]
    return parser, rows


def _merge_row(merged: dict[str, dict[str, Any]], parsed: ParsedRow, where: str, rel: Path | None) -> list[str]:
    """Fold one row into its image's item: labels are OR-ed (an unknown label stays unknown only until a row
    knows it), fields come from the first row that gives them. Returns a problem per field that disagrees with an
    earlier row (the earlier value is kept: rows of one image must describe one image)."""
    item = merged.setdefault(str(parsed.image), {"image": _path_for_datalist(parsed.image, rel)})
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
    return problems


def _attach_masks(
    merged: dict[str, dict[str, Any]], masks: Mapping[str, Mapping[str, list[Path]]], out_dir: Path, rel: Path | None
) -> list[str]:
    """Set each item's ``mask_<class>``: its one ROI mask, or the union of several written to ``out_dir``.
    Returns a problem per class whose masks could not be merged (the item then has no mask of that class)."""
    problems = []
    for key, by_class in masks.items():
        item = merged[key]
        for cls, paths in by_class.items():
            unique = sorted(set(paths))
            if len(unique) == 1:
                item[f"mask_{cls}"] = _path_for_datalist(unique[0], rel)
                continue
            try:
                out = _merge_masks(unique, out_dir, key, cls)
            except ValueError as err:
                problems.append(f"{key}: {cls} masks not merged: {err}")
                continue
            item[f"mask_{cls}"] = _path_for_datalist(out, rel)
    return problems


def _merge_masks(paths: Sequence[Path], out_dir: Path, image: str, cls: str) -> Path:
    """Union of several ROI masks of one image and class, written as a 0/255 PNG; returns its path."""
    import hashlib

    from PIL import Image

    from .readers import read_mammogram

    union = None
    for p in paths:
        arr, _ = read_mammogram(p, mask=True)
        if union is not None and arr.shape != union.shape:
            raise ValueError(f"{p}: mask size {arr.shape} differs from {paths[0]} {union.shape}")
        union = arr > 0 if union is None else union | (arr > 0)
    name = f"{Path(image).stem}_{hashlib.sha1(image.encode()).hexdigest()[:8]}_{cls}.png"
    out = out_dir / name
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".tmp{os.getpid()}-{out.name}")
    Image.fromarray(np.where(union, 255, 0).astype(np.uint8)).save(tmp, format="PNG")
    os.replace(tmp, out)
    return out
