"""GLAM's training losses per stage (the paper's section 3.2; docs/training.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .enums import STAGES, OutputKey, Stage
from .errors import UsageError
from .precision import full_precision

# the global module's three maps S_0, S_1, S_2, each under the sparsity term
SCALE_KEYS = (OutputKey.SALIENCY_SCALE0, OutputKey.SALIENCY_SCALE1, OutputKey.SALIENCY_SCALE2)


def _bce(probabilities: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """BCE on probabilities in float32 outside autocast (it is not autocast-safe); NaN when ``probabilities`` are."""
    with full_precision(probabilities.device.type):
        p = probabilities.float()
        # torch's BCE asserts on NaN (fatal on CUDA): NaN * 0 poisons the loss instead, without a host sync
        poison = (p * 0).sum()
        return F.binary_cross_entropy(torch.nan_to_num(p, nan=0.5, posinf=1.0, neginf=0.0), target.float()) + poison


def _l1(maps: torch.Tensor) -> torch.Tensor:
    """Sum of |S| over pixels and classes, averaged over the batch."""
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
    """Loss of a GLAM training stage from the network's output dict and the image labels (B, 2).

    ``global``: L_g = sum_n [BCE(y, y_n) + lambda |S_n|_1] over the three scales; ``local``: L_l = BCE(y, y_l) +
    lambda sum_k |A_k|_1; ``joint``: L_g + L_l + BCE(y, y_f). The L1 sums are over pixels and classes, averaged over
    the batch, so lambda is on the paper's scale.

    Args:
        stage: ``"global"``, ``"local"`` or ``"joint"``.
        lambda_sparsity: lambda.
    """

    def __init__(self, stage: str = Stage.GLOBAL, lambda_sparsity: float = 1e-4) -> None:
        super().__init__()
        if stage not in STAGES:
            raise UsageError(f"stage must be one of {STAGES}, got {stage!r}")
        self.stage = Stage(stage)
        self.lambda_sparsity = _check_lambda(lambda_sparsity)

    def components(self, outputs: dict[str, torch.Tensor], target: torch.Tensor) -> dict[str, torch.Tensor]:
        """The named terms of the loss, for logging."""
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
