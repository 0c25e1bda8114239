"""GLAM's settings record (scripts/networks/glam_settings.py) drives the constructor, the checkpoint's record and its
checks, and inference's settings: a setting is one field of GLAMSettings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from scripts.networks import GLAM, GLAM_DEFAULTS, GLAMSaliencyNet, GLAMSettings
from scripts.networks.glam_settings import CHOSEN, FROM_CHECKPOINT, setting, setting_specs
from scripts.networks.inference import CHECKPOINT_SETTINGS, INFERENCE_CHOSEN, checkpoint_settings, inference_settings
from scripts.networks.settings import (
    INFERENCE_CHOICES,
    SETTINGS_KEY,
    decode_settings,
    encode_settings,
    read_checkpoint_settings,
    validate_settings,
)
from scripts.networks.weights import load_weights

CONFIGS = Path(__file__).resolve().parents[2] / "bundle" / "configs"

#: a value other than the default for every setting, small enough for a CPU test (a new setting needs one here)
OTHER_VALUES = {
    "stage": "local",
    "patch_size": (64, 32),
    "num_patches_train": 3,
    "num_patches_eval": 2,
    "t_global": 0.05,
    "t_local": 0.3,
    "global_pool_after_upsampling": True,
    "gammas": (0.3, 0.4, 0.3),
    "gamma_c": 0.3,
    "aggregation": "concat",
    "local_depth": 18,
    "local_width": 8,
    "local_padding_mode": "replicate",
    "activation_checkpointing": True,
    "attention_hidden": 16,
    "joint_modules": False,
    "global_backbone": {"width": 4},
    "pool_in_breast": True,
    "image_size": (256, 192),
    "pixel_spacing": (0.1, 0.12),
}
#: a recorded (JSON) value each recorded setting's check refuses
BAD_RECORDED = {
    "patch_size": [64, 9000],
    "num_patches_train": 0,
    "num_patches_eval": 257,
    "t_global": 0,
    "t_local": 1.5,
    "global_pool_after_upsampling": "yes",
    "gammas": [0.5, 0.5],
    "gamma_c": -0.1,
    "aggregation": 3,
    "local_depth": 0,
    "local_width": 1.5,
    "local_padding_mode": "reflect",
    "attention_hidden": True,
    "joint_modules": 1,
    "global_backbone": [],
    "pool_in_breast": None,
    "image_size": 512,
    "pixel_spacing": [0.1, -0.1],
}
RECORDED = [name for name, spec in setting_specs().items() if spec.record]


def test_every_setting_is_a_field_with_a_test_value_and_glam_takes_exactly_the_fields():
    fields = [f.name for f in dataclasses.fields(GLAMSettings)]
    assert set(OTHER_VALUES) == set(fields) and fields == list(GLAM_DEFAULTS)
    assert all(OTHER_VALUES[name] != GLAM_DEFAULTS[name] for name in fields)
    assert set(BAD_RECORDED) == set(RECORDED)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['patch_sise'\]"):
        GLAM(patch_sise=64)
    with pytest.raises(TypeError, match="must be a GLAMSettings"):
        GLAM({"patch_size": 64})


def test_the_record_builds_the_network_and_is_what_its_checkpoint_records(tmp_path):
    settings = GLAMSettings(**OTHER_VALUES)
    torch.manual_seed(0)
    from_record = GLAM(settings)
    torch.manual_seed(0)
    from_keywords = GLAM(**OTHER_VALUES)
    state, other = from_record.state_dict(), from_keywords.state_dict()
    assert state.keys() == other.keys() and all(torch.equal(state[k], other[k]) for k in state)
    # each setting reached the network
    assert from_record.stage == "local" and from_record.patch_size == (64, 32) and from_record.gamma_c == 0.3
    assert (from_record.num_patches_train, from_record.num_patches_eval) == (3, 2)
    g = from_record.global_network
    assert (g.t, g.gammas, g.pool_after_upsampling, g.pool_in_breast) == (0.05, (0.3, 0.4, 0.3), True, True)
    assert from_record.local_network.dn_resnet.conv1.padding_mode == "replicate"
    assert from_record.fusion is None and from_record.stage_aggregation["joint"] == "concat"
    # the record a checkpoint carries: exactly the recorded fields, as JSON, and the bundle's version
    record = decode_settings(state[SETTINGS_KEY])
    assert set(record) == {*RECORDED, "bundle_version"} and record == from_record.settings
    assert record["patch_size"] == [64, 32] and record["pixel_spacing"] == [0.1, 0.12]
    assert record["gammas"] == [0.3, 0.4, 0.3] and record["global_backbone"] == {"width": 4}
    assert "stage" not in record and "activation_checkpointing" not in record
    # a replaced record builds another network; the defaults are the paper's
    assert GLAMSettings.of(settings, patch_size=128).patch_size == 128 and settings.patch_size == (64, 32)
    assert GLAMSettings().image_size == (2944, 1920) and GLAMSettings().local_width == 64


def test_each_recorded_setting_is_checked_when_a_record_is_read():
    good = GLAM(**{k: v for k, v in OTHER_VALUES.items() if k != "activation_checkpointing"}).settings
    assert validate_settings(dict(good)) == good
    for name, bad in BAD_RECORDED.items():
        with pytest.raises(ValueError, match=f"the settings record's {name} is "):
            decode_settings(encode_settings({**good, name: bad}))
    # the comparison skips exactly the record's inference choices
    assert set(INFERENCE_CHOICES) == {n for n, s in setting_specs().items() if s.record and not s.compared}
    assert set(INFERENCE_CHOICES) == {"num_patches_eval", "num_patches_train", "gamma_c", "t_global", "t_local",
                                      "global_pool_after_upsampling"}  # fmt: skip


def test_inference_rebuilds_every_recorded_setting_from_a_checkpoint(tmp_path):
    trained = GLAM(**OTHER_VALUES)
    path = tmp_path / "model.pt"
    torch.save(trained.state_dict(), path)
    assert read_checkpoint_settings(path) == trained.settings
    recorded = checkpoint_settings(path)
    assert set(recorded) == set(CHECKPOINT_SETTINGS)
    net = GLAMSaliencyNet(**inference_settings(recorded))
    load_weights(net, path)  # strictly: the same weights
    for name in CHECKPOINT_SETTINGS:
        assert net.settings[name] == trained.settings[name], name
    # every setting that shapes or picks the weights comes from the checkpoint; inference chooses M and gamma_c
    compared = {n for n, s in setting_specs().items() if s.record and s.compared}
    assert compared <= set(CHECKPOINT_SETTINGS)
    assert INFERENCE_CHOSEN == ("num_patches_eval", "gamma_c")
    assert (net.settings["num_patches_eval"], net.settings["gamma_c"]) == (1, 0.5)  # the record's defaults
    assert net.stage == "local"  # no joint modules: the authors' layout runs the local stage
    chosen = inference_settings(recorded, num_patches_eval="2", gamma_c="0.25", pool_in_breast="true")
    assert (chosen["num_patches_eval"], chosen["gamma_c"], chosen["pool_in_breast"]) == (2, 0.25, True)


def test_a_new_field_in_a_copy_of_the_record_reaches_the_constructor_the_checkpoint_and_the_specs(tmp_path):
    @dataclasses.dataclass(frozen=True)
    class Extended(GLAMSettings):
        # a setting that changes no weight, chosen at inference
        extra_gain: float = setting(1.0, float, lambda v: v > 0, "a positive number", compared=False, inference=CHOSEN)

    small = {k: OTHER_VALUES[k] for k in ("patch_size", "local_depth", "local_width", "global_backbone")}
    net = GLAM(Extended(extra_gain=2.5, **small), stage="global")
    assert net.settings["extra_gain"] == 2.5
    path = tmp_path / "extended.pt"
    torch.save(net.state_dict(), path)
    assert read_checkpoint_settings(path)["extra_gain"] == 2.5  # a later version's setting is kept when read
    # this version's comparison does not know it: a setting only the checkpoint records is named as differing
    with pytest.raises(ValueError, match=r"extra_gain: checkpoint 2.5, network \"\(not recorded\)\""):
        GLAM(**small).load_state_dict(torch.load(path, weights_only=True))
    specs = setting_specs(Extended)
    assert list(specs)[-1] == "extra_gain" and specs["extra_gain"].inference == CHOSEN
    assert setting_specs()["image_size"].inference == FROM_CHECKPOINT


def test_the_configs_build_the_record_from_their_ids():
    from monai.bundle import ConfigParser

    train = yaml.safe_load((CONFIGS / "train.yaml").read_text())
    named = {k: v for k, v in train["glam_settings"].items() if not k.startswith("_")}
    assert set(named) <= set(GLAM_DEFAULTS)
    assert all(value.startswith("@") and value[1:] in train for value in named.values())  # each an id of train.yaml
    assert set(train["network_def"]) == {"_target_", "settings", "stage"}
    inference = yaml.safe_load((CONFIGS / "inference.yaml").read_text())
    overridable = {k for k in inference["model_settings"] if not k.startswith("_")} - {"checkpoint", "stage"}
    assert overridable == set(CHECKPOINT_SETTINGS) | set(INFERENCE_CHOSEN)
    parser = ConfigParser()
    parser.read_config(str(CONFIGS / "train.yaml"))
    parser.update({"pool_in_breast": "true", "local_width": 16, "t_local": "0.3", "activation_checkpointing": "no"})
    parser.update({"local_padding_mode": "replicate"})
    record = parser.get_parsed_content("glam_settings")
    assert isinstance(record, GLAMSettings) and record.local_padding_mode == "replicate"
    assert (record.pool_in_breast, record.local_width, record.t_local, record.activation_checkpointing) == (
        True,
        16,
        0.3,
        False,
    )
    assert record.gammas == GLAM_DEFAULTS["gammas"]  # not named in train.yaml: the record's default
