"""Inputs that are not mammograms are skipped with their reason (scripts.data.readers.pixel_kind_problem, the
inference reader, the folder scan): binary masks, thumbnails too small for the model's window, files that are no
image; the quick-start's 736 x 480 images (8- and 16-bit PNG, 0.4 mm) stay accepted. On the authors' sample exam,
read in place, the segmentation masks and the exam's text files are errors.csv rows, the four films are scored, and
breasts.csv groups them into the exam's two breasts by the exam their file names state."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from PIL import Image
from test_inference_workflow import INFERENCE_CONFIG, TINY, TINY_INFERENCE, _run

#: the authors' window and a pixel size of their films' order (the size rule's reference)
WINDOW, MODEL_MM = (2944, 1920), 0.1


def _read(path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _breast(rows: int, cols: int, seed: int = 0, top: int = 4095) -> np.ndarray:
    """A breast facing right with a texture of many grey levels, 0 outside."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:rows, 0:cols]
    inside = ((yy - rows / 2) / (rows * 0.45)) ** 2 + (xx / (cols * 0.8)) ** 2 < 1
    return np.where(inside, rng.integers(top // 3, top, (rows, cols)), 0)


def _png(path, array: np.ndarray, mode: str, spacing_mm: float | None = None) -> str:
    image = Image.fromarray(array.astype(np.uint16 if mode == "I;16" else np.uint8))
    if mode == "1":
        image = image.convert("1")
    # pHYs in pixels per metre, as PIL writes dpi
    dpi = None if spacing_mm is None else (25.4 / spacing_mm, 25.4 / spacing_mm)
    image.save(path, **({} if dpi is None else {"dpi": dpi}))
    return str(path)


def _read_with(path: str, **kwargs):
    from config_chains import parse

    # inference.yaml's reader, with the model's window and spacing (None: no size check) and the option
    overrides = {"image_size": kwargs.get("window"), "pixel_spacing": kwargs.get("pixel_spacing")}
    overrides["accept_non_mammography"] = kwargs.get("accept_non_mammography", False)
    reader = parse(**overrides).get_parsed_content("preprocessing#transforms#0#reader")
    return reader.get_data(reader.read(path))


@pytest.mark.parametrize("window,model_mm", [(WINDOW, MODEL_MM), (WINDOW, None), ((736, 480), 0.4)])
def test_the_quick_start_images_stay_accepted(tmp_path, window, model_mm):
    image = _breast(736, 480)
    for name, array, mode, spacing in [
        ("16bit.png", image, "I;16", 0.4),
        ("8bit.png", image * 255 // 4095, "L", None),  # no pHYs: the pixel rule alone
    ]:
        data, meta = _read_with(_png(tmp_path / name, array, mode, spacing), window=window, pixel_spacing=model_mm)
        assert data.shape == (1, 736, 480)


def test_binary_images_are_skipped_naming_their_two_values(tmp_path, sample_exam):
    from scripts.data.readers import NotAMammogram

    mask = sample_exam / "segmentation" / "0_R-CC_benign.png"
    with pytest.raises(NotAMammogram, match=rf"^{mask}: skipped, not a mammogram: .*2 value\(s\) only \(0 and 255\)"):
        _read_with(str(mask), window=WINDOW, pixel_spacing=MODEL_MM)
    one_bit = _png(tmp_path / "one_bit.png", (_breast(1000, 700) > 0) * 255, "1")
    assert Image.open(one_bit).mode == "1"
    with pytest.raises(NotAMammogram, match=r"2 value\(s\) only \(0 and 1\)"):  # PIL gives a 1-bit image as 0 / 1
        _read_with(one_bit)
    flat = _png(tmp_path / "flat.png", np.full((1000, 700), 7), "L")
    with pytest.raises(NotAMammogram, match=r"1 value\(s\) only \(7\)"):
        _read_with(flat)
    # three values are not binary: the rule is the binary image's, a real film has hundreds
    three = _png(tmp_path / "three.png", np.tile(np.array([0, 5, 9]), (1000, 300))[:, :700], "L")
    assert _read_with(three)[0].shape == (1, 1000, 700)
    # accept_non_mammography reads them all
    assert _read_with(str(mask), accept_non_mammography=True)[0].shape == (1, 2944, 1920)


def test_thumbnails_are_skipped_by_pixels_and_by_stated_extent(tmp_path):
    from scripts.data.readers import NotAMammogram

    # 512 px long: 512 x 5 = 2560 < 2944, the breast would be enlarged more than 5 times
    small = _png(tmp_path / "thumb.png", _breast(512, 320) * 255 // 4095, "L")
    with pytest.raises(NotAMammogram, match=r"512 x 320 px: its long side is under a fifth of the model's 2944 px"):
        _read_with(small, window=WINDOW, pixel_spacing=MODEL_MM)
    # 589 px: 589 x 5 = 2945 >= 2944, not a thumbnail by its pixels
    assert _read_with(_png(tmp_path / "589.png", _breast(589, 380), "I;16"), window=WINDOW)[0].shape[1] == 589
    # 736 px stated at 0.05 mm cover 36.8 mm, under a third of the 294.4 mm window (98.1 mm)
    detail = _png(tmp_path / "detail.png", _breast(736, 480), "I;16", spacing_mm=0.05)
    with pytest.raises(NotAMammogram, match=r"covers 37 mm on its long side, under a third of the model's 294 mm"):
        _read_with(detail, window=WINDOW, pixel_spacing=MODEL_MM)
    # 0.14 mm: 103 mm, over 98.1 mm; a model without a pixel size has no mm rule
    assert _read_with(_png(tmp_path / "ok.png", _breast(736, 480), "I;16", 0.14), window=WINDOW, pixel_spacing=0.1)
    assert _read_with(detail, window=WINDOW, pixel_spacing=None)[0].shape == (1, 736, 480)
    # without a window (a reader outside inference) there is no size rule
    assert _read_with(small)[0].shape == (1, 512, 320)


@pytest.fixture(scope="module")
def exam_run(tmp_path_factory, sample_exam):
    from scripts.networks import GLAMSaliencyNet

    root = tmp_path_factory.mktemp("exam")
    torch.manual_seed(0)
    ckpt = root / "model.pt"
    torch.save(GLAMSaliencyNet(stage="joint", **TINY).state_dict(), ckpt)
    out = root / "out"
    overrides = {
        "input_dir": str(sample_exam),
        "output_dir": str(out),
        "ckpt_path": str(ckpt),
        "outputs": ["S_c"],
        "num_workers": 0,
    }
    _run([INFERENCE_CONFIG, TINY_INFERENCE], overrides)
    return {"exam": sample_exam, "out": out}


def test_the_sample_exams_masks_and_text_files_are_skipped_and_its_films_scored(exam_run):
    exam, out = exam_run["exam"], exam_run["out"]
    predictions = _read(out / "predictions.csv")
    assert sorted(r["image"] for r in predictions) == sorted(str(p) for p in (exam / "images").glob("*.png"))
    errors = {r["image"]: r["error"] for r in _read(out / "errors.csv") if r["error"]}
    masks = sorted(str(p) for p in (exam / "segmentation").glob("*.png"))
    texts = [str(exam / "README.md"), str(exam / "exam.json")]
    assert sorted(errors) == sorted(masks + texts)
    for path in masks:
        assert errors[path] == (
            f"NotAMammogram: {path}: skipped, not a mammogram: its pixels take 2 value(s) only (0 and 255): a mask "
            "or a drawing, not an X-ray"
        )
    for path in texts:
        assert errors[path].startswith(f"NotAMammogram: {path}: skipped, not a mammogram: no image file")


def test_the_sample_exams_breasts_are_grouped_by_the_exam_its_file_names_state(exam_run):
    exam, out = exam_run["exam"], exam_run["out"]
    predictions = {r["image"]: r for r in _read(out / "predictions.csv")}
    assert {r["laterality_source"] for r in predictions.values()} == {"filename"}
    assert {r["patient_id"] for r in predictions.values()} == {""}  # no patient ID stated anywhere
    breasts = _read(out / "breasts.csv")
    assert [(b["patient_id"], b["laterality"], b["grouped_by"]) for b in breasts] == [
        (str(exam / "images" / "0"), "L", "file name"),
        (str(exam / "images" / "0"), "R", "file name"),
    ]
    for breast, side in zip(breasts, "LR"):
        views = [str(exam / "images" / f"0_{side}-{v}.png") for v in ("CC", "MLO")]
        assert breast["inputs"].split(";") == views and breast["views"] == "CC;MLO" and breast["note"] == ""
        for cls in ("benign", "malignant"):
            mean = (float(predictions[views[0]][f"prob_{cls}"]) + float(predictions[views[1]][f"prob_{cls}"])) / 2
            assert float(breast[f"prob_{cls}"]) == pytest.approx(mean, abs=1e-6)


def _row(image: str, laterality: str, source: str, patient: str = "", view: str = "CC") -> dict[str, str]:
    return {
        "image": image,
        "laterality": laterality,
        "laterality_source": source,
        "patient_id": patient,
        "view": view,
        "prob_benign": "0.2",
        "prob_malignant": "0.4",
    }


def test_the_grouping_states_its_source_and_needs_a_stated_laterality():
    from scripts.inference.tables import breast_rows, stated_exam

    assert stated_exam("/x/images/0_L-CC.png") == ("/x/images/0", "file name")
    assert stated_exam("/x/SYN00012_R_MLO.dcm") == ("/x/SYN00012", "file name")
    assert stated_exam("/x/Mass-Test_P_00001_LEFT_CC.png") == ("/x/Mass_Test_P_00001", "file name")
    assert stated_exam("/x/exam7/RCC.dcm") == ("/x/exam7", "folder")
    assert stated_exam("/x/exam7/L_MLO.nii.gz") == ("/x/exam7", "folder")
    assert stated_exam("/x/scan.png") is None and stated_exam("/x/CCTV_L.png") is None  # no view or side tokens
    rows = [
        _row("/x/e1/L_CC.png", "L", "filename"),
        _row("/x/e1/L_MLO.png", "L", "filename", view="MLO"),
        _row("/x/p7_R_CC.png", "R", "datalist"),
        _row("/x/p7_R_MLO.dcm", "R", "dicom", view="MLO"),
        _row("/x/p8_L_CC.png", "L", "image"),  # the side was read from the pixels: no breast
        _row("/x/1-1.dcm", "R", "dicom", patient="P_1"),
        _row("/x/2-1.dcm", "R", "dicom", patient="P_1", view="MLO"),
    ]
    table = {b["inputs"]: (b["patient_id"], b["laterality"], b["grouped_by"], b["images"]) for b in breast_rows(rows)}
    assert table == {
        "/x/1-1.dcm;/x/2-1.dcm": ("P_1", "R", "patient_id", 2),
        "/x/e1/L_CC.png;/x/e1/L_MLO.png": ("/x/e1", "L", "folder", 2),
        "/x/p7_R_CC.png;/x/p7_R_MLO.dcm": ("/x/p7", "R", "file name", 2),
        "/x/p8_L_CC.png": ("", "", "", 1),
    }
