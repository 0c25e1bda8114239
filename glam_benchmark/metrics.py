"""What the benchmark reads from the workflows' reports and judges: ``metrics.json`` (:func:`read_metrics`), a trial's
selection score (:func:`validation_dice`), one Table-1 row (:func:`table_row`), relative gains, the acceptance
conditions of the benchmark (:func:`acceptance_checks`) and bootstrap intervals of the orderings from the per-image
reports (:func:`bootstrap_orderings`); and what needs no learning (:func:`no_learning_baselines`: image-wide
intensity statistics of the breast as classifiers, the brightest cell as a map), which a weakly supervised model must
beat."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from scripts.enums import CLASS_NAMES, LesionClass, MapName

from .presets import BenchmarkError

CLASSES = (LesionClass.MALIGNANT, LesionClass.BENIGN)  # the paper's column order
#: the report's column groups: (key in a table row, title)
METRIC_GROUPS = (
    ("dice", "Dice"),
    ("pxap_image", "image-level PxAP"),
    ("pxap_dataset", "dataset-level PxAP"),
    ("froc_1", "FROC at 1 FP/image"),
    ("auc", "classification AUC"),
    ("breast_auc", "breast-level AUC"),
)
#: GLAM's AUC within this distance of the best weakly supervised baseline's counts as "classifying as well"
AUC_TOLERANCE = 0.05
#: the pointing-game hit rate GLAM's S_c must reach, and the share of S_g peaks on the border it must stay under
POINTING_TARGET = 0.8
BORDER_LIMIT = 0.1
#: the U-Net's soft Dice must reach this on both classes (a fully supervised model that learned the task)
UNET_DICE_TARGET = 0.5
#: the orderings of Table 1 that the benchmark checks: (better, worse) on Dice and image-level PxAP
ORDERINGS = (("GLAM", "GMIC"), ("GMIC", "CAM"), ("U-Net", "GLAM"))
#: the paper's Table 2 in order (its Dice: S_c-joint 0.390 / 0.335 >= S_c-sep 0.375 / 0.318 > S_g 0.325 / 0.261),
#: and its local map above the global one (S_l 0.343 / 0.297 > S_g): the module the paper is about
S_C_JOINT, S_C_SEP = f"{MapName.COMBINED}-joint", f"{MapName.COMBINED}-sep"
ABLATION_ORDERINGS = (
    (S_C_JOINT, S_C_SEP),
    (S_C_SEP, MapName.GLOBAL.value),
    (MapName.LOCAL.value, MapName.GLOBAL.value),
)


def read_metrics(path: Path) -> dict[str, Any]:
    """A ``metrics.json`` written by the bundle's ``MetricsReport``."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise BenchmarkError(f"{path}: cannot read the metrics report ({err})") from err


def validation_dice(summary: Mapping[str, Any], map_key: str = MapName.GLOBAL) -> float:
    """The selection score of a trial: mean over the classes of the map's mean soft Dice (the workflow's key
    metric); classes without a lesion image in the split are left out; NaN when no class has one."""
    stats = summary["metrics"][map_key]
    values = [stats[c]["dice_mean"] for c in summary["classes"] if stats[c]["dice_mean"] is not None]
    return float(np.mean(values)) if values else float("nan")


def table_row(summary: Mapping[str, Any], map_key: str) -> dict[str, dict[str, float | None]]:
    """One row of Table 1 from a metrics.json: ``{"dice": {class: mean}, "dice_std": ..., "pxap_image": ...,
    "pxap_image_std": ..., "pxap_dataset": ..., "froc_1": (the lesion sensitivity at 1 false positive per image),
    "auc": ..., "breast_auc": ..., "pointing_game": ..., "peak_on_border": ..., "n_lesion": {class: images with a
    lesion of the class}}``, classes by name (None / 0 where the report has no such entry: reports written before
    the breast-level AUC and the FROC)."""
    stats = summary["metrics"][map_key]
    classes = list(summary["classes"])
    row: dict[str, dict[str, float | None]] = {
        "dice": {c: stats[c]["dice_mean"] for c in classes},
        "dice_std": {c: stats[c]["dice_std"] for c in classes},
        "pxap_image": {c: stats[c]["pxap_image_mean"] for c in classes},
        "pxap_image_std": {c: stats[c]["pxap_image_std"] for c in classes},
        "pxap_dataset": {c: stats[c]["pxap_dataset"] for c in classes},
        "froc_1": {c: (stats[c].get("froc") or {}).get("1") for c in classes},
        "auc": {c: summary["classification_auc"][c] for c in classes},
        "breast_auc": {c: (summary.get("breast_auc") or {}).get(c) for c in classes},
        "pointing_game": {c: stats[c].get("pointing_game") for c in classes},
        "peak_on_border": {c: stats[c].get("peak_on_border") for c in classes},
        "n_lesion": {c: summary.get("n_lesion_images", {}).get(c, 0) for c in classes},
    }
    return row


