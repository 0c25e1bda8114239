"""Box annotations as masks (scripts.transforms.boxes): painting by hand and the same geometry as a mask file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai.data import MetaTensor
from monai.transforms import Compose

from scripts.data.boxes import parse_boxes
from scripts.transforms.boxes import BoxesToMasksd


def _image(h=10, w=8):
    return MetaTensor(torch.ones(1, h, w), meta={"spacing": np.array([0.1, 0.1]), "filename_or_obj": "a.dcm"})


def test_boxes_paint_every_pixel_they_touch_per_class_and_unite_with_a_mask_file():
    mask_file = torch.zeros(1, 10, 8, dtype=torch.uint8)
    mask_file[0, 9, 7] = 1
    item = {
        "image": _image(),
        "mask_benign": mask_file,
        "boxes": [
            {"label": "benign", "box": [1, 2, 3, 4]},  # rows 1-2, cols 2-3
            {"label": "Malignant", "box": [4.5, 0.2, 6, 1.5]},  # rows 4-5, cols 0-1 (touched pixels)
            {"label": "benign", "box": [8, 6, 20, 20]},  # clipped at the border: rows 8-9, cols 6-7
        ],
    }
    out = BoxesToMasksd()(item)
    benign = np.zeros((10, 8), np.uint8)
    benign[1:3, 2:4] = 1
    benign[8:10, 6:8] = 1
    malignant = np.zeros((10, 8), np.uint8)
    malignant[4:6, 0:2] = 1
    np.testing.assert_array_equal(np.asarray(out["mask_benign"])[0], benign)
    np.testing.assert_array_equal(np.asarray(out["mask_malignant"])[0], malignant)
    assert "boxes" not in out
    assert out["mask_malignant"].meta["spacing"].tolist() == [0.1, 0.1]  # the image's geometry


def test_items_without_boxes_pass_and_bad_boxes_are_one_line():
    item = {"image": _image()}
    assert BoxesToMasksd()(item).keys() == item.keys()
    for bad, match in [
        ([{"label": "cyst", "box": [0, 0, 1, 1]}], r"boxes\[0\]: label must be one of"),
        ([{"label": "benign", "box": [0, 0, 1]}], r"boxes\[0\]: box must be \[y0, x0, y1, x1\]"),
        ([{"label": "benign", "box": [5, 0, 2, 1]}], r"needs 0 <= y0 < y1"),
        ({"label": "benign"}, r"must be a list"),
    ]:
        with pytest.raises(ValueError, match=match):
            BoxesToMasksd()({"image": _image(), "boxes": bad})
    assert parse_boxes(None) == []
    with pytest.raises(ValueError, match="mask_files must be 'unite' or 'keep'"):
        BoxesToMasksd(mask_files="replace")


def test_keep_leaves_a_class_with_a_mask_file_as_the_file_says():
    """mask_files="keep" (the pipeline's): boxes fill the classes without a mask file only."""
    mask_file = torch.zeros(1, 10, 8, dtype=torch.uint8)
    mask_file[0, 9, 7] = 1
    boxes = [{"label": "benign", "box": [1, 2, 3, 4]}, {"label": "malignant", "box": [4, 0, 6, 2]}]
    out = BoxesToMasksd(mask_files="keep")({"image": _image(), "mask_benign": mask_file, "boxes": boxes})
    assert out["mask_benign"] is mask_file
    malignant = np.zeros((10, 8), np.uint8)
    malignant[4:6, 0:2] = 1
    np.testing.assert_array_equal(np.asarray(out["mask_malignant"])[0], malignant)


def test_boxes_go_through_the_masks_geometry_in_the_whole_prefix(tmp_path):
    """A left MLO DICOM (0.07 x 0.08 mm, resampled to 0.1 mm, mirrored, cropped): an item with boxes and the same
    item with mask files painted from those boxes give the same masks after the mammogram steps of
    ``validate#preprocessing``; the boxes leave the item, and a class with a mask file keeps that file (the boxes
    only fill the classes without one)."""
    from _dicom_factory import make_dicom
    from config_chains import parse
    from conftest import TRAIN_CONFIG
    from PIL import Image

    h, w = 180, 120
    rows, cols = np.mgrid[0:h, 0:w]
    breast = ((rows - 90) / 80.0) ** 2 + (cols / 100.0) ** 2 < 1  # chest wall at column 0 of a left breast
    pixels = np.where(breast, 1500 + (rows * 7 + cols * 3) % 400, 0).astype(np.uint16)
    image = make_dicom(tmp_path / "L_MLO.dcm", pixels, laterality="L", view_position="MLO", spacing=(0.07, 0.08))
    boxes = [
        {"label": "benign", "box": [40, 10, 55.5, 30]},
        {"label": "malignant", "box": [100.2, 20, 130, 61]},
        {"label": "malignant", "box": [120, 50, 140, 70]},  # overlaps the other malignant box
    ]
    files = {}
    for cls in ("benign", "malignant"):
        painted = np.zeros((h, w), np.uint8)
        for b in boxes:
            if b["label"] == cls:
                y0, x0, y1, x1 = b["box"]
                painted[int(np.floor(y0)) : int(np.ceil(y1)), int(np.floor(x0)) : int(np.ceil(x1))] = 255
        files[f"mask_{cls}"] = str(tmp_path / f"{cls}.png")
        Image.fromarray(painted).save(files[f"mask_{cls}"])
    sizes = {"pixel_spacing": 0.1, "image_size": [128, 96], "crop_iterations": 10, "crop_buffer": 5}
    validate = parse([TRAIN_CONFIG], **sizes).get_parsed_content("validate#preprocessing")
    prefix = Compose(validate.transforms[1:10])  # the mammogram steps: drop empty masks ... crop
    assert type(prefix.transforms[-1]).__name__ == "CropBreastd"
    common = {"image": str(image), "laterality": "L", "view": "MLO"}
    from_boxes = prefix({**common, "boxes": boxes})
    from_files = prefix({**common, **files})
    assert "boxes" not in from_boxes
    assert from_boxes["image"].shape == from_files["image"].shape
    assert from_boxes["image"].shape[-2:] != (h, w)  # resampled and cropped
    for key in files:
        got, want = np.asarray(from_boxes[key]), np.asarray(from_files[key])
        assert got.dtype == want.dtype == np.uint8 and got.shape == want.shape == tuple(from_boxes["image"].shape)
        np.testing.assert_array_equal(got, want, err_msg=key)
        assert want.any() and set(np.unique(want)) == {0, 1}
    # a class with a mask file keeps the file when boxes name that class too
    both = prefix({**common, "mask_benign": files["mask_benign"], "boxes": [{"label": "benign", "box": [0, 0, 5, 5]}]})
    np.testing.assert_array_equal(np.asarray(both["mask_benign"]), np.asarray(from_files["mask_benign"]))
