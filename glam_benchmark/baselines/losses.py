"""The baselines' losses, on the conventions of :class:`scripts.losses.GLAMLoss` (lambda on the paper's scale)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from monai.losses import DiceLoss
from torch import nn

from scripts.enums import OutputKey
from scripts.losses import _bce, _check_labels, _check_lambda, _l1
from scripts.precision import full_precision

from .unet import LOGITS

__all__ = ["CAMLoss", "GMICLoss", "MaskDiceBCELoss"]


class CAMLoss(nn.Module):
    """Loss of the CAM baseline: BCE(y, y_global) + lambda sum_ij |S(i, j)|.

    The terms follow :class:`GLAMLoss`'s conventions (BCE averaged over batch and classes in float32; the L1 summed
    over pixels and classes, averaged over the batch), so lambda is on the paper's scale for every model.

    Args:
        lambda_sparsity: lambda.

    Forward: ``(outputs, target)``, outputs with ``y_global`` (B, 2) and ``saliency_global`` (B, 2, h, w), target
    (B, 2) labels -> scalar loss. :meth:`components` gives the named terms.
    """

    def __init__(self, lambda_sparsity: float = 1e-4) -> None:
        super().__init__()
        self.lambda_sparsity = _check_lambda(lambda_sparsity)

    def components(self, outputs: dict[str, torch.Tensor], target: torch.Tensor) -> dict[str, torch.Tensor]:
        _check_labels(outputs, target)
        return {
            "bce_global": _bce(outputs[OutputKey.Y_GLOBAL], target),
            "l1_global": self.lambda_sparsity * _l1(outputs[OutputKey.SALIENCY_GLOBAL]),
        }

    def forward(self, outputs: dict[str, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        return sum(self.components(outputs, target).values())


class GMICLoss(CAMLoss):
    """Loss of the GMIC baseline (Shen et al. 2021), trained end to end:
    BCE(y, y_global) + BCE(y, y_local) + BCE(y, y_fusion) + lambda sum_ij |S(i, j)| (the global map's sparsity).

    Forward: ``(outputs, target)``, outputs of :class:`~glam_benchmark.baselines.GMIC`, target (B, 2) labels -> scalar.
    """

    def components(self, outputs: dict[str, torch.Tensor], target: torch.Tensor) -> dict[str, torch.Tensor]:
        terms = super().components(outputs, target)
        for key in ("y_local", "y_fusion"):
            if key not in outputs:
                raise ValueError(f"GMICLoss needs {key!r} in the model outputs (a GMIC network)")
        terms["bce_local"] = _bce(outputs[OutputKey.Y_LOCAL], target)
        terms["bce_fusion"] = _bce(outputs[OutputKey.Y_FUSION], target)
        return terms


class MaskDiceBCELoss(nn.Module):
    """Fully supervised segmentation loss (the U-Net baseline): soft Dice + pixel BCE on the lesion masks.

    Per image and class: Dice = 1 - (2 sum(p g) + s) / (sum(p^2) + sum(g^2) + s) (MONAI's ``DiceLoss`` with
    squared denominators, the form of the evaluation's soft Dice) and the mean pixel BCE, p = sigmoid(logits), g the
    mask, s = ``smooth``. The (image, class) pairs whose mask is unknown, labelled positive with an empty mask
    (the datalist gives no mask for that lesion), are left out; lesion-free pairs (label 0) train towards an
    empty map. Both terms are averaged over the pairs kept; an empty batch of pairs gives 0.

    Args:
        lambda_dice, lambda_bce: weights of the two terms.
        smooth: s, added to numerator and denominator of the Dice.

    Forward: ``(outputs, target)``, outputs with ``logits`` (B, 2, H, W), target a dict with ``label`` (B, 2) and
    ``mask`` (B, 2, H, W) (``GLAMPrepareBatch(with_masks=True)``) -> scalar loss.
    """

    def __init__(self, lambda_dice: float = 1.0, lambda_bce: float = 1.0, smooth: float = 1e-5) -> None:
        super().__init__()
        if not (lambda_dice >= 0 and lambda_bce >= 0):
            raise ValueError(f"lambda_dice and lambda_bce must be >= 0, got {lambda_dice}, {lambda_bce}")
        self.lambda_dice, self.lambda_bce = float(lambda_dice), float(lambda_bce)
        self.dice = DiceLoss(sigmoid=True, squared_pred=True, reduction="none", smooth_nr=smooth, smooth_dr=smooth)

    def components(self, outputs: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not isinstance(target, dict) or not {"label", "mask"} <= set(target):
            raise ValueError(
                "MaskDiceBCELoss needs dict targets {'label': (B, 2), 'mask': (B, 2, H, W)}: "
                "train with GLAMPrepareBatch(with_masks=True)"
            )
        logits, label, mask = outputs[LOGITS], target["label"], target["mask"]
        if mask.shape != logits.shape or label.shape != logits.shape[:2]:
            raise ValueError(
                f"logits {tuple(logits.shape)}, mask {tuple(mask.shape)} and label {tuple(label.shape)} disagree"
            )
        with full_precision(logits.device.type):
            logits, mask = logits.float(), mask.float()
            known = ((label < 0.5) | (mask.flatten(2).amax(dim=2) > 0)).float()  # (B, C)
            count = known.sum().clamp_min(1.0)
            dice = self.dice(logits, mask).flatten(1)  # (B, C)
            bce = F.binary_cross_entropy_with_logits(logits, mask, reduction="none").flatten(2).mean(dim=2)
            return {
                "dice": self.lambda_dice * (dice * known).sum() / count,
                "bce": self.lambda_bce * (bce * known).sum() / count,
            }

    def forward(self, outputs: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> torch.Tensor:
        return sum(self.components(outputs, target).values())
