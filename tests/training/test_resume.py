"""Resumption: a CPU training run killed with SIGKILL in the middle of an epoch and resumed with ``--resume true``
ends exactly where an uninterrupted run with the same seed ends (epoch count, per-epoch validation metrics, best
key metric and its epoch, final weights, optimizer and scheduler state, best model).

Both runs go through the bundle's command line (``run_workflow scripts.GLAMWorkflow --run_id training``) on the tiny
preset, stage ``global`` with 3 epochs on 8 training images (4 with lesions, 4 without; batch size 1: 8 iterations per
epoch) and 2 validation images. The reference run and the interrupted run start together (one thread each: they share
the CPU but not their results); the interrupted run is killed once epoch 1's checkpoint exists and the first iteration
of epoch 2 has been logged, so seven iterations, validation and the checkpoint of epoch 2 were still to come."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, TINY_CONFIG, TRAIN_CONFIG, assert_identical, workflow_command

from scripts.data import load_datalist
from scripts.data.datalist import resolve_paths

META = TRAIN_CONFIG.parent / "metadata.json"
EPOCHS = 3
KILL_IN_EPOCH = 2  # killed after the first iteration of this epoch: the last checkpoint is the previous epoch's
TIMEOUT_S = 240


@pytest.fixture
def small_datalist(tmp_path, tiny_datalist) -> str:
    """4 training images with lesions and 4 without (so every epoch uses all 8); validation: one of each."""
    data = resolve_paths(load_datalist(tiny_datalist), Path(tiny_datalist).parent)

    def pick(split, n):
        positives = [item for item in data[split] if any(item["label"])][:n]
        negatives = [item for item in data[split] if not any(item["label"])][:n]
        assert len(positives) == n and len(negatives) == n
        return positives + negatives

    path = tmp_path / "datalist.json"
    path.write_text(json.dumps({"training": pick("training", 4), "validation": pick("validation", 1)}))
    return str(path)


def _start(root: Path, datalist: str, log: Path, *extra: str) -> subprocess.Popen:
    command = [
        *workflow_command("training"),
        "--config_file", repr([str(TRAIN_CONFIG), str(TINY_CONFIG)]),
        "--meta_file", str(META),
        "--stage", "global",
        "--epochs", repr({"global": EPOCHS, "local": 1, "joint": 1}),
        "--batch_size", repr({"global": 1, "local": 1, "joint": 1}),
        "--datalist", datalist,
        "--ckpt_root", str(root / "models"),
        "--output_root", str(root / "eval"),
        *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(log, "wb") as out:
        return subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def _text(log: Path) -> str:
    return log.read_bytes().decode("utf-8", "replace").replace("\r", "\n")  # the progress bar uses \r


def _wait(proc: subprocess.Popen, log: Path) -> None:
    try:
        proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"training failed ({proc.returncode}):\n{_text(log)[-3000:]}"


def _iterations(log: Path) -> list[tuple[int, int, str]]:
    """(epoch, iteration, loss) of every logged training iteration."""
    found = re.findall(r"Epoch: (\d+)/\d+, Iter: (\d+)/\d+ -- train_loss: (\S+)", _text(log))
    return [(int(e), int(i), loss) for e, i, loss in found]


def _validations(log: Path) -> dict[int, str]:
    """epoch -> the logged validation metrics line."""
    return {int(e): line.strip() for e, line in re.findall(r"Epoch\[(\d+)\] Metrics -- (.*)", _text(log))}


def _load(path: Path):
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_matches_an_uninterrupted_run(tmp_path, small_datalist):
    ref_root, cut_root = tmp_path / "reference", tmp_path / "interrupted"
    ref_log, cut_log, resume_log = tmp_path / "reference.log", tmp_path / "interrupted.log", tmp_path / "resumed.log"
    reference = _start(ref_root, small_datalist, ref_log)
    interrupted = _start(cut_root, small_datalist, cut_log)
    try:
        marker = f"Epoch: {KILL_IN_EPOCH}/{EPOCHS}, Iter: 1/"
        deadline = time.monotonic() + TIMEOUT_S
        while marker not in _text(cut_log):
            assert interrupted.poll() is None, f"the run ended before the kill point:\n{_text(cut_log)[-3000:]}"
            assert time.monotonic() < deadline, "the kill point was not reached in time"
            time.sleep(0.02)
        os.kill(interrupted.pid, signal.SIGKILL)
        interrupted.wait()
        assert interrupted.returncode == -signal.SIGKILL

        # killed mid-epoch: the last checkpoint is that of the epoch before, and the next epoch had begun
        last_pt = cut_root / "models" / "global" / "last.pt"
        at_kill = _load(last_pt)["trainer"]
        epoch_length = at_kill["epoch_length"]
        assert epoch_length == 8
        assert at_kill["iteration"] == (KILL_IN_EPOCH - 1) * epoch_length, "the kill came after the epoch's end"
        assert any(e == KILL_IN_EPOCH for e, _, _ in _iterations(cut_log))
        assert not [p for p in last_pt.parent.iterdir() if p.name.endswith(".tmp")]

        resumed = _start(cut_root, small_datalist, resume_log, "--resume", "true")
        _wait(resumed, resume_log)
        _wait(reference, ref_log)
    finally:
        for proc in (reference, interrupted):
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    # the resumed process trained the remaining epochs only, with the same losses and validation results
    ref_iters, resumed_iters = _iterations(ref_log), _iterations(resume_log)
    assert len(ref_iters) == EPOCHS * epoch_length
    assert [(e, i) for e, i, _ in resumed_iters] == [(e, i) for e, i, _ in ref_iters if e >= KILL_IN_EPOCH]
    assert resumed_iters == [x for x in ref_iters if x[0] >= KILL_IN_EPOCH]
    ref_val, resumed_val = _validations(ref_log), _validations(resume_log)
    assert sorted(ref_val) == list(range(1, EPOCHS + 1))
    assert resumed_val == {e: line for e, line in ref_val.items() if e >= KILL_IN_EPOCH}

    # same epoch count, best key metric and its epoch, and final state, bit for bit
    ref_last, resumed_last = _load(ref_root / "models/global/last.pt"), _load(cut_root / "models/global/last.pt")
    assert dict(resumed_last["trainer"]) == {
        "epoch_length": epoch_length,
        "iteration": EPOCHS * epoch_length,
        "max_epochs": EPOCHS,
    }
    assert_identical(dict(resumed_last["trainer"]), dict(ref_last["trainer"]), "trainer")
    assert_identical(resumed_last["best_metric"], ref_last["best_metric"], "best_metric")
    assert ref_last["best_metric"]["best_metric_epoch"] in range(1, EPOCHS + 1)
    assert_identical(resumed_last["network"], ref_last["network"], "network")
    assert_identical(resumed_last["optimizer"], ref_last["optimizer"], "optimizer")
    assert_identical(resumed_last["lr_scheduler"], ref_last["lr_scheduler"], "lr_scheduler")
    assert_identical(_load(cut_root / "models/global/model.pt"), _load(ref_root / "models/global/model.pt"), "model.pt")
