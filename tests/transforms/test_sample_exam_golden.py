"""Golden values on the authors' sample exam (docs/preprocessing.md, "Golden values on the sample exam"; skipped
without ../shared)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from config_chains import inference_chains
from monai.transforms import Invertd
from PIL import Image

from scripts.data.readers import read_mammogram
from scripts.transforms.mammo import breast_crop, open_breast_mask, open_breast_mask_exact

VIEWS = ("L-CC", "R-CC", "L-MLO", "R-MLO")
# image (H, W), best center (row, col), breast rows / cols in the window
GOLDEN = {
    "L-CC": ((2023, 801), (1011, -211), (460, 2482), (0, 800)),
    "R-CC": ((2144, 801), (1072, -210), (400, 2518), (0, 750)),
    "L-MLO": ((2730, 981), (1206, -31), (12, 2729), (0, 980)),
    "R-MLO": ((2650, 1006), (1126, -5), (12, 2648), (0, 1005)),
}
MASK_PIXELS = {"R-CC": 20_440, "R-MLO": 25_151}


@pytest.fixture(scope="module")
def exam(sample_exam):
    return json.loads((sample_exam / "exam.json").read_text())


@pytest.fixture(scope="module")
def windows(sample_exam, exam):
    """Each view through inference.yaml's preprocessing (its standardisation, transform 5, disabled to see the breast
    pixels > 0; the exam's horizontal_flip given to the flip, transform 2)."""
    flip = {"preprocessing#transforms#2#horizontal_flip": exam["horizontal_flip"]}
    t, _ = inference_chains(**flip, **{"preprocessing#transforms#5#_disabled_": True})
    out = {}
    for view in VIEWS:
        item = {"image": str(sample_exam / exam["views"][view]), "laterality": view[0], "view": view[2:]}
        out[view] = (t, t(item))
    return out


@pytest.mark.parametrize("view", VIEWS)
def test_best_center_and_breast_position_in_window(windows, view):
    shape, center, rows, cols = GOLDEN[view]
    _, d = windows[view]
    image = d["image"]
    assert tuple(image.shape) == (1, 2944, 1920)
    assert tuple(int(v) for v in image.meta["spatial_shape"]) == shape  # the file's size, from the reader
    assert tuple(int(v) for v in image.meta["best_center"]) == center
    # the files are the authors' crops: opened mask + 50 px buffers span each image exactly
    assert [int(v) for v in image.meta["crop_box"]] == [0, 0, *shape]
    breast = image[0].numpy() > 0
    r = np.flatnonzero(breast.any(axis=1))
    c = np.flatnonzero(breast.any(axis=0))
    assert (r[0], r[-1]) == rows
    assert (c[0], c[-1]) == cols


def test_laterality_inferred_from_pixels_gives_the_same_windows(sample_exam, exam, windows):
    """Without the datalist's laterality the reader's guess and FlipToRight's image rule agree."""
    t, _ = inference_chains(**{"preprocessing#transforms#5#_disabled_": True})
    for view in ("R-CC", "L-MLO"):
        d = t({"image": str(sample_exam / exam["views"][view]), "view": view[2:]})
        np.testing.assert_array_equal(d["image"].numpy(), windows[view][1]["image"].numpy())


@pytest.mark.parametrize("view", sorted(MASK_PIXELS))
def test_benign_masks_lie_on_breast_pixels_of_the_window(sample_exam, exam, windows, view):
    mask = np.asarray(Image.open(sample_exam / exam["masks"][view]["benign"]))
    assert mask.shape == (2944, 1920)
    assert set(np.unique(mask)) == {0, 255}
    lesion = mask > 0
    assert lesion.sum() == MASK_PIXELS[view]
    breast = windows[view][1]["image"][0].numpy() > 0
    assert breast[lesion].all()


@pytest.mark.parametrize("view", ("R-CC", "L-MLO"))
def test_window_map_inverts_onto_the_original_image(sample_exam, exam, windows, view):
    """A saliency map in window coordinates goes back through Invertd onto the file's pixel grid."""
    t, d = windows[view]
    (h, w), _, (first_row, _), _ = GOLDEN[view]
    r, c = 1000, 300  # a pixel of the stored image
    mirrored = view[0] == "R"  # horizontal_flip "NO": right views were mirrored to face right
    # CC: zero rows padded on top (the breast's first window row); MLO: the window starts at image row 0
    win_r = r + (first_row if view.endswith("CC") else 0)
    win_c = (w - 1 - c) if mirrored else c
    saliency = torch.zeros_like(d["image"])
    saliency[0, win_r, win_c] = 1.0
    out = Invertd("pred", transform=t, orig_keys="image", nearest_interp=False)({**d, "pred": saliency})
    back = out["pred"][0].numpy()
    assert back.shape == (h, w)
    assert back[r, c] == 1.0 and back.sum() == 1.0
    original, _ = read_mammogram(sample_exam / exam["views"][view])
    image_back = Invertd("image", transform=t, orig_keys="image", nearest_interp=False)(dict(d))["image"]
    np.testing.assert_array_equal(image_back[0].numpy(), original)


@pytest.mark.parametrize("view", VIEWS)
def test_fast_crop_equals_exact_crop(sample_exam, exam, view):
    """Measured: the distance-transform opening is pixel-identical to scipy's 100 iterations (0 px)."""
    image, _ = read_mammogram(sample_exam / exam["views"][view])
    if view[0] == "R":
        image = image[:, ::-1]
    fast = breast_crop(image, method="fast")[0]
    exact = breast_crop(image, method="exact")[0]
    assert np.abs(np.subtract(fast, exact)).max() == 0
    np.testing.assert_array_equal(open_breast_mask(image > 0), open_breast_mask_exact(image > 0))
