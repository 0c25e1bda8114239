"""Soft Dice of a saliency map against a binary lesion mask (paper appendix E): sum(S^2) + sum(G^2) below."""

from __future__ import annotations

import torch

from ..errors import UsageError
from ._common import PerImageMetric, check_inputs


def compute_soft_dice(y_pred: torch.Tensor, y: torch.Tensor, check_values: bool = True) -> torch.Tensor:
    """Soft Dice per image and class: 2 sum(S G) / (sum(S^2) + sum(G^2)).

    Args:
        y_pred: (B, C, H, W) saliency maps in [0, 1].
        y: (B, C, H, W) binary masks.
        check_values: validate score range and mask values (one host synchronisation).

    Returns:
        (B, C) float64 on the inputs' device; NaN where the class's mask is empty.
    """
    y_pred, y = check_inputs(y_pred, y, check_values)
    s = y_pred.float() if y_pred.dtype != torch.float64 else y_pred
    g = y.to(s.dtype)
    # products in the input precision, sums accumulated in float64: a full-size mammogram has ~5.7e6 pixels
    intersection = torch.sum(s * g, dim=(2, 3), dtype=torch.float64)
    s_sq = torch.sum(s * s, dim=(2, 3), dtype=torch.float64)
    g_sq = torch.sum(g, dim=(2, 3), dtype=torch.float64)  # G is binary, so G^2 == G
    dice = 2.0 * intersection / (s_sq + g_sq)
    return torch.where(g_sq > 0, dice, torch.full_like(dice, float("nan")))


class SoftDiceMetric(PerImageMetric):
    """Soft Dice as a MONAI cumulative metric: ``aggregate(reduction="mean" | "std")`` over the lesion images.

    Args:
        check_values: check the scores' range and the masks' values on every call.
    """

    def _compute_tensor(self, y_pred: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[override]
        if y is None:
            raise UsageError("y (the ground-truth masks) is required.")
        dice = compute_soft_dice(y_pred, y, self.check_values)
        self._check_num_classes(y_pred)
        return dice
