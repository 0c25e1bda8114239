"""CAM baseline (Zhou et al., CVPR 2016) on GLAM's global backbone: one last-layer saliency head, top-t% pooling.

The GLAM paper's CAM baseline (section 4.3, Table 1) uses the same backbone as GLAM's global module (GMIC's
"ResNet-22", :class:`~scripts.networks.global_network.GlobalBackbone`) with a single 1x1 convolution + sigmoid on
its last feature map, pooled into the image-level prediction by top-t% pooling; t = 1 is CAM's global average
pooling, and the paper tunes t in {1, 2, 3, 5, 10, 20, 100} %. The same module is GMIC's single-scale global
module (:class:`~glam_benchmark.baselines.GMIC` holds one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from scripts.enums import OutputKey
from scripts.networks.glam import check_image
from scripts.networks.global_network import GlobalBackbone, breast_cells
from scripts.pooling import check_fraction, top_t_pool

__all__ = ["CAM"]


class CAM(nn.Module):
    """Class activation maps with top-t% pooling: (B, 1, H, W) -> one saliency map and the image prediction.

    Args:
        num_classes: saliency channels (benign, malignant).
        t: top-t% pooling fraction in (0, 1]; 1.0 is global average pooling (the original CAM).
        in_channels: image channels (1 for mammograms).
        backbone: keyword arguments of :class:`~scripts.networks.global_network.GlobalBackbone` (the paper's
            ResNet-22 when empty), the same as GLAM's global module in a comparison.
        pool_in_breast: zero the map on cells mostly outside the breast before pooling, as
            :class:`~scripts.networks.global_network.GlobalNetwork` does.

    Forward: ``image`` (B, 1, H, W) standardised mammograms -> dict with

    - ``y_global`` (B, 2): top-t% pooled map, probabilities (benign, malignant): the classification output;
    - ``saliency_global`` (B, 2, h, w): the map, sigmoid of a 1x1 conv (no bias) on ReLU(final BN(layer 5)),
      h x w = 46 x 30 for a 2944 x 1920 input (the backbone's stride 64); the model's only map;
    - ``z_global`` (B, 16 w): spatial max of the last feature map (used by GMIC's fusion head).
    """

    def __init__(
        self,
        num_classes: int = 2,
        t: float = 1.0,
        in_channels: int = 1,
        backbone: Mapping[str, Any] | None = None,
        pool_in_breast: bool = False,
    ) -> None:
        super().__init__()
        self.t = check_fraction(t, "t")
        self.pool_in_breast = bool(pool_in_breast)
        self.backbone = GlobalBackbone(in_channels=in_channels, **dict(backbone or {}))
        self.representation_size = self.backbone.out_channels[-1]
        self.saliency_head = nn.Conv2d(self.representation_size, num_classes, 1, bias=False)

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        check_image(image)
        features = self.backbone(image)["final"]
        saliency = torch.sigmoid(self.saliency_head(features).float())  # float32 under bf16 autocast, as GLAM's
        if self.pool_in_breast:
            saliency = saliency * breast_cells(image, saliency.shape[-2:]).to(saliency.dtype)
        return {
            OutputKey.Y_GLOBAL: top_t_pool(saliency, self.t),
            OutputKey.SALIENCY_GLOBAL: saliency,
            OutputKey.Z_GLOBAL: features.amax(dim=(-2, -1)),
        }

    def extra_repr(self) -> str:
        return f"t={self.t}"
