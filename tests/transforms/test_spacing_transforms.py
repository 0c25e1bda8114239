"""Resampling to the model's pixel spacing (ResampleToSpacing / ResampleToSpacingd): identity for an unknown model
spacing, sizes and pixel centres against hand-computed values, masks kept binary, the unknown-spacing record, the
inverse, and the configs' mammogram steps with a ``pixel_spacing`` on files that state their spacing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from config_chains import mammogram_steps
from monai.data import MetaTensor
from monai.transforms import Compose, Invertd
from PIL import Image

from scripts.transforms import ResampleToSpacing, ResampleToSpacingd
from scripts.transforms.mammo import (
    MODEL_SPACING_KEY,
    SPACING_ASSUMED_KEY,
    SPACING_SOURCE_KEY,
    SPACING_USED_KEY,
    as_pixel_spacing,
    format_spacing,
)


def image(h: int, w: int, spacing=None, values: np.ndarray | None = None) -> MetaTensor:
    """(1, h, w) float32 MetaTensor as MammogramReader gives it: meta spacing (NaN when unknown) and the matching
    affine (rows on axis 0)."""
    arr = np.arange(h * w, dtype=np.float32).reshape(h, w) if values is None else values.astype(np.float32)
    sr, sc = spacing if spacing is not None else (1.0, 1.0)
    meta = {
        "spacing": np.asarray(spacing if spacing is not None else (np.nan, np.nan), dtype=np.float64),
        "affine": np.diag([sr, sc, 1.0, 1.0]),
        "filename_or_obj": "x.png",
    }
    return MetaTensor(torch.as_tensor(arr)[None], meta=meta)


def ramp(h: int, w: int, rows: np.ndarray | None = None, cols: np.ndarray | None = None) -> np.ndarray:
    """A plane a*row + b*col (+1): bilinear resampling and Gaussian smoothing keep it inside the image, so a resampled
    pixel's value tells where its centre was taken from."""
    r = np.arange(h, dtype=np.float64) if rows is None else rows
    c = np.arange(w, dtype=np.float64) if cols is None else cols
    return 3.0 * r[:, None] + 0.5 * c[None, :] + 1.0


def test_as_pixel_spacing_and_format():
    assert as_pixel_spacing(0.4) == (0.4, 0.4) and as_pixel_spacing([0.4, 0.5]) == (0.4, 0.5)
    assert as_pixel_spacing((1, 2)) == (1.0, 2.0) and as_pixel_spacing(np.array([0.1, 0.1])) == (0.1, 0.1)
    for unknown in (None, "null", "None", ""):
        assert as_pixel_spacing(unknown) is None
    for bad in (0, -0.4, [0.4, 0.0], [0.1, 0.2, 0.3], float("nan"), "fine"):
        with pytest.raises(ValueError, match="pixel_spacing"):
            as_pixel_spacing(bad)
    assert format_spacing((0.4, 0.4)) == "0.4" and format_spacing((0.4, 0.5)) == "0.4 x 0.5"


def test_no_model_spacing_is_the_identity_and_invertible():
    img = image(40, 30, spacing=(0.2, 0.1))
    before = img.clone()
    t = ResampleToSpacing(None)
    out = t(img)
    assert torch.equal(out.as_tensor(), before.as_tensor()) and out.dtype == before.dtype
    np.testing.assert_array_equal(out.meta["spacing"], (0.2, 0.1))
    assert out.meta[SPACING_ASSUMED_KEY] is False and np.isnan(out.meta[MODEL_SPACING_KEY]).all()
    torch.testing.assert_close(out.affine, before.affine)
    assert [op["class"] for op in out.applied_operations] == ["ResampleToSpacing"]
    back = t.inverse(out)
    assert torch.equal(back.as_tensor(), before.as_tensor()) and back.applied_operations == []
    assert MODEL_SPACING_KEY not in back.meta and SPACING_ASSUMED_KEY not in back.meta
    # an unknown input spacing and no model spacing: nothing assumed either
    assert ResampleToSpacing(None)(image(40, 30))[0].meta[SPACING_ASSUMED_KEY] is False


