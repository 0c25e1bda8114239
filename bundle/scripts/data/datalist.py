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
    "detect_csv_flavour",
    "items_from_csv",
    "items_from_dicom_dir",
]

SPLITS = ("training", "validation", "test")
PATH_KEYS = ("image", "mask_benign", "mask_malignant")


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
    return "malignant" if malignant else "benign" if benign else "normal"


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
# building datalists from a DICOM folder or a CSV (used by scripts/make_datalist.py)
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


def _norm(name: str) -> str:
    return " ".join(str(name).strip().lower().replace("_", " ").split())


CSV_FLAVOURS = {
    "generic": "image, patient_id, laterality, view, label_benign, label_malignant, mask_benign, mask_malignant",
    "cbis-ddsm": "patient_id, left or right breast, image view, pathology, image file path, ROI mask file path",
    "vindr-mammo": "study_id, image_id, laterality, view_position, breast_birads (finding_birads optional)",
}


def detect_csv_flavour(columns: Iterable[str]) -> str:
    """'cbis-ddsm', 'vindr-mammo' or 'generic' from a CSV header (case, spaces and underscores ignored)."""
    cols = {_norm(c) for c in columns}
    if {"image file path", "pathology"} <= cols:
        return "cbis-ddsm"
    if {"study id", "image id"} <= cols:
        return "vindr-mammo"
    if "image" in cols:
        return "generic"
    accepted = "; ".join(f"{k}: {v}" for k, v in CSV_FLAVOURS.items())
    raise DatalistError(f"unrecognised CSV columns {sorted(cols)}; accepted layouts: {accepted}")


def _laterality(value: Any) -> str | None:
    v = str(value or "").strip().upper()
    return {"L": "L", "LEFT": "L", "R": "R", "RIGHT": "R"}.get(v)


def _birads(value: Any) -> int | None:
    digits = "".join(ch for ch in str(value or "") if ch.isdigit())
    return int(digits[0]) if digits else None


def _binary(value: Any, where: str) -> int | None:
    v = str(value if value is not None else "").strip().lower()
    if v in ("", "nan", "none", "null", "unknown"):
        return None
    if v in ("0", "0.0", "false", "no"):
        return 0
    if v in ("1", "1.0", "true", "yes"):
        return 1
    raise DatalistError(f"{where}: label must be 0/1 (or empty for unknown), got {value!r}")


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
    """
    import csv

    csv_path = Path(csv_path)
    if not csv_path.is_file():
        raise DatalistError(f"{csv_path}: CSV file not found")
    base = Path(root) if root is not None else csv_path.parent
    rel = None if relative_to is None else Path(relative_to)
    with csv_path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None:
            raise DatalistError(f"{csv_path}: empty CSV (no header)")
        flavour = detect_csv_flavour(reader.fieldnames)
        rows = [{_norm(k): (v or "").strip() for k, v in row.items() if k is not None} for row in reader]

    problems: list[str] = []
    merged: dict[str, dict[str, Any]] = {}
    masks: dict[str, dict[str, list[Path]]] = defaultdict(lambda: defaultdict(list))
    for line, row in enumerate(rows, start=2):
        where = f"{csv_path}:{line}"
        try:
            if flavour == "cbis-ddsm":
                image = base / row["image file path"]
                pathology = row.get("pathology", "").upper()
                if pathology.startswith("MALIGNANT"):
                    label = [0, 1]
                elif pathology.startswith("BENIGN"):
                    label = [1, 0]
                else:
                    raise DatalistError(f"{where}: pathology must be BENIGN, BENIGN_WITHOUT_CALLBACK or MALIGNANT")
                fields = {
                    "patient_id": row.get("patient id", ""),
                    "laterality": _laterality(row.get("left or right breast")),
                    "view": row.get("image view", "").upper() or None,
                }
                roi = row.get("roi mask file path", "")
                if roi:
                    masks[str(image)]["malignant" if label[1] else "benign"].append(base / roi)
            elif flavour == "vindr-mammo":
                study, image_id = row.get("study id", ""), row.get("image id", "")
                if not study or not image_id:
                    raise DatalistError(f"{where}: study_id and image_id are required")
                image = base / "images" / study / f"{image_id}.dicom"
                scores = [b for b in (_birads(row.get("breast birads")), _birads(row.get("finding birads"))) if b]
                if not scores:
                    raise DatalistError(f"{where}: no BI-RADS category in breast_birads/finding_birads")
                top = max(scores)  # BI-RADS proxy: 1 normal, 2-3 benign, 4-5 malignant (suspicious)
                label = [int(top in (2, 3)), int(top >= 4)]
                fields = {
                    "patient_id": study,
                    "laterality": _laterality(row.get("laterality")),
                    "view": row.get("view position", "").upper() or None,
                }
            else:
                if not row.get("image"):
                    raise DatalistError(f"{where}: empty image path")
                image = base / row["image"]
                lab = [_binary(row.get("label benign"), where), _binary(row.get("label malignant"), where)]
                label = None if None in lab else lab
                fields = {
                    "patient_id": row.get("patient id", ""),
                    "laterality": _laterality(row.get("laterality")),
                    "view": row.get("view", "").upper() or None,
                }
                for cls in ("benign", "malignant"):
                    if row.get(f"mask {cls}"):
                        masks[str(image)][cls].append(base / row[f"mask {cls}"])
        except DatalistError as err:
            problems.append(str(err))
            continue
        key = str(image)
        item = merged.setdefault(key, {"image": _path_for_datalist(image, rel)})
        if label is None:
            item.setdefault("label", None)
        else:
            old = item.get("label") or [0, 0]
            item["label"] = [max(a, b) for a, b in zip(old, label)]
        for k, v in fields.items():
            if v:
                if item.get(k) not in (None, v):
                    problems.append(f"{where}: {k} {v!r} differs from {item[k]!r} on an earlier row of {image}")
                item.setdefault(k, v)

    for key, by_class in masks.items():
        item = merged[key]
        for cls, paths in by_class.items():
            unique = sorted(set(paths))
            if len(unique) == 1:
                item[f"mask_{cls}"] = _path_for_datalist(unique[0], rel)
                continue
            try:
                out = _merge_masks(unique, Path(mask_dir) if mask_dir else csv_path.parent / "merged_masks", key, cls)
            except ValueError as err:
                problems.append(f"{key}: {cls} masks not merged: {err}")
                continue
            item[f"mask_{cls}"] = _path_for_datalist(out, rel)
    items = [{k: v for k, v in it.items() if v is not None} for it in merged.values()]
    return items, problems


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
