"""What the benchmark reads from the workflows' reports and judges: ``metrics.json`` (:func:`read_metrics`), a
trial's selection score (:func:`validation_dice`), one Table-1 row (:func:`table_row`), relative gains and the
acceptance conditions of the benchmark (:func:`acceptance_checks`)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .presets import BenchmarkError

CLASSES = ("malignant", "benign")  # the paper's column order
#: the report's column groups: (key in a table row, title)
METRIC_GROUPS = (
    ("dice", "Dice"),
    ("pxap_image", "image-level PxAP"),
    ("pxap_dataset", "dataset-level PxAP"),
    ("auc", "classification AUC"),
)
#: an AUC within this distance of a baseline's counts as "very similar classification accuracy" (the paper)
AUC_TOLERANCE = 0.03


def read_metrics(path: Path) -> dict[str, Any]:
    """A ``metrics.json`` written by the bundle's ``MetricsReport``."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise BenchmarkError(f"{path}: cannot read the metrics report ({err})") from err


def validation_dice(summary: Mapping[str, Any], map_key: str = "S_g") -> float:
    """The selection score of a trial: mean over the classes of the map's mean soft Dice (the workflow's key
    metric); classes without a lesion image in the split are left out; NaN when no class has one."""
    stats = summary["metrics"][map_key]
    values = [stats[c]["dice_mean"] for c in summary["classes"] if stats[c]["dice_mean"] is not None]
    return float(np.mean(values)) if values else float("nan")


def table_row(summary: Mapping[str, Any], map_key: str) -> dict[str, dict[str, float | None]]:
    """One row of Table 1 from a metrics.json: ``{"dice": {class: mean}, "dice_std": ..., "pxap_image": ...,
    "pxap_image_std": ..., "pxap_dataset": ..., "auc": ...}``, classes by name."""
    stats = summary["metrics"][map_key]
    classes = list(summary["classes"])
    row: dict[str, dict[str, float | None]] = {
        "dice": {c: stats[c]["dice_mean"] for c in classes},
        "dice_std": {c: stats[c]["dice_std"] for c in classes},
        "pxap_image": {c: stats[c]["pxap_image_mean"] for c in classes},
        "pxap_image_std": {c: stats[c]["pxap_image_std"] for c in classes},
        "pxap_dataset": {c: stats[c]["pxap_dataset"] for c in classes},
        "auc": {c: summary["classification_auc"][c] for c in classes},
    }
    return row


def relative_gain(ours: float | None, theirs: float | None) -> float | None:
    """(ours - theirs) / theirs, None where undefined (missing value or theirs <= 0)."""
    if ours is None or theirs is None or theirs <= 0 or math.isnan(ours) or math.isnan(theirs):
        return None
    return (ours - theirs) / theirs


@dataclass(frozen=True)
class Check:
    """One acceptance condition: what was compared, the values, whether it holds."""

    condition: str
    detail: str
    holds: bool


def row_value(rows: Mapping[str, Any], model: str, metric: str, cls: str) -> float | None:
    """``rows[model][metric][cls]`` as a float; None where the model, metric or class is missing or the value is
    NaN (so that a missing value fails a comparison instead of passing it)."""
    value = rows.get(model, {}).get(metric, {}).get(cls)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def acceptance_checks(rows: Mapping[str, Mapping[str, Mapping[str, float | None]]]) -> list[Check]:
    """The benchmark's acceptance conditions on Table-1 rows keyed ``GLAM``, ``GMIC``, ``CAM``, ``U-Net``:

    - GLAM S_c beats CAM and GMIC (strictly) on Dice, image-level PxAP and dataset-level PxAP, both classes;
    - GLAM's AUC is within :data:`AUC_TOLERANCE` of CAM's and of GMIC's, both classes;
    - the U-Net is above GLAM (strictly) on Dice, image-level PxAP and dataset-level PxAP, both classes.

    A missing value (a failed model, a class without lesion images) fails its check.
    """
    checks = []

    def fmt(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f}"

    for metric, title in METRIC_GROUPS[:3]:
        for other in ("CAM", "GMIC"):
            for cls in CLASSES:
                ours, theirs = row_value(rows, "GLAM", metric, cls), row_value(rows, other, metric, cls)
                holds = ours is not None and theirs is not None and ours > theirs
                checks.append(Check(f"GLAM beats {other}: {title} {cls}", f"{fmt(ours)} vs {fmt(theirs)}", holds))
    for other in ("CAM", "GMIC"):
        for cls in CLASSES:
            ours, theirs = row_value(rows, "GLAM", "auc", cls), row_value(rows, other, "auc", cls)
            holds = ours is not None and theirs is not None and abs(ours - theirs) <= AUC_TOLERANCE + 1e-12
            diff = "n/a" if ours is None or theirs is None else f"{ours - theirs:+.3f}"
            checks.append(
                Check(
                    f"GLAM AUC within {AUC_TOLERANCE} of {other}: {cls}",
                    f"{fmt(ours)} vs {fmt(theirs)} ({diff})",
                    holds,
                )
            )
    for metric, title in METRIC_GROUPS[:3]:
        for cls in CLASSES:
            unet, ours = row_value(rows, "U-Net", metric, cls), row_value(rows, "GLAM", metric, cls)
            holds = unet is not None and ours is not None and unet > ours
            checks.append(Check(f"U-Net above GLAM: {title} {cls}", f"{fmt(unet)} vs {fmt(ours)}", holds))
    return checks
