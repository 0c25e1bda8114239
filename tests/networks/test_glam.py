"""The composed GLAM model: outputs per stage, shapes, maps, gradients, freezing, bad input."""

import pytest
import torch
from conftest import requires_cuda

from scripts.networks import GLAM
from scripts.patches import render_saliency, select_peak_centred_boxes, shift_patch_boxes

SMALL = {"patch_size": 64, "local_depth": 18, "local_width": 4, "num_patches_train": 3, "num_patches_eval": 2}


def small_glam(**kwargs) -> GLAM:
    torch.manual_seed(0)
    return GLAM(**{**SMALL, **kwargs})


def image(b=2, h=256, w=192, seed=0):
    return torch.randn(b, 1, h, w, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "stage,keys",
    [
        ("global", set()),
        ("local", {"patch_boxes", "patch_maps", "y_local", "saliency_local", "saliency"}),
        ("joint", {"patch_boxes", "patch_maps", "y_local", "saliency_local", "saliency", "attention", "y_fusion"}),
    ],
)
def test_outputs_per_stage(stage, keys):
    model = small_glam(stage=stage).eval()
    with torch.no_grad():
        out = model(image())
    base = {"y_global", "y_scales", "z_global", "saliency_global"} | {f"saliency_scale{i}" for i in range(3)}
    assert set(out) == base | keys
    assert out["y_global"].shape == (2, 2) and out["saliency_global"].shape == (2, 2, 16, 12)
    for k in ("y_global", "y_local", "y_fusion"):
        if k in out:
            assert ((out[k] >= 0) & (out[k] <= 1)).all()
    if stage != "global":
        assert out["patch_boxes"].shape == (2, 2, 4) and out["patch_boxes"].dtype == torch.long  # M = 2 in eval
        assert out["saliency"].shape == (2, 2, 64, 48) and out["saliency_local"].shape == (2, 2, 64, 48)
        assert out["patch_maps"].shape == (2, 2, 2, 16, 16)


def test_k_patches_in_training_m_in_eval():
    model = small_glam(stage="local")
    assert model.train().num_patches == 3 and model(image())["patch_boxes"].shape[1] == 3
    assert model.eval().num_patches == 2


def test_y_global_is_mean_of_scales_and_default_gammas():
    model = small_glam(stage="global").eval()
    with torch.no_grad():
        out = model(image())
    torch.testing.assert_close(out["y_global"], out["y_scales"].mean(1))
    s1 = out["saliency_scale1"].repeat_interleave(2, -2).repeat_interleave(2, -1)
    s2 = out["saliency_scale2"].repeat_interleave(4, -2).repeat_interleave(4, -1)
    torch.testing.assert_close(out["saliency_global"], 0.2 * out["saliency_scale0"] + 0.6 * s1 + 0.2 * s2)


def test_quarter_maps_are_the_full_maps_sampled_every_4_px_and_sc_is_sg_half_outside_patches():
    model = small_glam(stage="local").eval()
    x = image()
    with torch.no_grad():
        out = model(x)
    full = model.full_resolution(out, x.shape[-2:])
    assert full["S_c"].shape == (2, 2, 256, 192)
    torch.testing.assert_close(full["S_c"][..., ::4, ::4], out["saliency"], rtol=0, atol=0)
    torch.testing.assert_close(full["S_l"][..., ::4, ::4], out["saliency_local"], rtol=0, atol=0)
    inside = torch.zeros(2, 1, 256, 192, dtype=torch.bool)
    for b in range(2):
        for r, c, h, w in out["patch_boxes"][b].tolist():
            inside[b, :, r : r + h, c : c + w] = True
    s_g = full["S_g"]
    torch.testing.assert_close(full["S_c"][~inside.expand_as(s_g)], (s_g / 2)[~inside.expand_as(s_g)])
    assert (full["S_l"][~inside.expand_as(s_g)] == 0).all()


