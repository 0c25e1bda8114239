"""The whole breast in the model's window (issue 45, part 3): an MLO view whose breast reaches the top edge (the
pectoral muscle and the axilla up to row 0), stated by no pixel spacing, run through bundle/configs/inference.yaml at
the demonstration model's scale (a 736 x 480 window at 0.4 mm, the default crop_iterations 100 and crop_buffer 50;
a tiny randomly initialised GLAMSaliencyNet). The share of the breast inside the window is measured here against the
breast mask this test draws, independently of the bundle's breast mask, and compared with predictions.csv's
``breast_in_window``. The same file stating 0.1 mm pixels makes the breast larger than the window: the column says
so, and the note says why. The sample exam's MLO views (../shared) go through the same preprocessing."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import BUNDLE_ROOT, REPO_ROOT
from scipy import ndimage as ndi

INFERENCE_CONFIG = BUNDLE_ROOT / "configs" / "inference.yaml"
TINY_INFERENCE = REPO_ROOT / "tests" / "configs" / "tiny_inference.yaml"
META = BUNDLE_ROOT / "configs" / "metadata.json"
WINDOW, MODEL_MM = (736, 480), 0.4  # the demonstration model's window and spacing
TINY = dict(patch_size=64, local_depth=18, local_width=4, image_size=WINDOW, global_backbone={"width": 4})
# the inference defaults (bundle/configs/inference.yaml), which tiny_inference.yaml lowers for its tiny window
DEFAULTS = dict(image_size=list(WINDOW), crop_iterations=100, crop_buffer=50, panel_height=512)
SHAPE = (4096, 2560)  # rows, cols: a full-field detector's picture
UNSTATED, STATED = "mlo_unstated.dcm", "mlo_at_0.1mm.dcm"


def mlo_phantom(h: int, w: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A left MLO view facing right, (H, W) uint16, and its breast mask, shaped like the sample exam's MLO views (a
    tall, narrow breast: its widest 0.36 of its height): the chest wall at column 0; the breast's edge runs from 80 %
    of its widest at row 0 (the axilla) to its widest at 60 % of the height, and back to the chest wall at 93 % (the
    inframammary fold); the pectoral muscle, brighter, is a triangle from the top edge (60 % of the widest) to the
    chest wall at 45 % of the height. Textured tissue on a zero background."""
    t = np.arange(h, dtype=np.float64)[:, None] / h
    cols = np.arange(w, dtype=np.float64)[None, :]
    widest = 0.36 * 0.93 * h
    upper = 0.8 + 0.2 * np.clip(t / 0.6, 0, 1)
    lower = np.sqrt(np.clip(1 - ((t - 0.6) / 0.33) ** 2, 0, 1))
    edge = widest * np.where(t <= 0.6, upper, lower)
    breast = (cols < edge) & (t < 0.93)
    pectoral = cols < 0.6 * widest * (1 - t / 0.45)
    texture = np.random.default_rng(seed).integers(300, 2500, size=(h, w))
    image = np.where(breast, 800 + texture + 1000 * pectoral, 0).astype(np.uint16)
    return image, breast


def coverage(mask: np.ndarray, row: dict) -> float:
    """Share of the mask's pixels inside the window of a predictions.csv row (the test's own count)."""
    y0, x0, y1, x1 = (int(row[k]) for k in ("window_y0", "window_x0", "window_y1", "window_x1"))
    return float(mask[y0:y1, x0:x1].sum() / mask.sum())


