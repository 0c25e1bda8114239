"""Repository command-line tools of the core: checkpoint conversion."""

import subprocess
import sys

import torch
from conftest import REPO_ROOT
from convert_nyukat_checkpoint import load_nyukat_glam
from nyukat_layout import authors_state_dict

from scripts.networks import GLAM


def run(*args, cwd=REPO_ROOT):
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True)


def test_convert_cli_round_trip(tmp_path):
    sd = authors_state_dict(seed=11, joint=True)
    src, dst = tmp_path / "authors.pth", tmp_path / "out" / "converted.pt"
    torch.save(sd, src)
    res = run(REPO_ROOT / "tools" / "convert_nyukat_checkpoint.py", src, dst)
    assert res.returncode == 0, res.stderr
    assert "dropped 4 unused tensors" in res.stdout and "included: True" in res.stdout
    converted = torch.load(dst, weights_only=True)
    model = GLAM.reference(joint_modules=True)
    model.load_state_dict(converted, strict=True)
    expected = load_nyukat_glam(sd).state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())


def test_convert_cli_names_the_bad_key(tmp_path):
    sd = authors_state_dict(seed=12)
    del sd["detection_network.gn_conv_last.weight"]
    src = tmp_path / "broken.pth"
    torch.save(sd, src)
    res = run(REPO_ROOT / "tools" / "convert_nyukat_checkpoint.py", src, tmp_path / "x.pt")
    assert res.returncode == 1
    assert "missing key for 'local_network.gn_conv_last.weight'" in res.stderr
    assert not (tmp_path / "x.pt").exists()


def test_convert_cli_rejects_a_file_that_is_not_a_checkpoint(tmp_path):
    src = tmp_path / "notes.pth"
    src.write_text("not a checkpoint")
    res = run(REPO_ROOT / "tools" / "convert_nyukat_checkpoint.py", src, tmp_path / "x.pt")
    assert res.returncode == 2 and "cannot read" in res.stderr and "notes.pth" in res.stderr
