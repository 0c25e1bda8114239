"""One reader of the command line: ``python -m monai.bundle run training`` is parsed by MONAI (Python Fire, into the
arguments of ``monai.bundle.scripts.run``) and its config files are read by MONAI's ``ConfigParser``; the bundle
takes both from there (scripts.commands.command_line, running_parser) and builds no second workflow.

The in-process runs call ``monai.bundle.scripts.run`` as Fire calls it; ``sys.argv`` is set to the matching command
line and counts every read of it (the bundle reads none)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import TINY_CONFIG, TRAIN_CONFIG, tiny_overrides
from monai.bundle import ConfigParser, ConfigWorkflow
from monai.bundle import scripts as bundle_scripts

from scripts.commands import UsageError, command_line, running_parser

META = str(TRAIN_CONFIG.parent / "metadata.json")
BUNDLE_ROOT = str(TRAIN_CONFIG.parent.parent)


class CountingArgv(list):
    """``sys.argv`` that counts the reads of its items."""

    reads = 0

    def __iter__(self):
        CountingArgv.reads += 1
        return super().__iter__()

    def __getitem__(self, index):
        CountingArgv.reads += 1
        return super().__getitem__(index)

    def __len__(self):
        CountingArgv.reads += 1
        return super().__len__()


@pytest.fixture
def reads(monkeypatch):
    """Counts, during the test: the reads of ``sys.argv``, each config file loaded by MONAI's ``ConfigParser`` (by
    resolved path) and the ``ConfigWorkflow`` objects built."""
    counts: dict = {"files": Counter(), "workflows": 0}
    load = ConfigParser.load_config_file.__func__
    init = ConfigWorkflow.__init__

    def counting_load(cls, filepath, **kwargs):
        counts["files"][str(Path(filepath).resolve())] += 1
        return load(cls, filepath, **kwargs)

    def counting_init(self, *args, **kwargs):
        counts["workflows"] += 1
        init(self, *args, **kwargs)

    monkeypatch.setattr(ConfigParser, "load_config_file", classmethod(counting_load))
    monkeypatch.setattr(ConfigWorkflow, "__init__", counting_init)
    CountingArgv.reads = 0
    return counts


def _run_training(monkeypatch, **overrides) -> None:
    """``python -m monai.bundle run training --config_file [train.yaml, tiny.yaml] --meta_file ... --key value``
    as Fire calls it, with that command line in ``sys.argv``."""
    files = [str(TRAIN_CONFIG), str(TINY_CONFIG)]
    argv = [str(Path(bundle_scripts.__file__).with_name("__main__.py")), "run", "training", "--config_file"]
    argv += [str(files), "--meta_file", META, "--logging_file", "False"]
    for key, value in overrides.items():
        argv += [f"--{key}", str(value)]
    monkeypatch.setattr(sys, "argv", CountingArgv(argv))
    bundle_scripts.run("training", config_file=files, meta_file=META, logging_file=False, **overrides)


def test_a_training_run_reads_the_command_line_once_and_builds_one_workflow(
    tmp_path, tiny_datalist, monkeypatch, reads
):
    """The documented command, one tiny stage: MONAI's workflow is the only one; the bundle never reads sys.argv;
    train.yaml is read twice: by MONAI to build the run, and by the override check for the ids the files had
    before MONAI merged the overrides in (the one question MONAI's merged copy cannot answer)."""
    path_before = list(sys.path)
    overrides = tiny_overrides(tmp_path, tiny_datalist, stage="global", epochs=1, check_data=False)
    _run_training(monkeypatch, **overrides)
    assert (tmp_path / "models" / "global" / "model.pt").is_file()  # the stage ran
    assert CountingArgv.reads == 0
    assert reads["workflows"] == 1
    assert reads["files"][str(TRAIN_CONFIG.resolve())] == 2
    assert reads["files"][str(TINY_CONFIG.resolve())] == 2
    added = list(sys.path)
    for entry in path_before:
        added.remove(entry)
    assert added == [BUNDLE_ROOT]  # ConfigWorkflow.run's insert, once


def test_the_override_check_reads_monai_s_parse_not_sys_argv(tmp_path, tiny_datalist, monkeypatch, reads):
    """A typo is refused from the overrides MONAI received, with the closest id, before anything is made; here
    ``sys.argv`` (pytest's) holds no such override."""
    files = [str(TRAIN_CONFIG), str(TINY_CONFIG)]
    overrides = tiny_overrides(tmp_path, tiny_datalist, check_data=False)
    with pytest.raises(Exception) as info:
        bundle_scripts.run("training", config_file=files, meta_file=META, logging_file=False, epoch=1, **overrides)
    cause = info.value
    while cause is not None and not isinstance(cause, UsageError):
        cause = cause.__cause__
    assert str(cause) == "unknown option --epoch: the configuration has no 'epoch'; did you mean --epochs?"
    assert not (tmp_path / "models").exists()
    assert reads["workflows"] == 1


def test_command_line_is_the_arguments_monai_run_received(tmp_path, monkeypatch):
    """Run arguments and overrides as MONAI's ``run`` received them (values as Fire parsed them), an args file's
    defaults under both; None outside that call."""
    seen = []

    class Recorder:
        def run(self):
            seen.append(command_line())

        def finalize(self):
            pass

    monkeypatch.setattr(bundle_scripts, "create_workflow", lambda **kwargs: Recorder())
    bundle_scripts.run("evaluating", config_file="a.yaml", tracking="mlflow", epochs=1, **{"validate#x": [1, "b"]})
    assert seen.pop() == (
        {"run_id": "evaluating", "config_file": "a.yaml", "tracking": "mlflow"},
        {"epochs": 1, "validate#x": [1, "b"]},
    )
    args = tmp_path / "args.yaml"
    args.write_text("config_file: b.yaml\nmeta_file: m.json\nepochs: 5\nseed: 3\n")
    bundle_scripts.run(args_file=str(args), meta_file="n.json", epochs=1)
    assert seen.pop() == ({"config_file": "b.yaml", "meta_file": "n.json"}, {"seed": 3, "epochs": 1})
    assert command_line() is None


def test_running_parser_is_the_parser_evaluating_the_entry():
    parser = ConfigParser({"who": {"_target_": "scripts.commands.running_parser"}})
    assert parser.get_parsed_content("who") is parser
    with pytest.raises(RuntimeError, match="evaluates"):
        running_parser()
