"""The global module f_g of GLAM: GMIC's pre-activation "ResNet-22" with three saliency heads; module names follow
the authors' checkpoint layout."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..enums import OutputKey
from ..errors import UsageError
from ..pooling import check_fraction, top_t_pool

PADDING_MODES = ("zeros", "replicate")


def nearest_resize(x: torch.Tensor, size: list[int]) -> torch.Tensor:
    """Nearest-neighbour resize of (B, C, h, w) maps to ``size``: pixel (i, j) takes (i * h // H, j * w // W).

    Exact integer indices, unlike ``F.interpolate``, so maps rendered at a stride are the full-size maps subsampled.
    """
    out_h, out_w = int(size[0]), int(size[1])
    in_h, in_w = x.shape[-2:]
    if (in_h, in_w) == (out_h, out_w):
        return x
    rows = torch.arange(out_h, device=x.device) * in_h // out_h
    cols = torch.arange(out_w, device=x.device) * in_w // out_w
    return x.index_select(-2, rows).index_select(-1, cols)


def breast_cells(image: torch.Tensor, size: list[int]) -> torch.Tensor:
    """(B, 1, h, w) float mask of the map cells mostly (> 50 %) on the breast of (B, 1, H, W) images.

    The breast is every pixel above the image's minimum, which the preprocessing gives background and padding.
    """
    foreground = (image > image.amin(dim=(-2, -1), keepdim=True)).to(image.dtype)
    return (F.adaptive_avg_pool2d(foreground, (int(size[0]), int(size[1]))) > 0.5).to(image.dtype)


class PreActBasicBlock(nn.Module):
    """Pre-activation basic block as in GMIC: (B, in_planes, H, W) -> (B, planes, H/stride, W/stride).

    The ``downsample`` shortcut is a 1x1 convolution of the activated input; no ReLU after the sum.
    """

    def __init__(
        self, in_planes: int, planes: int, stride: int = 1, downsample: bool = False, padding_mode: str = "zeros"
    ) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False, padding_mode=padding_mode)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False, padding_mode=padding_mode)
        # x[::s, ::s] then a stride-1 1x1 conv (the same numbers): torch's CPU backward of a strided 1x1 conv in
        # channels-last corrupts the heap for inputs of 8 or fewer channels
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
    """GMIC's ResNet-22: (B, 1, H, W) -> ``{"layer3": (B, 4w, H/s, W/s), "layer4": (B, 8w, H/2s, W/2s), "final":
    (B, 16w, H/4s, W/4s)}``, the last after BN + ReLU (s = 16 by default).

    Args:
        in_channels: image channels.
        width: planes of the first layer; the five layers have width x (1, 2, 4, 8, 16) planes.
        strides: stride of each of the five layers.
        blocks_per_layer: pre-activation blocks per layer (2 in GMIC's ResNet-22).
        stem_stride: stride of the 7x7 stem convolution (2).
        stem_pool: the stem's 3x3 max-pool of stride 2 (no padding).
        padding_mode: ``"zeros"`` (the paper) or ``"replicate"`` (no bright frame after standardisation).
        planes: explicit planes of the five layers (overrides ``width``).
        first_planes: the stem's planes (default: the first layer's).
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
            # GMIC gives the first block of every layer a 1x1 shortcut, even at stride 1 with equal width
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
    """Strides and receptive fields (input pixels) of the backbone's three taps."""
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
    """GLAM's global module: (B, 1, H, W) -> S_0, S_1, S_2 (B, 2) at strides 16, 32, 64, S_g (B, 2, H/16, W/16),
    ``y_scales`` (B, 3, 2), y_g (B, 2) and z_g (B, 16 w).

    Args:
        num_classes: saliency channels (benign, malignant).
        gammas: weights of S_0, S_1, S_2 in S_g.
        t: top-t% pooling fraction of the per-scale predictions.
        pool_after_upsampling: pool every scale after upsampling it to S_0's size (the authors' code).
        in_channels: image channels.
        backbone: keyword arguments of :class:`GlobalBackbone`.
        pool_in_breast: zero the map cells mostly outside the breast before pooling, so that the background cannot
            carry the prediction.
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
        # float32 probabilities: under bf16 autocast a confident map would round to 1.0 and the BCE would explode
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
