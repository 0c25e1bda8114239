"""GLAM's training losses per stage (GLAM_SPEC section 4; the paper's section 3.2)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GLAMLoss"]


def _bce(probabilities: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    # Binary cross-entropy on probabilities is not autocast-safe: compute it in float32 outside autocast.
    with torch.autocast(device_type=probabilities.device.type, enabled=False):
        return F.binary_cross_entropy(probabilities.float(), target.float())


def _l1(maps: torch.Tensor) -> torch.Tensor:
    """sum over pixels and classes of |S|, averaged over the batch: (B, ...) -> scalar."""
    return maps.float().abs().flatten(1).sum(1).mean()


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

    def __init__(self, stage: str = "global", lambda_sparsity: float = 1e-4) -> None:
        super().__init__()
        if stage not in ("global", "local", "joint"):
            raise ValueError(f"stage must be 'global', 'local' or 'joint', got {stage!r}")
        if not lambda_sparsity >= 0:
            raise ValueError(f"lambda_sparsity must be >= 0, got {lambda_sparsity}")
        self.stage = stage
        self.lambda_sparsity = float(lambda_sparsity)

    def components(self, outputs: dict[str, torch.Tensor], target: torch.Tensor) -> dict[str, torch.Tensor]:
        if target.ndim != 2 or target.shape != outputs["y_global"].shape:
            raise ValueError(
                f"target must be (B, 2) labels like y_global {tuple(outputs['y_global'].shape)}, "
                f"got shape {tuple(target.shape)}"
            )
        terms: dict[str, torch.Tensor] = {}
        if self.stage in ("global", "joint"):
            y_scales = outputs["y_scales"]
            terms["bce_global"] = sum(_bce(y_scales[:, n], target) for n in range(y_scales.shape[1]))
            terms["l1_global"] = self.lambda_sparsity * sum(_l1(outputs[f"saliency_scale{n}"]) for n in range(3))
        if self.stage in ("local", "joint"):
            for key in ("y_local", "patch_maps"):
                if key not in outputs:
                    raise ValueError(f"stage {self.stage!r} loss needs {key!r} in the model outputs (model stage?)")
            terms["bce_local"] = _bce(outputs["y_local"], target)
            terms["l1_local"] = self.lambda_sparsity * _l1(outputs["patch_maps"])
        if self.stage == "joint":
            if "y_fusion" not in outputs:
                raise ValueError("stage 'joint' loss needs 'y_fusion' in the model outputs (model stage?)")
            terms["bce_fusion"] = _bce(outputs["y_fusion"], target)
        return terms

    def forward(self, outputs: dict[str, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        return sum(self.components(outputs, target).values())
