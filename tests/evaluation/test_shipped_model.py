"""The shipped demonstration model (``bundle/models/model.pt``) works from a fresh clone without training.

It is GLAM trained by the CPU benchmark's recipe (``glam_benchmark/configs/benchmark_cpu.yaml``) on synthetic 736x480
images, and its checkpoint records those settings, so ``bundle/configs/inference.yaml`` runs it with no preset: the
documented command line is run here as a user runs it (a subprocess from the repository root), on synthetic PNG and
DICOM mammograms of its size.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from conftest import BUNDLE_ROOT, REPO_ROOT, workflow_command
from monai.bundle import ConfigParser
from PIL import Image

SHIPPED = BUNDLE_ROOT / "models" / "model.pt"
INFERENCE_CONFIG = BUNDLE_ROOT / "configs" / "inference.yaml"
TRAIN_CONFIG = BUNDLE_ROOT / "configs" / "train.yaml"
RECIPE = REPO_ROOT / "glam_benchmark" / "configs" / "benchmark_cpu.yaml"
SIZE = (736, 480)
#: the model zoo's limit on one file in a bundle (its CONTRIBUTING.md, "Model storage")
ZOO_FILE_LIMIT_BYTES = 25_000_000


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _recorded(network: torch.nn.Module) -> dict:
    """A network's settings as its checkpoints record them (JSON-normalised), without the informational version."""
    from scripts.networks.settings import SETTINGS_KEY, decode_settings

    settings = decode_settings(network.state_dict()[SETTINGS_KEY])
    settings.pop("bundle_version")
    return settings


def test_shipped_model_is_small_loads_strictly_and_records_the_cpu_benchmark_recipe():
    """<= 25 MB; its keys and shapes are exactly inference.yaml's network_def built with the defaults (no preset);
    its record equals network_def of train.yaml with glam_benchmark/configs/benchmark_cpu.yaml (stage joint), the
    bundle version aside."""
    from scripts.networks import checkpoint_setting, read_checkpoint_settings
    from scripts.networks.settings import INFERENCE_CHOICES, SETTINGS_KEY
    from scripts.networks.weights import load_weights

    assert SHIPPED.is_file(), f"{SHIPPED} is missing (it is part of the repository)"
    assert 1_000_000 < SHIPPED.stat().st_size <= ZOO_FILE_LIMIT_BYTES

    parser = ConfigParser()
    parser.read_config(str(INFERENCE_CONFIG))
    parser["bundle_root"] = str(BUNDLE_ROOT)  # ckpt_path defaults to <bundle_root>/models/model.pt
    assert Path(parser.get_parsed_content("ckpt_path")) == SHIPPED
    network = parser.get_parsed_content("network_def")
    state = torch.load(SHIPPED, map_location="cpu", weights_only=True)
    expected = network.state_dict()
    assert set(state) == set(expected)
    # the settings record's buffer holds the encoded text, whose length follows the bundle version: compared below
    assert all(state[k].shape == v.shape for k, v in expected.items() if k != SETTINGS_KEY)
    load_weights(network, SHIPPED)  # strict, and the settings record is checked against the network's

    recipe = ConfigParser()
    recipe.read_config([str(TRAIN_CONFIG), str(RECIPE)])
    recipe["stage"] = "joint"  # train.yaml's 'all' runs the stages in turn; the shipped model is the joint one
    trained = _recorded(recipe.get_parsed_content("network_def"))
    record = read_checkpoint_settings(SHIPPED)
    assert record is not None and record.pop("bundle_version")
    # the model predates one setting, recorded nowhere in it; it was trained with, and is rebuilt with, its default
    predated = {name: trained[name] for name in set(trained) - set(record)}
    assert predated == {"local_padding_mode": "zeros"} and checkpoint_setting(SHIPPED, "local_padding_mode") == "zeros"
    record.update(predated)
    assert record == trained
    # what the task asked to ship: the CPU benchmark's geometry
    assert record["image_size"] == list(SIZE) and record["pixel_spacing"] == [0.4, 0.4]
    assert record["patch_size"] == [128, 128] and (record["local_depth"], record["local_width"]) == (18, 16)
    assert record["joint_modules"] and record["pool_in_breast"]
    # inference.yaml rebuilt the trained network from the record alone (M, K and gamma_c are inference choices)
    rebuilt = _recorded(network)
    assert {k: v for k, v in rebuilt.items() if k not in INFERENCE_CHOICES} == {
        k: v for k, v in record.items() if k not in INFERENCE_CHOICES
    }


