"""JSON datalists in MONAI's layout (``{"training": [...], "validation": [...], "test": [...]}``)."""

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
from .errors import DatalistError

SPLITS = ("training", "validation", "test")
PATH_KEYS = ("image", *(f"mask_{cls}" for cls in CLASS_NAMES))


def load_datalist(path: str | os.PathLike) -> dict[str, list[dict[str, Any]]]:
    """Read a datalist JSON file (an object of lists of items); paths stay as written.

    Raises:
        DatalistError: naming the file, when it is missing, unreadable, not JSON or not a datalist.
    """
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
    """Write ``datalist`` as indented JSON atomically; returns the path."""
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

    Each label stratum is allocated by systematic sampling over the cumulative fractions; items keep their input order.

    Args:
        items: the datalist items.
        fractions: fractions of patients for (training, validation, test), or a dict by split.
        seed: seed of the patients' order.
        stratify: split each label stratum (any malignant / any benign / normal / unknown) in proportion.

    Returns:
        ``{split: items}``.
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
    """Give every split with a fraction > 0 one patient from the largest split (if it has 2+), in place."""
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
    """Messages naming every patient (an item without ``patient_id`` is its own) in more than one split.

    Raises:
        DatalistError: with all messages, when ``raise_error`` and there is any.
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


def _patients(items: Sequence[Mapping[str, Any]]) -> int:
    return len({patient_key(it) for it in items if isinstance(it, Mapping)})


def check_split_sizes(
    datalist: Mapping[str, Sequence[Mapping[str, Any]]], fractions: Mapping[str, float] | None = None
) -> list[str]:
    """Splits that would break training, one message each (no validation items, an empty split asked for)."""
    n = {s: len(datalist.get(s, []) or []) for s in SPLITS}
    patients = {s: _patients(datalist.get(s, []) or []) for s in SPLITS}
    sizes = (
        f"{' / '.join(f'{s} {patients[s]}' for s in SPLITS)} patients ({' / '.join(str(n[s]) for s in SPLITS)} images)"
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