def pooled_rate(row: Mapping[str, Any], key: str) -> float | None:
    """A per-class rate (pointing game, peaks on the border) over all (image, class) pairs with a lesion: the
    per-class rates weighted by their numbers of lesion images; None where a rate is missing."""
    rates, counts = row.get(key, {}), row.get("n_lesion", {})
    pairs = [(rates.get(c), counts.get(c, 0)) for c in CLASSES]
    if any(r is None for r, n in pairs if n) or not sum(n for _, n in pairs):
        return None
    return float(sum(r * n for r, n in pairs if n) / sum(n for _, n in pairs))


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
    NaN (so that a missing value fails a comparison instead of passing it); a row that is not a mapping (a model
    that did not run) has no values."""
    row = rows.get(model)
    per_class = row.get(metric) if isinstance(row, Mapping) else None
    value = per_class.get(cls) if isinstance(per_class, Mapping) else None
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _fmt(value: float | None, std: float | None = None) -> str:
    """A figure as the reports print it: three decimals (``± std`` when given), ``n/a`` when missing."""
    if value is None:
        return "n/a"
    return f"{value:.3f}" if std is None else f"{value:.3f} ± {std:.3f}"


def beats_no_learning(row: Mapping[str, Any] | None, no_learning: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether a map learnt to localise: its pointing game (``row``, a :func:`table_row`) strictly above the
    brightest-cell map's (``no_learning``, :func:`no_learning_baselines` on the same split) for every class with a
    lesion image in that split, and the values compared (the failing classes named first). A missing value fails,
    and so does a split without a lesion image (nothing shows that the map localises).

    Args:
        row: the map's row on the split; None when the model has none (it failed).
        no_learning: the no-learning figures of the same split.

    Returns:
        (holds, detail).
    """
    counted = [c for c in CLASSES if (no_learning.get("n_lesion") or {}).get(c, 0) > 0]
    if not counted:
        return False, "no lesion image in the split"
    compared = {
        c: (row_value({"map": row}, "map", "pointing_game", c), no_learning["brightest_cell_hit"].get(c))
        for c in counted
    }
    failing = [c for c, (ours, theirs) in compared.items() if ours is None or theirs is None or not ours > theirs]
    detail = "; ".join(f"{c} {_fmt(ours)} vs {_fmt(theirs)}" for c, (ours, theirs) in compared.items())
    return not failing, (f"not above on {' and '.join(failing)}: " if failing else "") + detail


