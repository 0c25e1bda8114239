"""The breast mask of a whole file (file_breast_mask), the share of it inside a box (breast_share), and the crop's and
window's opening scaled for an estimated spacing (opening_iterations), each against an independent computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai.data import MetaTensor
from scipy import ndimage as ndi

from scripts.transforms.mammo.array import OPENING_SCALE_KEY, BestCenterWindow, CropBreast, opening_iterations
from scripts.transforms.mammo.breast import breast_share, file_breast_mask


def _scipy_opening(fg: np.ndarray, iterations: int) -> np.ndarray:
    """The authors' opening in scipy's words: erosion, the largest 4-connected component, dilation."""
    eroded = ndi.binary_erosion(fg, iterations=iterations) if iterations else fg
    labels, n = ndi.label(eroded)
    if n == 0:
        return np.zeros_like(fg)
    largest = labels == 1 + int(np.argmax(np.bincount(labels.ravel())[1:]))
    return ndi.binary_dilation(largest, iterations=iterations) if iterations else largest


def _blob(h: int, w: int) -> np.ndarray:
    rows, cols = np.mgrid[:h, :w]
    image = (((rows - h / 2) / (0.4 * h)) ** 2 + (cols / (0.6 * w)) ** 2 < 1).astype(np.float32)
    image[5:9, w - 12 : w - 4] = 1.0  # a label in a corner, not connected: the opening drops it
    return image


@pytest.mark.parametrize(
    ("shape", "iterations", "step"), [((300, 200), 12, 1), ((2500, 1500), 100, 1), ((800, 500), 90, 3)]
)
def test_file_breast_mask_is_the_opening_of_every_kth_pixel(shape, iterations, step):
    image = _blob(*shape)
    picture = image[::step, ::step]
    mask, k = file_breast_mask(picture, iterations, step)
    j = int(np.ceil(max(picture.shape) / 1024))
    assert k == j * step
    np.testing.assert_array_equal(mask, _scipy_opening(picture[::j, ::j] > 0, iterations // k))
    assert not mask[5 // k : 9 // k + 1, -12 // k :].any()  # the label is gone


def test_file_breast_mask_falls_back_and_refuses():
    thin = np.zeros((40, 30), np.float32)
    thin[10:12, :] = 1  # two rows: 20 erosions leave nothing, the largest component stands for the breast
    mask, k = file_breast_mask(thin, 20)
    assert k == 1 and mask.sum() == 60
    with pytest.raises(ValueError, match="no pixel > 0"):
        file_breast_mask(np.zeros((10, 10)), 5)


def test_breast_share_counts_the_sampled_pixels_inside_the_box():
    rng = np.random.default_rng(0)
    mask = rng.random((50, 40)) > 0.6
    for k, box in [(1, (3, 4, 20, 33)), (3, (7, 2, 100, 61)), (4, (-5, -5, 37, 1000)), (2, (10, 10, 10, 30))]:
        inside = sum(
            int(mask[i, j])
            for i in range(mask.shape[0])
            for j in range(mask.shape[1])
            if box[0] <= i * k < box[2] and box[1] <= j * k < box[3]
        )
        assert breast_share(mask, k, box) == pytest.approx(inside / mask.sum())
    assert breast_share(mask, 2, None) == 0.0 and breast_share(np.zeros((3, 3), bool), 1, (0, 0, 3, 3)) == 0.0


def test_opening_iterations_scale_by_the_recorded_factor():
    image = MetaTensor(torch.zeros(1, 4, 4), meta={OPENING_SCALE_KEY: 0.237})
    assert opening_iterations(image, 100) == 24
    assert opening_iterations(MetaTensor(torch.zeros(1, 4, 4)), 100) == 100  # no record: as configured
    for scale in (1.0, float("nan"), 0.0, -2.0, "x"):
        assert opening_iterations(MetaTensor(torch.zeros(1, 4, 4), meta={OPENING_SCALE_KEY: scale}), 37) == 37
    assert opening_iterations(torch.zeros(1, 4, 4), 7) == 7  # a plain tensor


def test_the_crop_and_the_window_open_by_the_scaled_iterations():
    """With opening_scale 0.1 the crop's box is breast_crop's at 10 iterations (not 100), recorded with the
    configured 100; the window is placed as with 10 iterations."""
    from scripts.transforms.mammo.breast import best_center_window, breast_crop

    picture = _blob(800, 520)
    picture[:120, :60] = 1.0  # a narrow strip up the chest wall, as an axilla: 100 erosions cut it, 10 keep it
    scaled = MetaTensor(torch.as_tensor(picture)[None], meta={OPENING_SCALE_KEY: 0.1, "view": "MLO"})
    out = CropBreast(iterations=100, buffer=5)(scaled)
    (top, left), (bottom, right) = breast_crop(picture, 10, 5)[0]
    np.testing.assert_array_equal(out.meta["crop_box"], [top, left, bottom, right])
    assert out.meta["crop_iterations"] == 100 and top == 0
    # the authors' crop at the configured 100 cuts the strip away (the tissue check puts it back: tissue=False)
    assert breast_crop(picture, 100, 5, tissue=False)[0][0][0] > 0
    placement = BestCenterWindow((256, 192), iterations=100).placement(scaled)
    assert placement == best_center_window(picture, "MLO", (256, 192), iterations=10)
    assert placement != best_center_window(picture, "MLO", (256, 192), iterations=100, tissue=False)


@pytest.mark.parametrize(
    "given, scale",
    [
        ((0.1, 0.1), 0.25),  # a stated 0.1 mm at the model's 0.4 mm: 100 file pixels are 25 model pixels
        ((0.07, 0.07), 0.175),
        ((0.1, 0.4), 0.5),  # pixels that are not square: sqrt(0.25 x 1.0), the erosion's one factor
        ((0.8, 0.8), 2.0),  # a coarser file: its pixels are two model pixels
        ((0.4002, 0.4002), 1.0),  # within rtol of the model's: not resampled, the file's pixels are the model's
    ],
)
def test_the_opening_scale_is_model_pixels_per_file_pixel_whatever_the_source(given, scale):
    from scripts.transforms import ResampleToSpacing

    plan = ResampleToSpacing(pixel_spacing=0.4).plan(torch.zeros(1, 40, 30), spacing=given)
    assert plan["opening_scale"] == pytest.approx(scale, rel=1e-12)
    assert plan["resample"] is (scale != 1.0)
