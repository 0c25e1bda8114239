"""python -m glam_benchmark.demo: one forward pass of a random GLAM on a synthetic mammogram."""

import subprocess
import sys

from conftest import REPO_ROOT


def test_demo_prints_predictions_and_writes_a_png(tmp_path):
    out = tmp_path / "demo.png"
    res = subprocess.run(
        [sys.executable, "-m", "glam_benchmark.demo", "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert "y_global (benign, malignant)" in res.stdout
    from PIL import Image

    with Image.open(out) as im:
        assert im.size == (4 * 480, 736)
