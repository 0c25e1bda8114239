"""Configurable global backbone: receptive fields, breast-only pooling, narrow channels-last training."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from conftest import BUNDLE_ROOT

from glam_benchmark.baselines import CAM, GMIC
from scripts.networks import GLAM, GlobalBackbone, GlobalNetwork
from scripts.networks.global_network import PreActBasicBlock, breast_cells, receptive_fields

# the CPU benchmark's backbone: no stem max-pool, one block a layer (glam_benchmark/docs/results_findings.md)
SMALL_RF = {"stem_pool": False, "blocks_per_layer": 1}


def measured_receptive_field(backbone: GlobalBackbone, tap: str, size: int) -> int:
    """Rows of the input whose gradient reaches the centre unit of a tap (float64, all weights positive so that
    nothing cancels; the max-pool, whose gradient goes to one input of its window, swapped for an average pool of the
    same geometry)."""
    backbone = backbone.double().eval()
    if isinstance(backbone.first_pool, torch.nn.MaxPool2d):
        backbone.first_pool = torch.nn.AvgPool2d(3, stride=2, padding=0)
    with torch.no_grad():
        for p in backbone.parameters():
            p.copy_(p.abs() + 0.01)
    x = torch.zeros(1, 1, size, size, dtype=torch.float64, requires_grad=True)
    out = backbone(x)[tap]
    h, w = out.shape[-2:]
    out[0, :, h // 2, w // 2].sum().backward()
    rows = torch.nonzero(x.grad[0, 0].abs().sum(1) > 0)[:, 0]
    return int(rows.max() - rows.min() + 1)


@pytest.mark.parametrize(
    "settings",
    [{}, SMALL_RF, {"stem_stride": 1, "stem_pool": False}, {"strides": (1, 1, 2, 2, 2), "blocks_per_layer": 3}],
)
def test_receptive_fields_match_the_input_gradient(settings: dict) -> None:
    backbone = GlobalBackbone(width=2, **settings)
    strides, fields = backbone.tap_strides, backbone.receptive_fields
    size = 2 * max(fields) + 64
    for tap, field in zip(("layer3", "layer4", "final"), fields):
        assert measured_receptive_field(backbone, tap, size) == field
    assert receptive_fields() == ((16, 32, 64), (211, 435, 883))  # the paper's ResNet-22 (GMIC)
    x = torch.zeros(1, 1, 32 * strides[2], 16 * strides[2], dtype=torch.float64)
    taps = backbone.eval()(x)
    assert [tuple(taps[k].shape[-2:]) for k in ("layer3", "layer4", "final")] == [
        (32 * strides[2] // s, 16 * strides[2] // s) for s in strides
    ]


def test_width_and_default_layout() -> None:
    paper = GlobalBackbone()
    assert paper.out_channels == (64, 128, 256) and isinstance(paper.first_pool, torch.nn.MaxPool2d)
    narrow = GlobalBackbone(width=8, **SMALL_RF, padding_mode="replicate")
    assert narrow.out_channels == (32, 64, 128) and isinstance(narrow.first_pool, torch.nn.Identity)
    assert all(
        m.padding_mode == "replicate"
        for m in narrow.modules()
        if isinstance(m, torch.nn.Conv2d) and m.padding != (0, 0)
    )
    with pytest.raises(ValueError, match="padding_mode"):
        GlobalBackbone(padding_mode="reflect")
    with pytest.raises(ValueError, match="width"):
        GlobalBackbone(width=0)


def test_strided_shortcut_is_the_strided_1x1_convolution() -> None:
    torch.manual_seed(0)
    block = PreActBasicBlock(4, 8, stride=2, downsample=True).eval()
    x = torch.randn(2, 4, 23, 17)
    out = F.relu(block.bn1(x))
    reference = F.conv2d(out, block.downsample[0].weight, stride=2)
    residual = block(x) - block.conv2(F.relu(block.bn2(block.conv1(out))))
    torch.testing.assert_close(residual, reference, rtol=1e-5, atol=1e-6)


def test_narrow_backbone_trains_in_channels_last() -> None:
    # torch 2.13's CPU backward of a strided 1x1 conv in channels-last corrupts the heap for <= 8 input channels;
    # a crash would take the test process down, so the step runs in a child process
    code = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {str(BUNDLE_ROOT)!r})
        from scripts.networks import GlobalNetwork
        net = GlobalNetwork(backbone=dict(width=4, stem_pool=False, blocks_per_layer=1))
        net = net.to(memory_format=torch.channels_last)
        x = torch.randn(2, 1, 128, 96).contiguous(memory_format=torch.channels_last)
        for _ in range(2):
            net(x)["y_global"].sum().backward()
        print("trained")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "trained" in done.stdout, done.stderr[-2000:]


def test_breast_cells_and_pooling_in_the_breast() -> None:
    image = torch.full((2, 1, 64, 48), -1.0)
    image[0, :, :, :20] = 0.5  # breast on the left 20 columns
    image[1, :, 8:40, :] = 0.3  # rows 8..39
    cells = breast_cells(image, (8, 6))  # 8x8-pixel cells: a cell counts when more than half of it is breast
    expected = torch.zeros(2, 1, 8, 6)
    expected[0, :, :, :2] = 1  # columns 0..15 fully, 16..23 half: not more than half
    expected[1, :, 1:5, :] = 1
    torch.testing.assert_close(cells, expected)

    torch.manual_seed(0)
    net = GlobalNetwork(t=0.1, backbone={"width": 2, **SMALL_RF}, pool_in_breast=True).eval()
    out = net(image)
    for s in (out["saliency_scale0"], out["saliency_scale1"], out["saliency_scale2"]):
        inside = breast_cells(image, s.shape[-2:])
        assert (s * (1 - inside)).abs().max() == 0
    # y is the top-t pool of the masked maps: a background cell never sets it
    from scripts.pooling import top_t_pool

    y0 = top_t_pool(out["saliency_scale0"], 0.1)
    torch.testing.assert_close(out["y_scales"][:, 0], y0)


def test_models_share_the_backbone_settings() -> None:
    settings = {"width": 4, **SMALL_RF, "padding_mode": "replicate"}
    glam = GLAM(
        stage="joint", patch_size=32, local_depth=18, local_width=4, global_backbone=settings, pool_in_breast=True
    )
    cam = CAM(backbone=settings, pool_in_breast=True)
    gmic = GMIC(patch_size=32, num_patches=2, local_width=4, backbone=settings, pool_in_breast=True)
    x = torch.randn(2, 1, 128, 96)
    out = glam.eval()(x)
    assert out["saliency_global"].shape[-2:] == (16, 12)  # stride 8
    assert (
        out["z_global"].shape == (2, 64)
        and glam.fusion.linear.in_features == 64 + glam.local_network.representation_size
    )
    assert cam.eval()(x)["saliency_global"].shape[-2:] == (4, 3)  # stride 32
    assert gmic.eval()(x)["y_fusion"].shape == (2, 2)
