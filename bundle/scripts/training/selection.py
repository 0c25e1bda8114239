"""The validation metric that selects each stage's best model: the configured one, or, on a split without lesion
masks (where mask metrics are 0 every epoch), ``val_auc_mean`` or, where an AUC is undefined, ``val_neg_loss``."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from ignite.metrics import Metric
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce

from ..enums import CLASS_NAMES, MASK_KEYS, OutputKey, Stage

#: validation metrics that read the lesion masks (0.0 on a split without masks)
MASK_METRICS = ("val_soft_dice", "val_dice_benign", "val_dice_malignant", "val_pointing_game")
logger = logging.getLogger(__name__)


def stage_score_key(stage: str) -> str:
    """The image-level prediction a stage trains: ``y_global``, ``y_local`` or ``y_fusion``."""
    scores = {Stage.GLOBAL: OutputKey.Y_GLOBAL, Stage.LOCAL: OutputKey.Y_LOCAL, Stage.JOINT: OutputKey.Y_FUSION}
    return str(scores.get(str(stage), OutputKey.Y_GLOBAL))


def validation_has_masks(items: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any validation item names a lesion mask (a non-empty ``mask_benign`` / ``mask_malignant``)."""
    return any(str(item.get(key) or "").strip() for item in items for key in MASK_KEYS)


def _auc_defined(items: Sequence[Mapping[str, Any]]) -> str | None:
    """None when every class has validation images with and without it; else why not (one phrase)."""
    labels = [np.asarray(item.get("label", [0, 0]), dtype=float).ravel() for item in items]
    if not labels:
        return "the validation split is empty"
    table = np.stack([np.pad(x[:2], (0, max(0, 2 - x.size))) for x in labels])
    for index, name in enumerate(CLASS_NAMES):
        positives = int((table[:, index] > 0.5).sum())
        if positives == 0:
            return f"no validation image is {name}"
        if positives == len(table):
            return f"every validation image is {name}"
    return None


def configured_selection(metric: str) -> dict[str, str]:
    """``{"metric": metric, "reason": "selection_metric"}``: the configured metric, whatever the data holds."""
    return {"metric": str(metric), "reason": "selection_metric"}


def choose_selection(metric: str, items: Sequence[Mapping[str, Any]], stage: str = "") -> dict[str, str]:
    """``{"metric", "reason"}``: ``metric``, unless it reads masks the validation lacks."""
    metric = str(metric)
    if metric not in MASK_METRICS or validation_has_masks(items):
        return configured_selection(metric)
    why_not_auc = _auc_defined(items)
    if why_not_auc is None:
        chosen = "val_auc_mean"
        reason = (
            f"the validation split ({len(items)} images) has no lesion masks, so {metric} would be 0 every epoch: "
            f"selecting by val_auc_mean (the mean of val_auc_benign and val_auc_malignant, the ROC AUCs of "
            f"{stage_score_key(stage)})"
        )
    else:
        chosen = "val_neg_loss"
        reason = (
            f"the validation split ({len(items)} images) has no lesion masks, so {metric} would be 0 every epoch, "
            f"and the AUC is undefined ({why_not_auc}): selecting by val_neg_loss (minus the validation loss)"
        )
    logger.warning("%sbest-model selection: %s", f"{stage} stage: " if stage else "", reason)
    return {"metric": chosen, "reason": reason}


class NegativeBCE(Metric):
    """Minus the mean binary cross-entropy of image-level probabilities and labels: a key metric must grow."""

    @reinit__is_reduced
    def reset(self) -> None:
        self._sum = 0.0
        self._count = 0

    @reinit__is_reduced
    def update(self, output: Any) -> None:
        preds, labels = output
        p = torch.stack([torch.as_tensor(x).float().reshape(-1) for x in preds]).clamp(1e-7, 1 - 1e-7)
        y = torch.stack([torch.as_tensor(x).float().reshape(-1) for x in labels]).to(p.device)
        bce = -(y * torch.log(p) + (1 - y) * torch.log1p(-p))
        self._sum += float(bce.sum())
        self._count += bce.numel()

    @sync_all_reduce("_sum", "_count")
    def compute(self) -> float:
        return -self._sum / self._count if self._count else float("nan")
