"""A GLAM state dict records the settings the network was built with: a checkpoint of other settings is refused
with them named; inference choices (M, gamma_c, K, the score pooling) may differ; checkpoints without the record load
as before."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import workflow_command
from references import numpy_top_t

from scripts.bundle_info import bundle_version
from scripts.networks import GLAM, GLAM_DEFAULTS, GLAMSaliencyNet, checkpoint_setting, read_checkpoint_settings
from scripts.networks.settings import (
    SETTINGS_KEY,
    decode_settings,
    encode_settings,
    settings_differences,
)
from scripts.transforms.mammo import as_pixel_spacing

BUNDLE = Path(__file__).resolve().parents[2] / "bundle"

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
        "local_padding_mode": "zeros",
        "attention_hidden": 128,
        "joint_modules": True,
        "global_backbone": {"width": 4},
        "pool_in_breast": True,
        "image_size": [2944, 1920],
        "pixel_spacing": None,
        "bundle_version": json.loads((BUNDLE / "configs" / "metadata.json").read_text())["version"],
    }
    # the stage is not a setting: one checkpoint serves the next stage and inference
    other_stage = GLAMSaliencyNet(stage="local", t_global=0.05, gammas=(0.3, 0.4, 0.3), pool_in_breast=True, **TINY)
    other_stage.load_state_dict(net.state_dict(), strict=True)


def test_other_settings_are_refused_by_name():
    saved = GLAM(**TINY).state_dict()
    with pytest.raises(
        ValueError,
        match=r"patch_size: checkpoint \[64, 64\], network \[32, 32\].*pool_in_breast: checkpoint false, network true",
    ):
        GLAM(**{**TINY, "patch_size": 32, "pool_in_breast": True}).load_state_dict(saved)
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


def test_score_pooling_is_an_inference_choice_and_changes_the_scores_as_pooling_predicts():
    """t_global, t_local and global_pool_after_upsampling change no weight: a checkpoint loads into a network built
    with other values, its maps and patches stay the same, and its scores are the new top-t% pooling of those maps
    (computed here independently, by sorting)."""
    torch.manual_seed(0)
    trained = GLAMSaliencyNet(stage="local", **TINY).eval()
    chosen = GLAMSaliencyNet(stage="local", t_global=0.25, t_local=0.5, global_pool_after_upsampling=True, **TINY)
    chosen.load_state_dict(trained.state_dict(), strict=True)
    assert settings_differences(trained.settings, chosen.settings) == []
    x = torch.randn(2, 1, 256, 192, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        before, after = trained.eval().forward_all(x), chosen.eval().forward_all(x)
    for key in ("saliency_global", "saliency_scale0", "saliency_scale2", "patch_boxes", "patch_maps", "saliency"):
        assert torch.equal(before[key], after[key]), key
    # y_scales: every scale nearest-upsampled to S_0's size (pooling after upsampling), then its top 25%
    s0 = after["saliency_scale0"]
    scales = [s0] + [
        after[f"saliency_scale{i}"].repeat_interleave(2**i, -2).repeat_interleave(2**i, -1) for i in (1, 2)
    ]
    assert all(s.shape == s0.shape for s in scales)
    expected_scales = np.stack([numpy_top_t(s.numpy(), 0.25) for s in scales], axis=1)  # (B, 3, C)
    np.testing.assert_allclose(after["y_scales"].numpy(), expected_scales, rtol=1e-6)
    np.testing.assert_allclose(after["y_global"].numpy(), expected_scales.mean(axis=1), rtol=1e-6)
    # y_local: the K patch maps of a class side by side (concatenation), their top 50%
    maps = after["patch_maps"].numpy()  # (B, K, C, h, w)
    side_by_side = np.concatenate(list(maps.transpose(1, 0, 2, 3, 4)), axis=-1)  # (B, C, h, K w)
    np.testing.assert_allclose(after["y_local"].numpy(), numpy_top_t(side_by_side, 0.5), rtol=1e-6)
    assert not torch.allclose(before["y_global"], after["y_global"])  # the choice did change the scores
    assert not torch.allclose(before["y_local"], after["y_local"])


def test_settings_records_compare_by_value():
    a = {"gammas": (0.2, 0.6, 0.2), "global_backbone": {"width": 4, "stem_pool": False}, "gamma_c": 0.5}
    b = {"gammas": [0.2, 0.6, 0.2], "global_backbone": {"stem_pool": False, "width": 4}, "gamma_c": 0.9}
    assert torch.equal(encode_settings({**a, "gamma_c": 0.9}), encode_settings(b))
    assert settings_differences(a, b) == []  # gamma_c is an inference choice
    assert settings_differences({"local_width": 4}, {}) == ['local_width: checkpoint 4, network "(not recorded)"']
    assert settings_differences({"t_global": 0.03, "t_local": 0.2}, {}) == []  # score pooling: inference choices
    # a setting the checkpoint predates is not compared; the bundle version is information only
    assert settings_differences({}, {"pixel_spacing": [0.4, 0.4]}) == []
    assert settings_differences({"bundle_version": "0.1.0"}, {"bundle_version": "0.9.0"}) == []
    with pytest.raises(ValueError, match="not a settings record"):
        decode_settings(torch.tensor([255, 0, 1], dtype=torch.uint8))


def test_window_and_spacing_are_settings():
    net = GLAM(image_size=[736, 480], pixel_spacing=0.4, **TINY)
    recorded = decode_settings(net.state_dict()[SETTINGS_KEY])
    assert recorded["image_size"] == [736, 480] and recorded["pixel_spacing"] == [0.4, 0.4]
    with pytest.raises(ValueError, match=r"image_size: checkpoint \[736, 480\], network \[368, 240\]"):
        GLAM(image_size=(368, 240), pixel_spacing=0.4, **TINY).load_state_dict(net.state_dict())
    with pytest.raises(ValueError, match=r"pixel_spacing: checkpoint \[0.4, 0.4\], network \[0.8, 0.4\]"):
        GLAM(image_size=(736, 480), pixel_spacing=(0.8, 0.4), **TINY).load_state_dict(net.state_dict())
    assert as_pixel_spacing(0.5) == (0.5, 0.5) and as_pixel_spacing([0.1, 0.2]) == (0.1, 0.2)
    for bad in (0, -1.0, [0.1], "x", [0.1, float("nan")], True):
        with pytest.raises(ValueError, match="pixel_spacing"):
            as_pixel_spacing(bad)


def test_the_bundle_version_is_recorded_and_never_compared():
    assert bundle_version() == json.loads((BUNDLE / "configs" / "metadata.json").read_text())["version"]
    state = GLAM(**TINY).state_dict()
    state[SETTINGS_KEY] = encode_settings({**decode_settings(state[SETTINGS_KEY]), "bundle_version": "0.0.1"})
    GLAM(**TINY).load_state_dict(state, strict=True)


def test_checkpoint_settings_are_read_back(tmp_path):
    path = tmp_path / "model.pt"
    assert read_checkpoint_settings(path) is None  # no file: GLAM's defaults, the paper's values
    assert checkpoint_setting(path, "patch_size") == 512 and checkpoint_setting(path, "image_size") == (2944, 1920)
    assert checkpoint_setting(path, "patch_size", 256) == 256
    torch.save(GLAM(image_size=(368, 240), pixel_spacing=0.8, **TINY).state_dict(), path)
    assert checkpoint_setting(path, "patch_size") == [64, 64]
    assert checkpoint_setting(path, "image_size") == [368, 240]
    assert checkpoint_setting(path, "pixel_spacing") == [0.8, 0.8]
    assert checkpoint_setting(path, "global_backbone") == {"width": 4}
    # a new file at the same path is read again (the cache is keyed by the file's time and size)
    torch.save(GLAM(image_size=(736, 480), **{**TINY, "patch_size": 128}).state_dict(), path)
    os.utime(path, ns=(1, 1))
    assert checkpoint_setting(path, "image_size") == [736, 480] and checkpoint_setting(path, "patch_size") == [128, 128]
    legacy = tmp_path / "legacy.pt"
    torch.save({k: v for k, v in GLAM(**TINY).state_dict().items() if k != SETTINGS_KEY}, legacy)
    assert read_checkpoint_settings(legacy) is None and checkpoint_setting(legacy, "local_width") == 64
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="broken.pt"):
        checkpoint_setting(broken, "patch_size")
    with pytest.raises(KeyError, match="no_such_setting"):
        checkpoint_setting(legacy, "no_such_setting")


def test_checkpoint_setting_refuses_a_name_glam_does_not_take(tmp_path):
    """Without a record, the fallback is GLAM's own default (GLAM_DEFAULTS, read from its signature); a name that is
    no GLAM argument has none."""
    path = tmp_path / "absent.pt"
    assert GLAM_DEFAULTS["t_local"] == 0.2 and GLAM_DEFAULTS["num_patches_train"] == 6
    assert checkpoint_setting(path, "t_local") == 0.2
    with pytest.raises(KeyError, match="'patch_sise' is not a GLAM setting"):
        checkpoint_setting(path, "patch_sise")


def _with_record(tmp_path, name: str, text: str) -> Path:
    """A tiny GLAM checkpoint whose settings record is ``text`` (JSON, written as the network writes its own)."""
    state = GLAM(**TINY).state_dict()
    state[SETTINGS_KEY] = torch.tensor(list(text.encode("utf-8")), dtype=torch.uint8)
    path = tmp_path / name
    torch.save(state, path)
    return path


def _record(**changes) -> str:
    record = decode_settings(GLAM(**TINY).state_dict()[SETTINGS_KEY])
    record.update(changes)
    return json.dumps(record)  # allow_nan: NaN is written as the token NaN, which json.loads reads back


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (_record(t_global=float("nan")), "the settings record's t_global is not a finite number (NaN or infinite)"),
        (
            _record(global_backbone={"width": float("inf")}),
            "the settings record's global_backbone.width is not a finite number",
        ),
        ("[1, 2, 3]", "the settings record is a list, not a mapping of settings"),
        (
            _record(image_size=[40000, 40000]),
            "the settings record's image_size is [40000, 40000]; it must be [rows, cols], integers in 1..8192",
        ),
        (_record(patch_size=[0, 64]), "the settings record's patch_size is [0, 64]"),
        (_record(pixel_spacing=[0.4, -1]), "the settings record's pixel_spacing is [0.4, -1]"),
        (_record(num_patches_eval=10**9), "the settings record's num_patches_eval is 1000000000"),
        (_record(joint_modules="yes"), 'the settings record\'s joint_modules is "yes"; it must be true or false'),
    ],
)
def test_a_settings_record_is_validated_when_read(tmp_path, text, expected):
    """Each bad record is one line naming the checkpoint file, from every way in: the inference config's
    checkpoint_settings (read_checkpoint_settings), load_weights, and GLAM's own load_state_dict."""
    from scripts.networks.inference import checkpoint_settings
    from scripts.networks.weights import load_weights

    path = _with_record(tmp_path, "bad.pt", text)
    for read in (lambda: checkpoint_settings(path), lambda: load_weights(GLAM(**TINY), path)):
        with pytest.raises(ValueError) as caught:
            read()
        message = str(caught.value)
        assert message.startswith(f"the checkpoint {path}: ") and expected in message and "\n" not in message
    with pytest.raises(ValueError, match="^the checkpoint: the settings record"):
        GLAM(**TINY).load_state_dict(torch.load(path, weights_only=True))


