"""The data check runs before the first epoch: a datalist with bad files makes ``training`` fail at once with a
``DataCheckError`` that lists every bad file, before any stage is built; ``check_data: false`` skips it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT, TINY_CONFIG, TRAIN_CONFIG, tiny_overrides, workflow_command

import scripts.data
import scripts.training.workflow
from scripts.data import DataCheckError, load_datalist
from scripts.data.datalist import resolve_paths
from scripts.training.workflow import GLAMWorkflow

META = TRAIN_CONFIG.parent / "metadata.json"


@pytest.fixture
def bad_datalist(tmp_path, tiny_datalist) -> tuple[str, list[str]]:
    """The tiny datalist with a truncated training image and a missing validation mask; returns (path, bad files)."""
    data = resolve_paths(load_datalist(tiny_datalist), Path(tiny_datalist).parent)
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(Path(data["training"][0]["image"]).read_bytes()[:64])
    data["training"][0]["image"] = str(truncated)
    missing = tmp_path / "no_such_mask.png"
    data["validation"][1]["mask_benign"] = str(missing)
    path = tmp_path / "bad_datalist.json"
    path.write_text(json.dumps(data))
    return str(path), [str(truncated), str(missing)]


@pytest.fixture
def calls(monkeypatch) -> dict[str, list]:
    """Record the data check and the stage runner instead of training (the config looks both up when it runs)."""
    seen: dict[str, list] = {"check": [], "train": []}
    real_check = scripts.data.checks.assert_datalist_ok

    def check(*args, **kwargs):
        seen["check"].append(args)
        return real_check(*args, **kwargs)

    monkeypatch.setattr(scripts.data.checks, "assert_datalist_ok", check)
    monkeypatch.setattr(
        scripts.training.workflow, "run_stages", lambda parser, stage, *args: seen["train"].append(stage) or []
    )
    return seen


def _workflow(tmp_path: Path, datalist: str, **overrides) -> GLAMWorkflow:
    wf = GLAMWorkflow(
        config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG)],
        meta_file=str(META),
        workflow_type="train",
        **tiny_overrides(tmp_path, datalist, stage="global", **overrides),
    )
    wf.initialize()
    return wf


def _data_check_error(err: BaseException) -> DataCheckError | None:
    while err is not None:  # MONAI wraps errors raised in config expressions
        if isinstance(err, DataCheckError):
            return err
        err = err.__cause__ or err.__context__
    return None


def test_bad_files_stop_training_before_any_stage_is_built(tmp_path, bad_datalist, calls):
    datalist, bad_files = bad_datalist
    with pytest.raises(Exception) as err:
        _workflow(tmp_path, datalist).run()
    found = _data_check_error(err.value)
    assert found is not None, f"expected a DataCheckError, got {err.value!r}"
    assert sorted(p.file for p in found.report.problems) == sorted(bad_files)  # every bad file, nothing else
    for f in bad_files:
        assert f in str(found)
    assert len(calls["check"]) == 1 and calls["train"] == []
    assert not (tmp_path / "models").exists() and not (tmp_path / "eval").exists()


@pytest.mark.parametrize("flag", [False, "false", "0"])  # strings as the command line passes them
def test_check_data_false_skips_the_check(tmp_path, bad_datalist, calls, flag):
    _workflow(tmp_path, bad_datalist[0], check_data=flag).run()
    assert calls["check"] == [] and calls["train"] == ["global"]


def test_good_data_passes_the_check_and_training_starts(tmp_path, tiny_datalist, calls):
    _workflow(tmp_path, tiny_datalist, check_data="true").run()
    assert len(calls["check"]) == 1 and calls["train"] == ["global"]


def test_images_without_a_pixel_spacing_are_named_when_the_model_has_one(tmp_path, tiny_datalist, calls, caplog):
    """train.yaml passes its pixel_spacing to the check: a PNG without pHYs is warned about, training starts."""
    from PIL import Image

    data = resolve_paths(load_datalist(tiny_datalist), Path(tiny_datalist).parent)
    plain = tmp_path / "no_phys.png"
    Image.open(data["training"][0]["image"]).save(plain)  # the same pixels, no pHYs chunk
    data["training"][0]["image"] = str(plain)
    path = tmp_path / "datalist.json"
    path.write_text(json.dumps(data))
    with caplog.at_level("WARNING", logger="scripts.data.checks"):
        _workflow(tmp_path, str(path), pixel_spacing=0.8).run()
    messages = [r.getMessage() for r in caplog.records if r.name == "scripts.data.checks"]
    assert len(messages) == 1 and str(plain) in messages[0] and "0.8 mm" in messages[0], messages
    assert calls["train"] == ["global"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="scripts.data.checks"):
        _workflow(tmp_path, str(path)).run()  # the tiny preset's model spacing: null, nothing is assumed
    assert not [r for r in caplog.records if r.name == "scripts.data.checks"]


@pytest.mark.slow
def test_command_line_fails_within_seconds_listing_the_bad_files(tmp_path, bad_datalist):
    datalist, bad_files = bad_datalist
    command = [
        *workflow_command("training"),
        "--config_file", repr([str(TRAIN_CONFIG), str(TINY_CONFIG)]),
        "--meta_file", str(META),
        "--datalist", datalist,
        "--ckpt_root", str(tmp_path / "models"),
        "--output_root", str(tmp_path / "eval"),
    ]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert "DataCheckError" in done.stderr
    for f in bad_files:
        assert f in done.stderr
    assert "Epoch" not in done.stderr and not (tmp_path / "models").exists()
    print(f"failed after {elapsed:.1f} s (Python, MONAI and torch start-up included)")