def test_downsampling_sizes_centres_affine_and_inverse():
    """(40, 30) at (0.2, 0.1) mm to (0.4, 0.3) mm: (20, 10) pixels, output pixel (i, j) centred on input (2i + 0.5,
    3j + 1); the affine states the new spacing, meta the file's and the model's; the inverse gives (40, 30) and the
    file's affine back."""
    img = image(40, 30, spacing=(0.2, 0.1), values=ramp(40, 30))
    t = ResampleToSpacing((0.4, 0.3))
    out = t(img)
    assert tuple(out.shape) == (1, 20, 10) and out.dtype == torch.float32
    expected = ramp(20, 10, rows=2 * np.arange(20) + 0.5, cols=3 * np.arange(10) + 1.0)
    # the anti-aliasing filter (sigma (f - 1) / 2) keeps a plane except where it reaches the zero-padded border
    np.testing.assert_allclose(out[0, 3:-3, 3:-3].numpy(), expected[3:-3, 3:-3], rtol=1e-5)
    np.testing.assert_allclose(out.meta["spacing"], (0.2, 0.1))  # the file's, for maps written on its grid
    np.testing.assert_allclose(out.meta[MODEL_SPACING_KEY], (0.4, 0.3))
    assert out.meta[SPACING_ASSUMED_KEY] is False
    # MONAI's affine convention: the new pixel (0, 0) is centred on the old (0.5, 1) -> translation in mm
    np.testing.assert_allclose(np.asarray(out.affine)[:2, :2], np.diag([0.4, 0.3]))
    np.testing.assert_allclose(np.asarray(out.affine)[:2, 3], (0.5 * 0.2, 1.0 * 0.1))
    back = t.inverse(out)
    assert tuple(back.shape) == (1, 40, 30) and back.applied_operations == []
    np.testing.assert_allclose(back.meta["spacing"], (0.2, 0.1))
    np.testing.assert_allclose(np.asarray(back.affine), np.diag([0.2, 0.1, 1.0, 1.0]), atol=1e-12)


def test_upsampling_doubles_the_size_with_pixel_centres_aligned():
    """(20, 16) at 0.8 mm to 0.4 mm: (40, 32), output pixel i centred on input (i - 0.5) / 2 (bilinear,
    align_corners=False, no anti-aliasing when enlarging); the inverse is anti-aliased and returns (20, 16)."""
    img = image(20, 16, spacing=(0.8, 0.8), values=ramp(20, 16))
    t = ResampleToSpacing(0.4)
    out = t(img)
    assert tuple(out.shape) == (1, 40, 32)
    expected = ramp(40, 32, rows=(np.arange(40) - 0.5) / 2, cols=(np.arange(32) - 0.5) / 2)
    np.testing.assert_allclose(out[0, 1:-1, 1:-1].numpy(), expected[1:-1, 1:-1], rtol=1e-5)
    back = t.inverse(out)
    assert tuple(back.shape) == (1, 20, 16)
    np.testing.assert_allclose(back[0, 2:-2, 2:-2].numpy(), ramp(20, 16)[2:-2, 2:-2], rtol=1e-4)


