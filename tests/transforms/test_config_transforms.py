"""The preprocessing chains the configs write out (bundle/configs/train.yaml, inference.yaml): each transform a
config id, in the order docs/preprocessing.md gives; the cached halves deterministic and every random draw per step;
the masks follow their image; overrides by id (size ids, one transform's argument, from the command line) reach the
transform they name; inference's loading shares the preprocessing's objects, so Invertd puts a map back on the file's
grid."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from config_chains import INFERENCE_CONFIG, parse, training_chain
from conftest import REPO_ROOT, TINY_CONFIG, TRAIN_CONFIG, assert_identical, workflow_command
from monai.transforms import Compose, Invertd, RandomizableTrait, Transform
from PIL import Image

from scripts.transforms import BestCenterRegiond, BestCenterWindowd, CropBreastd, ResampleToSpacingd

TINY = [TRAIN_CONFIG, TINY_CONFIG]
TINY_INFERENCE = [INFERENCE_CONFIG, TINY_CONFIG.parent / "tiny_inference.yaml"]
#: the mammogram steps of both cached training chains (inference's, for the image alone, skips the mask steps)
MAMMOGRAM_STEPS = [
    "DropEmptyKeysd",
    "LoadImaged",
    "LoadImaged",
    "BoxesToMasksd",
    "ResampleToSpacingd",
    "AsDiscreted",
    "CastToTyped",
    "FlipToRightd",
    "CropBreastd",
]
TARGETS = ["EnsureTyped", "EnsureTyped", "SelectItemsd"]
AUGMENTATIONS = ["RandAdjustContrastd", "RandScaleIntensityd", "RandShiftIntensityd"]


def types(chain: Compose) -> list[str]:
    return [type(t).__name__ for t in chain.transforms]


def breast(h: int, w: int, top: int, radius_rows: float, radius_cols: float, seed: int) -> np.ndarray:
    """uint16 (h, w): a textured half-ellipse against the left edge (the chest wall), background 0."""
    rows, cols = np.mgrid[:h, :w]
    inside = ((rows - top - radius_rows) / radius_rows) ** 2 + (cols / radius_cols) ** 2 < 1
    texture = np.random.default_rng(seed).integers(200, 4000, size=(h, w))
    return np.where(inside, rows * 100 + cols + texture, 0).astype(np.uint16)


def write_items(root: Path, spacing_mm: float | None = None) -> list[dict]:
    """Three datalist items written as PNGs: a right CC view stored facing left (mirrored by the chain) with a 20x20
    benign mask, a left MLO view with a 12x20 malignant mask and no benign key, a left CC view with empty mask
    fields; ``spacing_mm`` goes into the pHYs chunk of every file."""
    options = {} if spacing_mm is None else {"dpi": (25.4 / spacing_mm,) * 2}

    def save(name: str, array: np.ndarray) -> str:
        Image.fromarray(array).save(root / name, **options)
        return str(root / name)

    r_cc = breast(300, 180, 20, 130, 150, seed=1)[:, ::-1].copy()  # chest wall on the right
    benign = np.zeros(r_cc.shape, np.uint8)
    benign[140:160, 120:140] = 255
    l_mlo = breast(280, 170, 0, 135, 160, seed=2)
    malignant = np.zeros(l_mlo.shape, np.uint8)
    malignant[100:112, 30:50] = 255
    l_cc = breast(260, 150, 10, 110, 120, seed=3)
    return [
        {
            "image": save("R_CC.png", r_cc),
            "mask_benign": save("R_CC_benign.png", benign),
            "mask_malignant": None,
            "label": [1, 0],
            "laterality": "R",
            "view": "CC",
        },
        {
            "image": save("L_MLO.png", l_mlo),
            "mask_malignant": save("L_MLO_malignant.png", malignant),
            "label": [0, 1],
            "laterality": "L",
            "view": "MLO",
        },
        {
            "image": save("L_CC.png", l_cc),
            "mask_benign": "",
            "mask_malignant": "",
            "label": [0, 0],
            "laterality": "L",
            "view": "CC",
        },
    ]


@pytest.fixture(scope="module")
def items(tmp_path_factory) -> list[dict]:
    """The three items without a pixel spacing (plain PNGs)."""
    return write_items(tmp_path_factory.mktemp("config_transforms"))


def run(chain: Compose, items: list[dict], seed: int) -> list[dict]:
    chain.set_random_state(seed)
    return [chain(dict(item)) for item in items]


# -------------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("train_masks", [False, True])
def test_the_chains_hold_the_documented_transforms_in_order(train_masks):
    """docs/preprocessing.md's order, one config id per transform; GLAM's training drops the masks before loading
    them and stacks none (`train_masks` false), the U-Net baseline's keeps and stacks them."""
    parser = parse([TRAIN_CONFIG], train_masks=train_masks)
    drop, stack = ([], ["StackMasksd"]) if train_masks else (["DeleteItemsd"], [])
    window = ["BestCenterRegiond", "QuantizeToUint16d"]
    assert types(parser.get_parsed_content("train#preprocessing")) == (
        ["CopyItemsd", *drop, *MAMMOGRAM_STEPS, *window, *stack, *TARGETS]
    )
    assert types(parser.get_parsed_content("train#batch_transforms")) == [
        "RandWindowShiftd",
        "StandardizeImaged",
        *AUGMENTATIONS,
    ]
    assert types(parser.get_parsed_content("validate#preprocessing")) == (
        ["CopyItemsd", *MAMMOGRAM_STEPS, "BestCenterWindowd", "QuantizeToUint16d", "StackMasksd", *TARGETS]
    )
    assert types(parser.get_parsed_content("validate#batch_transforms")) == ["StandardizeImaged"]
    inference = parse()
    image_steps = ["LoadImaged", "ResampleToSpacingd", "FlipToRightd", "CropBreastd"]
    assert types(inference.get_parsed_content("preprocessing")) == [
        *image_steps,
        "BestCenterWindowd",
        "StandardizeImaged",
    ]
    pictures = ["DropEmptyKeysd", "LoadImaged", "BoxesToMasksd", "Thumbnaild", "DeleteItemsd"]
    assert types(inference.get_parsed_content("loading")) == [
        "LoadImaged",
        *pictures,
        *image_steps[1:],
        "BestCenterWindowd",
        "StandardizeImaged",
    ]