def test_render_overwrites_overlaps_in_order_and_handles_unaligned_boxes():
    s_g = torch.zeros(1, 2, 4, 4)
    maps = torch.stack([torch.full((2, 2, 2), 0.25), torch.full((2, 2, 2), 0.75)])[None]  # (1, K=2, 2, 2, 2)
    boxes = torch.tensor([[[1, 1, 8, 8], [5, 3, 8, 8]]])  # not aligned to the 4 px grid, overlapping
    full = render_saliency(s_g, maps, boxes, (16, 16), stride=1, gamma_c=0.0)["S_l"]
    expected = torch.zeros(1, 2, 16, 16)
    expected[..., 1:9, 1:9] = 0.25
    expected[..., 5:13, 3:11] = 0.75
    torch.testing.assert_close(full, expected)
    quarter = render_saliency(s_g, maps, boxes, (16, 16), stride=4, gamma_c=0.0)["S_l"]
    torch.testing.assert_close(quarter, full[..., ::4, ::4])


def test_gamma_c_weights_the_combination():
    s_g = torch.rand(1, 2, 4, 4)
    maps = torch.rand(1, 1, 2, 4, 4)
    boxes = torch.tensor([[[0, 0, 16, 16]]])
    out = render_saliency(s_g, maps, boxes, (16, 16), stride=1, gamma_c=0.3)
    torch.testing.assert_close(out["S_c"], 0.3 * out["S_g"] + 0.7 * out["S_l"])


@pytest.mark.parametrize("stage", ["global", "local", "joint"])
def test_gradients_reach_every_trainable_parameter_and_nothing_frozen(stage):
    model = small_glam(stage=stage).train()
    from scripts.losses import GLAMLoss

    out = model(image())
    GLAMLoss(stage=stage, lambda_sparsity=1e-3)(out, torch.tensor([[1.0, 0.0], [0.0, 1.0]])).backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert trainable == with_grad
    expected_prefixes = {
        "global": ("global_network.",),
        "local": ("local_network.",),
        "joint": ("global_network.", "local_network.", "attention.", "fusion."),
    }[stage]
    assert {n.split(".")[0] + "." for n in trainable} == set(expected_prefixes)


def test_frozen_global_module_keeps_its_batchnorm_statistics():
    model = small_glam(stage="local").train()
    before = {k: v.clone() for k, v in model.global_network.state_dict().items()}
    model(image())
    assert not model.global_network.training
    for k, v in model.global_network.state_dict().items():
        assert torch.equal(v, before[k]), k
    model.set_stage("joint").train()
    assert model.global_network.training


def test_random_patches_for_negatives_and_given_boxes():
    model = small_glam(stage="local").train()
    x = image()
    g = torch.Generator().manual_seed(3)
    out = model(x, random_patch_mask=torch.tensor([True, False]), generator=g)
    selected = model(x)["patch_boxes"]
    assert torch.equal(out["patch_boxes"][1], selected[1])  # positive image: Algorithm 1
    boxes = torch.tensor([[[0, 0, 64, 64]] * 3, [[10, 20, 64, 64]] * 3])
    given = model(x, patch_boxes=boxes)
    assert torch.equal(given["patch_boxes"], boxes)


def test_patch_shift_moves_algorithm_1_boxes_in_training_only():
    model = small_glam(stage="joint").train()
    x = image()
    selected = model(x)["patch_boxes"]
    shifted = model(x, patch_shift=8, generator=torch.Generator().manual_seed(0))["patch_boxes"]
    assert not torch.equal(shifted, selected)
    assert (shifted - selected)[..., :2].abs().max() <= 8 and torch.equal(shifted[..., 2:], selected[..., 2:])
    # the patches are cropped where the shifted boxes say, and S_l is drawn there
    out = model(x, patch_shift=8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out["patch_boxes"], shifted)
    with pytest.raises(ValueError, match="patch_shift is a training augmentation"):
        model.eval()(x, patch_shift=8)


def test_centre_patches_crops_the_peak_centred_boxes_in_training_only():
    model = small_glam(stage="local").train()
    x = image()
    out = model(x, centre_patches=True)
    s_g = out["saliency_global"]
    expected = select_peak_centred_boxes(s_g, list(x.shape[-2:]), list(model.patch_size), model.num_patches)
    assert torch.equal(out["patch_boxes"], expected)
    assert not torch.equal(expected, model(x)["patch_boxes"])  # not Algorithm 1's boxes on these maps
    # the local module sees the centred patches: the same maps as when the boxes are given
    assert torch.equal(model(x, patch_boxes=expected)["patch_maps"], out["patch_maps"])
    # then patch_shift moves them by the generator's offsets
    shifted = model(x, centre_patches=True, patch_shift=4, generator=torch.Generator().manual_seed(0))
    offsets = shift_patch_boxes(expected, list(x.shape[-2:]), 4, torch.Generator().manual_seed(0))
    assert torch.equal(shifted["patch_boxes"], offsets)
    with pytest.raises(ValueError, match="centre_patches is a training option"):
        model.eval()(x, centre_patches=True)