def test_rounding_tolerance_and_the_model_fallback():
    # within rtol (a PNG's whole pixels per metre): not resampled, the file's spacing is kept (1.2 mm is above the
    # plausible range of mammograms' pixel sizes: spacing_range widens it)
    out = ResampleToSpacing(1.2, spacing_range=(0.02, 2.0))(image(50, 40, spacing=(1.2004802, 1.2004802)))
    assert tuple(out.shape) == (1, 50, 40) and out.meta["spacing"][0] == pytest.approx(1.2004802)
    # unknown spacing with fallback="model" (the opt-in): not resampled, the model's spacing is assumed and recorded
    t = ResampleToSpacing([0.4, 0.5], fallback="model")
    out = t(image(50, 40))
    assert tuple(out.shape) == (1, 50, 40) and out.meta[SPACING_ASSUMED_KEY] is True
    assert out.meta[SPACING_SOURCE_KEY] == "model"
    np.testing.assert_allclose(out.meta[MODEL_SPACING_KEY], (0.4, 0.5))
    np.testing.assert_allclose(out.meta[SPACING_USED_KEY], (0.4, 0.5))
    assert np.isnan(out.meta["spacing"]).all()
    back = t.inverse(out)
    assert (
        SPACING_ASSUMED_KEY not in back.meta and SPACING_USED_KEY not in back.meta and tuple(back.shape) == (1, 50, 40)
    )
    # a plain tensor has no metadata: its spacing is unknown
    plain = ResampleToSpacing(0.4, fallback="model")(torch.ones(1, 8, 6))
    assert tuple(plain.shape) == (1, 8, 6)
    # the default fallback needs the window it fits the breast into, for an image whose spacing nobody states
    ResampleToSpacing(0.4)(image(50, 40, spacing=(0.4, 0.4)))
    with pytest.raises(ValueError, match="x.png states no pixel spacing.*window"):
        ResampleToSpacing(0.4)(image(50, 40))
    with pytest.raises(ValueError, match="fallback"):
        ResampleToSpacing(0.4, fallback="guess", window=(64, 32))


def breast_image(h: int, w: int, spacing=None) -> tuple[MetaTensor, np.ndarray]:
    """A half-ellipse of tissue against the left edge (rows 10 %-90 %, 60 % of the width) on zeros, and its mask."""
    rows, cols = np.mgrid[:h, :w]
    mask = ((rows - 0.5 * h) / (0.4 * h)) ** 2 + (cols / (0.6 * w)) ** 2 < 1
    return image(h, w, spacing=spacing, values=np.where(mask, 1000.0 + rows % 7, 0.0)), mask


def test_spacing_precedence_file_datalist_option_estimate():
    """The file's spacing wins, then the datalist item's pixel_spacing, then input_spacing, then the estimate; meta
    records the spacing used and its source, the inverse restores the reader's source."""
    window = (64, 48)
    t = ResampleToSpacingd("image", pixel_spacing=0.4, input_spacing=0.3, window=window, iterations=2, buffer=2)
    stated, _ = breast_image(80, 60, spacing=(0.2, 0.2))
    stated.meta[SPACING_SOURCE_KEY] = "PixelSpacing"
    unknown, mask = breast_image(80, 60)
    cases = [
        ({"image": stated, "pixel_spacing": 0.1}, (0.2, 0.2), "PixelSpacing", (40, 30)),
        ({"image": unknown.clone(), "pixel_spacing": [0.8, 0.8]}, (0.8, 0.8), "datalist", (160, 120)),
        ({"image": unknown.clone(), "pixel_spacing": ""}, (0.3, 0.3), "option", (60, 45)),
    ]
    for data, used, source, size in cases:
        out = t(data)["image"]
        np.testing.assert_allclose(out.meta[SPACING_USED_KEY], used)
        assert out.meta[SPACING_SOURCE_KEY] == source and tuple(out.shape[1:]) == size
        assert out.meta[SPACING_ASSUMED_KEY] is False
    back = t.inverse({"image": t({"image": stated.clone()})["image"]})["image"]
    assert back.meta[SPACING_SOURCE_KEY] == "PixelSpacing" and tuple(back.shape[1:]) == (80, 60)
    estimated = ResampleToSpacingd("image", pixel_spacing=0.4, window=window, iterations=2, buffer=2)(
        {"image": unknown.clone()}
    )["image"]
    assert estimated.meta[SPACING_SOURCE_KEY] == "fit_breast" and estimated.meta[SPACING_ASSUMED_KEY] is True
    with pytest.raises(ValueError, match="x.png: the datalist's pixel_spacing"):
        t({"image": unknown.clone(), "pixel_spacing": -1})


