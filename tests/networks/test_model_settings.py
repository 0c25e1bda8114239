"""A GLAM state dict records the settings the network was built with: a checkpoint of other settings is refused
with them named; inference choices (M, gamma_c, K) may differ; checkpoints without the record load as before."""

import pytest
import torch

from scripts.networks import GLAM, GLAMSaliencyNet
from scripts.networks.settings import SETTINGS_KEY, decode_settings, encode_settings, settings_differences

TINY = dict(patch_size=64, local_depth=18, local_width=4, global_backbone={"width": 4})


def test_the_state_dict_records_the_constructor_settings():
    net = GLAM(t_global=0.05, gammas=(0.3, 0.4, 0.3), pool_in_breast=True, num_patches_eval=2, **TINY)
    recorded = decode_settings(net.state_dict()[SETTINGS_KEY])
    assert recorded == {
        "patch_size": [64, 64],
        "num_patches_train": 6,
        "num_patches_eval": 2,
        "t_global": 0.05,
        "t_local": 0.2,
        "global_pool_after_upsampling": False,
        "gammas": [0.3, 0.4, 0.3],
        "gamma_c": 0.5,
        "aggregation": None,
        "local_depth": 18,
        "local_width": 4,
        "attention_hidden": 128,
        "joint_modules": True,
        "global_backbone": {"width": 4},
        "pool_in_breast": True,
    }
    # the stage is not a setting: one checkpoint serves the next stage and inference
    other_stage = GLAMSaliencyNet(stage="local", t_global=0.05, gammas=(0.3, 0.4, 0.3), pool_in_breast=True, **TINY)
    other_stage.load_state_dict(net.state_dict(), strict=True)


def test_other_settings_are_refused_by_name():
    saved = GLAM(**TINY).state_dict()
    with pytest.raises(
        ValueError,
        match=r"patch_size: checkpoint \[64, 64\], network \[32, 32\].*t_global: checkpoint 0.03, network 0.1",
    ):
        GLAM(**{**TINY, "patch_size": 32, "t_global": 0.1}).load_state_dict(saved)
    with pytest.raises(
        ValueError,
        match=r"global_backbone: checkpoint \{\"width\": 4\}, network \{\"padding_mode\": \"replicate\", \"wid",
    ):
        GLAM(**{**TINY, "global_backbone": {"width": 4, "padding_mode": "replicate"}}).load_state_dict(saved)


def test_inference_choices_may_differ_and_old_checkpoints_load():
    torch.manual_seed(0)
    saved = GLAM(**TINY).state_dict()
    other = GLAM(**{**TINY, "num_patches_eval": 3, "num_patches_train": 2, "gamma_c": 0.7})
    other.load_state_dict(saved, strict=True)
    assert decode_settings(other.state_dict()[SETTINGS_KEY])["gamma_c"] == 0.7  # the network keeps its own record
    torch.testing.assert_close(other.state_dict()["fusion.linear.weight"], saved["fusion.linear.weight"])
    legacy = {k: v for k, v in saved.items() if k != SETTINGS_KEY}
    GLAM(**{**TINY, "t_global": 0.1}).load_state_dict(legacy, strict=True)  # no record: nothing to compare


def test_settings_records_compare_by_value():
    a = {"gammas": (0.2, 0.6, 0.2), "global_backbone": {"width": 4, "stem_pool": False}, "gamma_c": 0.5}
    b = {"gammas": [0.2, 0.6, 0.2], "global_backbone": {"stem_pool": False, "width": 4}, "gamma_c": 0.9}
    assert torch.equal(encode_settings({**a, "gamma_c": 0.9}), encode_settings(b))
    assert settings_differences(a, b) == []  # gamma_c is an inference choice
    assert settings_differences({"t_global": 0.03}, {}) == ['t_global: checkpoint 0.03, network "(not recorded)"']
    with pytest.raises(ValueError, match="not a settings record"):
        decode_settings(torch.tensor([255, 0, 1], dtype=torch.uint8))
