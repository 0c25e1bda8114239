"""glam_benchmark/performance/training.py: the memory fit, the table, and each mode at a tiny size (figures are not
asserted: they are machine-dependent and recorded in docs/performance.md)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO_ROOT

MODULE = "glam_benchmark.performance.training"
TINY = ["--height", "256", "--width", "160", "--patch", "64", "--local-depth", "18", "--local-width", "4"]


def _tool():
    return importlib.import_module("glam_benchmark.performance.training")


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
        [sys.executable, "-m", MODULE, "speed", *TINY, "--k", "2", "--repeats", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
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
        [sys.executable, "-m", MODULE, "_peak", *TINY, "--k", "2", "--checkpointing"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
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
        res = subprocess.run(
            [sys.executable, "-m", MODULE, "speed", *args], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
        )
        assert res.returncode == 2 and message in res.stderr


def test_largest_fitting_k_doubles_bisects_and_stops_at_the_images_limit():
    tool = _tool()
    asked: list[int] = []

    def fits_up_to(n: int):
        def fits(k: int) -> bool:
            asked.append(k)
            return k <= n

        return fits

    assert tool.largest_fitting(fits_up_to(9), 15) == 9 and max(asked) <= 15
    asked.clear()
    assert tool.largest_fitting(fits_up_to(100), 15) == 15 and max(asked) == 15  # the image's limit, not 16
    assert tool.largest_fitting(fits_up_to(0), 15) == 0
    assert tool.largest_fitting(fits_up_to(1), 1) == 1


@pytest.mark.parametrize("size, patch, expected", [((2944, 1920), 512, 15), ((736, 480), 128, 15), ((256, 160), 64, 8)])
def test_max_patches_counts_the_disjoint_patch_windows_on_the_global_map(size, patch, expected):
    """2944x1920 with 512 px patches: S_g is 184x120 (stride 16), a patch 32x32 cells, 5 x 3 = 15 windows (the K = 16
    the GPU search asked for did not fit); 256x160 with 64 px: 16x10 cells of 4x4, 4 x 2 = 8."""
    import argparse

    assert _tool().max_patches(argparse.Namespace(height=size[0], width=size[1], patch=patch)) == expected


def test_pipeline_measures_every_stage_of_the_input_pipeline(tmp_path, tiny_datalist):
    """One run on the tiny data: decode, the cached half and its transforms, the loader, the per-step half and its
    transforms, the model-only and the whole training step, with the whole step's fraction of the model's speed."""
    out = tmp_path / "pipeline.json"
    pinned = tmp_path / "pinned.yaml"  # as train.yaml has it on CUDA (on a CPU, DataLoader ignores it)
    pinned.write_text("pin_memory: true\n")
    cmd = [sys.executable, "-m", MODULE, "pipeline", "--datalist", tiny_datalist, "--config"]
    cmd += [str(REPO_ROOT / "tests" / "configs" / "tiny.yaml"), str(pinned), *TINY]
    cmd += ["--k", "2", "--batch", "2", "--num-workers", "1"]
    cmd += ["--steps", "3", "--warmup", "1", "--repeats", "1", "--loader-epochs", "1", "--json", str(out)]
    cmd += ["--cache-dir", str(tmp_path / "cache")]
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {r["measure"]: r for r in json.loads(out.read_text())["rows"]}
    for measure in (
        "decode the image file once",
        "cached half (fill)",
        "fill the disk cache",
        "loader, disk cache warm",
        "loader, disk cache warm, memory not pinned",
        "per-step half on the device",
        "model-only step",
        "whole training step",
    ):
        assert rows[measure]["images_per_s"] > 0, measure
        assert rows[measure]["ms_per_image"] == pytest.approx(1000 / rows[measure]["images_per_s"])
    cached = {m.split(": ", 1)[1]: r["share"] for m, r in rows.items() if m.startswith("cached: ")}
    steps = {m.split(": ", 1)[1]: r["share"] for m, r in rows.items() if m.startswith("per-step: ")}
    assert {"LoadImaged", "CropBreastd", "BestCenterRegiond", "QuantizeToUint16d"} <= set(cached)
    assert set(steps) == {
        "RandWindowShiftd",
        "StandardizeImaged",
        "RandAdjustContrastd",
        "RandScaleIntensityd",
        "RandShiftIntensityd",
    }
    assert sum(cached.values()) == pytest.approx(1) and sum(steps.values()) == pytest.approx(1)
    whole = rows["whole training step"]
    assert whole["of_model_only"] == pytest.approx(whole["images_per_s"] / rows["model-only step"]["images_per_s"])
    assert len(list((tmp_path / "cache").glob("*.pt"))) == len(json.loads(open(tiny_datalist).read())["training"])