@pytest.mark.parametrize("chain, train_masks", [("train", False), ("train", True), ("validate", False)])
def test_the_training_chains_on_synthetic_mammograms(items, chain, train_masks):
    """The model's window, float32, standardised; the cached half uint16 plain tensors with the file and the labels;
    the masks (with them) followed their image into the window: 20x20 and 12x20 px, counted on the files."""
    parser = parse(TINY, train_masks=train_masks)
    size = tuple(parser.get_parsed_content("image_size"))
    cached = run(parser.get_parsed_content(f"{chain}#preprocessing"), items, 0)
    got = run(training_chain(chain, TINY, train_masks=train_masks), items, 0)
    assert all(tuple(d["image"].shape) == (1, *size) and d["image"].dtype == torch.float32 for d in got)
    for d in got:
        assert abs(float(d["image"].mean())) < 0.1 and abs(float(d["image"].std()) - 1) < 0.1  # before augmentation
    assert all(d["image"].dtype == torch.uint16 and type(d["image"]) is torch.Tensor for d in cached)
    assert [d["image_path"] for d in got] == [it["image"] for it in items]
    assert [d["label"].tolist() for d in got] == [it["label"] for it in items]
    if chain == "train":  # the random window shift and the augmentations are drawn: another seed, other outputs
        again = run(training_chain(chain, TINY, train_masks=train_masks), items, 1)
        assert any(not torch.equal(a["image"], b["image"]) for a, b in zip(again, got))
    if chain == "train" and not train_masks:
        assert all("mask" not in d for d in cached + got)
        return
    assert [[int(m.sum()) for m in d["mask"]] for d in got] == [[400, 0], [0, 240], [0, 0]]
    assert all(d["mask"].dtype == torch.uint8 for d in cached)


