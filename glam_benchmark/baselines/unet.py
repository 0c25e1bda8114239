"""Fully supervised U-Net baseline: the upper bound of the GLAM paper's Table 1, trained on the lesion masks."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from monai.networks.nets import BasicUNet
from torch import nn

from scripts.enums import OutputKey
from scripts.networks.glam import check_image
from scripts.pooling import check_fraction, top_t_pool

#: the U-Net's raw per-pixel logits, an output GLAM does not have
LOGITS = "logits"

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
        input_stride: run the U-Net on the image average-pooled by this factor and upsample its logits back
            (bilinear): a quarter of the cost at 2, for CPU budgets; 1 (default) is the plain U-Net.

    Forward: ``image`` (B, 1, H, W) -> dict with ``saliency_global`` (B, 2, H, W) sigmoid probabilities (the
    model's only map), ``logits`` (B, 2, H, W) (for the loss), ``y_global`` (B, 2) top-t% pooled map.
    H and W should be multiples of 16 x ``input_stride`` (four 2x down-samplings) for the skip connections to align
    exactly.
    """

    def __init__(
        self,
        num_classes: int = 2,
        t: float = 0.03,
        features: Sequence[int] = (32, 32, 64, 128, 256, 32),
        in_channels: int = 1,
        input_stride: int = 1,
    ) -> None:
        super().__init__()
        if len(features) != 6:
            raise ValueError(f"features must have 6 entries (BasicUNet's widths), got {tuple(features)}")
        if isinstance(input_stride, bool) or not isinstance(input_stride, int) or input_stride < 1:
            raise ValueError(f"input_stride must be a positive int, got {input_stride!r}")
        self.t = check_fraction(t, "t")
        self.input_stride = input_stride
        self.unet = BasicUNet(spatial_dims=2, in_channels=in_channels, out_channels=num_classes, features=features)

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        check_image(image)
        s = self.input_stride
        if s == 1:
            logits = self.unet(image)
        else:
            logits = self.unet(F.avg_pool2d(image, s))
            logits = F.interpolate(logits, size=image.shape[-2:], mode="bilinear", align_corners=False)
        saliency = torch.sigmoid(logits.float())  # float32 under bf16 autocast, as GLAM's
        return {
            OutputKey.Y_GLOBAL: top_t_pool(saliency, self.t),
            OutputKey.SALIENCY_GLOBAL: saliency,
            LOGITS: logits,
        }

    def extra_repr(self) -> str:
        return f"t={self.t}, input_stride={self.input_stride}"
