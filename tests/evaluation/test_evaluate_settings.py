"""Evaluation reads the model's settings from its checkpoint, as inference does: a model trained with a preset is
evaluated by the documented command without the preset; a command-line setting that contradicts the checkpoint is
refused naming it; a checkpoint without a record is built from the configuration as before. And an empty split
names the flags that help."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import BUNDLE_ROOT, TINY_CONFIG, TRAIN_CONFIG, workflow_command
from monai.bundle import ConfigParser

from scripts.evaluation.model import checkpoint_record, evaluation_settings
from scripts.evaluation.report import eval_split_items
from scripts.networks import GLAM
from scripts.networks.settings import SETTINGS_KEY

EVAL_CONFIG = BUNDLE_ROOT / "configs" / "evaluate.yaml"
META = str(BUNDLE_ROOT / "configs" / "metadata.json")
#: train.yaml's values of the settings the tiny preset changes, as train.yaml alone would build them
PAPER = {"image_size": [2944, 1920], "patch_size": 512, "local_depth": 34, "local_width": 64}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_datalist):
    """A tiny-preset GLAM's model.pt and last.pt (as training writes them), and a datalist whose test split holds 4
    images of the tiny data (absolute paths)."""
    from scripts.data import load_datalist
    from scripts.data.datalist import resolve_paths
    from scripts.networks.weights import plain_state_dict, save_atomic

    root = tmp_path_factory.mktemp("trained")
    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(TINY_CONFIG)])
    parser["stage"] = "joint"
    parser["device"] = "$torch.device('cpu')"
    torch.manual_seed(0)
    state = plain_state_dict(parser.get_parsed_content("network_def"))
    save_atomic(state, root / "model.pt")
    save_atomic({"network": state, "trainer": {"epoch_length": 1, "iteration": 1, "max_epochs": 1}}, root / "last.pt")
    content = resolve_paths(load_datalist(tiny_datalist), Path(tiny_datalist).parent)
    datalist = root / "datalist.json"
    datalist.write_text(json.dumps({"training": [], "validation": content["validation"], "test": content["test"][:4]}))
    return root, datalist, state


def evaluate_command(root: Path, datalist: Path, ckpt: Path, *extra: str) -> list[str]:
    """The documented evaluation command, without any preset: train.yaml then evaluate.yaml."""
    return [
        *workflow_command("evaluating"),
        "--config_file",
        f"['{TRAIN_CONFIG}','{EVAL_CONFIG}']",
        "--meta_file",
        META,
        "--ckpt_path",
        str(ckpt),
        "--datalist",
        str(datalist),
        "--output_root",
        str(root / "out"),
        "--num_workers",
        "0",
        *extra,
    ]


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(BUNDLE_ROOT)}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


# -- the command line ------------------------------------------------------------------------------------------------
def test_the_documented_command_evaluates_a_preset_model_without_the_preset(trained, tmp_path):
    root, datalist, _ = trained
    result = run(evaluate_command(tmp_path, datalist, root / "model.pt"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "evaluate" / "metrics.json").read_text())
    assert summary["n_images"] == 4 and summary["maps"] == ["S_g", "S_l", "S_c"]
    line = next(x for x in result.stderr.splitlines() if "evaluation: model settings of" in x)
    assert f"model settings of {root / 'model.pt'} from the checkpoint: image_size, pixel_spacing, patch_size" in line
    assert "the command line" not in line and "the configuration" not in line


def test_a_setting_that_contradicts_the_checkpoint_is_refused_naming_it(trained, tmp_path):
    root, datalist, _ = trained
    result = run(evaluate_command(tmp_path, datalist, root / "model.pt", "--local_width", "8"), cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    # refused while the evaluator runs: the bundle's StatsHandler leaves it to the one line
    assert "Traceback" not in result.stderr + result.stdout, result.stdout[-3000:]
    (line,) = error_lines(result)
    assert line.startswith("error: ") and "local_width: checkpoint 4, network 8" in line
    assert not (tmp_path / "out" / "evaluate" / "metrics.json").exists()


def test_an_empty_test_split_names_the_flags_that_help(trained, tmp_path):
    """A datalist made with --fractions 0.5 0.5 0: no test split; the message names --eval_split validation."""
    root, datalist, _ = trained
    content = json.loads(datalist.read_text())
    no_test = tmp_path / "no_test.json"
    no_test.write_text(json.dumps({**content, "test": []}))
    result = run(evaluate_command(tmp_path, no_test, root / "model.pt"), cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert error_lines(result) == [
        f"error: {no_test}: split 'test' is missing or empty; nothing to evaluate: evaluate the "
        "validation split with --eval_split validation, or give the datalist a test split "
        "(tools/make_datalist.py --fractions TRAIN VAL TEST with TEST > 0, e.g. --fractions 0.7 0.15 0.15)"
    ]


# -- the settings, unit by unit --------------------------------------------------------------------------------------
def config_values(*files: Path) -> dict:
    parser = ConfigParser()
    parser.read_config([str(f) for f in files])
    names = ("image_size", "pixel_spacing", "patch_size", "num_patches_eval", "t_global", "t_local", "gamma_c")
    names += ("aggregation", "local_depth", "local_width", "global_backbone", "pool_in_breast")
    return {name: parser.get_parsed_content(name) for name in names}


def test_checkpoint_takes_the_recorded_value_and_any_other_value_is_used_as_given(trained):
    """inference.yaml's rule: "checkpoint" (evaluate.yaml's value of each setting, after a preset layered before
    it) is the record's value; a value given instead, by a flag or a file after evaluate.yaml, is used as given."""
    root, _, state = trained
    tiny = config_values(TRAIN_CONFIG, TINY_CONFIG)
    evaluated = config_values(TRAIN_CONFIG, TINY_CONFIG, EVAL_CONFIG)
    assert set(evaluated.values()) == {"checkpoint"}  # evaluate.yaml after the preset: the preset's values are not used
    for ckpt in ("model.pt", "last.pt"):
        settings = evaluation_settings(root / ckpt, "joint", **evaluated)
        for name in ("local_depth", "local_width"):
            assert settings[name] == tiny[name]
        assert settings["image_size"] == tiny["image_size"] and settings["patch_size"] == [64, 64]
        assert settings["stage"] == "joint" and settings["joint_modules"] is True
        network = GLAM(**settings)
        network.load_state_dict(state)  # loads strictly: the same settings record
    # a choice that changes no weight, given, is used as given and still loads
    settings = evaluation_settings(root / "model.pt", "joint", **{**evaluated, "t_global": 0.1})
    assert settings["t_global"] == 0.1
    GLAM(**settings).load_state_dict(state)
    # a weight-shaping setting given is used as given: the load refuses it, naming it
    settings = evaluation_settings(root / "model.pt", "joint", **{**evaluated, "local_width": 8})
    with pytest.raises(ValueError, match=r"local_width: checkpoint 4, network 8"):
        GLAM(**settings).load_state_dict(state)
    with pytest.raises(ValueError, match="unknown model settings"):
        evaluation_settings(root / "model.pt", "joint", no_such_setting=1)
    # a per-stage share (a benchmark preset layered after evaluate.yaml) reaches the network as the evaluated
    # stage's, as in training
    shares = {"global": 0.2, "local": 0.05, "joint": 0.3}
    for stage in ("local", "joint"):
        parser = ConfigParser()
        parser.read_config([str(TRAIN_CONFIG), str(TINY_CONFIG), str(EVAL_CONFIG)])
        parser.update({"ckpt_path": str(root / "model.pt"), "stage": stage, "t_local": shares})
        assert parser.get_parsed_content("model_settings")["t_local"] == shares[stage]


