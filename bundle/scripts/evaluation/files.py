"""The evaluation report's files (per-image CSV, summary JSON, ``unscored.csv``) and its text table."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..atomic import atomic_write
from ..enums import LesionClass


def write_report_files(
    rows: Sequence[Mapping[str, str]],
    summary: Mapping[str, Any],
    csv_path: str | os.PathLike,
    json_path: str | os.PathLike,
) -> None:
    """Write ``rows`` to ``csv_path`` and ``summary`` (no NaN) to ``json_path``, atomically."""
    with atomic_write(csv_path, "w") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    with atomic_write(json_path, "w") as f:
        f.write(json.dumps(summary, indent=2, allow_nan=False) + "\n")


def write_unscored(entries: Sequence[Mapping[str, str]], path: str | os.PathLike) -> None:
    """Write the unscored images (``image``, ``reason``) to ``path`` atomically; the header alone when none."""
    with atomic_write(path, "w") as f:
        writer = csv.DictWriter(f, fieldnames=["image", "reason"], lineterminator="\n")
        writer.writeheader()
        writer.writerows({"image": e["image"], "reason": e["reason"]} for e in entries)


def _fmt(value: float | None, std: float | None = None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if std is None else f"{value:.3f} +/- {std:.3f}"


# the table's column groups: title, and the cell of one map (its summary stats) and class
_GROUPS: tuple[tuple[str, Callable[[Mapping[str, Any], Mapping[str, Any], str], str]], ...] = (
    ("Dice", lambda summary, s, c: _fmt(s[c]["dice_mean"], s[c]["dice_std"])),
    ("image-level PxAP", lambda summary, s, c: _fmt(s[c]["pxap_image_mean"], s[c]["pxap_image_std"])),
    ("dataset-level PxAP", lambda summary, s, c: _fmt(s[c]["pxap_dataset"])),
    ("pointing game", lambda summary, s, c: _fmt(s[c].get("pointing_game"))),
    ("FROC at 1 FP/image", lambda summary, s, c: _fmt(s[c].get("froc", {}).get("1"))),
    ("classification AUC", lambda summary, s, c: _fmt(summary["classification_auc"][c])),
    ("breast AUC", lambda summary, s, c: _fmt(summary.get("breast_auc", {}).get(c))),
)
_SEPARATOR = "  "


def _paper_order(classes: Sequence[str]) -> list[str]:
    return sorted(classes, key=lambda c: (c != LesionClass.MALIGNANT, c != LesionClass.BENIGN))


def _span(widths: Sequence[int], group: int, n_classes: int) -> int:
    """Width of a group's class columns together, separators included."""
    first = 1 + group * n_classes
    return sum(widths[first : first + n_classes]) + len(_SEPARATOR) * (n_classes - 1)


def _column_widths(lines: Sequence[Sequence[str]], n_classes: int) -> list[int]:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    # a longer group title widens the group's last column
    for g, (title, _) in enumerate(_GROUPS):
        span = _span(widths, g, n_classes)
        if len(title) > span:
            widths[g * n_classes + n_classes] += len(title) - span
    return widths


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return _SEPARATOR.join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()


def _group_line(widths: Sequence[int], n_classes: int) -> str:
    titles = [title.ljust(_span(widths, g, n_classes)) for g, (title, _) in enumerate(_GROUPS)]
    return _SEPARATOR.join(["map".ljust(widths[0]), *titles]).rstrip()


def _heading(summary: Mapping[str, Any], order: Sequence[str]) -> list[str]:
    title = f"GLAM evaluation: {summary.get('split', 'split')} split, {summary['n_images']} images"
    if summary.get("n_unscored"):
        title += (
            f" scored ({summary['n_unscored']} unscored image(s) skipped, in no number below: "
            f"{summary.get('unscored_csv', 'unscored.csv')})"
        )
    if summary.get("stage"):
        title += f", stage {summary['stage']}"
    lesions = ", ".join(f"{c} {summary['n_lesion_images'][c]}" for c in order)
    positives = ", ".join(f"{c} {summary['n_positive_labels'][c]}" for c in order)
    lines = [
        title,
        *([f"checkpoint: {summary['checkpoint']}"] if summary.get("checkpoint") else []),
        f"images with a lesion mask: {lesions}; labelled positive: {positives}",
    ]
    if "n_breasts" in summary:
        counted = ", ".join(f"{c} {summary['n_lesions'][c]}" for c in order)
        lines.append(
            f"lesions (connected components of the masks): {counted}; breasts: {summary['n_breasts']} "
            f"({summary['images_without_breast']} image(s) without a patient_id or laterality, each its own breast)"
        )
    return lines


def format_table(summary: Mapping[str, Any]) -> str:
    """The summary as plain text in the layout of the paper's Table 1: one row per map, malignant first."""
    order = _paper_order(list(summary["classes"]))
    header = ["", *(c for _ in _GROUPS for c in order)]
    body = [
        [m, *(cell(summary, summary["metrics"][m], c) for _, cell in _GROUPS for c in order)] for m in summary["maps"]
    ]
    widths = _column_widths([header, *body], len(order))
    lines = [
        *_heading(summary, order),
        "",
        _group_line(widths, len(order)),
        _line(header, widths),
        "-" * (sum(widths) + len(_SEPARATOR) * (len(widths) - 1)),
        *(_line(row, widths) for row in body),
        "",
        "Dice and PxAP over the images with a lesion of the class (mean +/- std); pointing game: share of those images"
        f" whose map peaks within {summary.get('pointing_tolerance_px', 0):g} px of a lesion of the class; FROC: share"
        " of the lesions found at 1 false positive per image (docs/metrics.md); AUC of y_global per image and per"
        " breast (the mean of its images'; every row).",
    ]
    return "\n".join(lines)
