"""What a user asks for on the command line is what runs (bundle/scripts/training/workflow.py): ``--key None`` (or
``null``) reaches the configuration as None for every option, although MONAI drops None-valued overrides;
``--help`` prints the workflow's own options and page; an unknown option points at that page."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import BUNDLE_ROOT, REPO_ROOT, TRAIN_CONFIG, workflow_command
from monai.bundle import ConfigParser

from scripts.errors import UsageError
from scripts.training.workflow import _file_config, check_overrides, given_none

META = str(TRAIN_CONFIG.parent / "metadata.json")
QUICKSTART = REPO_ROOT / "configs" / "quickstart.yaml"
INFERENCE = TRAIN_CONFIG.parent / "inference.yaml"
EVALUATE = TRAIN_CONFIG.parent / "evaluate.yaml"


def _monai_run(run_id: str, config_files: list, *extra: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    command = [
        *workflow_command(run_id),
        "--config_file",
        str([str(f) for f in config_files]),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(BUNDLE_ROOT)}
    return subprocess.run(
        [*command, "--meta_file", META, *extra], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_quick_start_trained_from_scratch_sees_none(tmp_path):
    # the documented `--quickstart_global_init None` (docs/own_data.md) through the real training entry: each
    # stage's run is replaced by a line printing what the global stage starts from
    probe = tmp_path / "probe.yaml"
    probe.write_text("run_stage:\n  - \"$print('SEEN', repr(@previous_model), repr(@previous_modules))\"\n")
    folders = ["--ckpt_root", str(tmp_path / "m"), "--output_root", str(tmp_path / "e")]
    common = [*folders, "--stage", "global", "--check_data", "false", "--datalist", str(tmp_path / "unused.json")]
    for spelling in ("None", "null"):
        result = _monai_run(
            "training", [TRAIN_CONFIG, QUICKSTART, probe], *common, "--quickstart_global_init", spelling
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert "SEEN None None" in result.stdout, spelling  # no model to start from, no module taken from it
        # listed with the settings the run was given (MONAI's input summary leaves None out)
        assert "> quickstart_global_init: None (given on the command line)" in result.stderr

    default = _monai_run("training", [TRAIN_CONFIG, QUICKSTART, probe], *common)
    assert default.returncode == 0, default.stderr[-3000:]
    shipped = os.path.join("bundle", "models", "model.pt")
    assert f"SEEN {shipped!r} ['global_network']" in default.stdout


def test_given_none_sets_every_none_override_and_refuses_a_merge():
    parser = ConfigParser({"a": 1, "b": {"c": "x"}, "d": "keep", "e": "none"})
    assert given_none({"a": None, "b#c": "null", "d": "kept", "e": "none"}, parser) == ["a", "b#c"]
    assert parser.get() == {"a": None, "b": {"c": None}, "d": "keep", "e": "none"}  # "none" is a word (dicom_outputs)
    with pytest.raises(UsageError, match=r"--\+b None"):
        given_none({"+b": None}, parser)


@pytest.mark.parametrize(
    "run_id, files, page, option, not_option",
    [
        ("inference", [INFERENCE], "docs/inference.md", "--input_dir ''", "--epochs"),
        ("training", [TRAIN_CONFIG, QUICKSTART], "docs/training.md", "--quickstart_global_init", "--input_dir"),
    ],
)
def test_help_prints_the_workflows_options_and_page(run_id, files, page, option, not_option):
    result = _monai_run(run_id, files, "--help")
    assert result.returncode == 0, result.stderr[-3000:]
    command = f"python -m monai.bundle run_workflow scripts.GLAMWorkflow --run_id {run_id} --config_file ..."
    assert f"{command} [--option value ...]: {page}" in result.stdout
    options = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  --")]
    assert option in result.stdout and not_option not in options
    assert "error" not in result.stderr


def test_help_of_the_evaluation_names_its_page():
    from scripts.training.workflow import workflow_help

    text = workflow_help("evaluating", _file_config([str(TRAIN_CONFIG), str(EVALUATE)], META))
    assert "docs/evaluation.md" in text and "\n  --eval_split test\n" in text


def test_an_unknown_option_points_at_the_workflows_page():
    with pytest.raises(UsageError, match=r"--help lists the options, docs/inference.md describes them"):
        check_overrides(["zzzz_qqq"], _file_config(str(INFERENCE), META), "docs/inference.md")
    with pytest.raises(UsageError, match="did you mean --input_dir"):
        check_overrides(["input_dri"], {"input_dir": ""}, "docs/inference.md")
