"""The global module f_g of GLAM: GMIC's pre-activation "ResNet-22" with three saliency heads.

Layout (docs/model.md), for a (B, 1, 2944, 1920) input::

    stem    conv 7x7/2 (1->16) + maxpool 3/2 (no padding)        16 x 735 x 479
    layer1  2 pre-activation blocks, 16 planes, stride 1         16 x 735 x 479
    layer2  32 planes, stride 2                                  32 x 368 x 240
    layer3  64 planes, stride 2  -> head S_0 (raw output)        64 x 184 x 120
    layer4  128 planes, stride 2 -> head S_1 (raw output)       128 x  92 x  60
    layer5  256 planes, stride 2 -> final BN + ReLU -> head S_2 256 x  46 x  30

Module names follow the authors' checkpoint layout so that a converted state dict maps one to one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..enums import OutputKey
from ..errors import UsageError
from ..pooling import check_fraction, top_t_pool

__all__ = [
    "PreActBasicBlock",
    "GlobalBackbone",
    "GlobalNetwork",
    "nearest_resize",
    "receptive_fields",
    "breast_cells",
    "PADDING_MODES",
]

PADDING_MODES = ("zeros", "replicate")


def nearest_resize(x: torch.Tensor, size: list[int]) -> torch.Tensor:
    """Nearest-neighbour resize of (B, C, h, w) maps to ``size`` with exact integer index arithmetic.

    Output pixel (i, j) takes input pixel (i * h // H, j * w // W). Unlike ``F.interpolate``, whose source
    index comes from a floating-point scale, this is exact for any size pair, so maps rendered at a stride
    are exactly the full-size maps subsampled (docs/model.md, "Outputs").
    """
    out_h, out_w = int(size[0]), int(size[1])
    in_h, in_w = x.shape[-2:]
    if (in_h, in_w) == (out_h, out_w):
        return x
    rows = torch.arange(out_h, device=x.device) * in_h // out_h
    cols = torch.arange(out_w, device=x.device) * in_w // out_w
    return x.index_select(-2, rows).index_select(-1, cols)


def breast_cells(image: torch.Tensor, size: list[int]) -> torch.Tensor:
    """(B, 1, h, w) float mask of the map cells that lie mostly (> 50 %) on the breast, for (B, 1, H, W) images.

    The breast is every pixel above the image's minimum: after the preprocessing the background and the window's
    padding are exactly the minimum (0 in the file, standardised). A map cell covers the input block
    ``[i * H // h, (i + 1) * H // h)`` (adaptive average pooling), as its nearest upsampling does.
    """
    foreground = (image > image.amin(dim=(-2, -1), keepdim=True)).to(image.dtype)
    return (F.adaptive_avg_pool2d(foreground, (int(size[0]), int(size[1]))) > 0.5).to(image.dtype)


class PreActBasicBlock(nn.Module):
    """Pre-activation basic block (He et al. 2016) as in GMIC: (B, C_in, H, W) -> (B, planes, H/s, W/s).

    bn1 -> relu -> conv1 (stride) -> bn2 -> relu -> conv2, plus a residual; the shortcut of a block with a
    ``downsample`` is a 1x1 convolution (no bias, no BN) applied to the *activated* input. No ReLU after the sum.
    """

    def __init__(
        self, in_planes: int, planes: int, stride: int = 1, downsample: bool = False, padding_mode: str = "zeros"
    ) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False, padding_mode=padding_mode)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False, padding_mode=padding_mode)
        # The 1x1 shortcut of stride s is applied as x[::s, ::s] followed by a stride-1 1x1 convolution (the same
        # numbers): torch 2.13's CPU backward of a strided 1x1 convolution in channels-last corrupts the heap for
        # inputs of 8 or fewer channels (narrow CPU presets train in channels-last).
        self.stride = int(stride)
        self.downsample = nn.Sequential(nn.Conv2d(in_planes, planes, 1, bias=False)) if downsample else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(x))
        if self.downsample is None:
            residual = x
        else:
            residual = self.downsample(out[..., :: self.stride, :: self.stride] if self.stride > 1 else out)
        out = self.conv1(out)
        out = F.relu(self.bn2(out))
        out = self.conv2(out)
        return out + residual


class GlobalBackbone(nn.Module):
    """GMIC's ResNet-22 (B, 1, H, W) -> dict of the three tapped feature maps.

    Returns ``{"layer3": (B, 4w, H/s0, W/s0) raw, "layer4": (B, 8w, H/2s0, W/2s0) raw, "final": (B, 16w, H/4s0,
    W/4s0) after final BN + ReLU}``. With the defaults (the paper's global module) w = 16 and the stride of
    ``layer3`` is s0 = 16: 184x120, 92x60 and 46x30 maps for a 2944x1920 input.

    Args:
        in_channels: image channels.
        width: planes of the first layer; the five layers have width x (1, 2, 4, 8, 16) planes.
        strides: stride of each of the five layers.
        blocks_per_layer: pre-activation blocks per layer (2 in GMIC's ResNet-22).
        stem_stride: stride of the 7x7 stem convolution (2).
        stem_pool: the stem's 3x3 max-pool of stride 2 (no padding).
        padding_mode: ``"zeros"`` (the paper) or ``"replicate"``, for every 3x3 and 7x7 convolution. After
            per-image standardisation the zero padding is brighter than the background, a frame that units next to
            the border can read image-wide statistics from; replication removes that frame.
        planes: explicit planes of the five layers (overrides ``width``); ``first_planes``: the stem's (default:
            the first layer's).

    The receptive field and the stride of each tap follow from ``stem_stride``, ``stem_pool``, ``strides`` and
    ``blocks_per_layer`` (see :func:`receptive_fields`): 211 / 435 / 883 px at strides 16 / 32 / 64 for the paper's
    setting.
    """

    def __init__(
        self,
        in_channels: int = 1,
        width: int = 16,
        strides: Sequence[int] = (1, 2, 2, 2, 2),
        blocks_per_layer: int = 2,
        stem_stride: int = 2,
        stem_pool: bool = True,
        padding_mode: str = "zeros",
        planes: Sequence[int] | None = None,
        first_planes: int | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("width", width), ("blocks_per_layer", blocks_per_layer), ("stem_stride", stem_stride)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{name} must be a positive int, got {value!r}")
        if padding_mode not in PADDING_MODES:
            raise UsageError(f"padding_mode must be one of {PADDING_MODES}, got {padding_mode!r}")
        planes = tuple(width * m for m in (1, 2, 4, 8, 16)) if planes is None else tuple(planes)
        if len(planes) != 5 or len(strides) != 5:
            raise UsageError(f"planes and strides must have 5 entries (five layers), got {planes}, {tuple(strides)}")
        first_planes = planes[0] if first_planes is None else first_planes
        self.first_conv = nn.Conv2d(
            in_channels, first_planes, 7, stride=stem_stride, padding=3, bias=False, padding_mode=padding_mode
        )
        self.first_pool = nn.MaxPool2d(3, stride=2, padding=0) if stem_pool else nn.Identity()
        layers = []
        in_planes = first_planes
        for p, s in zip(planes, strides):
            # GMIC gives the first block of every layer a 1x1 shortcut conv, even at stride 1 with equal width.
            blocks = [PreActBasicBlock(in_planes, p, stride=s, downsample=True, padding_mode=padding_mode)]
            blocks += [PreActBasicBlock(p, p, padding_mode=padding_mode) for _ in range(blocks_per_layer - 1)]
            layers.append(nn.Sequential(*blocks))
            in_planes = p
        self.layer_list = nn.ModuleList(layers)
        self.final_bn = nn.BatchNorm2d(in_planes)
        self.out_channels = tuple(planes[2:])
        self.tap_strides, self.receptive_fields = receptive_fields(stem_stride, stem_pool, strides, blocks_per_layer)

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


def receptive_fields(
    stem_stride: int = 2,
    stem_pool: bool = True,
    strides: Sequence[int] = (1, 2, 2, 2, 2),
    blocks_per_layer: int = 2,
) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Strides and receptive fields (input pixels, per side) of the backbone's three taps (layers 3, 4, 5).

    The receptive field grows by (k - 1) x (the input stride) with every k x k convolution or pooling; 1x1
    shortcuts add nothing. The paper's global module: strides (16, 32, 64), receptive fields (211, 435, 883).
    """
    field, jump = 7, int(stem_stride)
    if stem_pool:
        field, jump = field + 2 * jump, jump * 2
    taps_stride, taps_field = [], []
    for i, s in enumerate(strides):
        field += 2 * jump  # conv1 of the first block, at the input's stride
        jump *= int(s)
        field += 2 * jump + (blocks_per_layer - 1) * 4 * jump  # its conv2, then two 3x3 convs per further block
        if i >= 2:
            taps_stride.append(jump)
            taps_field.append(field)
    return tuple(taps_stride), tuple(taps_field)


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
        backbone: keyword arguments of :class:`GlobalBackbone` (width, strides, blocks_per_layer, stem_stride,
            stem_pool, padding_mode); the paper's ResNet-22 when empty.
        pool_in_breast: set every scale's map to 0 on cells that lie mostly outside the breast
            (:func:`breast_cells`) before pooling: lesions are in the breast, and the background and the window's
            padding then cannot carry the image's prediction. Off in the paper.

    Forward: image (B, 1, H, W) -> dict with (s0 = the backbone's ``layer3`` stride, 16 by default)
        ``saliency_scale0|1|2``: S_0 (B, 2, H/s0, W/s0), S_1 (B, 2, H/2s0, W/2s0), S_2 (B, 2, H/4s0, W/4s0);
        ``saliency_global``: S_g (B, 2, H/s0, W/s0);
        ``y_scales``: (B, 3, 2) per-scale top-t% pooled predictions; ``y_global``: y_g (B, 2), their mean;
        ``z_global``: z_g (B, 16 w), the spatial max of the last feature map (used by the fusion head).
    """

    def __init__(
        self,
        num_classes: int = 2,
        gammas: Sequence[float] = (0.2, 0.6, 0.2),
        t: float = 0.03,
        pool_after_upsampling: bool = False,
        in_channels: int = 1,
        backbone: Mapping[str, Any] | None = None,
        pool_in_breast: bool = False,
    ) -> None:
        super().__init__()
        if len(gammas) != 3 or any(g < 0 for g in gammas) or abs(sum(gammas) - 1.0) > 1e-6:
            raise UsageError(f"gammas must be three non-negative weights summing to 1, got {tuple(gammas)}")
        self.gammas = tuple(float(g) for g in gammas)
        self.t = check_fraction(t, "t")
        self.pool_after_upsampling = bool(pool_after_upsampling)
        self.num_classes = num_classes
        self.pool_in_breast = bool(pool_in_breast)
        self.downsampling_branch = GlobalBackbone(in_channels=in_channels, **dict(backbone or {}))
        c3, c4, c5 = self.downsampling_branch.out_channels
        self.postprocess_module = nn.Module()
        self.postprocess_module.gn_conv_1 = nn.Conv2d(c3, num_classes, 1, bias=False)
        self.postprocess_module.gn_conv_2 = nn.Conv2d(c4, num_classes, 1, bias=False)
        self.postprocess_module.gn_conv_last = nn.Conv2d(c5, num_classes, 1, bias=False)
        self.representation_size = c5

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        taps = self.downsampling_branch(x)
        pm = self.postprocess_module
        # probabilities in float32 (under bf16 autocast the logits are bf16): bf16 has no value between 0.996 and
        # 1, so a confident map would round to exactly 1.0, its top-t score too, and the BCE of a negative label
        # would hit its clamp (100) with a gradient of 1e12
        s0 = torch.sigmoid(pm.gn_conv_1(taps["layer3"]).float())
        s1 = torch.sigmoid(pm.gn_conv_2(taps["layer4"]).float())
        s2 = torch.sigmoid(pm.gn_conv_last(taps["final"]).float())
        if self.pool_in_breast:
            s0 = s0 * breast_cells(x, s0.shape[-2:]).to(s0.dtype)
            s1 = s1 * breast_cells(x, s1.shape[-2:]).to(s1.dtype)
            s2 = s2 * breast_cells(x, s2.shape[-2:]).to(s2.dtype)
        size = s0.shape[-2:]
        upsampled = [s0, nearest_resize(s1, size), nearest_resize(s2, size)]
        g0, g1, g2 = self.gammas
        saliency_global = g0 * upsampled[0] + g1 * upsampled[1] + g2 * upsampled[2]
        pooled_maps = upsampled if self.pool_after_upsampling else [s0, s1, s2]
        y_scales = torch.stack([top_t_pool(s, self.t) for s in pooled_maps], dim=1)
        z_global = taps["final"].amax(dim=(-2, -1))
        return {
            OutputKey.SALIENCY_SCALE0.value: s0,
            OutputKey.SALIENCY_SCALE1.value: s1,
            OutputKey.SALIENCY_SCALE2.value: s2,
            OutputKey.SALIENCY_GLOBAL.value: saliency_global,
            OutputKey.Y_SCALES.value: y_scales,
            OutputKey.Y_GLOBAL.value: y_scales.mean(dim=1),
            OutputKey.Z_GLOBAL.value: z_global,
        }
