"""Fully supervised U-Net baseline: the upper bound of the GLAM paper's Table 1, trained on the lesion masks."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from monai.networks.nets import BasicUNet
from torch import nn

from ..pooling import check_fraction, top_t_pool
from .glam import check_image

__all__ = ["UNetSaliency"]


class UNetSaliency(nn.Module):
    """MONAI's ``BasicUNet`` (2-D, one sigmoid channel per class) with the outputs of a GLAM workflow.

    The map is the segmentation itself, at the input's full resolution. A U-Net has no classification output; its
    image-level score, used for the AUC only, is the top-t% pooling of the map (the same fraction of the image's
    area as GLAM's global pooling).

    Args:
        num_classes: output channels (benign, malignant).
        t: top-t% fraction of the image-level score.
        features: ``BasicUNet`` widths (six numbers; MONAI's default (32, 32, 64, 128, 256, 32)).
        in_channels: image channels (1 for mammograms).

    Forward: ``image`` (B, 1, H, W) -> dict with ``saliency_global`` (B, 2, H, W) sigmoid probabilities (the
    model's only map), ``logits`` (B, 2, H, W) (for the loss), ``y_global`` (B, 2) top-t% pooled map.
    H and W should be multiples of 16 (four 2x down-samplings) for the skip connections to align exactly.
    """

    def __init__(
        self,
        num_classes: int = 2,
        t: float = 0.03,
        features: Sequence[int] = (32, 32, 64, 128, 256, 32),
        in_channels: int = 1,
    ) -> None:
        super().__init__()
        if len(features) != 6:
            raise ValueError(f"features must have 6 entries (BasicUNet's widths), got {tuple(features)}")
        self.t = check_fraction(t, "t")
        self.unet = BasicUNet(spatial_dims=2, in_channels=in_channels, out_channels=num_classes, features=features)

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        check_image(image)
        logits = self.unet(image)
        saliency = torch.sigmoid(logits)
        return {"y_global": top_t_pool(saliency, self.t), "saliency_global": saliency, "logits": logits}

    def extra_repr(self) -> str:
        return f"t={self.t}"
