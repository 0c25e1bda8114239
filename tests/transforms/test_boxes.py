"""Box annotations as masks (scripts.transforms.boxes): painting by hand and the same geometry as a mask file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai.data import MetaTensor

from scripts.transforms.boxes import BoxesToMasksd, parse_boxes


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
