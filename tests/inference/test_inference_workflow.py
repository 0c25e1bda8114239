"""The inference workflow (bundle/configs/inference.yaml) on tiny synthetic PNG and DICOM inputs with a randomly
initialised tiny GLAMSaliencyNet: files, geometry on the original image, probabilities, errors.csv, the reference
preset and datalist mode. The comparisons with an independent forward pass run in float32 (``precision: fp32`` in
tests/configs/tiny_inference.yaml, true float32 on CUDA too) on the workflow's own device."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from conftest import BUNDLE_ROOT, REPO_ROOT, workflow_command

INFERENCE_CONFIG = BUNDLE_ROOT / "configs" / "inference.yaml"
REFERENCE_CONFIG = BUNDLE_ROOT / "configs" / "inference_reference.yaml"
TINY_INFERENCE = REPO_ROOT / "tests" / "configs" / "tiny_inference.yaml"
META = BUNDLE_ROOT / "configs" / "metadata.json"
TINY = dict(patch_size=64, local_depth=18, local_width=4, image_size=(256, 160))
MAPS = ("S_g", "S_l", "S_c")
#: every output (the default is S_c and the panel)
ALL_OUTPUTS = ["S_g", "S_l", "S_c", "png", "panel"]
#: the maps are stored as round(map x 65535): read back within half a step
MAP_TOLERANCE = 0.5 / 65535 + 1e-7
CORRUPT = "SYN00000_M_corrupt.png"  # sorts between the L and R views: in the middle of the folder


def _run(config_files, overrides: dict) -> None:
    from monai.bundle import ConfigWorkflow

    wf = ConfigWorkflow(
        config_file=[str(f) for f in config_files], meta_file=str(META), workflow_type="infer", **overrides
    )
    wf.initialize()
    wf.run()
    wf.finalize()


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _nifti_maps(path: Path) -> np.ndarray:
    """(W, H, 1, 1, 2) file -> (2, H, W)."""
    data = np.asarray(nib.load(str(path)).get_fdata(), dtype=np.float32)
    assert data.ndim == 5 and data.shape[2:4] == (1, 1) and data.shape[4] == 2
    return data[:, :, 0, 0, :].transpose(2, 1, 0)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict:
    from glam_benchmark.synthetic import make_synthetic_dataset
    from scripts.networks import GLAMSaliencyNet

    root = tmp_path_factory.mktemp("inference")
    png = make_synthetic_dataset(root / "png", 4, size=(256, 160), seed=1, fmt="png")
    make_synthetic_dataset(root / "dcm", 4, size=(256, 160), seed=2, fmt="dcm", facing="native")
    folder = root / "in"
    folder.mkdir()
    for f in sorted((root / "png" / "images").iterdir()):
        shutil.copy(f, folder / f"png_{f.name}")
    for f in sorted((root / "dcm" / "images").iterdir()):
        shutil.copy(f, folder / f.name)
    (folder / CORRUPT).write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a png" * 4)
    torch.manual_seed(0)
    ckpt = root / "model.pt"
    torch.save(GLAMSaliencyNet(stage="joint", **TINY).state_dict(), ckpt)
    out = root / "out"
    overrides = {"input_dir": str(folder), "output_dir": str(out), "ckpt_path": str(ckpt), "outputs": ALL_OUTPUTS}
    _run([INFERENCE_CONFIG, TINY_INFERENCE], overrides)
    return {"root": root, "folder": folder, "ckpt": ckpt, "out": out, "png_datalist": png}


def test_every_good_image_has_all_outputs_on_the_original_geometry(inputs):
    from scripts.data.readers import read_mammogram

    out, folder = inputs["out"], inputs["folder"]
    rows = _read_csv(out / "predictions.csv")
    good = sorted(str(p) for p in folder.iterdir() if p.name != CORRUPT)
    assert sorted(r["image"] for r in rows) == good  # the corrupt file in the middle lost nothing
    for row in rows:
        original, _ = read_mammogram(row["image"])
        assert (int(row["height"]), int(row["width"])) == original.shape
        p = [float(row["prob_benign"]), float(row["prob_malignant"])]
        assert all(0.0 <= v <= 1.0 for v in p)
        assert row["label_benign"] == row["label_malignant"] == ""  # a folder has no labels
        stem = row["output_stem"]
        for name in MAPS:
            maps = _nifti_maps(out / "maps" / f"{stem}_{name}.nii.gz")
            assert maps.shape == (2, *original.shape)
            assert maps.min() >= 0.0 and maps.max() <= 1.0
            stored = np.asarray(nib.load(str(out / "maps" / f"{stem}_{name}.nii.gz")).dataobj.get_unscaled())
            assert stored.dtype == np.uint16  # 16-bit integers, scaled by 1/65535 on reading
            for c, cls in enumerate(("benign", "malignant")):
                png = np.asarray(read_mammogram(out / "maps" / f"{stem}_{name}_{cls}.png", mask=True)[0])
                assert png.shape == original.shape
                np.testing.assert_array_equal(png, np.round(maps[c] * 65535))
        from PIL import Image

        panel = Image.open(out / "panels" / f"{stem}_panel.png")
        assert panel.mode == "RGB" and panel.height > original.shape[0] and panel.width >= 4 * original.shape[1]
        listed = sorted(row["files"].split(";"))
        assert listed == sorted(
            [f"maps/{stem}_{m}{ext}" for m in MAPS for ext in (".nii.gz", "_benign.png", "_malignant.png")]
            + [f"panels/{stem}_panel.png"]
        )
    assert not [p for p in out.rglob(".*") if p.is_file()]  # atomic writes leave no temporary files


def test_errors_csv_names_the_corrupt_file_and_why(inputs):
    errors = [e for e in _read_csv(inputs["out"] / "errors.csv") if e["error"]]  # the others are notes
    assert len(errors) == 1
    assert errors[0]["image"] == str(inputs["folder"] / CORRUPT)
    assert "MammogramReadError" in errors[0]["error"] and "not a readable image" in errors[0]["error"]


def _independent_window_maps(path: str, ckpt: Path):
    """Preprocess and run the model directly (in float32, on the device the workflow uses), render S_l and S_c at
    full window resolution."""
    from config_chains import inference_chains

    from scripts.inference.step import _exact_float32
    from scripts.networks import GLAMSaliencyNet

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")  # inference.yaml's device
    t, _ = inference_chains(image_size=[256, 160], crop_iterations=5, crop_buffer=4)  # inference.yaml's own
    d = t({"image": path})
    net = GLAMSaliencyNet(stage="joint", **TINY)
    net.load_state_dict(torch.load(ckpt, weights_only=True), strict=True)
    net.to(device).eval()
    with torch.no_grad(), _exact_float32(device):
        outputs = net.forward_all(d["image"].as_tensor()[None].to(device))
        full = net.full_resolution(outputs, (256, 160))
    outputs = {k: v.cpu() for k, v in outputs.items() if isinstance(v, torch.Tensor)}
    return d["image"].meta, outputs, {"S_c": full["S_c"][0].cpu().numpy(), "S_l": full["S_l"][0].cpu().numpy()}


def test_inverted_map_matches_the_window_map_through_flip_crop_and_padding(inputs):
    """For a mirrored DICOM: every original pixel inside the crop and the window holds the window map's value at
    (row + offset, mirrored column + offset); every other pixel is 0; the patch boxes cover exactly where S_l > 0."""
    from scripts.data.readers import read_mammogram

    rows = {Path(r["image"]).name: r for r in _read_csv(inputs["out"] / "predictions.csv")}
    name = "SYN00000_R_MLO.dcm"  # a right breast stored facing left: mirrored by the preprocessing
    row = rows[name]
    path = str(inputs["folder"] / name)
    H, W = read_mammogram(path)[0].shape
    meta, outputs, window_maps = _independent_window_maps(path, inputs["ckpt"])
    assert bool(meta["flipped_to_right"])
    top, left = (int(v) for v in np.asarray(meta["window_start"]).reshape(-1)[:2])
    c0, c1, c2, c3 = (int(v) for v in np.asarray(meta["crop_box"]).reshape(-1)[:4])  # top, left, bottom, right
    rr, cc = np.meshgrid(np.arange(H), np.arange(W), indexing="ij")
    col_flipped = W - 1 - cc  # original column -> column of the mirrored image
    win_r, win_c = rr - c0 - top, col_flipped - c1 - left
    inside = (rr >= c0) & (rr < c2) & (col_flipped >= c1) & (col_flipped < c3)
    inside &= (win_r >= 0) & (win_r < 256) & (win_c >= 0) & (win_c < 160)
    assert inside.sum() > 0.5 * H * W and (~inside).any()  # the crop removed something: the check is not trivial
    for map_name in ("S_c", "S_l"):
        back = _nifti_maps(inputs["out"] / "maps" / f"{row['output_stem']}_{map_name}.nii.gz")
        expected = np.zeros((2, H, W), np.float32)
        expected[:, inside] = window_maps[map_name][:, win_r[inside], win_c[inside]]
        np.testing.assert_allclose(back, expected, atol=MAP_TOLERANCE, rtol=0)

    # patch boxes: from the model's window boxes through the same offsets, and S_l > 0 exactly on them
    boxes = []
    for r, c, h, w in outputs["patch_boxes"][0].tolist():
        r0, r1 = r + top + c0, r + h + top + c0
        f0, f1 = c + left + c1, c + w + left + c1  # columns of the mirrored image
        boxes.append((max(0, r0), max(0, W - f1), min(H, r1), min(W, W - f0)))
    assert boxes and row["patch_boxes"] == ";".join(" ".join(str(v) for v in b) for b in boxes)
    # S_l > 0 exactly on the boxes (values below half a 16-bit step are stored as 0: compared on the window map)
    s_l = _nifti_maps(inputs["out"] / "maps" / f"{row['output_stem']}_S_l.nii.gz").max(axis=0)
    window_s_l = np.zeros((H, W), np.float32)
    window_s_l[inside] = window_maps["S_l"].max(axis=0)[win_r[inside], win_c[inside]]
    covered = np.zeros((H, W), bool)
    for t, lft, b, rgt in boxes:
        covered[t:b, lft:rgt] = True
    np.testing.assert_array_equal(window_s_l > 0, covered & inside)
    np.testing.assert_array_equal(s_l > 0, window_s_l >= 0.5 / 65535)


def test_batch_of_only_failures_and_bad_inputs(tmp_path):
    from scripts.inference.inputs import collate_inference, inference_items
    from scripts.inference.step import GLAMInferenceStep

    records = [{"image": "a.png", "error": "ValueError: x", "load_s": 0.25}, {"image": "b.png", "error": "E: y"}]
    batch = collate_inference(records)
    assert batch["image"] is None and batch["items"] == [] and len(batch["errors"]) == 2
    assert batch["load_s"] == 0.25  # the loading seconds travel with the batch for timing.json
    assert GLAMInferenceStep()(None, batch)["pred"] is None  # the network is not called
    with pytest.raises(ValueError, match="holds no file of a supported type"):
        inference_items(tmp_path)
    with pytest.raises(ValueError, match="is not a folder"):
        inference_items(tmp_path / "missing")
    with pytest.raises(ValueError, match="no split 'test'"):
        inference_items(datalist={"training": [{"image": "x.png"}]}, split="test")
    (tmp_path / "a.dcm").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not an image")
    datalist = {"test": [{"image": "x.png", "label": [0, 1]}]}
    # a folder given on the command line wins over a datalist that a preset brings
    assert inference_items(tmp_path, datalist)[0] == {"image": str(tmp_path / "a.dcm")}
    assert inference_items("", datalist) == datalist["test"]


@pytest.mark.slow
def test_cli_reference_preset_on_a_datalist(inputs, tmp_path):
    """The command line with the reference overlay (sizes from the tiny preset) on a datalist with labels and masks:
    the network has the authors' inference layout, labels reach predictions.csv."""
    from scripts.data import load_datalist
    from scripts.networks import GLAMSaliencyNet

    torch.manual_seed(1)
    net = GLAMSaliencyNet(
        stage="local", aggregation="concat", global_pool_after_upsampling=True, t_local=0.3, joint_modules=False, **TINY
    )
    ckpt = tmp_path / "reference.pt"
    torch.save(net.state_dict(), ckpt)
    datalist = inputs["png_datalist"]
    split = next(k for k, v in load_datalist(datalist).items() if v)
    out = tmp_path / "out"
    configs = [str(INFERENCE_CONFIG), str(REFERENCE_CONFIG), str(TINY_INFERENCE)]
    cmd = [
        *workflow_command("inference"),
        "--config_file",
        json.dumps(configs),
    ]
    cmd += ["--meta_file", str(META), "--datalist", str(datalist), "--split", split, "--output_dir", str(out)]
    cmd += ["--ckpt_path", str(ckpt)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _read_csv(out / "predictions.csv")
    items = load_datalist(datalist)[split]
    assert len(rows) == len(items) and _read_csv(out / "errors.csv") == []
    by_name = {Path(r["image"]).name: r for r in rows}
    for item in items:
        row = by_name[Path(item["image"]).name]
        assert [int(row["label_benign"]), int(row["label_malignant"])] == list(item["label"])
        assert len(row["patch_boxes"].split(";")) == 1  # M = 1


def test_inference_without_weights_stops_with_one_line_naming_the_file(tmp_path):
    missing = tmp_path / "nowhere" / "model.pt"
    cmd = [
        *workflow_command("inference"),
        "--config_file",
        str(INFERENCE_CONFIG),
    ]
    cmd += ["--meta_file", str(META), "--input_dir", str(tmp_path), "--output_dir", str(tmp_path / "out")]
    cmd += ["--ckpt_path", str(missing), "--bundle_root", "bundle"]  # the documented command line
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: model weights not found: {missing}: ") and "--ckpt_path" in last
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_dicom_with_zero_or_missing_pixel_spacing_gets_maps_and_a_warning(inputs, tmp_path, caplog):
    """Spacing 0 (written by some exporters) or absent: the maps are written, stating 1 mm pixels, with a warning
    naming the file (nibabel refused the zero affine before: 'Could not decompose affine' in errors.csv)."""
    from _dicom_factory import make_dicom

    from scripts.data import read_mammogram

    pixels = np.zeros((256, 160), np.uint16)
    pixels[40:220, :110] = 1500
    pixels[100:120, 50:70] = 3000
    folder = tmp_path / "in"
    folder.mkdir()
    zero = make_dicom(folder / "zero_spacing.dcm", pixels, spacing=(0.0, 0.0))
    missing = make_dicom(folder / "no_spacing.dcm", pixels, spacing=None)
    good = make_dicom(folder / "good_spacing.dcm", pixels, spacing=(0.07, 0.08))
    assert read_mammogram(zero)[1]["spacing"] is None and read_mammogram(missing)[1]["spacing"] is None
    out = tmp_path / "out"
    with caplog.at_level("WARNING", logger="scripts.inference.writer"):
        _run(
            [INFERENCE_CONFIG, TINY_INFERENCE],
            {"input_dir": str(folder), "output_dir": str(out), "ckpt_path": str(inputs["ckpt"])},
        )
    notes = {Path(r["image"]).name: r["note"] for r in _read_csv(out / "errors.csv") if not r["error"]}
    assert set(notes) == {"zero_spacing.dcm", "no_spacing.dcm"} and len(_read_csv(out / "errors.csv")) == 2
    rows = {Path(r["image"]).name: r for r in _read_csv(out / "predictions.csv")}
    assert set(rows) == {"zero_spacing.dcm", "no_spacing.dcm", "good_spacing.dcm"}
    assert rows["good_spacing.dcm"]["spacing_source"] in ("ImagerPixelSpacing", "file")  # the reader's name, if any
    assert rows["no_spacing.dcm"]["spacing_source"] == rows["zero_spacing.dcm"]["spacing_source"] == "unknown"
    for name, zooms in (("zero_spacing.dcm", (1.0, 1.0)), ("no_spacing.dcm", (1.0, 1.0)), (good.name, (0.08, 0.07))):
        nifti = nib.load(str(out / "maps" / f"{rows[name]['output_stem']}_S_c.nii.gz"))
        assert nifti.header.get_zooms()[:2] == pytest.approx(zooms)  # (x = column, y = row)
    warned = [r.getMessage() for r in caplog.records if "no valid pixel spacing" in r.getMessage()]
    assert sorted(Path(m.split(":")[0]).name for m in warned) == ["no_spacing.dcm", "zero_spacing.dcm"]
    assert all("1 mm per pixel" in m for m in warned)


def test_timing_json_counts_the_good_images_and_splits_the_wall_time(inputs):
    timing = json.loads((inputs["out"] / "timing.json").read_text())
    good = len(_read_csv(inputs["out"] / "predictions.csv"))
    assert timing["images"] == timing["written"] == good > 0 and timing["failed"] == 1 and timing["skipped"] == 0
    assert timing["images_per_s"] == pytest.approx(good / timing["wall_s"])
    assert timing["images_per_min"] == pytest.approx(60 * good / timing["wall_s"])
    parts = ("model", "waiting_for_data", "waiting_for_writers", "other")
    assert sum(timing[f"{k}_s"] for k in parts) == pytest.approx(timing["wall_s"])  # the wall time, split
    assert timing["model_share"] > 0 and all(0 <= timing[f"{k}_share"] < 1 for k in parts)
    for k in parts:
        assert timing[f"{k}_share"] == pytest.approx(timing[f"{k}_s"] / timing["wall_s"])
    # the work beside the engine: loading (every input, the corrupt one too) and the writer threads' parts
    assert timing["loading_s"] > 0 and timing["writer_threads"] >= 1
    writing_parts = sum(timing[f"writing_{k}_s"] for k in ("maps_back", "map_files", "panel", "dicom"))
    assert 0 < writing_parts <= timing["writing_s"] and timing["writing_dicom_s"] == 0.0


def test_default_outputs_are_the_s_c_map_and_the_panel(inputs, tmp_path):
    """Without ``outputs``: per image the S_c NIfTI and the panel (image | S_c), which its row lists; no S_g / S_l,
    no PNG maps. The S_c map is the one the full run wrote."""
    from PIL import Image

    out = tmp_path / "out"
    overrides = {"input_dir": str(inputs["folder"]), "output_dir": str(out), "ckpt_path": str(inputs["ckpt"])}
    _run([INFERENCE_CONFIG, TINY_INFERENCE], overrides)
    rows = _read_csv(out / "predictions.csv")
    full = {r["image"]: r for r in _read_csv(inputs["out"] / "predictions.csv")}
    assert sorted(r["image"] for r in rows) == sorted(full)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    stems = sorted(r["output_stem"] for r in rows)
    expected = [f"maps/{s}_S_c.nii.gz" for s in stems] + [f"panels/{s}_panel.png" for s in stems]
    expected += [f"manifests/{s}.json" for s in stems]  # what a rerun checks the files against
    assert files == sorted([*expected, "breasts.csv", "errors.csv", "predictions.csv", "run.json", "timing.json"])
    for row in rows:
        assert row["files"] == f"maps/{row['output_stem']}_S_c.nii.gz;panels/{row['output_stem']}_panel.png"
        assert row["prob_benign"] == full[row["image"]]["prob_benign"]
        np.testing.assert_array_equal(
            _nifti_maps(out / "maps" / f"{row['output_stem']}_S_c.nii.gz"),
            _nifti_maps(inputs["out"] / "maps" / f"{full[row['image']]['output_stem']}_S_c.nii.gz"),
        )
        panel = Image.open(out / "panels" / f"{row['output_stem']}_panel.png")
        height, width = int(row["height"]), int(row["width"])
        assert panel.height > height and panel.width == 2 * width + 6  # two tiles: the image and S_c


def test_outputs_setting_is_checked():
    from scripts.inference.files import OutputSelection

    assert OutputSelection.parse(["S_c", "panel"]) == OutputSelection()
    selection = OutputSelection.parse("S_g, S_c ,png", dicom_outputs="both")
    assert selection.maps == ("S_g", "S_c") and selection.png and not selection.panel
    assert selection.dicom == ("sc", "map") and selection.names() == ["S_g", "S_c", "png", "dicom_sc", "dicom_map"]
    assert selection.files("x", dicom_input=False)["S_g_benign"] == "maps/x_S_g_benign.png"
    assert "dicom_sc" in selection.files("x", dicom_input=True) and "dicom_sc" not in selection.files("x", False)
    with pytest.raises(ValueError, match=r"unknown \['nifti'\]"):
        OutputSelection.parse(["S_c", "nifti"])
    with pytest.raises(ValueError, match="name at least one map"):
        OutputSelection.parse(["png", "panel"])
    with pytest.raises(ValueError, match="dicom_outputs must be one of"):
        OutputSelection.parse(["S_c"], dicom_outputs="pdf")
