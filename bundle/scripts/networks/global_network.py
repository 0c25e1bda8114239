"""The global module f_g of GLAM: GMIC's pre-activation "ResNet-22" with three saliency heads.

Layout (GLAM_SPEC section 1), for a (B, 1, 2944, 1920) input::

    stem    conv 7x7/2 (1->16) + maxpool 3/2 (no padding)        16 x 735 x 479
    layer1  2 pre-activation blocks, 16 planes, stride 1         16 x 735 x 479
    layer2  32 planes, stride 2                                  32 x 368 x 240
    layer3  64 planes, stride 2  -> head S_0 (raw output)        64 x 184 x 120
    layer4  128 planes, stride 2 -> head S_1 (raw output)       128 x  92 x  60
    layer5  256 planes, stride 2 -> final BN + ReLU -> head S_2 256 x  46 x  30

Module names follow the authors' checkpoint layout so that a converted state dict maps one to one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..pooling import check_fraction, top_t_pool

__all__ = ["PreActBasicBlock", "GlobalBackbone", "GlobalNetwork", "nearest_resize"]


def nearest_resize(x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """Nearest-neighbour resize of (B, C, h, w) maps to ``size`` with exact integer index arithmetic.

    Output pixel (i, j) takes input pixel (i * h // H, j * w // W). Unlike ``F.interpolate``, whose source
    index comes from a floating-point scale, this is exact for any size pair, so maps rendered at a stride
    are exactly the full-size maps subsampled (GLAM_SPEC section 5).
    """
    out_h, out_w = int(size[0]), int(size[1])
    in_h, in_w = x.shape[-2:]
    if (in_h, in_w) == (out_h, out_w):
        return x
    rows = torch.arange(out_h, device=x.device) * in_h // out_h
    cols = torch.arange(out_w, device=x.device) * in_w // out_w
    return x[..., rows[:, None], cols[None, :]]


class PreActBasicBlock(nn.Module):
    """Pre-activation basic block (He et al. 2016) as in GMIC: (B, C_in, H, W) -> (B, planes, H/s, W/s).

    bn1 -> relu -> conv1 (stride) -> bn2 -> relu -> conv2, plus a residual; the shortcut of a block with a
    ``downsample`` is a 1x1 convolution (no bias, no BN) applied to the *activated* input. No ReLU after the sum.
    """

    def __init__(self, in_planes: int, planes: int, stride: int = 1, downsample: bool = False) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.downsample = (
            nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False)) if downsample else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(x))
        residual = x if self.downsample is None else self.downsample(out)
        out = self.conv1(out)
        out = F.relu(self.bn2(out))
        out = self.conv2(out)
        return out + residual


class GlobalBackbone(nn.Module):
    """GMIC's ResNet-22 (B, 1, H, W) -> dict of the three tapped feature maps.

    Returns ``{"layer3": (B, 64, H/16, W/16) raw, "layer4": (B, 128, H/32, W/32) raw,
    "final": (B, 256, H/64, W/64) after final BN + ReLU}`` (sizes for 2944x1920: 184x120, 92x60, 46x30).
    """

    def __init__(
        self,
        in_channels: int = 1,
        first_planes: int = 16,
        planes: Sequence[int] = (16, 32, 64, 128, 256),
        strides: Sequence[int] = (1, 2, 2, 2, 2),
        blocks_per_layer: int = 2,
    ) -> None:
        super().__init__()
        if len(planes) != 5 or len(strides) != 5:
            raise ValueError(f"planes and strides must have 5 entries (five layers), got {planes}, {strides}")
        self.first_conv = nn.Conv2d(in_channels, first_planes, 7, stride=2, padding=3, bias=False)
        self.first_pool = nn.MaxPool2d(3, stride=2, padding=0)
        layers = []
        in_planes = first_planes
        for p, s in zip(planes, strides):
            # GMIC gives the first block of every layer a 1x1 shortcut conv, even at stride 1 with equal width.
            blocks = [PreActBasicBlock(in_planes, p, stride=s, downsample=True)]
            blocks += [PreActBasicBlock(p, p) for _ in range(blocks_per_layer - 1)]
            layers.append(nn.Sequential(*blocks))
            in_planes = p
        self.layer_list = nn.ModuleList(layers)
        self.final_bn = nn.BatchNorm2d(in_planes)
        self.out_channels = tuple(planes[2:])

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.first_pool(self.first_conv(x))
        taps = {}
        for i, layer in enumerate(self.layer_list):
            h = layer(h)
            if i == 2:
                taps["layer3"] = h
            elif i == 3:
                taps["layer4"] = h
        taps["final"] = F.relu(self.final_bn(h))
        return taps


class GlobalNetwork(nn.Module):
    """GLAM's global module: multi-scale saliency S_0, S_1, S_2, their combination S_g, y_g and z_g.

    Args:
        num_classes: saliency channels (benign, malignant).
        gammas: weights (gamma_0, gamma_1, gamma_2) of S_0 (finest, H/16), S_1 (H/32), S_2 (H/64) in
            S_g = sum gamma_n * upsample(S_n); the paper's 0.2 / 0.6 / 0.2 by default.
        t: top-t% pooling fraction for the per-scale predictions (0.03 in the authors' code).
        pool_after_upsampling: pool every scale after nearest-upsampling it to S_0's size, as the authors'
            code does; otherwise each scale is pooled at its native resolution.
        in_channels: image channels (1 for mammograms).

    Forward: image (B, 1, H, W) -> dict with
        ``saliency_scales``: tuple of S_0 (B, 2, H/16, W/16), S_1 (B, 2, H/32, W/32), S_2 (B, 2, H/64, W/64);
        ``saliency_global``: S_g (B, 2, H/16, W/16);
        ``y_scales``: (B, 3, 2) per-scale top-t% pooled predictions; ``y_global``: y_g (B, 2), their mean;
        ``z_global``: z_g (B, 256), the spatial max of the last feature map (used by the fusion head).
    """

    def __init__(
        self,
        num_classes: int = 2,
        gammas: Sequence[float] = (0.2, 0.6, 0.2),
        t: float = 0.03,
        pool_after_upsampling: bool = False,
        in_channels: int = 1,
    ) -> None:
        super().__init__()
        if len(gammas) != 3 or any(g < 0 for g in gammas) or abs(sum(gammas) - 1.0) > 1e-6:
            raise ValueError(f"gammas must be three non-negative weights summing to 1, got {tuple(gammas)}")
        self.gammas = tuple(float(g) for g in gammas)
        self.t = check_fraction(t, "t")
        self.pool_after_upsampling = bool(pool_after_upsampling)
        self.num_classes = num_classes
        self.downsampling_branch = GlobalBackbone(in_channels=in_channels)
        c3, c4, c5 = self.downsampling_branch.out_channels
        self.postprocess_module = nn.Module()
        self.postprocess_module.gn_conv_1 = nn.Conv2d(c3, num_classes, 1, bias=False)
        self.postprocess_module.gn_conv_2 = nn.Conv2d(c4, num_classes, 1, bias=False)
        self.postprocess_module.gn_conv_last = nn.Conv2d(c5, num_classes, 1, bias=False)
        self.representation_size = c5

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor | tuple[torch.Tensor, ...]]:
        taps = self.downsampling_branch(x)
        pm = self.postprocess_module
        s0 = torch.sigmoid(pm.gn_conv_1(taps["layer3"]))
        s1 = torch.sigmoid(pm.gn_conv_2(taps["layer4"]))
        s2 = torch.sigmoid(pm.gn_conv_last(taps["final"]))
        size = s0.shape[-2:]
        upsampled = [s0, nearest_resize(s1, size), nearest_resize(s2, size)]
        saliency_global = sum(g * s for g, s in zip(self.gammas, upsampled))
        pooled_maps = upsampled if self.pool_after_upsampling else [s0, s1, s2]
        y_scales = torch.stack([top_t_pool(s, self.t) for s in pooled_maps], dim=1)
        z_global = taps["final"].amax(dim=(-2, -1))
        return {
            "saliency_scales": (s0, s1, s2),
            "saliency_global": saliency_global,
            "y_scales": y_scales,
            "y_global": y_scales.mean(dim=1),
            "z_global": z_global,
        }
