"""Test helpers: the GLAM authors' checkpoint layout (docs/model.md, "The reference-compatible preset and the
authors' checkpoints") built with random values, and an independent functional forward pass over those raw tensors
written from the paper and that description."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

GLOBAL = "global_network.downsampling_branch."
HEADS = "global_network.postprocess_module."
LOCAL = "detection_network.dn_resnet."


def _bn(sd: dict, prefix: str, n: int, g: torch.Generator) -> None:
    sd[prefix + "weight"] = torch.rand(n, generator=g) + 0.5
    sd[prefix + "bias"] = torch.randn(n, generator=g) * 0.1
    sd[prefix + "running_mean"] = torch.randn(n, generator=g) * 0.1
    sd[prefix + "running_var"] = torch.rand(n, generator=g) + 0.5
    sd[prefix + "num_batches_tracked"] = torch.tensor(1000)


def _conv(sd: dict, key: str, shape: tuple[int, ...], g: torch.Generator) -> None:
    fan_in = int(np.prod(shape[1:]))
    sd[key] = torch.randn(*shape, generator=g) * (2.0 / fan_in) ** 0.5


def authors_state_dict(seed: int = 0, joint: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}
    _conv(sd, GLOBAL + "first_conv.weight", (16, 1, 7, 7), g)
    in_planes = 16
    for i, planes in enumerate((16, 32, 64, 128, 256)):
        for j in range(2):
            p = f"{GLOBAL}layer_list.{i}.{j}."
            cin = in_planes if j == 0 else planes
            _bn(sd, p + "bn1.", cin, g)
            _conv(sd, p + "conv1.weight", (planes, cin, 3, 3), g)
            _bn(sd, p + "bn2.", planes, g)
            _conv(sd, p + "conv2.weight", (planes, planes, 3, 3), g)
            if j == 0:
                _conv(sd, p + "downsample.0.weight", (planes, cin, 1, 1), g)
        in_planes = planes
    _bn(sd, GLOBAL + "final_bn.", 256, g)
    _conv(sd, HEADS + "gn_conv_1.weight", (2, 64, 1, 1), g)
    _conv(sd, HEADS + "gn_conv_2.weight", (2, 128, 1, 1), g)
    _conv(sd, HEADS + "gn_conv_last.weight", (2, 256, 1, 1), g)
    _conv(sd, HEADS + "combine.weight", (2, 6, 1, 1), g)
    _conv(sd, LOCAL + "conv1.weight", (64, 3, 7, 7), g)
    _bn(sd, LOCAL + "bn1.", 64, g)
    in_planes = 64
    for layer, (planes, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3)), start=1):
        for j in range(blocks):
            p = f"{LOCAL}layer{layer}.{j}."
            cin = in_planes if j == 0 else planes
            _conv(sd, p + "conv1.weight", (planes, cin, 3, 3), g)
            _bn(sd, p + "bn1.", planes, g)
            _conv(sd, p + "conv2.weight", (planes, planes, 3, 3), g)
            _bn(sd, p + "bn2.", planes, g)
            if j == 0 and cin != planes:
                _conv(sd, p + "downsample.0.weight", (planes, cin, 1, 1), g)
                _bn(sd, p + "downsample.1.", planes, g)
        in_planes = planes
    _conv(sd, "detection_network.gn_conv_last.weight", (2, 512, 1, 1), g)
    if joint:
        _conv(sd, "mil.mil_attn_V.weight", (128, 512), g)
        _conv(sd, "mil.mil_attn_U.weight", (128, 512), g)
        _conv(sd, "mil.mil_attn_w.weight", (1, 128), g)
        _conv(sd, "mil.classifier_linear.weight", (2, 512), g)
        sd["mil.classifier_linear.bias"] = torch.zeros(2)
        _conv(sd, "fusion_dnn.weight", (2, 768), g)
        sd["fusion_dnn.bias"] = torch.zeros(2)
        _conv(sd, "shared_rep_filter.weight", (512, 512, 1, 1), g)
    return sd


def _bn_eval(x: torch.Tensor, sd: dict, prefix: str) -> torch.Tensor:
    return F.batch_norm(
        x, sd[prefix + "running_mean"], sd[prefix + "running_var"], sd[prefix + "weight"], sd[prefix + "bias"]
    )


def reference_global(sd: dict, image: torch.Tensor) -> dict[str, torch.Tensor]:
    """GMIC ResNet-22 (pre-activation) and the three heads, as docs/model.md describes them."""
    h = F.conv2d(image, sd[GLOBAL + "first_conv.weight"], stride=2, padding=3)
    h = F.max_pool2d(h, 3, stride=2, padding=0)
    taps = []
    for i, stride in enumerate((1, 2, 2, 2, 2)):
        for j in range(2):
            p = f"{GLOBAL}layer_list.{i}.{j}."
            act = F.relu(_bn_eval(h, sd, p + "bn1."))
            shortcut = F.conv2d(act, sd[p + "downsample.0.weight"], stride=stride) if j == 0 else h
            out = F.conv2d(act, sd[p + "conv1.weight"], stride=stride if j == 0 else 1, padding=1)
            out = F.conv2d(F.relu(_bn_eval(out, sd, p + "bn2.")), sd[p + "conv2.weight"], padding=1)
            h = out + shortcut
        taps.append(h)
    final = F.relu(_bn_eval(h, sd, GLOBAL + "final_bn."))
    s0 = torch.sigmoid(F.conv2d(taps[2], sd[HEADS + "gn_conv_1.weight"]))
    s1 = torch.sigmoid(F.conv2d(taps[3], sd[HEADS + "gn_conv_2.weight"]))
    s2 = torch.sigmoid(F.conv2d(final, sd[HEADS + "gn_conv_last.weight"]))
    return {"s0": s0, "s1": s1, "s2": s2, "final": final}


def reference_local(sd: dict, patches: torch.Tensor) -> torch.Tensor:
    """torchvision-style ResNet-34 with stride 1 in every layer, then the 1x1 head and sigmoid: (N, 2, p/4, p/4)."""
    x = patches.repeat(1, 3, 1, 1)
    x = F.relu(_bn_eval(F.conv2d(x, sd[LOCAL + "conv1.weight"], stride=2, padding=3), sd, LOCAL + "bn1."))
    x = F.max_pool2d(x, 3, stride=2, padding=1)
    for layer, blocks in enumerate((3, 4, 6, 3), start=1):
        for j in range(blocks):
            p = f"{LOCAL}layer{layer}.{j}."
            identity = x
            if p + "downsample.0.weight" in sd:
                identity = _bn_eval(F.conv2d(x, sd[p + "downsample.0.weight"]), sd, p + "downsample.1.")
            out = F.relu(_bn_eval(F.conv2d(x, sd[p + "conv1.weight"], padding=1), sd, p + "bn1."))
            out = _bn_eval(F.conv2d(out, sd[p + "conv2.weight"], padding=1), sd, p + "bn2.")
            x = F.relu(out + identity)
    return torch.sigmoid(F.conv2d(x, sd["detection_network.gn_conv_last.weight"]))