def acceptance_checks(
    rows: Mapping[str, Mapping[str, Any] | None],
    glam_global: Mapping[str, Any] | None = None,
    wall_s: float | None = None,
    wall_limit_s: float | None = None,
    no_learning: Mapping[str, Any] | None = None,
) -> list[Check]:
    """The benchmark's acceptance conditions on Table-1 rows (test split) keyed ``GLAM`` (its S_c), ``GMIC``, ``CAM``,
    ``U-Net``:

    - GLAM beats GMIC and GMIC beats CAM (strictly) on Dice and on image-level PxAP, both classes;
    - GLAM's AUC is within :data:`AUC_TOLERANCE` of the best weakly supervised baseline's, both classes;
    - the U-Net is above GLAM on Dice, both classes, with a Dice of at least :data:`UNET_DICE_TARGET`;
    - GLAM's pointing game (S_c, both classes pooled) is at least :data:`POINTING_TARGET`, and the peaks of its S_g
      (``glam_global``: the S_g row of the same model) lie on the image border for under :data:`BORDER_LIMIT`;
    - with ``no_learning`` (:func:`no_learning_baselines` on the test split): every model in ``rows`` (GLAM: its
      S_c and its S_g) beats the no-learning map's pointing game (:func:`beats_no_learning`);
    - with ``wall_limit_s``: the whole run took at most that long.

    A missing value (a failed model: a row of None, a class without lesion images) fails its check.
    """
    checks = []
    for metric, title in (("dice", "Dice"), ("pxap_image", "image-level PxAP")):
        for better, worse in ORDERINGS[:2]:
            for cls in CLASSES:
                a, b = row_value(rows, better, metric, cls), row_value(rows, worse, metric, cls)
                holds = a is not None and b is not None and a > b
                checks.append(Check(f"{better} beats {worse}: {title} {cls}", f"{_fmt(a)} vs {_fmt(b)}", holds))
    for cls in CLASSES:
        ours = row_value(rows, "GLAM", "auc", cls)
        baselines = {m: row_value(rows, m, "auc", cls) for m in ("CAM", "GMIC")}
        known = {m: v for m, v in baselines.items() if v is not None}
        best = max(known, key=known.get) if known else None
        holds = ours is not None and best is not None and ours >= known[best] - AUC_TOLERANCE - 1e-12
        detail = "n/a" if best is None or ours is None else f"{_fmt(ours)} vs {best} {_fmt(known[best])}"
        checks.append(Check(f"GLAM AUC within {AUC_TOLERANCE} of the best baseline: {cls}", detail, holds))
    for cls in CLASSES:
        unet, ours = row_value(rows, "U-Net", "dice", cls), row_value(rows, "GLAM", "dice", cls)
        holds = unet is not None and ours is not None and unet > ours and unet >= UNET_DICE_TARGET
        checks.append(
            Check(f"U-Net above GLAM, Dice >= {UNET_DICE_TARGET}: {cls}", f"{_fmt(unet)} vs {_fmt(ours)}", holds)
        )
    glam = rows.get("GLAM")
    hit = pooled_rate(glam, "pointing_game") if isinstance(glam, Mapping) else None
    checks.append(
        Check(f"GLAM pointing game (S_c) >= {POINTING_TARGET}", _fmt(hit), hit is not None and hit >= POINTING_TARGET)
    )
    border = pooled_rate(glam_global, "peak_on_border") if isinstance(glam_global, Mapping) else None
    checks.append(
        Check(
            f"GLAM's S_g peaks on the border for < {BORDER_LIMIT:.0%} of lesions",
            _fmt(border),
            border is not None and border < BORDER_LIMIT,
        )
    )
    if no_learning is not None:
        maps = {"GLAM S_c": rows["GLAM"], "GLAM S_g": glam_global} if "GLAM" in rows else {}
        maps.update({m: rows[m] for m in ("GMIC", "CAM", "U-Net") if m in rows})
        for name, row in maps.items():
            holds, detail = beats_no_learning(row, no_learning)
            checks.append(
                Check(
                    f"{name} beats the no-learning map's pointing game on the test split, both classes", detail, holds
                )
            )
    if wall_limit_s is not None:
        holds = wall_s is not None and wall_s <= wall_limit_s
        minutes = "n/a" if wall_s is None else f"{wall_s / 60:.0f} min"
        checks.append(Check(f"whole run within {wall_limit_s / 3600:g} h", minutes, holds))
    return checks


def ablation_checks(dice: Mapping[str, Mapping[str, float | None]]) -> list[Check]:
    """The paper's Table-2 ordering on mean Dice, ``dice[map][class]`` for ``S_g`` (the global module trained
    alone), ``S_l`` (the local module trained on its patches, the global one frozen), ``S_c-sep`` (their average
    before joint training) and ``S_c-joint``: S_c-joint at least S_c-sep, S_c-sep and S_l strictly above S_g, both
    classes. A missing value fails its check."""
    return [
        _ordering_check(dice, better, worse, cls, "Dice", strict=worse == MapName.GLOBAL)
        for better, worse in ABLATION_ORDERINGS
        for cls in CLASSES
    ]


def pointing_checks(pointing: Mapping[str, Mapping[str, float | None]]) -> list[Check]:
    """S_c-joint's pointing game at least S_g's (the global module trained alone), both classes, from
    ``pointing[map][class]``: the combined map refines the global one and should not peak off the lesions more
    often. A missing value fails its check."""
    return [_ordering_check(pointing, S_C_JOINT, MapName.GLOBAL.value, cls, "pointing game") for cls in CLASSES]