def _read_csv(path: Path) -> dict[str, dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return {Path(r["image"]).name: r for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def mlo_run(tmp_path_factory) -> dict:
    from _dicom_factory import make_dicom
    from monai.bundle import ConfigWorkflow

    from scripts.networks import GLAMSaliencyNet

    root = tmp_path_factory.mktemp("breast_in_window")
    folder = root / "in"
    folder.mkdir()
    image, mask = mlo_phantom(*SHAPE, seed=0)
    make_dicom(folder / UNSTATED, image, spacing=None, view_position="MLO", laterality="L", patient_id="P1")
    make_dicom(folder / STATED, image, spacing=(0.1, 0.1), view_position="MLO", laterality="L", patient_id="P2")
    torch.manual_seed(0)
    ckpt = root / "model.pt"
    torch.save(GLAMSaliencyNet(stage="joint", pixel_spacing=MODEL_MM, **TINY).state_dict(), ckpt)
    out = root / "out"
    wf = ConfigWorkflow(
        config_file=[str(INFERENCE_CONFIG), str(TINY_INFERENCE)],
        meta_file=str(META),
        workflow_type="infer",
        input_dir=str(folder),
        output_dir=str(out),
        ckpt_path=str(ckpt),
        **DEFAULTS,
    )
    wf.initialize()
    wf.run()
    wf.finalize()
    notes = {Path(r["image"]).name: r["note"] for r in _read_csv(out / "errors.csv").values()}
    return {"rows": _read_csv(out / "predictions.csv"), "notes": notes, "mask": mask}


def test_the_whole_mlo_is_in_the_window_when_the_spacing_is_estimated(mlo_run):
    """The breast reaches row 0: with the spacing estimated the window holds >= 97 % of the test's own mask (the code
    before this change held 0.94 of it, rows 247 on: the crop's opening, 100 pixels at the model's scale where the
    breast is 221 pixels wide, cut the axilla and the top of the pectoral muscle away), and breast_in_window agrees
    with that count."""
    row, mask = mlo_run["rows"][UNSTATED], mlo_run["mask"]
    assert row["spacing_source"] == "fit_breast" and row["view"] == "MLO"
    share = coverage(mask, row)
    assert share >= 0.97
    assert int(row["window_y0"]) == 0  # the top edge, where the axilla is
    assert float(row["breast_in_window"]) >= 0.97
    assert float(row["breast_in_window"]) == pytest.approx(share, abs=0.01)
    assert "breast_in_window" not in mlo_run["notes"][UNSTATED]  # whole: no note about it


def test_a_stated_spacing_can_make_the_breast_larger_than_the_window(mlo_run):
    """At the stated 0.1 mm the breast is 3809 x 1371 file pixels, 952 x 343 model pixels: taller than the 736 x 480
    window. breast_in_window says how much it holds (as the test's own count does, within 0.01) and the note says
    why."""
    row, mask = mlo_run["rows"][STATED], mlo_run["mask"]
    assert row["spacing_source"] in ("ImagerPixelSpacing", "file") and float(row["spacing_row_mm"]) == 0.1
    share = coverage(mask, row)
    assert 0.3 < share < 0.9
    assert float(row["breast_in_window"]) == pytest.approx(share, abs=0.01)
    note = mlo_run["notes"][STATED]
    assert f"the model's 736 x 480 window holds {float(row['breast_in_window']):.3f} of the breast" in note
    assert "is larger than the window" in note


def test_the_panel_legend_states_the_share():
    from scripts.inference.panel import panel_title_lines

    facts = {"spacing_row_mm": "0.1", "spacing_col_mm": "0.1", "spacing_source": "file", "view": "MLO"}
    lines = panel_title_lines("a.dcm", [0.1, 0.2], ["", ""], ["S_c"], False, {**facts, "breast_in_window": "0.642"})
    assert "yellow: the model's window (holds 64% of the breast)" in lines[-1]
    whole = panel_title_lines("a.dcm", [0.1, 0.2], ["", ""], ["S_c"], False, {**facts, "breast_in_window": "1.000"})
    assert "(holds 100% of the breast)" in whole[-1]
    almost = panel_title_lines("a.dcm", [0.1, 0.2], ["", ""], ["S_c"], False, {**facts, "breast_in_window": "0.996"})
    assert "(holds 99.6% of the breast)" in almost[-1]


@pytest.mark.parametrize("view", ["L-MLO", "R-MLO"])
def test_the_sample_exams_mlo_views_are_whole_in_the_window(sample_exam, view):
    """The authors' sample MLO views (no spacing stated) through the inference preprocessing at the demonstration
    model's scale: the window holds >= 97 % of the breast, the largest connected region of pixels > 0 with its holes
    filled (scipy here, not the bundle's mask; the issue measured 0.82 on the L-MLO before), and breast_in_window
    agrees with that share."""
    from config_chains import inference_chains

    from scripts.data.readers import read_mammogram
    from scripts.inference.facts import image_facts
    from scripts.transforms.mammo.coverage import original_size, window_on_original

    path = sample_exam / "images" / f"0_{view}.png"
    pixels = read_mammogram(path)[0]
    labels, n = ndi.label(pixels > 0)
    breast = ndi.binary_fill_holes(labels == 1 + int(np.argmax(np.bincount(labels.ravel())[1:])))
    _, loading = inference_chains(pixel_spacing=MODEL_MM, image_size=list(WINDOW), panel_height=1024)
    item = loading({"image": str(path), "view": "MLO", "laterality": view[0]})
    meta = item["image"].meta
    y0, x0, y1, x1 = window_on_original(meta, original_size(meta))
    share = float(breast[y0:y1, x0:x1].sum() / breast.sum())
    assert str(meta["spacing_source"]) == "fit_breast" and share >= 0.97
    assert float(image_facts(item)["breast_in_window"]) == pytest.approx(share, abs=0.01)


def test_a_stated_spacings_crop_opening_counts_the_files_pixels(tmp_path):
    """The MLO stated at 0.07 mm fits the window (717 model rows). The crop's mask opening counts the file's pixels
    as the authors' does at full resolution: crop_iterations 100 is 7 mm, 100 x 0.07 / 0.4 = 17.5 model pixels
    (meta opening_scale), and the window holds the whole breast (the test's own count), axilla included, with no note.
    600 file pixels make the authors' crop cut the top away; the crop checks itself against the tissue breast and is
    placed on it instead (meta crop_source "tissue", said in the note), so the window still holds the whole breast
    (the code before held less than 0.99 of it)."""
    from _dicom_factory import make_dicom
    from config_chains import inference_chains

    from scripts.inference.facts import image_facts, image_notes
    from scripts.transforms.mammo.array import opening_iterations
    from scripts.transforms.mammo.coverage import original_size, window_on_original

    image, mask = mlo_phantom(*SHAPE, seed=0)
    path = make_dicom(tmp_path / "mlo_0.07.dcm", image, spacing=(0.07, 0.07), view_position="MLO", laterality="L")
    shares, items = {}, {}
    for iterations in (100, 600):
        sizes = dict(image_size=list(WINDOW), crop_iterations=iterations, crop_buffer=12, panel_height=1024)
        _, loading = inference_chains(pixel_spacing=MODEL_MM, **sizes)
        item = items[iterations] = loading({"image": str(path)})
        meta = item["image"].meta
        assert float(meta["opening_scale"]) == pytest.approx(0.07 / MODEL_MM)
        assert opening_iterations(item["image"], iterations) == round(iterations * 0.07 / MODEL_MM)
        y0, x0, y1, x1 = window_on_original(meta, original_size(meta))
        shares[iterations] = float(mask[y0:y1, x0:x1].sum() / mask.sum())
        assert int(meta["crop_box"][0]) == 0 and y0 == 0  # the top edge, where the axilla is
        assert float(image_facts(item)["breast_in_window"]) == pytest.approx(shares[iterations], abs=0.01)
    assert shares[100] >= 0.999 and shares[600] >= 0.999
    assert items[100]["image"].meta["crop_source"] == "authors"
    assert not any("breast_in_window" in n or "tissue" in n for n in image_notes(items[100], WINDOW))
    assert items[600]["image"].meta["crop_source"] == "tissue"
    assert any("placed on the largest tissue region" in n for n in image_notes(items[600], WINDOW))


def test_breast_in_window_sees_a_crop_that_cut_the_breast(tmp_path):
    """breast_in_window is measured against the tissue breast, which the crop's opening does not shape: a crop whose
    top lies 150 model rows down (as the authors' crop opened by 600 file pixels was) with crop_iterations 600 on
    record gives the share the test's own mask gives in that window (the code before measured against the authors'
    mask opened by the same 600 pixels, cut alike, and said 1.0)."""
    from _dicom_factory import make_dicom
    from config_chains import inference_chains

    from scripts.transforms.mammo.coverage import BREAST_IN_WINDOW, breast_in_window, original_size, window_on_original

    image, mask = mlo_phantom(*SHAPE, seed=0)
    path = make_dicom(tmp_path / "mlo_0.07.dcm", image, spacing=(0.07, 0.07), view_position="MLO", laterality="L")
    sizes = dict(image_size=list(WINDOW), crop_iterations=600, crop_buffer=12, panel_height=1024)
    _, loading = inference_chains(pixel_spacing=MODEL_MM, **sizes)
    item = loading({"image": str(path)})
    meta = item["image"].meta
    meta["crop_box"] = np.asarray(meta["crop_box"]) + np.array([150, 0, 0, 0])
    meta["crop_iterations"] = 600
    item.pop(BREAST_IN_WINDOW, None)
    y0, x0, y1, x1 = window_on_original(meta, original_size(meta))
    share = float(mask[y0:y1, x0:x1].sum() / mask.sum())
    assert 0.5 < share < 0.95
    assert breast_in_window(item) == pytest.approx(share, abs=0.01)