def test_a_checkpoint_without_a_record_is_built_from_the_given_values_else_glams_defaults(trained, tmp_path):
    """The baselines' and older checkpoints record no settings: "checkpoint" is then GLAM's default (as in
    inference), and a value given is used as given."""
    _, _, state = trained
    bare = {k: v for k, v in state.items() if k != SETTINGS_KEY}
    torch.save(bare, tmp_path / "old.pt")
    assert checkpoint_record(tmp_path / "old.pt") is None
    settings = evaluation_settings(tmp_path / "old.pt", "global", **config_values(TRAIN_CONFIG, TINY_CONFIG))
    assert settings["local_width"] == 4 and settings["patch_size"] == 64 and settings["stage"] == "global"
    assert list(settings["gammas"]) == [0.2, 0.6, 0.2]  # GLAM's default: train.yaml names none
    evaluated = config_values(TRAIN_CONFIG, TINY_CONFIG, EVAL_CONFIG)
    paper = evaluation_settings(tmp_path / "old.pt", "joint", **evaluated)
    assert paper["local_width"] == 64 and paper["local_depth"] == 34  # nothing recorded: GLAM's defaults


def test_a_missing_split_names_the_other_split_only_when_it_has_items():
    with pytest.raises(ValueError, match=r"with --eval_split test, or give the datalist a validation split .*VAL > 0"):
        eval_split_items({"validation": [], "test": [{"image": "a.png"}]}, "validation", "d.json")
    with pytest.raises(ValueError) as err:
        eval_split_items({"training": [{"image": "a.png"}]}, "test", "d.json")
    assert "--eval_split" not in str(err.value) and "--fractions TRAIN VAL TEST with TEST > 0" in str(err.value)
    with pytest.raises(ValueError, match=r"--eval_split must be one of \('validation', 'test'\), got 'training'"):
        eval_split_items({"training": [{"image": "a.png"}]}, "training", "d.json")
