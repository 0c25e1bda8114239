"""Boxes as ground truth, end to end: a VinDr-Mammo-shaped folder (DICOMs under images/<study>/<image>.dicom, a
finding_annotations.csv with boxes) through tools/make_datalist.py, the data check and the evaluation of the tiny
model; the report from the boxes equals the report from mask files painted from the same boxes (the pointing game
and the FROC against the boxes, through the masks' geometry)."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
from _dicom_factory import make_dicom
from PIL import Image
from scipy import ndimage
from test_evaluate import CLASSES, eval_setup
from test_evaluate_localisation import run

from scripts.data.checks import run_data_checks
from scripts.data.readers import read_mammogram

__all__ = ["eval_setup"]  # the module-scoped fixture, shared with test_evaluate.py

REPO_ROOT = Path(__file__).resolve().parents[2]
HEADER = ["study_id", "series_id", "image_id", "laterality", "view_position", "height", "width", "breast_birads"]
HEADER += ["breast_density", "finding_categories", "finding_birads", "xmin", "ymin", "xmax", "ymax", "split"]
BIRADS = {"benign": "BI-RADS 3", "malignant": "BI-RADS 5"}


def make_datalist_cli():
    spec = importlib.util.spec_from_file_location("make_datalist_cli", REPO_ROOT / "tools" / "make_datalist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def component_boxes(mask: np.ndarray) -> list[list[int]]:
    """[y0, x0, y1, x1] (far edges exclusive) of each 8-connected component."""
    labels, _ = ndimage.label(mask > 0, structure=np.ones((3, 3)))
    return [[s[0].start, s[1].start, s[0].stop, s[1].stop] for s in ndimage.find_objects(labels)]


@pytest.fixture(scope="module")
def vindr(eval_setup):
    """Eight synthetic views as VinDr stores them (DICOMs as acquired: right breasts facing left), one CSV row per
    finding box (benign boxes BI-RADS 3, malignant 5) and one 'No finding' row (no coordinates) per clean view."""
    root, _, content = eval_setup
    folder = root / "vindr"
    rows, expected = [], {}
    for n, item in enumerate(content["training"][:8]):
        study, image_id, side = item["patient_id"], f"img{n}", item["laterality"]
        mirror = (lambda a: a[:, ::-1]) if side == "R" else (lambda a: a)
        pixels, meta = read_mammogram(item["image"])
        path = folder / "images" / study / f"{image_id}.dicom"
        path.parent.mkdir(parents=True, exist_ok=True)
        spacing = tuple(float(s) for s in meta["spacing"])
        make_dicom(path, mirror(np.asarray(pixels)).astype(np.uint16), laterality=side,
                   view_position=item["view"], patient_id=study, spacing=spacing)  # fmt: skip
        boxes = []
        for cls in CLASSES:
            mask = mirror(np.asarray(read_mammogram(item[f"mask_{cls}"], mask=True)[0]))
            boxes += [{"label": cls, "box": b} for b in component_boxes(mask)]
        expected[image_id] = boxes
        h, w = pixels.shape
        top = max((BIRADS[b["label"]] for b in boxes), default="BI-RADS 1")
        common = [study, "series", image_id, side, item["view"], h, w, top, "DENSITY B"]
        for b in boxes:
            y0, x0, y1, x1 = b["box"]
            rows.append([*common, "['Mass']", BIRADS[b["label"]], x0, y0, x1, y1, "test"])
        if not boxes:
            rows.append([*common, "['No Finding']", "", "nan", "nan", "nan", "nan", "test"])
    with (folder / "finding_annotations.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(HEADER)
        writer.writerows(rows)
    out = folder / "datalist.json"
    args = ["--csv", str(folder / "finding_annotations.csv"), "--root", str(folder), "--out", str(out)]
    assert make_datalist_cli().main([*args, "--fractions", "0", "0", "1", "--no-official-split"]) == 0
    return root, folder, out, expected


def test_make_datalist_fills_the_boxes_and_check_data_passes_them(vindr):
    _, folder, out, expected = vindr
    data = json.loads(out.read_text())
    assert not data.get("training") and not data.get("validation") and len(data["test"]) == 8
    for item in data["test"]:
        boxes = expected[Path(item["image"]).stem]
        assert item.get("boxes", []) == boxes and "mask_benign" not in item and "mask_malignant" not in item
        assert item["label"] == [int(any(b["label"] == c for b in boxes)) for c in CLASSES]
    assert sum(len(b) for b in expected.values()) >= 4 and {b["label"] for v in expected.values() for b in v} == {
        *CLASSES
    }
    report = run_data_checks(out)
    assert report.ok, report.format()
    assert len(report.ok_items) == 8


def _painted(folder: Path, data: dict) -> dict:
    """The same datalist with the boxes painted into mask PNGs (every pixel a box touches), no boxes."""
    items = []
    for item in data["test"]:
        image = read_mammogram(folder / item["image"])[0]
        new = {k: v for k, v in item.items() if k != "boxes"}
        for cls in CLASSES:
            mask = np.zeros(np.asarray(image).shape, np.uint8)
            for b in item.get("boxes", []):
                if b["label"] == cls:
                    y0, x0, y1, x1 = b["box"]
                    mask[math.floor(y0) : math.ceil(y1), math.floor(x0) : math.ceil(x1)] = 255
            new[f"mask_{cls}"] = f"masks/{Path(item['image']).stem}_{cls}.png"
            (folder / "masks").mkdir(exist_ok=True)
            Image.fromarray(mask).save(folder / new[f"mask_{cls}"])
        items.append(new)
    return {"test": items}


def test_evaluation_against_boxes_equals_against_masks_painted_from_them(vindr):
    """The pointing game and the FROC against the boxes (and every other number) are the report of the same
    lesions as mask files: boxes take the masks' geometry (the right breasts are mirrored, every view cropped)."""
    root, folder, out, _ = vindr
    masks_list = folder / "painted.json"
    masks_list.write_text(json.dumps(_painted(folder, json.loads(out.read_text()))))
    from_boxes, rows_boxes, probe, _, _ = run(root, out, eval_dir=str(root / "boxes_eval"), froc_tolerance=30)
    from_masks, rows_masks, _, _, _ = run(root, masks_list, eval_dir=str(root / "masks_eval"), froc_tolerance=30)
    assert from_boxes["metrics"] == from_masks["metrics"]
    for key in ("n_lesion_images", "n_lesions", "classification_auc", "breast_auc", "n_breasts"):
        assert from_boxes[key] == from_masks[key], key
    assert rows_boxes == rows_masks
    assert all(from_boxes["n_lesions"][c] > 0 for c in CLASSES)
    assert from_boxes["n_breasts"] == 4 and from_boxes["images_without_breast"] == 0
    for c in CLASSES:  # against boxes: rectangles in the window, the pointing game and the FROC defined
        assert from_boxes["metrics"]["S_c"][c]["pointing_game"] is not None
        assert from_boxes["metrics"]["S_c"][c]["froc"]["4"] is not None
    # the evaluator saw the boxes as masks in the window: lesion pixels of both classes
    assert all(any(item["lesion_mask"][ci].any() for item in probe.items) for ci in range(len(CLASSES)))
