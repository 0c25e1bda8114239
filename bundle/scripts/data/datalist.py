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
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write
from ..enums import CLASS_NAMES, LesionClass
from ..errors import UsageError
from .datalist_parsers import (
    CSV_FLAVOURS,
    DATALIST_PARSERS,
    CsvRowError,
    register_datalist_parser,
    unregister_datalist_parser,
)

# the builders live in datalist_sources.py; re-exported here
from .datalist_sources import (
    detect_csv_flavour,
    items_from_csv,
    items_from_dicom_dir,
    items_from_folder,
    path_for_datalist,
)
from .errors import DatalistError

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
    "items_from_folder",
    "path_for_datalist",
    "OFFICIAL_SPLIT_KEY",
    "split_items",
    "check_split_sizes",
    "split_choices",
]

SPLITS = ("training", "validation", "test")
PATH_KEYS = ("image", *(f"mask_{cls}" for cls in CLASS_NAMES))


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
    except RecursionError:  # Python's parser recurses once per nested list / object
        raise DatalistError(
            f"{path}: JSON nested too deeply to read (more than about {sys.getrecursionlimit()} levels of lists or "
            "objects); a datalist is {split: [item, ...]} with flat items"
        ) from None
    _validate_structure(data, str(path))
    return data


def _validate_structure(data: Any, where: str) -> None:
    if not isinstance(data, dict):
        raise DatalistError(f"{where}: a datalist must be a JSON object of splits, got {type(data).__name__}")
    for split, items in data.items():
        if not isinstance(items, list):
            raise DatalistError(f"{where}: split {split!r} must be a list of items, got {type(items).__name__}")


def save_datalist(datalist: Mapping[str, Sequence[Mapping[str, Any]]], path: str | os.PathLike) -> Path:
    """Write ``datalist`` as indented JSON atomically (:func:`~scripts.atomic.atomic_write`); returns the path."""
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
            raise UsageError(f"fractions: unknown split(s) {sorted(unknown)}; expected keys from {SPLITS}")
        values = [float(fractions.get(s, 0.0)) for s in SPLITS]
    else:
        values = [float(f) for f in fractions]
        if len(values) != 3:
            raise UsageError(f"fractions must be 3 numbers (training, validation, test), got {list(fractions)}")
    if any(not math.isfinite(v) or v < 0 for v in values) or abs(sum(values) - 1.0) > 1e-6:
        raise UsageError(f"fractions must be non-negative and sum to 1, got {values}")
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
    fractions, so each split receives its fraction up to one patient per group. With few patients per group that
    can leave a split with a fraction > 0 empty: it then takes one (seeded) patient from the largest split, as long
    as that one keeps a patient. Items keep their input order.
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
    _top_up(assignment, fr, rng)
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    for item in items:
        out[assignment[patient_key(item)]].append(item)
    return out


def _top_up(assignment: dict[str, str], fr: Mapping[str, float], rng: np.random.Generator) -> None:
    """Give every split with a fraction > 0 at least one patient, taken from the split with the most (if it has 2+)."""
    for split in SPLITS:
        members = defaultdict(list)
        for pid in sorted(assignment):
            members[assignment[pid]].append(pid)
        if fr[split] == 0 or members[split]:
            continue
        donor = max(SPLITS, key=lambda s: len(members[s]))
        if len(members[donor]) < 2:
            return
        assignment[members[donor][int(rng.integers(len(members[donor])))]] = split


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


OFFICIAL_SPLIT_KEY = "official_split"  # set by archives that publish a test set (CBIS-DDSM, VinDr-Mammo)


def split_items(
    items: Iterable[Mapping[str, Any]],
    fractions: Sequence[float] | Mapping[str, float] = (0.7, 0.15, 0.15),
    seed: int = 0,
    stratify: bool = True,
    official: bool = True,
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """:func:`split_by_patient`, keeping an archive's official test set; returns ``(datalist, notes)``.

    With ``official`` and items carrying ``official_split`` ("training" / "test"), every patient with an item in
    the official test set goes to ``test`` (all her items: a woman in both sets is moved whole, and the notes say
    how many), the others are split between training and validation in the ratio of those two fractions; the test
    fraction is not used. Without official splits (or ``official=False``) this is :func:`split_by_patient`. The
    ``official_split`` key is removed from the items.
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
        raise UsageError(
            "fractions: training and validation are both 0, but the official split only fixes 'test'; pass "
            "--no-official-split (official=False) to place every item by --fractions"
        )
    out = split_by_patient(rest, (fr["training"] / train_val, fr["validation"] / train_val, 0.0), seed, stratify)
    out["test"] = [it for it in items if patient_key(it) in test_patients]
    return out, notes


def _patients(items: Sequence[Mapping[str, Any]]) -> int:
    return len({patient_key(it) for it in items if isinstance(it, Mapping)})


def check_split_sizes(
    datalist: Mapping[str, Sequence[Mapping[str, Any]]], fractions: Mapping[str, float] | None = None
) -> list[str]:
    """Splits that would break training, one message each (empty list when none).

    A datalist with training items needs validation items: training without validation selects no model
    (``model.pt`` is never written and the next stage finds nothing to start from). Given the requested
    ``fractions``, a split asked for (fraction > 0) that received no patient is reported too.
    """
    n = {s: len(datalist.get(s, []) or []) for s in SPLITS}
    patients = {s: _patients(datalist.get(s, []) or []) for s in SPLITS}
    sizes = (
        " / ".join(f"{s} {patients[s]}" for s in SPLITS)
        + " patients ("
        + " / ".join(str(n[s]) for s in SPLITS)
        + " images)"
    )
    problems = []
    if n["training"] and not n["validation"]:
        problems.append(
            f"the validation split is empty ({sizes}): training would run without validation, select no model and "
            "write no model.pt"
        )
    if fractions is not None:
        fr = normalise_fractions(fractions)
        empty = [s for s in SPLITS if fr[s] > 0 and not n[s] and s != "validation"]
        if empty:
            problems.append(f"split(s) {', '.join(empty)} received no patient although their fraction is > 0 ({sizes})")
    return problems


def split_choices(n_patients: int) -> str:
    """The ways out of a refused split, for an error line."""
    hint = "--fractions 0.5 0.5 0" if n_patients == 2 else "--fractions 0.6 0.2 0.2"
    return (
        f"choose other fractions ({hint}; at least one patient per split you ask for), give an external "
        "validation list (--val-datalist FILE), or add patients"
    )