@pytest.mark.parametrize(
    "x,match",
    [
        (torch.randn(1, 256, 192), r"image must be \(B, 1, H, W\)"),
        (torch.randn(1, 3, 256, 192), "must have 1 channel"),
        (torch.randn(1, 1, 48, 192), "smaller than the 64x64 patch"),
        (torch.full((1, 1, 256, 192), float("nan")), "NaN or infinite"),
        (torch.full((1, 1, 256, 192), float("inf")), "NaN or infinite"),
    ],
)
def test_bad_images_raise_clear_errors(x, match):
    with pytest.raises(ValueError, match=match):
        small_glam(stage="local").eval()(x)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"t_global": 0.0}, "t must be in"),
        ({"t_local": 1.5}, "t_local must be in"),
        ({"num_patches_train": 0}, "num_patches_train must be a positive int"),
        ({"patch_size": 66}, "multiple of 4"),
        ({"stage": "both"}, "stage must be one of"),
        ({"gammas": (0.5, 0.5, 0.5)}, "gammas must be"),
        ({"gamma_c": 2.0}, "gamma_c must be in"),
        ({"aggregation": "max"}, "aggregation must be"),
        ({"local_depth": 50}, "depth must be one of"),
        ({"joint_modules": False}, "joint_modules=False"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GLAM(**{**SMALL, **kwargs})


def test_too_many_patches_for_the_image():
    model = small_glam(stage="local", num_patches_eval=13).eval()  # 256x192 holds 4x3 = 12 disjoint 64 px windows
    with pytest.raises(ValueError, match="num_patches=13 exceeds the 12 disjoint"):
        model(image())


def test_default_model_is_the_papers():
    model = GLAM()
    assert model.patch_size == (512, 512) and model.num_patches_train == 6 and model.num_patches_eval == 1
    assert model.global_network.t == 0.03 and model.concat_aggregation.t == 0.2
    assert model.global_network.gammas == (0.2, 0.6, 0.2) and model.gamma_c == 0.5
    assert len(model.local_network.dn_resnet.layer3) == 6 and model.local_network.dn_resnet.out_channels == 512


@pytest.mark.slow
def test_full_size_shapes():
    """2944x1920 input, M = 1: per-scale maps 184x120, 92x60, 46x30; z_g 256; A 2x128x128; S_c 736x480."""
    model = GLAM().eval()
    with torch.no_grad():
        g = model.global_network.downsampling_branch
        x = torch.randn(1, 1, 2944, 1920)
        h = g.first_pool(g.first_conv(x))
        assert h.shape == (1, 16, 735, 479)
        sizes = []
        for layer in g.layer_list:
            h = layer(h)
            sizes.append(tuple(h.shape[1:]))
        assert sizes == [(16, 735, 479), (32, 368, 240), (64, 184, 120), (128, 92, 60), (256, 46, 30)]
        out = model(x)
    assert out["saliency_scale0"].shape == (1, 2, 184, 120)
    assert out["saliency_scale1"].shape == (1, 2, 92, 60)
    assert out["saliency_scale2"].shape == (1, 2, 46, 30)
    assert out["saliency_global"].shape == (1, 2, 184, 120)
    assert out["z_global"].shape == (1, 256)
    assert out["patch_maps"].shape == (1, 1, 2, 128, 128)
    assert out["saliency"].shape == (1, 2, 736, 480) and out["saliency_local"].shape == (1, 2, 736, 480)
    r, c, ph, pw = out["patch_boxes"][0, 0].tolist()
    assert (ph, pw) == (512, 512) and r % 16 == 0 and c % 16 == 0


def test_probabilities_stay_float32_under_bf16_autocast():
    """Every probability a loss reads is float32 under bf16 autocast (bf16 rounds 0.9995 to 1.0, where the BCE of a
    negative label is clamped at 100 instead of 7.6): GLAM's and the baselines' maps and scores, and a fusion head
    made to output sigmoid(7.6) keeps that value and its loss."""
    import torch.nn.functional as F

    from glam_benchmark.baselines import CAM, GMIC, UNetSaliency
    from scripts.aggregation import FusionHead

    keys = ("y_global", "y_scales", "saliency_global", "saliency_scale0", "saliency_scale2", "patch_maps", "y_local")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        glam = small_glam(stage="joint").eval()(image())
        cam = CAM(t=0.25).eval()(image())
        gmic = GMIC(patch_size=64, num_patches=2, t_global=0.1, local_width=4, attention_hidden=8).eval()(image())
        unet = UNetSaliency(t=0.01, features=(4, 4, 8, 8, 8, 4)).eval()(image())
    assert {k: glam[k].dtype for k in (*keys, "y_fusion")} == dict.fromkeys((*keys, "y_fusion"), torch.float32)
    for out in (cam, gmic, unet):
        assert out["y_global"].dtype == out["saliency_global"].dtype == torch.float32
    assert gmic["y_local"].dtype == gmic["y_fusion"].dtype == torch.float32
    head = FusionHead(4, 4, 2)
    with torch.no_grad():
        head.linear.weight.zero_()
        head.linear.bias.fill_(7.6)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = head(torch.ones(1, 4), torch.ones(1, 4))
    assert y.dtype == torch.float32 and float(y.max()) < 1.0
    # log(1 + e^x) at the bf16 logit 7.59375 (the bias rounded to bf16): 7.5943, where the bf16 probability gave 100
    loss = F.binary_cross_entropy(y, torch.zeros_like(y))
    torch.testing.assert_close(loss, torch.tensor(7.5943), rtol=1e-4, atol=0)


@requires_cuda
def test_cuda_matches_cpu_in_float32():
    model = small_glam(stage="joint").eval()
    x = image()
    with torch.no_grad():
        cpu = model(x)
        gpu = model.to("cuda")(x.cuda())
    for key, value in cpu.items():
        torch.testing.assert_close(gpu[key].cpu().to(value.dtype), value, rtol=1e-4, atol=1e-4, msg=key)


def _trained_glam_and_lesion_images(n: int = 6) -> tuple[GLAM, torch.Tensor]:
    """The shipped model (trained: its S_g peaks on lesions) and ``n`` standardised synthetic 736x480 views with a
    conspicuous lesion, as it was trained on (glam_benchmark/configs/benchmark_cpu.yaml's lesions)."""
    from conftest import BUNDLE_ROOT, REPO_ROOT
    from monai.bundle import ConfigParser

    from glam_benchmark.synthetic import SyntheticConfig, SyntheticMammogramGenerator
    from scripts.networks.weights import load_weights
    from scripts.transforms import StandardizeImage

    parser = ConfigParser()
    recipe = REPO_ROOT / "glam_benchmark" / "configs" / "benchmark_cpu.yaml"
    parser.read_config([str(BUNDLE_ROOT / "configs" / "train.yaml"), str(recipe)])
    parser["stage"] = "joint"
    model = load_weights(parser.get_parsed_content("network_def"), BUNDLE_ROOT / "models" / "model.pt").eval()
    lesions = parser.get_parsed_content("benchmark_data")
    generator = SyntheticMammogramGenerator(SyntheticConfig(**{**vars(lesions), "lesion_prevalence": 1.0}), seed=11)
    views = [generator.generate(i, "L", "CC").image.astype("float32") for i in range(n)]
    return model, torch.stack([StandardizeImage()(torch.from_numpy(v)[None]) for v in views])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_bf16_autocast_matches_float32_on_a_trained_model(device):
    """bf16 against float32 where the comparison means something: a trained model on images with a lesion, so S_g
    has a real peak. S_g and the scores stay within bf16's rounding; Algorithm 1 may pick another window than float32
    only where the two are a tie within that rounding (float32's own score of bf16's window within 1 % of the best:
    with 0.7.0's model a neighbouring window of the peak, 1 of 6 images; with 0.9.0's a second salient region 136 px
    away, 1 of 6); given the same patches, S_c stays within 0.05, and so does S_l but at a few edge pixels: a trained
    local module's maps are steep (they reach 1.0), so bf16's rounding of a logit near 0 moves a pixel by up to 0.06
    (0.7.0's model: 0.058 at 0.02 % of S_l's pixels, mean 9e-5). (Random weights give a nearly flat S_g, where bf16
    picks windows anywhere.)"""
    model, x = _trained_glam_and_lesion_images()
    model, x = model.to(device), x.to(device)
    with torch.no_grad():
        fp32 = model(x)
        with torch.autocast(device, dtype=torch.bfloat16):
            bf16 = model.to(memory_format=torch.channels_last)(x)
            same_patches = model(x, patch_boxes=fp32["patch_boxes"])
    assert bf16["saliency"].dtype == torch.float32  # maps are rendered in float32
    for key in ("y_global", "y_fusion", "saliency_global"):
        assert torch.isfinite(bf16[key]).all()
        assert (bf16[key].float() - fp32[key]).abs().max() < 0.05, key
    # Algorithm 1's first window on each S_g, scored by float32's window averages (patches.select_map_windows)
    from scripts.patches import _class_agnostic_map, map_window_size, select_map_windows

    map_size = list(fp32["saliency_global"].shape[-2:])
    patch = [int(s) for s in fp32["patch_boxes"][0, 0, 2:]]
    window = map_window_size(patch, list(x.shape[-2:]), map_size)
    scores = torch.nn.functional.avg_pool2d(_class_agnostic_map(fp32["saliency_global"].float()), window, stride=1)
    for image, (c32, c16) in enumerate(
        zip(
            select_map_windows(fp32["saliency_global"].float(), window, 1)[:, 0],
            select_map_windows(bf16["saliency_global"].float(), window, 1)[:, 0],
        )
    ):
        best, taken = scores[image, 0, c32[0], c32[1]], scores[image, 0, c16[0], c16[1]]
        assert taken >= 0.99 * best, (image, c32.tolist(), c16.tolist(), float(best), float(taken))
    assert torch.equal(bf16["patch_boxes"][:, :, 2:], fp32["patch_boxes"][:, :, 2:])
    for key in ("saliency", "y_local"):
        assert (same_patches[key].float() - fp32[key]).abs().max() < 0.05, key
    local_error = (same_patches["saliency_local"].float() - fp32["saliency_local"]).abs()
    assert local_error.max() < 0.1 and (local_error > 0.02).float().mean() < 1e-3


@requires_cuda
def test_cuda_training_step_with_random_negatives():
    from scripts.losses import GLAMLoss

    model = small_glam(stage="local").cuda().train()
    g = torch.Generator(device="cuda").manual_seed(0)
    out = model(image().cuda(), random_patch_mask=torch.tensor([True, False], device="cuda"), generator=g)
    GLAMLoss("local")(out, torch.tensor([[0.0, 0.0], [1.0, 0.0]], device="cuda")).backward()
    assert all(p.grad is not None for p in model.local_network.parameters())


def test_activation_checkpointing_changes_memory_not_the_step():
    """One training step of the local module with and without activation checkpointing from the same weights and
    patches: the same outputs, gradients and batch-norm running statistics (the recomputation in backward must not
    update them a second time) and the same batch counters."""
    from scripts.networks.local_network import LocalNetwork

    torch.manual_seed(0)
    plain = LocalNetwork(depth=18, width=4).train()
    ckpt = LocalNetwork(depth=18, width=4, activation_checkpointing=True).train()
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(3, 1, 64, 64)
    outs = []
    for net in (plain, ckpt):
        out = net(x)
        (out["patch_maps"].square().sum() + out["patch_features"].sum()).backward()
        outs.append(out)
    torch.testing.assert_close(outs[1]["patch_maps"], outs[0]["patch_maps"], rtol=0, atol=0)
    for (name, p0), (_, p1) in zip(plain.named_parameters(), ckpt.named_parameters()):
        torch.testing.assert_close(p1.grad, p0.grad, rtol=1e-5, atol=1e-7, msg=name)
    for (name, b0), (_, b1) in zip(plain.named_buffers(), ckpt.named_buffers()):
        torch.testing.assert_close(b1, b0, rtol=0, atol=0, msg=name)
    assert any(name.endswith("num_batches_tracked") and int(b) == 1 for name, b in plain.named_buffers())