def test_the_cached_chains_are_deterministic_and_the_random_work_is_per_step():
    """train_cache / val_cache keep the whole cached chain (MONAI caches up to the first random transform: there is
    none), and every random transform runs in the per-step chain, the window shift first."""
    parser = parse(TINY)
    for config_id in ("train#preprocessing", "validate#preprocessing"):
        chain = parser.get_parsed_content(config_id)
        assert (
            chain.get_index_of_first(lambda t: isinstance(t, RandomizableTrait) or not isinstance(t, Transform)) is None
        )
    steps = parser.get_parsed_content("train#batch_transforms")
    assert [type(t).__name__ for t in steps.transforms if isinstance(t, RandomizableTrait)] == [
        "RandWindowShiftd",
        *AUGMENTATIONS,
    ]
    validate = parser.get_parsed_content("validate#batch_transforms")
    assert not any(isinstance(t, RandomizableTrait) for t in validate.transforms)


def test_overrides_reach_the_transforms(items):
    """The size ids reach every transform that takes them; an id of one transform changes that one alone."""
    sizes = {"image_size": [192, 128], "max_shift": [2, 3], "crop_iterations": 3, "crop_buffer": 2}
    parser = parse(TINY, **sizes, **{"train#batch_transforms#transforms#3#factors": 0.2})
    train = parser.get_parsed_content("train#preprocessing")
    region = next(t for t in train.transforms if isinstance(t, BestCenterRegiond))
    assert region.cropper.window == (192, 128) and region.cropper.max_shift == (2, 3) and region.cropper.iterations == 3
    crop = next(t for t in train.transforms if isinstance(t, CropBreastd))
    assert (crop.cropper.iterations, crop.cropper.buffer) == (3, 2)
    steps = parser.get_parsed_content("train#batch_transforms")
    assert steps.transforms[0].cropper.window == (192, 128) and steps.transforms[0].cropper.max_shift == (2, 3)
    assert steps.transforms[3].scaler.factors == (-0.2, 0.2)  # the scale augmentation, 1 +- 0.2
    validate = parser.get_parsed_content("validate#preprocessing")
    assert next(t for t in validate.transforms if isinstance(t, BestCenterWindowd)).cropper.window == (192, 128)
    assert all(tuple(d["image"].shape) == (1, 192, 128) for d in run(validate, items, 0))
    # inference.yaml is self-contained: the same ids, the same effect
    chain = parse(TINY_INFERENCE, image_size=[192, 128], crop_iterations=3).get_parsed_content("preprocessing")
    crop = next(t for t in chain.transforms if isinstance(t, CropBreastd))
    assert chain.transforms[-2].cropper.window == (192, 128) and crop.cropper.iterations == 3


@pytest.mark.parametrize("chain", ["train", "validate", "inference"])
def test_pixel_spacing_reaches_the_resampling(tmp_path, chain):
    """With `pixel_spacing` 0.5 mm, 0.25 mm files are halved before the crop, their masks with them (20x20 -> 10x10,
    12x20 -> 6x10); inference keeps the file's spacing in the metadata and adds the model's."""
    files = TINY_INFERENCE if chain == "inference" else TINY
    parser = parse(files, pixel_spacing=0.5, train_masks=True)
    config_id = "preprocessing" if chain == "inference" else f"{chain}#preprocessing"
    resample = next(t for t in parser.get_parsed_content(config_id).transforms if isinstance(t, ResampleToSpacingd))
    assert resample.resampler.pixel_spacing == (0.5, 0.5)
    spaced = write_items(tmp_path, spacing_mm=0.25)
    if chain == "inference":
        for d in run(parser.get_parsed_content("preprocessing"), spaced, 0):
            assert np.allclose(d["image"].meta["spacing"], 0.25) and np.allclose(d["image"].meta["model_spacing"], 0.5)
            assert not d["image"].meta["spacing_assumed"]
        return
    got = run(training_chain(chain, files, pixel_spacing=0.5, train_masks=True), spaced, 0)
    assert [[int(m.sum()) for m in d["mask"]] for d in got] == [[100, 0], [0, 60], [0, 0]]


