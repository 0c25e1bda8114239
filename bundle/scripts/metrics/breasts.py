"""Breast-level classification AUC: a breast scores its images' mean score, its label the maximum of theirs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from monai.metrics import compute_roc_auc

from ..errors import UsageError


def breast_key(item: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """``(patient_id, LATERALITY, study)`` of an item; None without a patient or a laterality (a breast of its own)."""
    patient, side = item.get("patient_id"), item.get("laterality")
    if patient in (None, "") or side in (None, ""):
        return None
    return str(patient), str(side).upper(), str(item.get("study") or "")


def group_breasts(keys: Sequence[tuple | None]) -> tuple[list[list[int]], int]:
    """The images' indices per breast in order of first appearance, and how many images had no key."""
    groups: dict[Any, list[int]] = {}
    alone = 0
    for i, key in enumerate(keys):
        if key is None:
            alone += 1
            key = ("#image", i)
        groups.setdefault(key, []).append(i)
    return list(groups.values()), alone


def breast_auc(scores: torch.Tensor, labels: torch.Tensor, keys: Sequence[tuple | None]) -> dict[str, Any]:
    """AUC per class over breasts (MONAI's ``compute_roc_auc``).

    Args:
        scores: (N, C) image scores.
        labels: (N, C) binary image labels.
        keys: N breast keys (:func:`breast_key`), None for an image of its own.

    Returns:
        ``{"auc": (C,) float64 (NaN where the breasts are all one label), "breasts": int, "images_without_breast":
        int}``.
    """
    scores, labels = torch.as_tensor(scores, dtype=torch.float64), torch.as_tensor(labels, dtype=torch.float64)
    if scores.ndim != 2 or scores.shape != labels.shape or len(keys) != scores.shape[0]:
        raise UsageError(
            f"scores and labels must be (N, C) of one shape with N keys, got {tuple(scores.shape)}, "
            f"{tuple(labels.shape)} and {len(keys)} keys."
        )
    groups, alone = group_breasts(keys)
    b_scores = torch.stack([scores[g].mean(0) for g in groups]) if groups else scores[:0]
    b_labels = torch.stack([labels[g].amax(0) for g in groups]) if groups else labels[:0]
    auc = torch.full((scores.shape[1],), float("nan"), dtype=torch.float64)
    for c in range(scores.shape[1]):
        if 0 < int(b_labels[:, c].sum()) < len(groups):  # both labels present: the AUC is defined
            auc[c] = float(compute_roc_auc(b_scores[:, c], b_labels[:, c]))
    return {"auc": auc, "breasts": len(groups), "images_without_breast": alone}