def test_a_valid_record_of_a_later_version_is_kept():
    """A setting this version does not know is kept (a later version's record), when finite; the shipped model's and
    the defaults' records pass."""
    from scripts.networks.settings import validate_settings

    record = {**decode_settings(GLAM(**TINY).state_dict()[SETTINGS_KEY]), "new_setting": [1, {"a": 2.5}]}
    assert validate_settings(record) is record
    assert read_checkpoint_settings(BUNDLE / "models" / "model.pt")["image_size"] == [736, 480]
    with pytest.raises(ValueError, match="new_setting\\[1\\].a is not a finite number"):
        validate_settings({**record, "new_setting": [1, {"a": float("-inf")}]})


def test_the_inference_command_stops_with_one_line_on_a_window_of_40000(tmp_path):
    """The documented command with a checkpoint whose record asks for a 40000 x 40000 window: exit status 1, one line
    on stderr naming the file, no traceback, and nothing allocated for the window (the process stays small)."""
    import subprocess
    import sys

    path = _with_record(tmp_path, "huge_window.pt", _record(image_size=[40000, 40000]))
    (tmp_path / "in").mkdir()
    command = [
        sys.executable, "-c",
        "import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
        "print('MAXRSS', p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
        *workflow_command("inference"),
        "--config_file", str(BUNDLE / "configs" / "inference.yaml"),
        "--meta_file", str(BUNDLE / "configs" / "metadata.json"),
        "--bundle_root", str(BUNDLE),
        "--input_dir", str(tmp_path / "in"), "--output_dir", str(tmp_path / "out"), "--ckpt_path", str(path),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    rc, maxrss = done.stdout.split("MAXRSS")[-1].split()
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert rc == "1" and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert any(str(path) in line and "image_size is [40000, 40000]" in line for line in errors), done.stderr[-2000:]
    assert int(maxrss) < 1.5 * 1024**2