def test_the_inference_loading_shares_the_preprocessing_objects_so_invertd_undoes_it(tmp_path):
    """The loading holds the preprocessing's own transforms around the panel pictures, so Invertd over the
    preprocessing brings a window-sized output back to the file's size and orientation."""
    parser = parse(TINY_INFERENCE, image_size=[192, 128], panel_height=100)
    preprocessing, loading = parser.get_parsed_content("preprocessing"), parser.get_parsed_content("loading")
    steps = list(preprocessing.transforms)
    assert loading.transforms[0] is steps[0] and all(a is b for a, b in zip(loading.transforms[6:], steps[1:]))
    assert len(loading.transforms) == len(steps) + 5
    items = write_items(tmp_path)
    out = loading(dict(items[0]))  # the right CC view stored facing left, 300x180, with a benign mask
    assert tuple(out["image"].shape) == (1, 192, 128) and "mask_benign" not in out
    assert tuple(out["mask_benign_thumbnail"].shape) == (1, 100, 60)  # every 3rd pixel: at most 100 rows
    assert bool(out["image"].meta["flipped_to_right"])
    out["image"] = out["image"].clone()
    out["image"][:] = 1 + torch.arange(out["image"].numel(), dtype=torch.float32).reshape(out["image"].shape)
    back = Invertd(keys="image", transform=preprocessing, orig_keys="image")(out)["image"]
    assert tuple(back.shape) == (1, 300, 180)
    # the window's values come back once each (the rest is the padding, 0), mirrored: its top-left pixel (1, at the
    # chest wall after the flip) lies on the file's right, where this right breast's chest wall is
    assert sorted(back[back > 0].tolist()) == list(range(1, 192 * 128 + 1))
    row, col = (int(i) for i in torch.nonzero(back[0] == 1)[0])
    assert col >= 90


PROBE = """
probe_item: null
probe_out: null
probe: "$torch.save(@train#preprocessing(dict(@probe_item))['image'], @probe_out)"
"""


def test_one_transform_of_the_training_chain_overridden_from_the_command_line(tmp_path):
    """`--train#preprocessing#transforms#6#mode ...` on the documented command (`run_workflow scripts.GLAMWorkflow`)
    replaces the resampling's interpolation of the training chain and nothing else: the run's window is the
    in-process chain's with that override, and not the bilinear default's."""
    (item,) = write_items(tmp_path, spacing_mm=0.25)[2:]
    probe = tmp_path / "probe.yaml"
    probe.write_text(PROBE)
    out = tmp_path / "window.pt"
    mode = "['nearest', 'nearest-exact', 'nearest-exact']"
    files = f"['{TRAIN_CONFIG}','{TINY_CONFIG}','{probe}']"
    command = [*workflow_command("probe")]
    command += ["--config_file", files, "--pixel_spacing", "0.5"]
    command += ["--train#preprocessing#transforms#6#mode", mode, "--probe_item", str(item), "--probe_out", str(out)]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    got = torch.load(out, weights_only=False)
    nearest = parse(TINY, pixel_spacing=0.5, **{"train#preprocessing#transforms#6#mode": eval(mode)})
    resample = nearest.get_parsed_content("train#preprocessing").transforms[6]
    assert isinstance(resample, ResampleToSpacingd) and resample.mode == ("nearest", "nearest-exact", "nearest-exact")
    assert_identical(got, nearest.get_parsed_content("train#preprocessing")(dict(item))["image"])
    bilinear = parse(TINY, pixel_spacing=0.5).get_parsed_content("train#preprocessing")(dict(item))["image"]
    assert not torch.equal(got, bilinear)
