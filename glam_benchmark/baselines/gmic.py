"""GMIC baseline (Shen et al., Medical Image Analysis 2021) from the bundle's parts, trained end to end in one stage.

GMIC as the GLAM paper compares it (Table 1): a single-scale global module (:class:`~glam_benchmark.baselines.CAM`:
GLAM's global backbone with one saliency head on its last layer, 46 x 30 for a 2944 x 1920 input), K patches
picked from that map by Algorithm 1 (:func:`scripts.patches.select_patch_boxes`, the greedy proposal GMIC
introduced), a ResNet-18 local module that gives each patch a 512-d representation h_k (MONAI's ResNet with the
standard strides; GLAM's local module is the stride-1 segmentation variant and has no role here), gated attention
over the patches (:class:`~scripts.aggregation.GatedAttentionAggregation`, 512 -> 128 -> 1) with a linear classifier
on the attended representation, and the fusion head on [z_g, z_l] (:class:`~scripts.aggregation.FusionHead`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from monai.networks.nets import ResNet
from torch import nn

from scripts.aggregation import FusionHead, GatedAttentionAggregation
from scripts.enums import OutputKey
from scripts.networks.glam import check_image
from scripts.patches import as_pair, crop_patches, select_patch_boxes

from .cam import CAM

__all__ = ["GMIC"]


class GMIC(nn.Module):
    """GMIC: global saliency, saliency-guided patches, patch classification, attention MIL and fusion.

    Args:
        patch_size: patch size in input pixels, int or (rows, cols) (GMIC: 256 at 2944 x 1920).
        num_patches: K, patches per image, in training and evaluation alike (GMIC: 6).
        t_global: top-t% fraction pooling the global map into y_global.
        local_width: first-layer width of the ResNet-18 local module (64: h_k is 512-d).
        attention_hidden: hidden size of the gated attention (128).
        num_classes: classes (benign, malignant).
        backbone, pool_in_breast: the global module's backbone and pooling options (see
            :class:`~glam_benchmark.baselines.CAM`).

    Forward: ``image`` (B, 1, H, W) standardised mammograms -> dict with

    - ``y_global`` (B, 2): the global module's top-t% pooled map; ``saliency_global`` (B, 2, H/64, W/64): its map,
      GMIC's saliency map (the model's only one); ``z_global`` (B, 256): spatial max of its last feature map;
    - ``patch_boxes`` (B, K, 4) long (row, col, height, width): Algorithm 1 on the (detached) global map;
    - ``attention`` (B, K): gated attention weights; ``z_local`` (B, 8 * local_width): sum_k alpha_k h_k;
    - ``y_local`` (B, 2): sigmoid(W z_local + b), the local module's prediction;
    - ``y_fusion`` (B, 2): sigmoid(W_f [z_global, z_local] + b_f): GMIC's classification output.
    """

    def __init__(
        self,
        patch_size: int | Sequence[int] = 256,
        num_patches: int = 6,
        t_global: float = 0.03,
        local_width: int = 64,
        attention_hidden: int = 128,
        num_classes: int = 2,
        backbone: Mapping[str, Any] | None = None,
        pool_in_breast: bool = False,
    ) -> None:
        super().__init__()
        self.patch_size = as_pair(patch_size, "patch_size")
        if isinstance(num_patches, bool) or not isinstance(num_patches, int) or num_patches < 1:
            raise ValueError(f"num_patches must be a positive int, got {num_patches!r}")
        if isinstance(local_width, bool) or not isinstance(local_width, int) or local_width < 1:
            raise ValueError(f"local_width must be a positive int, got {local_width!r}")
        self.num_patches = num_patches
        self.global_network = CAM(num_classes=num_classes, t=t_global, backbone=backbone, pool_in_breast=pool_in_breast)
        widths = [local_width * m for m in (1, 2, 4, 8)]
        # torchvision's ResNet-18 layout (7x7/2 stem, max-pool, strides 1/2/2/2, conv + BN shortcuts) ending in the
        # global average: one h_k per patch, no classifier (feed_forward=False)
        self.local_network = ResNet(
            block="basic",
            layers=[2, 2, 2, 2],
            block_inplanes=widths,
            spatial_dims=2,
            n_input_channels=1,
            conv1_t_size=7,
            conv1_t_stride=2,
            shortcut_type="B",
            feed_forward=False,
            bias_downsample=False,
        )
        self.representation_size = widths[-1]
        self.patch_classifier = nn.Linear(self.representation_size, num_classes)
        # t = 1: each patch contributes a 1 x 1 "map" (its class logits), pooled to itself
        self.attention = GatedAttentionAggregation(self.representation_size, attention_hidden, t=1.0)
        self.fusion = FusionHead(self.global_network.representation_size, self.representation_size, num_classes)

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        check_image(image, self.patch_size)
        out = self.global_network(image)
        boxes = select_patch_boxes(
            out[OutputKey.SALIENCY_GLOBAL].detach(), image.shape[-2:], self.patch_size, self.num_patches
        )
        B, K = boxes.shape[:2]
        patches = crop_patches(image, boxes, self.patch_size)  # (B, K, 1, ph, pw)
        h = self.local_network(patches.flatten(0, 1)).unflatten(0, (B, K))  # (B, K, D)
        logits = self.patch_classifier(h)  # (B, K, C)
        # The attention's weighted mean of per-patch logits is W (sum_k alpha_k h_k) + b because the weights sum to
        # 1, so its sigmoid is GMIC's classifier on the attended representation z_l.
        agg = self.attention(logits[..., None, None], h)
        out.update(
            patch_boxes=boxes,
            attention=agg[OutputKey.ATTENTION],
            z_local=agg[OutputKey.Z_LOCAL],
            y_local=torch.sigmoid(agg[OutputKey.Y_LOCAL].float()),  # float32 under bf16 autocast, as GLAM's
            y_fusion=self.fusion(out[OutputKey.Z_GLOBAL], agg[OutputKey.Z_LOCAL]),
        )
        return out
