"""The command line through MONAI's own mechanism for a workflow class: ``python -m monai.bundle run_workflow
scripts.GLAMWorkflow``. MONAI hands the class the overrides as keyword arguments; the class checks them (a typo named
with the closest id, ``None`` / ``null`` set to None), trains the three stages for run id ``training``, and prints a
user's mistake as one line while any other exception keeps its traceback. The in-process runs call
``monai.bundle.scripts.run_workflow`` as Python Fire calls it, with ``sys.argv`` as the command line's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import BUNDLE_ROOT, REPO_ROOT, TINY_CONFIG, TRAIN_CONFIG, tiny_overrides
from monai.bundle import scripts as bundle_scripts

from scripts.errors import UsageError

CONFIGS = TRAIN_CONFIG.parent
META = str(CONFIGS / "metadata.json")
QUICKSTART = REPO_ROOT / "configs" / "quickstart.yaml"
WORKFLOW = "scripts.GLAMWorkflow"
MAIN = str(Path(bundle_scripts.__file__).with_name("__main__.py"))


def _run(*files, argv: list[str] | None = None, monkeypatch=None, **overrides):
    """``python -m monai.bundle run_workflow scripts.GLAMWorkflow --config_file [...] --key value``, as Fire calls
    it; ``argv`` (with ``monkeypatch``) stands for the command line's words after ``run_workflow``."""
    if monkeypatch is not None:
        monkeypatch.setattr(sys, "argv", [MAIN, "run_workflow", WORKFLOW, *(argv or [])])
    config = [str(f) for f in files]
    bundle_scripts.run_workflow(WORKFLOW, config_file=config, meta_file=META, logging_file=False, **overrides)


def test_a_typo_is_one_line_naming_the_closest_id(tmp_path, tiny_datalist, monkeypatch, capsys):
    overrides = tiny_overrides(tmp_path, tiny_datalist, check_data=False)
    with pytest.raises(SystemExit) as info:
        _run(TRAIN_CONFIG, TINY_CONFIG, run_id="training", epoch=1, monkeypatch=monkeypatch, **overrides)
    assert info.value.code == 1 and isinstance(info.value.__cause__, UsageError)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: unknown option --epoch: the configuration has no 'epoch'; did you mean --epochs?"]
    assert not (tmp_path / "models").exists()
    # a component's argument: the closest of the arguments it has
    with pytest.raises(SystemExit):
        _run(TRAIN_CONFIG, run_id="training", monkeypatch=monkeypatch, **{"optimizer#lrr": 0.1})
    assert "did you mean --optimizer#lr?" in capsys.readouterr().err
    # from Python (no `python -m monai.bundle`), the error itself
    monkeypatch.setattr(sys, "argv", ["notebook"])
    with pytest.raises(UsageError, match="did you mean --epochs"):
        _run(TRAIN_CONFIG, TINY_CONFIG, run_id="training", epoch=1, **overrides)


def _probe_run(tmp_path: Path, stage: str) -> dict:
    """Overrides for a training run of one stage whose work is a probe's line: folders in tmp_path, no data read."""
    return {
        "ckpt_root": str(tmp_path / "m"),
        "output_root": str(tmp_path / "e"),
        "stage": stage,
        "check_data": False,
        "datalist": str(tmp_path / "unused.json"),
    }


@pytest.mark.parametrize("spelling", ["None", "null"])
def test_none_and_null_reach_the_component_as_none(tmp_path, capsys, monkeypatch, spelling):
    # each stage's run is replaced by a line printing what the global stage starts from
    probe = tmp_path / "probe.yaml"
    probe.write_text("run_stage:\n  - \"$print('SEEN', repr(@previous_model), repr(@previous_modules))\"\n")
    common = _probe_run(tmp_path, "global")
    # Fire parses `None` into None and MONAI drops it before the class is built: the class reads it off sys.argv
    given = {} if spelling == "None" else {"quickstart_global_init": "null"}
    argv = ["--quickstart_global_init", spelling]
    _run(TRAIN_CONFIG, QUICKSTART, probe, run_id="training", argv=argv, monkeypatch=monkeypatch, **given, **common)
    assert "SEEN None None" in capsys.readouterr().out
    _run(TRAIN_CONFIG, QUICKSTART, probe, run_id="training", monkeypatch=monkeypatch, **common)
    assert f"SEEN {os.path.join('bundle', 'models', 'model.pt')!r} ['global_network']" in capsys.readouterr().out


@pytest.mark.parametrize(("given", "seen"), [("false", "False"), ("TRUE", "True"), ("False", "False"), ("no", "'no'")])
def test_yaml_booleans_on_the_command_line_reach_the_component_as_booleans(
    tmp_path, capsys, caplog, monkeypatch, given, seen
):
    # Fire leaves `false` as text, which every truth test reads as true (a training-chain flag silently kept on)
    probe = tmp_path / "probe.yaml"
    seen_line = "$print('SEEN', repr(@flag), repr(@train#prepare_batch#random_negatives))"
    probe.write_text(f'flag: true\nrun_stage:\n  - "{seen_line}"\n')
    common = _probe_run(tmp_path, "local")
    overrides = {"flag": given, "train#prepare_batch#random_negatives": given}
    with caplog.at_level("INFO", logger="scripts"):
        _run(TRAIN_CONFIG, QUICKSTART, probe, run_id="training", monkeypatch=monkeypatch, **overrides, **common)
    assert f"SEEN {seen} {seen}" in capsys.readouterr().out
    # MONAI's input summary shows the text as given: the workflow says what it read
    said = f"> flag: {seen} (the command line's {given!r}, read as a boolean)"
    assert (said in caplog.text) == (seen != repr(given)), caplog.text[-2000:]