@pytest.fixture(scope="module")
def shipped_run(tmp_path_factory) -> dict:
    """``monai.bundle run inference`` as docs/inference.md gives it, default ckpt_path, on 2 PNG and 1 DICOM (a
    right breast stored as the detector sees it, so the flip is undone on the way back)."""
    from glam_benchmark.synthetic import make_synthetic_dataset

    root = tmp_path_factory.mktemp("shipped")
    make_synthetic_dataset(root / "png", 2, size=SIZE, seed=31, fmt="png", lesion_prevalence=1.0)
    make_synthetic_dataset(root / "dcm", 3, size=SIZE, seed=32, fmt="dcm", facing="native", lesion_prevalence=1.0)
    inputs = root / "in"
    inputs.mkdir()
    files = [shutil.copy(f, inputs / f.name) for f in sorted((root / "png" / "images").iterdir())]
    files.append(shutil.copy(root / "dcm" / "images" / "SYN00000_R_CC.dcm", inputs / "dcm_SYN00000_R_CC.dcm"))
    out = root / "out"
    cmd = [
        *workflow_command("inference"),
        "--config_file",
        "bundle/configs/inference.yaml",
    ]
    cmd += ["--meta_file", "bundle/configs/metadata.json", "--bundle_root", "bundle"]
    cmd += ["--input_dir", str(inputs), "--output_dir", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return {"files": [Path(f) for f in files], "out": out, "log": proc.stdout + proc.stderr}


@pytest.mark.slow
def test_shipped_model_runs_from_the_documented_command(shipped_run):
    from scripts.data.readers import read_mammogram

    out = shipped_run["out"]
    errors = _read_csv(out / "errors.csv")
    assert [e["error"] for e in errors if e["error"]] == []
    rows = {Path(r["image"]).name: r for r in _read_csv(out / "predictions.csv")}
    # the PNGs state their spacing (pHYs) and carry view and laterality in their names (SYN00000_L_CC.png); the DICOM
    # states all three in its tags: nothing was assumed. The shipped model crops with the authors' 100 iterations,
    # which cut this MLO's lower breast at its 0.4 mm (the tissue breast's box ends 127 rows lower): the crop placed on
    # the tissue breast says so, the only note
    noted = {Path(e["image"]).name: e["note"] for e in errors if e["note"]}
    assert list(noted) == ["SYN00000_L_MLO.png"], noted
    assert noted["SYN00000_L_MLO.png"].startswith("the authors' crop (the opened mask of pixels > 0) did not hold the")
    for f in shipped_run["files"]:
        row = rows[f.name]
        sources = ("filename", "filename") if f.suffix == ".png" else ("ViewPosition", "dicom")
        assert (row["view_source"], row["laterality_source"]) == sources, f.name
        assert (row["view"], row["laterality"]) == ("MLO" if "_MLO" in f.name else "CC", f.name.split("_")[-2]), f.name
    for f in shipped_run["files"]:
        assert rows[f.name]["spacing_source"] in ("pHYs", "ImagerPixelSpacing", "PixelSpacing", "file")
    assert set(rows) == {f.name for f in shipped_run["files"]}
    assert all(float(rows[name]["breast_in_window"]) >= 0.99 for name in rows), rows  # the MLO's whole breast too
    assert json.loads((out / "timing.json").read_text())["images"] == len(rows) == 3
    for f in shipped_run["files"]:
        row = rows[f.name]
        _, meta = read_mammogram(f)
        height, width = (int(s) for s in meta["shape"])
        assert (int(row["height"]), int(row["width"])) == (height, width) == SIZE
        probs = [float(row["prob_benign"]), float(row["prob_malignant"])]
        assert all(0.0 <= p <= 1.0 for p in probs)
        top, left, bottom, right = (int(v) for v in row["patch_boxes"].split())  # M = 1 patch
        assert 0 <= top < bottom <= height and 0 <= left < right <= width
        stem = row["output_stem"]
        # the default outputs: the S_c map and the panel, listed in the row; S_g, S_l and PNG maps only on request
        assert row["files"] == f"maps/{stem}_S_c.nii.gz;panels/{stem}_panel.png"
        assert not list((out / "maps").glob(f"{stem}_S_[gl]*")) and not list((out / "maps").glob(f"{stem}*.png"))
        nifti = nib.load(str(out / "maps" / f"{stem}_S_c.nii.gz"))
        assert nifti.shape == (width, height, 1, 1, 2)  # x = column, y = row, channels benign / malignant
        np.testing.assert_allclose(nifti.header.get_zooms()[:2], meta["spacing"][::-1], rtol=1e-3)
        s_c = np.asarray(nifti.dataobj, dtype=np.float32)
        assert np.isfinite(s_c).all() and s_c.min() >= 0.0 and s_c.max() <= 1.0
        assert s_c.max() - s_c.min() > 0.05  # the trained model's map varies over the image
        panel = Image.open(out / "panels" / f"{stem}_panel.png")
        assert panel.mode == "RGB" and panel.width == 2 * width + 6  # the image and S_c