@pytest.mark.parametrize("shape", [(4432, 2864), (600, 900), (300, 120)])
def test_fit_breast_spacing_fits_the_crop_into_the_window(shape):
    """The estimate against the numpy box of the breast (within 3 %), and what it is for: after resampling, the
    authors' crop (with its buffer) is no larger than the window, so the window holds the whole breast; a wide breast
    is limited by the columns, a tall one by the rows; the aspect ratio is kept."""
    from scripts.transforms import CropBreast
    from scripts.transforms.mammo import fit_breast_spacing

    window, iterations, buffer = (256, 160), 5, 4
    img, mask = breast_image(*shape)
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    box_h, box_w = rows[-1] + 1 - rows[0], cols[-1] + 1 - cols[0]
    factor = min((0.98 * 256 - 2 * buffer - 6) / box_h, (0.98 * 160 - buffer - 6) / box_w)
    got = fit_breast_spacing(img, (0.4, 0.4), window, iterations, buffer)
    assert got[0] == got[1] and got[0] == pytest.approx(0.4 * factor, rel=0.03)
    out = ResampleToSpacing(0.4, window=window, iterations=iterations, buffer=buffer)(img)
    crop = CropBreast(iterations=iterations, buffer=buffer)(out)
    assert crop.shape[1] <= window[0] and crop.shape[2] <= window[1]
    assert max(crop.shape[1] / window[0], crop.shape[2] / window[1]) > 0.9  # and it fills the window
    with pytest.raises(ValueError, match="no pixel > 0"):
        fit_breast_spacing(torch.zeros(1, 10, 10), 0.4, window)


