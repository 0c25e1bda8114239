"""GLAM's training losses per stage (the paper's section 3.2; docs/training.md) and the baselines' losses."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from monai.losses import DiceLoss
from torch import nn

from .enums import STAGES, OutputKey, Stage
from .errors import UsageError
from .precision import full_precision

# the global module's three maps S_0, S_1, S_2, each under the sparsity term
SCALE_KEYS = (OutputKey.SALIENCY_SCALE0, OutputKey.SALIENCY_SCALE1, OutputKey.SALIENCY_SCALE2)

__all__ = ["GLAMLoss", "CAMLoss", "GMICLoss", "MaskDiceBCELoss"]


def _bce(probabilities: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    # Binary cross-entropy on probabilities is not autocast-safe: compute it in float32 outside autocast.
    with full_precision(probabilities.device.type):
        p = probabilities.float()
        # torch's BCE refuses a NaN probability (a RuntimeError on the CPU, a device-side assert that ends the process
        # on CUDA): diverged weights make the loss NaN instead, for the training's stop handler to report
        # (scripts.handlers.finite), without a host synchronisation. NaN * 0 and Inf * 0 are NaN, a finite p * 0 is
        # 0, so for finite probabilities the loss and its gradients are exactly what they were.
        poison = (p * 0).sum()
        return F.binary_cross_entropy(torch.nan_to_num(p, nan=0.5, posinf=1.0, neginf=0.0), target.float()) + poison


def _l1(maps: torch.Tensor) -> torch.Tensor:
    """sum over pixels and classes of |S|, averaged over the batch: (B, ...) -> scalar."""
    return maps.float().abs().flatten(1).sum(1).mean()


def _check_labels(outputs: dict[str, torch.Tensor], target: torch.Tensor) -> None:
    if target.ndim != 2 or target.shape != outputs[OutputKey.Y_GLOBAL].shape:
        raise UsageError(
            f"target must be (B, 2) labels like y_global {tuple(outputs['y_global'].shape)}, "
            f"got shape {tuple(target.shape)}"
        )


def _check_lambda(lambda_sparsity: float) -> float:
    if not lambda_sparsity >= 0:
        raise UsageError(f"lambda_sparsity must be >= 0, got {lambda_sparsity}")
    return float(lambda_sparsity)


class GLAMLoss(nn.Module):
    """Loss of a GLAM training stage, from the model's output dict and the image labels (B, 2).

    - ``global``: L_g = sum_n [BCE(y, y~_n) + lambda sum_ij |S_n(i, j)|] over the three scales n;
    - ``local``: L_l = BCE(y, y_l) + lambda sum |S_l|, the sparsity summed over the K patch maps A_k (S_l is
      those maps written into the image);
    - ``joint``: L_g + L_l + BCE(y, y_f).

    BCE is averaged over the batch and the two classes; the L1 sums run over pixels and classes, averaged over
    the batch, as the paper writes them (so lambda is on the paper's scale, 10^[-5.5, -3.5]).

    Args:
        stage: ``"global"``, ``"local"`` or ``"joint"``.
        lambda_sparsity: lambda.

    Forward: ``(outputs, target)`` -> scalar loss. :meth:`components` gives the named terms for logging.
    """

    def __init__(self, stage: str = Stage.GLOBAL, lambda_sparsity: float = 1e-4) -> None:
        super().__init__()
        if stage not in STAGES:
            raise UsageError(f"stage must be one of {STAGES}, got {stage!r}")
        self.stage = Stage(stage)
        self.lambda_sparsity = _check_lambda(lambda_sparsity)

    def components(self, outputs: dict[str, torch.Tensor], target: torch.Tensor) -> dict[str, torch.Tensor]:
        _check_labels(outputs, target)
        terms: dict[str, torch.Tensor] = {}
        if self.stage in (Stage.GLOBAL, Stage.JOINT):
            y_scales = outputs[OutputKey.Y_SCALES]
            terms["bce_global"] = sum(_bce(y_scales[:, n], target) for n in range(y_scales.shape[1]))
            terms["l1_global"] = self.lambda_sparsity * sum(_l1(outputs[key]) for key in SCALE_KEYS)
        if self.stage in (Stage.LOCAL, Stage.JOINT):
            for key in (OutputKey.Y_LOCAL, OutputKey.PATCH_MAPS):
                if key not in outputs:
                    raise UsageError(f"stage {self.stage!r} loss needs {key!r} in the model outputs (model stage?)")
            terms["bce_local"] = _bce(outputs[OutputKey.Y_LOCAL], target)
            terms["l1_local"] = self.lambda_sparsity * _l1(outputs[OutputKey.PATCH_MAPS])
        if self.stage == Stage.JOINT:
            if OutputKey.Y_FUSION not in outputs:
                raise UsageError("stage 'joint' loss needs 'y_fusion' in the model outputs (model stage?)")
            terms["bce_fusion"] = _bce(outputs[OutputKey.Y_FUSION], target)
        return terms

    def forward(self, outputs: dict[str, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        return sum(self.components(outputs, target).values())


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

    Forward: ``(outputs, target)``, outputs of :class:`~scripts.networks.GMIC`, target (B, 2) labels -> scalar.
    """

    def components(self, outputs: dict[str, torch.Tensor], target: torch.Tensor) -> dict[str, torch.Tensor]:
        terms = super().components(outputs, target)
        for key in ("y_local", "y_fusion"):
            if key not in outputs:
                raise UsageError(f"GMICLoss needs {key!r} in the model outputs (a GMIC network)")
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
            raise UsageError(f"lambda_dice and lambda_bce must be >= 0, got {lambda_dice}, {lambda_bce}")
        self.lambda_dice, self.lambda_bce = float(lambda_dice), float(lambda_bce)
        self.dice = DiceLoss(sigmoid=True, squared_pred=True, reduction="none", smooth_nr=smooth, smooth_dr=smooth)

    def components(self, outputs: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not isinstance(target, dict) or not {"label", "mask"} <= set(target):
            raise UsageError(
                "MaskDiceBCELoss needs dict targets {'label': (B, 2), 'mask': (B, 2, H, W)}: "
                "train with GLAMPrepareBatch(with_masks=True)"
            )
        logits, label, mask = outputs[OutputKey.LOGITS], target["label"], target["mask"]
        if mask.shape != logits.shape or label.shape != logits.shape[:2]:
            raise UsageError(
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
