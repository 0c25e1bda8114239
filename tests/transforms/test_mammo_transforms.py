"""Preprocessing transforms on tiny synthetic breasts: crop, flip, window, standardise, augment, invert."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from config_chains import mammogram_steps, parse, training_chain
from conftest import TRAIN_CONFIG
from monai.data import MetaTensor
from monai.transforms import Compose, Invertd, NormalizeIntensity, RandAxisFlipd, RandFlipd
from PIL import Image
from scipy import ndimage as ndi

from scripts.transforms.mammo import (
    BestCenterWindow,
    BestCenterWindowd,
    CropBreast,
    CropBreastd,
    DropEmptyKeysd,
    FlipToRight,
    FlipToRightd,
    RandBestCenterWindow,
    RandBestCenterWindowd,
    StandardizeImage,
    StandardizeImaged,
    best_center_window,
    breast_crop,
    chest_wall_side,
    open_breast_mask,
    open_breast_mask_exact,
)


def half_disc(h: int, w: int, radius_rows: float, radius_cols: float, top: int = 0) -> np.ndarray:
    """float32 (h, w): rows*1000 + cols + 1 inside a half-ellipse against the left edge centred at row
    ``top + radius_rows`` (unique values, so any misplaced pixel shows)."""
    rows, cols = np.mgrid[:h, :w]
    inside = ((rows - top - radius_rows) / radius_rows) ** 2 + (cols / radius_cols) ** 2 < 1
    return np.where(inside, rows * 1000 + cols + 1, 0).astype(np.float32)


def as_meta(arr: np.ndarray, **meta) -> MetaTensor:
    return MetaTensor(torch.as_tensor(np.ascontiguousarray(arr))[None], meta=dict(meta))


# ------------------------------------------------------------------------------------------ mask opening


@pytest.mark.parametrize("seed", range(4))
def test_fast_opening_equals_scipy_iterations(seed):
    rng = np.random.default_rng(seed)
    fg = ndi.binary_dilation(rng.random((70, 50)) < 0.02, iterations=4)  # blobs of various sizes
    fg[:, :3] |= True  # touching the border: erodes from outside like scipy's border_value=0
    fg[35, :] = True  # a thin line the erosion must remove
    for iterations in (1, 3, 6):
        np.testing.assert_array_equal(
            open_breast_mask(fg, iterations), open_breast_mask_exact(fg, iterations), err_msg=f"{iterations}"
        )


def test_crop_box_by_hand():
    img = np.zeros((60, 40), np.float32)
    img[10:40, :20] = 5  # breast block against the left edge
    img[52, :] = 3  # 1-px line: gone after 3 erosions
    img[0:2, 35:40] = 9  # small speck: not the largest component
    assert breast_crop(img, iterations=3, buffer=5)[0] == ((5, 0), (45, 25))
    mirrored = img[:, ::-1]
    assert breast_crop(mirrored, iterations=3, buffer=5, chest_wall="right")[0] == ((5, 15), (45, 40))
    assert breast_crop(mirrored, iterations=3, buffer=5, chest_wall="auto")[0] == ((5, 15), (45, 40))
    # buffers stop at the image border
    assert breast_crop(img, iterations=3, buffer=50)[0] == ((0, 0), (60, 40))


def test_crop_box_rejects_blank_and_falls_back_when_erosion_empties():
    with pytest.raises(ValueError, match="no pixel > 0"):
        breast_crop(np.zeros((10, 10)), iterations=2)[0]
    img = np.zeros((20, 20), np.float32)
    img[5:9, :6] = 1
    with pytest.warns(UserWarning, match="removed the whole foreground"):
        assert breast_crop(img, iterations=10, buffer=0)[0] == ((5, 0), (9, 6))


def test_chest_wall_side():
    img = half_disc(40, 30, 15, 20)
    assert chest_wall_side(img) == "left"
    assert chest_wall_side(img[:, ::-1]) == "right"


# -------------------------------------------------------------------------------------------------- flip


@pytest.mark.parametrize(
    "laterality, hflip, flipped",
    [("L", "NO", False), ("R", "NO", True), ("L", "YES", True), ("R", "YES", False), ("right", "NO", True)],
)
def test_flip_by_laterality(laterality, hflip, flipped):
    img = half_disc(20, 16, 8, 10)
    out = FlipToRight(horizontal_flip=hflip)(as_meta(img), laterality=laterality)
    np.testing.assert_array_equal(out[0].numpy(), img[:, ::-1] if flipped else img)
    assert out.meta["flipped_to_right"] is flipped


def test_flip_infers_from_image_when_laterality_unknown_or_guessed():
    img = half_disc(20, 16, 8, 10)[:, ::-1]  # chest wall on the right
    out = FlipToRight()(as_meta(img))
    np.testing.assert_array_equal(out[0].numpy(), img[:, ::-1])
    # a laterality the reader guessed from pixels is not trusted over horizontal_flip="YES"
    guessed = as_meta(img, laterality="R", laterality_source="image")
    out = FlipToRight(horizontal_flip="YES")(guessed)
    assert out.meta["flipped_to_right"] is True


def test_flip_inverse_restores_and_bad_option_rejected():
    img = half_disc(20, 16, 8, 10)
    flip = FlipToRight()
    for lat in ("L", "R"):
        out = flip(as_meta(img), laterality=lat)
        back = flip.inverse(out)
        np.testing.assert_array_equal(back[0].numpy(), img)
        assert len(back.applied_operations) == 0
    with pytest.raises(ValueError, match="horizontal_flip"):
        FlipToRight(horizontal_flip="maybe")


# -------------------------------------------------------------------------------------------------- crop


def test_crop_breast_and_inverse():
    img = np.zeros((60, 40), np.float32)
    img[10:40, :20] = np.arange(30 * 20).reshape(30, 20) + 1
    crop = CropBreast(iterations=3, buffer=5)
    out = crop(as_meta(img))
    np.testing.assert_array_equal(out[0].numpy(), img[5:45, 0:25])
    np.testing.assert_array_equal(out.meta["crop_box"], [5, 0, 45, 25])
    back = crop.inverse(out)
    assert tuple(back.shape) == (1, 60, 40)
    np.testing.assert_array_equal(back[0].numpy(), img)


def test_crop_breastd_crops_masks_with_the_image_box_and_rejects_wrong_sizes():
    img = np.zeros((60, 40), np.float32)
    img[10:40, :20] = 7
    mask = np.zeros((60, 40), np.float32)
    mask[20:23, 5:8] = 1
    t = CropBreastd(["image", "mask_benign"], iterations=3, buffer=5)
    d = t({"image": as_meta(img), "mask_benign": as_meta(mask)})
    np.testing.assert_array_equal(d["mask_benign"][0].numpy(), mask[5:45, 0:25])
    with pytest.raises(ValueError, match=r"mask\.png.*mask_benign.*\(30, 40\).*masks must match"):
        t({"image": as_meta(img), "mask_benign": as_meta(mask[:30], filename_or_obj="mask.png")})


# ------------------------------------------------------------------------------------------------ window


def loop_best_row(fg: np.ndarray, center_col: int, win: tuple[int, int]) -> int:
    """The CC row search written as a plain loop over candidate rows."""
    h, w = fg.shape
    half_h, half_w = win[0] // 2, win[1] // 2
    left = center_col - half_w
    right = center_col + win[1] - half_w + max(-left, 0)
    left, right = max(left, 0), min(right, w)
    best, best_rows = -1, []
    for r in range(half_h, h - (win[0] - half_h) + 1):
        s = int(fg[r - half_h : r - half_h + win[0], left:right].sum())
        if s > best:
            best, best_rows = s, [r]
        elif s == best:
            best_rows.append(r)
    return min(best_rows, key=lambda r: ((r - h // 2) ** 2, r))


def test_window_cc_small_image_pads_top_and_bottom_evenly_and_right():
    img = half_disc(21, 9, 10, 6)  # rightmost breast column 5 (rows below the top third)
    p = best_center_window(img, "CC", (30, 16), iterations=0)
    assert p.rightmost == 5
    assert p.best_center == (21 // 2, 5 - 8 - 1)
    assert p.start == (-((30 - 21) // 2), 0)
    out = BestCenterWindow((30, 16), iterations=0)(as_meta(img, view="CC"))
    window = out[0].numpy()
    np.testing.assert_array_equal(window[4:25, :9], img)
    assert not window[:4].any() and not window[25:].any() and not window[:, 9:].any()
    np.testing.assert_array_equal(out.meta["window_start"], [-4, 0])


def test_window_cc_row_search_matches_a_loop():
    rng = np.random.default_rng(3)
    img = np.zeros((120, 60), np.float32)
    img[30:100, :45] = rng.integers(1, 100, size=(70, 45))
    img[rng.random(img.shape) < 0.05] = 0  # holes make the counts uneven
    img[55:60, :] = 1  # the breast reaches the right edge here
    p = best_center_window(img, "CC", (40, 30), iterations=0, reference_compatible=False)
    assert p.rightmost == 59
    assert p.best_center[1] == 59 + 1 - 30 + 15
    assert p.best_center[0] == loop_best_row(img > 0, p.best_center[1], (40, 30))
    assert p.start == (p.best_center[0] - 20, 30)


def test_window_reference_vs_spec_words():
    img = np.zeros((80, 70), np.float32)
    img[10:60, :50] = 5  # rightmost column 49, bottom row 59
    clean = best_center_window(img, "MLO", (40, 30), iterations=0, reference_compatible=False)
    assert clean.end == (60, 50)  # last window row/col = bottom-most / rightmost breast pixel
    ref = best_center_window(img, "MLO", (40, 30), iterations=0)
    assert ref.best_center == (59 - 20 - 1, 49 - 15 - 1)
    assert ref.end == (58, 48)
    mirrored = best_center_window(img, "MLO", (40, 30), iterations=0, mirrored=True)
    assert mirrored.best_center == (38, 49 + 1 - 15 - 1)


def test_window_mlo_small_image_pads_bottom_only():
    img = half_disc(25, 9, 12, 6)
    out = BestCenterWindow((30, 16), iterations=0)(as_meta(img, view="MLO"))
    window = out[0].numpy()
    np.testing.assert_array_equal(window[:25, :9], img)
    assert not window[25:].any()


def test_window_unknown_view():
    img = half_disc(25, 9, 12, 6)
    a = BestCenterWindow((30, 16), iterations=0)(as_meta(img))  # default_view="CC"
    b = BestCenterWindow((30, 16), iterations=0)(as_meta(img, view="CC"))
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(ValueError, match="unknown view"):
        BestCenterWindow((30, 16), iterations=0, default_view=None)(as_meta(img, view="??"))


def test_window_inverse_maps_back_to_input_geometry():
    img = half_disc(21, 9, 10, 6)
    t = BestCenterWindow((30, 16), iterations=0)
    out = t(as_meta(img, view="CC"))
    back = t.inverse(out)
    assert tuple(back.shape) == (1, 21, 9)
    np.testing.assert_array_equal(back[0].numpy(), img)


def test_rand_window_shift_is_reproducible_and_bounded():
    img = np.zeros((80, 60), np.float32)
    img[10:70, :40] = np.arange(60 * 40).reshape(60, 40) + 1
    mask = (img % 7 == 0).astype(np.float32)
    data = {"image": as_meta(img, view="MLO"), "mask_benign": as_meta(mask)}
    det = BestCenterWindowd(["image", "mask_benign"], window=(40, 30), iterations=0)(dict(data))
    starts = []
    for seed in (0, 0, 1, 2, 3):
        t = RandBestCenterWindowd(["image", "mask_benign"], window=(40, 30), max_shift=(6, 5), iterations=0)
        t.set_random_state(seed)
        d = t(dict(data))
        start = d["image"].meta["window_start"]
        top, left = int(start[0]), int(start[1])
        det_top, det_left = (int(v) for v in det["image"].meta["window_start"])
        assert abs(top - det_top) <= 6 and abs(left - det_left) <= 5
        assert 0 <= top <= 80 - 40 and 0 <= left <= 60 - 30  # this image is larger than the window: no padding
        np.testing.assert_array_equal(d["image"][0].numpy(), img[top : top + 40, left : left + 30])
        np.testing.assert_array_equal(d["mask_benign"][0].numpy(), mask[top : top + 40, left : left + 30])
        starts.append((top, left))
    assert starts[0] == starts[1]
    assert len(set(starts)) > 2


def test_rand_window_shift_never_adds_padding_at_the_chest_wall():
    img = half_disc(21, 9, 10, 6)  # smaller than the window: columns start at 0 (chest wall)
    t = RandBestCenterWindow(max_shift=(3, 4), window=(30, 16), iterations=0)
    t.set_random_state(5)
    for _ in range(20):
        out = t(as_meta(img, view="CC"))
        assert out.meta["window_start"][1] >= 0
        assert abs(int(out.meta["window_start"][0]) + 4) <= 3


# ---------------------------------------------------------------------------------------- standardise


def test_standardize_matches_numpy_and_floors_std():
    rng = np.random.default_rng(0)
    x = rng.normal(100, 20, size=(1, 30, 20)).astype(np.float32)
    out = StandardizeImage()(MetaTensor(torch.as_tensor(x), meta={"view": "CC"}))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(out.numpy(), (x64 - x64.mean()) / max(x64.std(), 1e-5), rtol=1e-5, atol=1e-5)
    assert out.meta["view"] == "CC" and out.dtype == torch.float32
    tiny = np.full((1, 4, 4), 3.0, np.float32)
    tiny[0, 0, 0] += 1e-6  # std ~ 2.4e-7 < 1e-5: the floor applies, MONAI's NormalizeIntensity would not
    expected = (tiny.astype(np.float64) - tiny.astype(np.float64).mean()) / 1e-5
    np.testing.assert_allclose(StandardizeImage()(torch.as_tensor(tiny)).numpy(), expected, rtol=1e-3, atol=1e-4)
    assert not np.allclose(NormalizeIntensity()(torch.as_tensor(tiny)).numpy(), expected, atol=1e-2)
    d = StandardizeImaged("image")({"image": torch.as_tensor(x)})
    np.testing.assert_allclose(d["image"].numpy(), out.numpy())


# ---------------------------------------------------------------------------------------------- pipeline


@pytest.fixture
def exam_files(tmp_path):
    """A right CC view stored facing left (as the authors' R views) with a benign mask, as 16-bit PNGs."""
    img = half_disc(50, 30, 20, 18, top=5).astype(np.uint16)  # values < 65536
    img = img[:, ::-1].copy()
    mask = np.zeros_like(img, dtype=np.uint8)
    mask[22:26, 22:25] = 255  # inside the breast (near the chest wall, which is on the right)
    assert (img[mask > 0] > 0).all()
    Image.fromarray(img).save(tmp_path / "R_CC.png")
    Image.fromarray(mask).save(tmp_path / "R_CC_benign.png")
    return (
        {
            "image": str(tmp_path / "R_CC.png"),
            "mask_benign": str(tmp_path / "R_CC_benign.png"),
            "mask_malignant": None,
            "laterality": "R",
            "view": "CC",
        },
        img,
        mask,
    )


def test_pipeline_masks_follow_the_image(exam_files):
    item, img, mask = exam_files
    t = mammogram_steps(image_size=[64, 40], crop_iterations=2, crop_buffer=3)
    d = t(dict(item))
    assert "mask_malignant" not in d
    image, m = d["image"][0].numpy(), d["mask_benign"][0].numpy()
    assert image.shape == m.shape == (64, 40)
    assert set(np.unique(m)) == {0.0, 1.0}
    assert m.sum() == (mask > 0).sum()
    # the same original pixels carry the mask: compare the unique pixel values
    np.testing.assert_array_equal(np.sort(image[m > 0]), np.sort(img[mask > 0].astype(np.float32)))
    # breast faces right: chest wall column 0 has tissue
    assert image[:, 0].any()


def test_pipeline_inverse_lands_on_the_original_pixel(exam_files):
    item, img, _ = exam_files
    t = mammogram_steps(standardize=True, image_size=[64, 40], crop_iterations=2, crop_buffer=3)
    d = t(dict(item))
    h, w = img.shape
    r, c = 30, w - 1 - 4  # a breast pixel of the stored (unflipped) image
    top = int(d["image"].meta["window_start"][0])
    box = d["image"].meta["crop_box"]
    win_r, win_c = r - int(box[0]) - top, (w - 1 - c) - int(box[1]) - int(d["image"].meta["window_start"][1])
    saliency = torch.zeros_like(d["image"])
    saliency[0, win_r, win_c] = 1.0
    d["pred"] = saliency
    out = Invertd("pred", transform=t, orig_keys="image", nearest_interp=False)(d)
    back = out["pred"][0].numpy()
    assert back.shape == img.shape
    assert back[r, c] == 1.0 and back.sum() == 1.0


def test_pipeline_training_is_reproducible_and_offers_no_left_right_mirroring(exam_files):
    item, _, _ = exam_files
    outs = []
    for seed in (7, 7, 8):
        t = training_chain("train", image_size=[64, 40], crop_iterations=2, crop_buffer=3, max_shift=[4, 4])
        t.set_random_state(seed)
        outs.append(t({**item, "label": [1, 0]}))
    np.testing.assert_array_equal(outs[0]["image"].numpy(), outs[1]["image"].numpy())
    assert not np.array_equal(outs[0]["image"].numpy(), outs[2]["image"].numpy())
    # no flip of any kind by default (an up-down flip is an opt-in written into the list; left-right never)
    assert not any(isinstance(a, (RandFlipd, RandAxisFlipd)) for a in t.transforms)


def test_augmentations_have_the_papers_settings_and_take_overrides_by_id():
    ids = "train#batch_transforms"
    contrast, scale, shift = parse([TRAIN_CONFIG]).get_parsed_content(ids).transforms[2:5]
    assert (contrast.prob, scale.prob, shift.prob) == (0.5, 0.5, 0.5)
    assert contrast.adjuster.gamma == (0.8, 1.25)
    assert scale.scaler.factors == (-0.1, 0.1) and shift.shifter.offsets == (-0.1, 0.1)
    overrides = {f"{ids}#transforms#2#gamma": [0.9, 1.1], f"{ids}#transforms#3#factors": 0.3}
    overrides.update({f"{ids}#transforms#4#offsets": 0.05, f"{ids}#transforms#4#prob": 0.2})
    contrast, scale, shift = parse([TRAIN_CONFIG], **overrides).get_parsed_content(ids).transforms[2:5]
    assert contrast.adjuster.gamma == (0.9, 1.1) and shift.prob == 0.2
    assert scale.scaler.factors == (-0.3, 0.3) and shift.shifter.offsets == (-0.05, 0.05)


def test_drop_empty_keys_and_flipd_uses_the_data_field():
    img = half_disc(20, 16, 8, 10)
    d = DropEmptyKeysd(["m1", "m2", "m3"])({"m1": None, "m2": " ", "m3": "x.png", "image": 1})
    assert d == {"m3": "x.png", "image": 1}
    t = FlipToRightd(["image"], source_key="image")
    out = t({"image": as_meta(img, laterality="L", laterality_source="dicom"), "laterality": "R"})
    np.testing.assert_array_equal(out["image"][0].numpy(), img[:, ::-1])
    back = t.inverse(out)
    np.testing.assert_array_equal(back["image"][0].numpy(), img)


def test_compose_inverse_of_dictionary_chain():
    img = np.zeros((50, 30), np.float32)
    img[5:45, 12:30] = np.arange(40 * 18).reshape(40, 18) + 1  # chest wall on the right
    keys = ["image"]
    t = Compose(
        [
            FlipToRightd(keys, laterality_key=None),
            CropBreastd(keys, iterations=2, buffer=3),
            BestCenterWindowd(keys, window=(64, 40), iterations=2),
        ]
    )
    d = t({"image": as_meta(img, view="MLO")})
    assert tuple(d["image"].shape) == (1, 64, 40)
    back = t.inverse(d)["image"]
    assert tuple(back.shape) == (1, 50, 30)
    np.testing.assert_array_equal(back[0].numpy(), img)


def test_pipeline_from_dicom_tags(tmp_path):
    """Laterality and view from the DICOM tags drive the flip and the window rule when the item has none."""
    from _dicom_factory import make_dicom

    stored = half_disc(50, 30, 20, 18, top=5)[:, ::-1].astype(np.uint16)  # a right breast, stored facing left
    path = make_dicom(
        tmp_path / "r_mlo.dcm",
        stored,
        laterality="R",
        view_position=None,
        view_code=("R-10226", "SRT", "medio-lateral oblique"),
    )
    t = mammogram_steps(image_size=[64, 40], crop_iterations=2, crop_buffer=3)
    d = t({"image": str(path)})
    image = d["image"]
    assert image.meta["laterality"] == "R" and image.meta["view"] == "MLO"
    assert bool(image.meta["flipped_to_right"])
    window = image[0].numpy()
    assert window[:, 0].any()  # chest wall at column 0
    box = [int(v) for v in image.meta["crop_box"]]
    cropped_rows = box[2] - box[0]
    assert int(image.meta["window_start"][0]) == 0  # MLO: window from the first row, padding at the bottom
    assert window[:cropped_rows].any(axis=1).sum() > 0 and not window[cropped_rows:].any()


def test_flip_to_rightd_honours_the_recorded_facing():
    """A right breast stored facing right (synthetic PNGs) must not be mirrored back; 'left' always flips."""
    from scripts.transforms.mammo import FlipToRightd

    img = torch.zeros(1, 4, 6)
    img[:, :, :2] = 1.0  # chest wall at the left edge: already facing right
    kept = FlipToRightd(["image"])({"image": img.clone(), "laterality": "R", "facing": "right"})["image"]
    assert torch.equal(torch.as_tensor(kept), img)
    flipped = FlipToRightd(["image"])({"image": img.clone(), "laterality": "L", "facing": "left"})["image"]
    assert torch.equal(torch.as_tensor(flipped), img.flip(-1))
    by_laterality = FlipToRightd(["image"])({"image": img.clone(), "laterality": "R"})["image"]
    assert torch.equal(torch.as_tensor(by_laterality), img.flip(-1))  # no facing: the authors' rule (R mirrored)
    with pytest.raises(ValueError, match="'facing' must be 'right' or 'left'"):
        FlipToRightd(["image"])({"image": img.clone(), "facing": "up"})