def test_dictionary_version_masks_stay_binary_and_follow_the_image():
    """The image's spacing decides for every key (a mask's own is ignored); nearest-exact keeps a mask 0/1 and puts a
    block where the image's block goes; a mask of another size is refused; Invertd restores the file's shape."""
    values = np.zeros((60, 40), np.float32)
    values[20:40, 10:30] = 100.0
    mask = (values > 0).astype(np.float32)
    data = {
        "image": image(60, 40, spacing=(0.1, 0.1), values=values),
        "mask_benign": image(60, 40, spacing=None, values=mask),
    }
    t = ResampleToSpacingd(
        ["image", "mask_benign", "mask_malignant"],
        pixel_spacing=0.05,
        mode=["bilinear", "nearest-exact", "nearest-exact"],
        allow_missing_keys=True,
    )
    out = t(dict(data))
    assert tuple(out["image"].shape) == tuple(out["mask_benign"].shape) == (1, 120, 80)
    m = out["mask_benign"][0].numpy()
    assert set(np.unique(m)) == {0.0, 1.0} and m.sum() == 4 * mask.sum()
    np.testing.assert_array_equal(np.argwhere(m)[[0, -1]], [[40, 20], [79, 59]])  # block (20..39, 10..29) x 2
    np.testing.assert_allclose(out["mask_benign"].meta[MODEL_SPACING_KEY], (0.05, 0.05))
    byte_mask = t(
        {"image": data["image"].clone(), "mask_benign": MetaTensor(torch.as_tensor(mask, dtype=torch.uint8)[None])}
    )
    assert byte_mask["mask_benign"].dtype == torch.uint8  # nearest copies values: bytes stay bytes
    # inverse: the image and a map computed on the resampled grid come back on the (60, 40) grid
    out["map"] = MetaTensor(torch.rand(2, 120, 80))
    inv = Invertd(["map", "mask_benign"], transform=Compose([t]), orig_keys="image", nearest_interp=False)(out)
    assert tuple(inv["map"].shape) == (2, 60, 40) and tuple(inv["mask_benign"].shape) == (1, 60, 40)
    assert tuple(t.inverse(out)["image"].shape) == (1, 60, 40)
    data["mask_benign"] = image(30, 40, values=np.zeros((30, 40)))
    with pytest.raises(ValueError, match="masks must match their image"):
        t(data)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A left CC breast at 0.2 mm (PNG pHYs) with a 0/255 mask and the same picture at 0.4 mm (every second pixel),
    and a copy of the fine one without pHYs."""
    root = tmp_path_factory.mktemp("spacing_files")
    rows, cols = np.mgrid[:160, :96]
    fine = np.where(((rows - 80) / 70) ** 2 + (cols / 80) ** 2 < 1, 1000 + rows * 5 + cols, 0).astype(np.uint16)
    lesion = np.zeros(fine.shape, np.uint8)
    lesion[70:90, 30:50] = 255
    paths = {}
    for name, arr, spacing in (
        ("fine", fine, 0.2),
        ("fine_mask", lesion, 0.2),
        ("coarse", fine[::2, ::2], 0.4),
        ("unknown", fine, None),
    ):
        paths[name] = str(root / f"{name}.png")
        Image.fromarray(arr).save(paths[name], **({} if spacing is None else {"dpi": (25.4 / spacing,) * 2}))
    return paths


def test_pipeline_resamples_before_the_crop_and_inverts_onto_the_file(files):
    """The configs' mammogram steps with pixel_spacing 0.2: the 0.4 mm file is enlarged 2x before the crop and the
    window (which count model pixels), its window then looks like the 0.2 mm file's, and Invertd puts a window map on
    the file's (80, 48) grid; the mask went through with the image and stayed 0/1."""
    chain = mammogram_steps(image_size=[128, 96], crop_iterations=3, crop_buffer=2, pixel_spacing=0.2)
    fine = chain({"image": files["fine"], "mask_benign": files["fine_mask"], "laterality": "L", "view": "CC"})
    coarse = chain({"image": files["coarse"], "laterality": "L", "view": "CC"})
    assert tuple(fine["image"].shape) == tuple(coarse["image"].shape) == (1, 128, 96)
    assert set(np.unique(fine["mask_benign"].numpy())) == {0, 1} and int(fine["mask_benign"].sum()) == 400
    assert np.abs(np.asarray(fine["image"].meta["crop_box"]) - np.asarray(coarse["image"].meta["crop_box"])).max() <= 2
    a, b = fine["image"][0].numpy().ravel(), coarse["image"][0].numpy().ravel()
    assert np.corrcoef(a, b)[0, 1] > 0.99
    # Invertd: a window map lands on the file's grid through window, crop and the resampling
    d = chain({"image": files["coarse"], "laterality": "L", "view": "CC"})
    d["saliency"] = MetaTensor(torch.ones(1, 128, 96))
    back = Invertd("saliency", transform=chain, orig_keys="image", nearest_interp=False)(d)["saliency"]
    assert tuple(back.shape) == (1, 80, 48) and float(back.max()) == pytest.approx(1.0, abs=1e-4)
    assert float(back.min()) == 0.0  # rows outside the window (160 model rows, 128 in the window)
    # the file without pHYs: its spacing estimated so that the breast fits the window, the estimate recorded
    unknown = chain({"image": files["unknown"], "laterality": "L", "view": "CC"})["image"]
    assert unknown.meta[SPACING_ASSUMED_KEY] is True and unknown.meta[SPACING_SOURCE_KEY] == "fit_breast"
    np.testing.assert_allclose(unknown.meta[MODEL_SPACING_KEY], (0.2, 0.2))
    box = np.asarray(unknown.meta["crop_box"])
    assert box[2] - box[0] <= 128 and box[3] - box[1] <= 96  # the whole crop inside the window
    assert fine["image"].meta[SPACING_ASSUMED_KEY] is False
