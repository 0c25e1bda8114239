"""tools/record_model_settings.py: an older checkpoint (no settings record) gets the record of the configs it was
trained with; its weights are unchanged; a checkpoint of other settings is refused with them named."""

from __future__ import annotations

import subprocess
import sys

import torch
from conftest import BUNDLE_ROOT, REPO_ROOT

from scripts.networks import GLAM
from scripts.networks.settings import SETTINGS_KEY, decode_settings

TOOL = REPO_ROOT / "tools" / "record_model_settings.py"
CONFIGS = f"['{BUNDLE_ROOT / 'configs' / 'train.yaml'}','{REPO_ROOT / 'tests' / 'configs' / 'tiny.yaml'}']"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=300)


def _tiny_network(**overrides) -> GLAM:
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(
        [str(BUNDLE_ROOT / "configs" / "train.yaml"), str(REPO_ROOT / "tests" / "configs" / "tiny.yaml")]
    )
    parser["stage"] = "joint"
    for key, value in overrides.items():
        parser[key] = value
    return parser.get_parsed_content("network_def")


def test_an_older_checkpoint_gets_its_record(tmp_path):
    torch.manual_seed(0)
    net = _tiny_network()
    legacy = {k: v for k, v in net.state_dict().items() if k != SETTINGS_KEY}
    torch.save(legacy, tmp_path / "old.pt")
    done = _run(
        str(tmp_path / "old.pt"), str(tmp_path / "new.pt"), "--config_file", CONFIGS, "--set", "pixel_spacing=0.5"
    )
    assert done.returncode == 0, done.stderr
    assert "pixel_spacing: [0.5, 0.5]" in done.stdout
    stamped = torch.load(tmp_path / "new.pt", weights_only=True)
    assert decode_settings(stamped[SETTINGS_KEY]) == {**net.settings, "pixel_spacing": [0.5, 0.5]}
    assert decode_settings(stamped[SETTINGS_KEY]) == _tiny_network(pixel_spacing=0.5).settings
    for key, value in legacy.items():
        assert torch.equal(stamped[key], value), key


def test_other_settings_and_bad_arguments_are_named(tmp_path):
    other = GLAM(patch_size=32, local_depth=18, local_width=4, global_backbone={"width": 8})
    torch.save(other.state_dict(), tmp_path / "other.pt")
    done = _run(str(tmp_path / "other.pt"), str(tmp_path / "new.pt"), "--config_file", CONFIGS)
    assert done.returncode == 1 and "patch_size: checkpoint [32, 32]" in done.stderr
    assert not (tmp_path / "new.pt").exists()
    missing = _run(str(tmp_path / "missing.pt"), str(tmp_path / "new.pt"), "--config_file", CONFIGS)
    assert missing.returncode == 2 and "missing.pt does not exist" in missing.stderr
    bad_set = _run(str(tmp_path / "other.pt"), str(tmp_path / "new.pt"), "--config_file", CONFIGS, "--set", "x")
    assert bad_set.returncode == 2 and "expected ID=VALUE" in bad_set.stderr