def _command(tmp_path: Path, run_id: str) -> subprocess.CompletedProcess:
    """The documented command in a fresh process from the repository root, on a probe config whose entries fail:
    ``user`` with a bundle error type wrapped by MONAI, ``bug`` with a KeyError raised inside bundle/scripts."""
    probe = tmp_path / "probe.yaml"
    probe.write_text(
        "user:\n  - {_target_: scripts.training.preflight.per_stage, value: many, stage: global, name: epochs}\n"
        "bug:\n  - {_target_: scripts.networks.settings.checkpoint_setting, path: none.pt, name: no_such_setting}\n"
    )
    command = [sys.executable, "-m", "monai.bundle", "run_workflow", WORKFLOW, "--run_id", run_id]
    command += ["--config_file", str([str(TRAIN_CONFIG), str(probe)]), "--meta_file", META]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(BUNDLE_ROOT)}
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_users_mistake_is_one_line_and_a_bug_keeps_its_traceback(tmp_path):
    user = _command(tmp_path, "user")
    assert user.returncode == 1, user.stderr
    lines = [line for line in user.stderr.splitlines() if "error" in line.lower()]
    assert lines == [
        "error: epochs must be a number or a dict per stage {global: .., local: .., joint: ..}, got 'many'"
    ]
    assert "Traceback" not in user.stderr
    bug = _command(tmp_path, "bug")
    assert bug.returncode == 1
    assert "Traceback (most recent call last)" in bug.stderr
    assert f"scripts{os.sep}networks{os.sep}settings.py" in bug.stderr  # the frame that raised it
    assert "KeyError" in bug.stderr and "\nerror: " not in bug.stderr


def test_plain_run_of_training_names_the_class_command(tmp_path):
    with pytest.raises(RuntimeError) as info:
        bundle_scripts.run("training", config_file=str(TRAIN_CONFIG), meta_file=META, logging_file=False)
    cause = info.value
    while cause is not None and not isinstance(cause, UsageError):
        cause = cause.__cause__ or cause.__context__
    assert cause is not None and "run_workflow scripts.GLAMWorkflow --run_id training" in str(cause)


@pytest.mark.parametrize(
    "run_id, files, page, option",
    [
        ("inference", [CONFIGS / "inference.yaml"], "docs/inference.md", "--input_dir ''"),
        ("evaluating", [TRAIN_CONFIG, CONFIGS / "evaluate.yaml"], "docs/evaluation.md", "--eval_split test"),
    ],
)
def test_help_names_the_class_command_and_the_workflows_page(run_id, files, page, option, capsys, monkeypatch):
    with pytest.raises(SystemExit) as info:
        _run(*files, run_id=run_id, help=True, monkeypatch=monkeypatch)  # Fire passes `--help` as help=True
    assert info.value.code == 0
    out = capsys.readouterr().out
    command = f"python -m monai.bundle run_workflow {WORKFLOW} --run_id {run_id} --config_file ... [--option value"
    assert command in out.splitlines()[0] and f"{page} describes it" in out.splitlines()[0]
    assert f"\n  {option}\n" in out


def test_three_stages_then_resume_through_the_class(tmp_path, tiny_datalist, monkeypatch):
    overrides = tiny_overrides(tmp_path, tiny_datalist, epochs=1, check_data=False)
    _run(TRAIN_CONFIG, TINY_CONFIG, run_id="training", monkeypatch=monkeypatch, **overrides)
    for stage in ("global", "local", "joint"):
        assert (tmp_path / "models" / stage / "model.pt").is_file(), stage
    first = torch.load(tmp_path / "models" / "joint" / "last.pt", weights_only=True)["trainer"]
    # the joint stage continued from its last.pt for one more epoch (the two before it are not rerun)
    before = {s: (tmp_path / "models" / s / "model.pt").stat().st_mtime_ns for s in ("global", "local")}
    resumed = {**overrides, "stage": "joint", "epochs": 2, "resume": True}
    _run(TRAIN_CONFIG, TINY_CONFIG, run_id="training", monkeypatch=monkeypatch, **resumed)
    last = torch.load(tmp_path / "models" / "joint" / "last.pt", weights_only=True)["trainer"]
    epochs = [int(t["iteration"]) // int(t["epoch_length"]) for t in (first, last)]
    assert epochs == [1, 2] and int(last["max_epochs"]) == 2
    assert before == {s: (tmp_path / "models" / s / "model.pt").stat().st_mtime_ns for s in ("global", "local")}
    assert json.loads((tmp_path / "models" / "joint" / "selection.json").read_text())["finished"]


def test_the_stats_handler_logs_a_bugs_traceback_and_leaves_a_users_error_to_the_entry_point():
    import logging

    from ignite.engine import Engine

    from scripts.handlers.stats import StatsHandler

    class Records(logging.Handler):
        def __init__(self):
            super().__init__()
            self.records = []

        def emit(self, record):
            self.records.append(record)

    def step(engine, batch):
        raise batch

    for error, logged in ((UsageError("--epochs must be a finite number"), False), (KeyError("a bug"), True)):
        engine = Engine(step)
        stats = StatsHandler(name="glam_test_stats", iteration_log=False, epoch_log=False)
        stats.attach(engine)
        seen = Records()
        stats.logger.addHandler(seen)
        try:
            with pytest.raises(type(error)):
                engine.run([error])
        finally:
            stats.logger.removeHandler(seen)
        assert bool(seen.records) == logged, error
        assert all(r.exc_info is not None for r in seen.records)  # a bug's traceback is kept
