"""A rerun decides what is done by the file an input path resolves to, not by how the path is spelled
(bundle/scripts/inference/folder.py): the same input folder given by an absolute path, a relative one or through a
linked folder is one set of inputs, run once, under one stem each."""

from __future__ import annotations

import csv
import os

import pytest
import torch
from test_inference_workflow import INFERENCE_CONFIG, TINY, TINY_INFERENCE, _run

N_IMAGES = 4


@pytest.fixture
def images_and_model(tmp_path):
    from glam_benchmark.synthetic import make_synthetic_dataset
    from scripts.networks import GLAMSaliencyNet

    make_synthetic_dataset(tmp_path / "a", N_IMAGES, size=(256, 160), seed=21, fmt="png")
    torch.manual_seed(0)
    ckpt = tmp_path / "model.pt"
    torch.save(GLAMSaliencyNet(stage="joint", **TINY).state_dict(), ckpt)
    return tmp_path, ckpt


def _rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_the_same_folder_spelled_otherwise_is_not_run_again(images_and_model, monkeypatch, caplog):
    root, ckpt = images_and_model
    out = root / "out"
    os.symlink(root / "a", root / "linked")
    common = {"output_dir": str(out), "ckpt_path": str(ckpt)}
    _run([INFERENCE_CONFIG, TINY_INFERENCE], {**common, "input_dir": str(root / "a" / "images")})
    first = _rows(out / "predictions.csv")
    assert len(first) == N_IMAGES
    first_breasts = _rows(out / "breasts.csv")
    assert sum(int(b["images"]) for b in first_breasts) == N_IMAGES
    snapshot = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "timing.json"}

    monkeypatch.chdir(root)
    for spelling in ("a/images", "./a/../a/images/", "linked/images", str(root / "linked" / "images")):
        caplog.clear()
        with caplog.at_level("INFO", logger="scripts"):
            _run([INFERENCE_CONFIG, TINY_INFERENCE], {**common, "input_dir": spelling})
        assert f"resuming: {N_IMAGES} of {N_IMAGES} inputs are done already (skipped)" in caplog.text, spelling
        rows = _rows(out / "predictions.csv")
        assert len(rows) == N_IMAGES, spelling  # one row per image
        assert sorted(r["output_stem"] for r in rows) == sorted(r["output_stem"] for r in first), spelling
        assert not any(r["output_stem"].endswith("_2") for r in rows)
        assert _rows(out / "breasts.csv") == first_breasts, spelling  # each image counted once
    # nothing was rewritten
    assert {p: p.read_bytes() for p in snapshot} == snapshot


def test_one_file_listed_under_two_spellings_is_run_once(images_and_model, monkeypatch, tmp_path):
    root, ckpt = images_and_model
    monkeypatch.chdir(root)
    image = sorted((root / "a" / "images").iterdir())[0]
    datalist = {"test": [{"image": os.path.relpath(image, root)}, {"image": str(image)}]}
    out = tmp_path / "out"
    _run(
        [INFERENCE_CONFIG, TINY_INFERENCE],
        {"datalist": datalist, "output_dir": str(out), "ckpt_path": str(ckpt), "input_dir": ""},
    )
    rows = _rows(out / "predictions.csv")
    assert [(r["image"], r["output_stem"]) for r in rows] == [(os.path.relpath(image, root), image.stem)]
