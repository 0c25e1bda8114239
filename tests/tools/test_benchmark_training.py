"""scripts/benchmark_training.py: the memory fit, the table, and each mode at a tiny size (figures are not
asserted: they are machine-dependent and recorded in docs/performance.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "benchmark_training.py"
TINY = ["--height", "256", "--width", "160", "--patch", "64", "--local-depth", "18", "--local-width", "4"]


def _tool():
    if "benchmark_training" not in sys.modules:
        spec = importlib.util.spec_from_file_location("benchmark_training", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["benchmark_training"] = module
        spec.loader.exec_module(module)
    return sys.modules["benchmark_training"]


def test_fit_line_matches_numpy_polyfit():
    rng = np.random.default_rng(0)
    x = np.arange(1, 7, dtype=float)
    y = 3.5 + 1.25 * x + rng.normal(0, 0.1, x.size)
    a, b = _tool().fit_line(list(zip(x, y)))
    slope, intercept = np.polyfit(x, y, 1)
    assert a == pytest.approx(intercept, rel=1e-9) and b == pytest.approx(slope, rel=1e-9)


def test_markdown_table_has_every_key_once():
    text = _tool().markdown([{"k": 1, "step_s": 0.123456}, {"k": 2, "peak_gib": 1.5}])
    lines = text.splitlines()
    assert lines[0] == "| k | step_s | peak_gib |"
    assert lines[2] == "| 1 | 0.1235 |  |" and lines[3] == "| 2 |  | 1.5 |"


def test_speed_times_every_stage_and_writes_json(tmp_path):
    out = tmp_path / "speed.json"
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "speed", *TINY, "--k", "2", "--repeats", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(out.read_text())
    assert [r["stage"] for r in data["rows"]] == ["global", "local", "joint"]
    for r in data["rows"]:
        assert r["step_s"] > 0 and r["images_per_s"] == pytest.approx(1 / r["step_s"]) and r["peak_gib"] > 0
    assert "| global | 256 | 160 | 2 |" in res.stdout


def test_peak_of_one_configuration_runs_in_its_own_process():
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "_peak", *TINY, "--k", "2", "--checkpointing"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    row = json.loads(res.stdout.strip().splitlines()[-1])
    assert row["k"] == 2 and row["checkpointing"] is True and row["peak_gib"] >= row["before_step_gib"] > 0


def test_bad_arguments_are_named():
    for args, message in (
        (["--patch", "512", "--height", "256", "--width", "160"], "--patch 512 is larger"),
        (["--k", "0"], "--k must be >= 1"),
    ):
        res = subprocess.run([sys.executable, str(SCRIPT), "speed", *args], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and message in res.stderr
