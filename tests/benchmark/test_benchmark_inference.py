"""glam_benchmark.performance.inference: one invocation generates the folder, decodes it, runs the documented inference
command and reports the run's split against decode + model time (here on two tiny images with a tiny model)."""

import json
import subprocess
import sys

import torch
from conftest import REPO_ROOT


def test_benchmark_reports_the_run_against_decode_plus_model_time(tmp_path):
    from scripts.enums import Stage
    from scripts.networks import GLAMSaliencyNet

    torch.manual_seed(0)
    ckpt = tmp_path / "tiny.pt"
    net = GLAMSaliencyNet(stage=Stage.JOINT, patch_size=64, local_depth=18, local_width=4, image_size=(256, 160))
    torch.save(net.state_dict(), ckpt)
    report = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "glam_benchmark.performance.inference", "--n", "2", "--size", "256", "160"]
    cmd += ["--data", str(tmp_path / "data"), "--weights", str(ckpt), "--json", str(report), "--copies", "2"]
    cmd += ["--", "--crop_iterations", "5", "--crop_buffer", "4", "--num_workers", "0"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(report.read_text())
    timing = result["timing"]
    assert timing["images"] == result["images"] == 4 and timing["failed"] == 0  # 2 images, 2 links to each
    assert result["decode_s"] == (result["decode_before_s"] + result["decode_after_s"]) / 2 > 0
    assert result["bound_s"] == result["decode_s"] + timing["model_s"]
    assert result["wall_over_bound"] == timing["wall_s"] / result["bound_s"]
    assert f"wall / (decode + model_s) = {timing['wall_s']:.2f}" in proc.stdout
    assert len(list((tmp_path / "data" / "images").glob("*.png"))) == 2
