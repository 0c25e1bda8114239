"""Converting the authors' checkpoints: every tensor lands in exactly one place, mismatches fail loudly, and
the converted model reproduces an independent functional forward pass over the authors' raw tensors."""

import numpy as np
import pytest
import torch
from convert_nyukat_checkpoint import convert_nyukat_state_dict, load_nyukat_glam
from nyukat_layout import authors_state_dict, reference_global, reference_local
from references import loop_algorithm_1, numpy_top_t

from scripts.networks import GLAM
from scripts.networks.settings import SETTINGS_KEY, decode_settings


@pytest.fixture(scope="module")
def authors_sd():
    return authors_state_dict(seed=0)


def test_authors_layout_size_matches_the_spec(authors_sd):
    assert len(authors_sd) == 352
    assert sum(v.numel() for v in authors_sd.values()) == 24_107_221


def test_our_inference_layout_is_the_authors_without_the_unused_combine_conv():
    sd = GLAM.reference().state_dict()
    assert decode_settings(sd.pop(SETTINGS_KEY))["patch_size"] == [512, 512]  # the settings record, not a weight
    assert len(sd) == 351
    assert sum(v.numel() for v in sd.values()) == 24_107_221 - 2 * 6


def test_every_tensor_lands_in_exactly_one_place(authors_sd):
    model = load_nyukat_glam(authors_sd)
    report = model.conversion_report
    assert report.dropped == ["global_network.postprocess_module.combine.weight"]
    assert not report.unfitted
    targets = list(report.mapped.values())
    assert len(targets) == len(set(targets)) == 351
    model_sd = model.state_dict()
    assert set(targets) == set(model_sd) - {SETTINGS_KEY}
    for src, dst in report.mapped.items():
        assert torch.equal(model_sd[dst], authors_sd[src]), (src, dst)
    # values, not only names: every model tensor equals exactly the one source tensor mapped to it and no other
    # source tensor of the same shape (random values make accidental equality impossible)
    by_shape: dict[tuple, list[str]] = {}
    for src, v in authors_sd.items():
        if v.dtype.is_floating_point:
            by_shape.setdefault(tuple(v.shape), []).append(src)
    for dst, value in model_sd.items():
        if not value.dtype.is_floating_point:
            continue
        equal = [src for src in by_shape[tuple(value.shape)] if torch.equal(authors_sd[src], value)]
        assert len(equal) == 1 and report.mapped[equal[0]] == dst


def test_joint_checkpoint_maps_attention_and_fusion_and_reports_the_rest():
    sd = authors_state_dict(seed=1, joint=True)
    model = load_nyukat_glam(sd)
    report = model.conversion_report
    assert report.has_joint_modules
    assert torch.equal(model.attention.attn_v.weight, sd["mil.mil_attn_V.weight"])
    assert torch.equal(model.attention.attn_u.weight, sd["mil.mil_attn_U.weight"])
    assert torch.equal(model.attention.attn_w.weight, sd["mil.mil_attn_w.weight"])
    assert torch.equal(model.fusion.linear.weight, sd["fusion_dnn.weight"])
    assert torch.equal(model.fusion.linear.bias, sd["fusion_dnn.bias"])
    assert set(report.dropped) == {
        "global_network.postprocess_module.combine.weight",
        "mil.classifier_linear.weight",
        "mil.classifier_linear.bias",
        "shared_rep_filter.weight",
    }


def test_joint_tensors_of_another_shape_are_reported_not_loaded():
    sd = authors_state_dict(seed=2, joint=True)
    sd["fusion_dnn.weight"] = torch.zeros(2, 1024)
    model = load_nyukat_glam(sd)
    report = model.conversion_report
    assert "fusion_dnn.weight" in report.unfitted and "(2, 1024)" in report.unfitted["fusion_dnn.weight"]
    assert not report.has_joint_modules and model.fusion is None and model.attention is None
    assert "not mapped: fusion_dnn.weight" in report.summary()


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda sd: sd.pop("detection_network.dn_resnet.layer3.2.bn1.running_var"), "missing key for 'local_network"),
        (lambda sd: sd.__setitem__("global_network.extra_head.weight", torch.zeros(1)), "unexpected key"),
        (
            lambda sd: sd.__setitem__("detection_network.gn_conv_last.weight", torch.zeros(3, 512, 1, 1)),
            r"detection_network.gn_conv_last.weight.*\(3, 512, 1, 1\)",
        ),
    ],
)
def test_bad_checkpoints_fail_loudly_naming_the_key(mutate, match):
    sd = authors_state_dict(seed=3)
    mutate(sd)
    with pytest.raises(ValueError, match=match):
        convert_nyukat_state_dict(sd)


def test_dataparallel_prefix_is_accepted():
    sd = {"module." + k: v for k, v in authors_state_dict(seed=4).items()}
    converted, report = convert_nyukat_state_dict(sd)
    assert len(converted) == 351 + 1 and len(report.mapped) == 351  # + the reference settings record
    settings = decode_settings(converted[SETTINGS_KEY])
    assert settings["aggregation"] == "concat" and settings["t_local"] == 0.3 and settings["joint_modules"] is False


def test_converted_model_reproduces_the_authors_forward_pass():
    """y_global, the selected patch and S_c (sampled every 4 px) against a functional forward written from the
    spec over the raw authors' tensors (t_g = 3% after upsampling, t_l = 30%, M = 1, S_c = (S_g + S_l) / 2).
    A 128 px patch keeps the ResNet-34-HR cheap; the layout is the full one."""
    sd = authors_state_dict(seed=5)
    model = load_nyukat_glam(sd, patch_size=128)
    image = torch.randn(2, 1, 512, 320, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(image)
        ref = reference_global(sd, image)
    s0, s1, s2 = ref["s0"], ref["s1"], ref["s2"]
    assert s0.shape[-2:] == (32, 20)

    def up(s):
        return s.repeat_interleave(32 // s.shape[-2], -2).repeat_interleave(20 // s.shape[-1], -1)

    s_g = 0.2 * s0 + 0.6 * up(s1) + 0.2 * up(s2)
    y_g = np.mean([numpy_top_t(up(s).numpy(), 0.03) for s in (s0, s1, s2)], axis=0)
    np.testing.assert_allclose(out["y_global"].numpy(), y_g, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["saliency_global"], s_g, rtol=1e-5, atol=1e-6)

    corners = loop_algorithm_1(s_g.numpy(), (8, 8), 1)
    expected_boxes = [[[r * 16, c * 16, 128, 128] for r, c in sample] for sample in corners]
    assert out["patch_boxes"].tolist() == expected_boxes

    s_c_full = torch.zeros(2, 2, 512, 320)
    for b, [[r, c, _, _]] in enumerate(expected_boxes):
        a = reference_local(sd, image[b : b + 1, :, r : r + 128, c : c + 128])
        np.testing.assert_allclose(out["y_local"][b].numpy(), numpy_top_t(a.numpy(), 0.3)[0], rtol=1e-5, atol=1e-6)
        s_c_full[b, :, r : r + 128, c : c + 128] = a[0].repeat_interleave(4, -2).repeat_interleave(4, -1)
    s_c_full = (s_g.repeat_interleave(16, -2).repeat_interleave(16, -1) + s_c_full) / 2
    torch.testing.assert_close(out["saliency"], s_c_full[..., ::4, ::4], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.full_resolution(out, (512, 320))["S_c"], s_c_full, rtol=1e-5, atol=1e-5)