def _ordering_check(
    values: Mapping[str, Mapping[str, float | None]],
    better: str,
    worse: str,
    cls: str,
    metric: str,
    strict: bool = False,
) -> Check:
    a, b = (values.get(better) or {}).get(cls), (values.get(worse) or {}).get(cls)
    a, b = (None if v is None or math.isnan(v) else float(v) for v in (a, b))
    holds = a is not None and b is not None and (a > b if strict else a >= b)
    detail = "n/a" if a is None or b is None else f"{a:.3f} vs {b:.3f}"
    return Check(f"{better} {'>' if strict else '>='} {worse}: {metric} {cls}", detail, holds)


def per_image_values(csv_path: Path, map_key: str, stat: str) -> dict[str, dict[str, float]]:
    """``{class: {image: value}}`` of one per-image column family (``<map>_<stat>_<class>``) of a metrics.csv,
    images without a lesion of the class left out."""
    import csv

    out: dict[str, dict[str, float]] = {c: {} for c in CLASSES}
    with open(csv_path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            for c in CLASSES:
                cell = row.get(f"{map_key}_{stat}_{c}", "")
                if cell != "":
                    out[c][row["image"]] = float(cell)
    return out


def bootstrap_orderings(
    per_image: Mapping[str, Mapping[str, Mapping[str, float]]],
    pairs: tuple[tuple[str, str], ...] = ORDERINGS,
    resamples: int = 2000,
    seed: int = 0,
) -> dict[tuple[str, str, str], dict[str, float]]:
    """Bootstrap over test images of the mean difference ``better - worse`` per class.

    ``per_image[model][class][image]``: a per-image value (Dice or PxAP). The images of a class are resampled with
    replacement (the same resample for every model: the models were evaluated on the same images). Returns per
    (better, worse, class): the observed difference, its 2.5 % / 97.5 % percentiles and the share of resamples in
    which ``better`` stays strictly ahead.
    """
    rng = np.random.default_rng(seed)
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    for cls in CLASSES:
        models = {m for pair in pairs for m in pair if m in per_image}
        images = sorted(set.intersection(*(set(per_image[m][cls]) for m in models))) if models else []
        if not images:
            continue
        values = {m: np.array([per_image[m][cls][i] for i in images]) for m in models}
        draws = rng.integers(0, len(images), size=(resamples, len(images)))
        for better, worse in pairs:
            if better not in values or worse not in values:
                continue
            diff = values[better] - values[worse]
            boot = diff[draws].mean(axis=1)
            out[(better, worse, cls)] = {
                "difference": float(diff.mean()),
                "low": float(np.percentile(boot, 2.5)),
                "high": float(np.percentile(boot, 97.5)),
                "share_ahead": float((boot > 0).mean()),
                "n_images": float(len(images)),
            }
    return out


# -- what needs no learning: image-wide intensity statistics and the brightest cell as baselines --


STATISTICS = ("max", "q99.9", "mean", "std")


def breast_statistics(images: torch.Tensor) -> dict[str, np.ndarray]:
    """Per image (N, 1, H, W), intensity statistics over the breast (the pixels above the image's minimum, which
    is the background after the preprocessing)."""
    out: dict[str, list[float]] = {name: [] for name in STATISTICS}
    for image in images.float():
        values = image[image > image.min()]
        if values.numel() == 0:
            values = image.flatten()
        out["max"].append(float(values.max()))
        # quantile of a regular subsample: torch.quantile refuses inputs of more than 2^24 values
        out["q99.9"].append(float(torch.quantile(values[:: max(1, values.numel() // 200_000)], 0.999)))
        out["mean"].append(float(values.mean()))
        out["std"].append(float(values.std()))
    return {k: np.asarray(v) for k, v in out.items()}


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC by ranks (ties count half); NaN when one class is missing."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels)
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).mean()
    ties = (pos[:, None] == neg[None, :]).mean()
    return float(greater + 0.5 * ties)


def brightest_cell_maps(images: torch.Tensor, cell: int) -> torch.Tensor:
    """A trivial saliency map of images (B, 1, H, W): the mean intensity of each ``cell`` x ``cell`` block, rescaled
    to [0, 1] per image and nearest-upsampled, the same for both classes (B, 2, H, W)."""
    pooled = F.avg_pool2d(images.float(), cell, ceil_mode=True)
    lo = pooled.amin(dim=(-2, -1), keepdim=True)
    hi = pooled.amax(dim=(-2, -1), keepdim=True)
    scaled = (pooled - lo) / (hi - lo).clamp_min(1e-12)
    upsampled = scaled.repeat_interleave(cell, dim=-2).repeat_interleave(cell, dim=-1)
    return upsampled[..., : images.shape[-2], : images.shape[-1]].clamp(0, 1).expand(-1, 2, -1, -1)


def no_learning_baselines(
    images: torch.Tensor, masks: torch.Tensor, labels: torch.Tensor, cell: int, tolerance: float
) -> dict[str, Any]:
    """For preprocessed images (N, 1, H, W), masks (N, 2, H, W) and labels (N, 2) (benign, malignant):

    - ``statistics``: per statistic, the AUC of the statistic as a score for any lesion / benign / malignant;
    - ``brightest_cell_hit``: per class, the pointing-game hit rate of :func:`brightest_cell_maps` (peak within
      ``tolerance`` px of a lesion of the class), over the images with a lesion of that class (None without one),
      and ``brightest_cell_pooled`` over both classes; ``n_lesion``: per class, the images with a lesion of it;
      ``cell`` and ``tolerance`` as used.
    """
    from scripts.metrics import PointingGameMetric

    y = labels.float().numpy()
    stats = breast_statistics(images)
    statistics = {
        name: {"any": auc(v, y.max(1)), **{c: auc(v, y[:, i]) for i, c in enumerate(CLASS_NAMES)}}
        for name, v in stats.items()
    }
    hit = PointingGameMetric(tolerance=tolerance, check_values=False)
    for start in range(0, len(images), 16):
        sl = slice(start, start + 16)
        hit(brightest_cell_maps(images[sl], cell), masks[sl])
    rates = hit.aggregate().tolist()
    has_lesion = masks.flatten(2).amax(2).float().sum(0).tolist()  # images with a lesion, per class
    pooled_n = sum(has_lesion)
    pooled = sum(r * n for r, n in zip(rates, has_lesion) if n) / pooled_n if pooled_n else None
    return {
        "statistics": statistics,
        "brightest_cell_hit": {c: float(r) if n else None for c, r, n in zip(CLASS_NAMES, rates, has_lesion)},
        "brightest_cell_pooled": pooled,
        "n_lesion": {c: int(n) for c, n in zip(CLASS_NAMES, has_lesion)},
        "cell": int(cell),
        "tolerance": float(tolerance),
    }


def validation_transform(parser: Any) -> Any:
    """The validation preprocessing of a parsed ``train.yaml`` as one per-image transform: its cached half
    (``validate#preprocessing``: the window, uint16) then its per-step half (``validate#batch_transforms``: the
    standardisation), i.e. the model's input as the validation workflow makes it, with ``mask`` and ``label``."""
    from monai.transforms import Compose

    return Compose(
        [parser.get_parsed_content("validate#preprocessing"), parser.get_parsed_content("validate#batch_transforms")]
    )


def preprocess_items(items: Sequence[Mapping[str, Any]], transform: Any) -> dict[str, torch.Tensor]:
    """Images (N, 1, H, W) float16, masks (N, 2, H, W) uint8 and labels (N, 2) of datalist ``items`` after a
    deterministic preprocessing ``transform`` that gives ``image``, ``mask`` and ``label``."""
    from monai.utils import convert_to_tensor

    def plain(value: Any) -> torch.Tensor:  # no MetaTensor: the cache must load with weights_only=True
        return convert_to_tensor(value, track_meta=False)

    images, masks, labels = [], [], []
    for item in items:
        d = transform(dict(item))
        images.append(plain(d["image"]).to(torch.float16))
        masks.append(plain(d["mask"]).to(torch.uint8))
        labels.append(plain(d["label"]).to(torch.float32).reshape(-1))
    return {"image": torch.stack(images), "mask": torch.stack(masks), "label": torch.stack(labels)}
