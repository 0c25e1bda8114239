"""The preprocessing chains written out as transform blocks in the configs are the chains of
``mammogram_transforms()``: the same transforms in the same order, with the same arguments, giving bit-identical
outputs (with the same random draws) on synthetic mammograms; overrides of the size ids reach the blocks."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import BUNDLE_ROOT, TINY_CONFIG, TRAIN_CONFIG, assert_identical
from monai.bundle import ConfigParser
from monai.transforms import Compose, RandomizableTrait, Transform
from PIL import Image

from scripts.transforms import (
    BestCenterWindowd,
    CropBreastd,
    RandBestCenterWindowd,
    ResampleToSpacingd,
    mammogram_augmentations,
    mammogram_transforms,
)

INFERENCE_CONFIG = BUNDLE_ROOT / "configs" / "inference.yaml"
TINY_INFERENCE_CONFIG = TINY_CONFIG.parent / "tiny_inference.yaml"
MASK_KEYS = ["mask_benign", "mask_malignant"]
# chain name -> (config files without / with the tiny sizes, config id of the Compose, train, mask keys)
CHAINS = {
    "train": ([TRAIN_CONFIG], [TRAIN_CONFIG, TINY_CONFIG], "train#preprocessing", True, MASK_KEYS),
    "validate": ([TRAIN_CONFIG], [TRAIN_CONFIG, TINY_CONFIG], "validate#preprocessing", False, MASK_KEYS),
    "inference": ([INFERENCE_CONFIG], [INFERENCE_CONFIG, TINY_INFERENCE_CONFIG], "preprocessing", False, []),
}


# ------------------------------------------------------------------------------------------------ helpers


def parse(files: list[Path], **overrides) -> ConfigParser:
    parser = ConfigParser()
    parser.read_config([str(f) for f in files])
    parser["bundle_root"] = str(BUNDLE_ROOT)
    if INFERENCE_CONFIG in files:  # its model settings come from the checkpoint: none here, GLAM's defaults
        parser["ckpt_path"] = str(BUNDLE_ROOT / "models" / "no_such_checkpoint.pt")
    for key, value in overrides.items():
        parser[key] = value
    return parser


def python_chain(parser: ConfigParser, chain: str, **settings) -> Compose:
    """``mammogram_transforms`` with the parser's settings (none: its own defaults), followed by the config's
    ``target_transforms`` for train and validate (they are not part of ``mammogram_transforms``)."""
    _, _, _, train, mask_keys = CHAINS[chain]
    if settings.pop("from_parser", True):
        settings.update(
            window=parser.get_parsed_content("image_size"),
            iterations=parser.get_parsed_content("crop_iterations"),
            buffer=parser.get_parsed_content("crop_buffer"),
            pixel_spacing=parser.get_parsed_content("pixel_spacing"),
        )
        if train:
            settings["max_shift"] = parser.get_parsed_content("max_shift")
    t = mammogram_transforms(keys=["image"], mask_keys=mask_keys, train=train, **settings)
    tail = parser.get_parsed_content("target_transforms") if mask_keys else []
    return Compose(list(t.transforms) + list(tail))


def describe(obj, depth: int = 0):
    """A comparable picture of a transform: its class and, recursively, its attributes (random states left out,
    numpy arrays as lists, classes and functions by name)."""
    if depth > 8:
        return "..."
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, np.random.RandomState):
        return "RandomState"
    if isinstance(obj, (list, tuple)):
        return type(obj).__name__, [describe(x, depth + 1) for x in obj]
    if isinstance(obj, dict):
        return {str(k): describe(v, depth + 1) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, np.ndarray):
        return "ndarray", str(obj.dtype), obj.tolist()
    if isinstance(obj, (type, torch.dtype, np.dtype)):
        return repr(obj)
    if isinstance(obj, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return obj.__qualname__
    if hasattr(obj, "__dict__"):
        attrs = {k: v for k, v in vars(obj).items() if k != "R"}
        return type(obj).__qualname__, describe(attrs, depth + 1)
    return repr(obj)


def assert_same_chain(got: Compose, want: Compose) -> None:
    got_types = [type(t).__name__ for t in got.transforms]
    assert got_types == [type(t).__name__ for t in want.transforms]
    for i, (a, b) in enumerate(zip(got.transforms, want.transforms)):
        assert describe(a) == describe(b), f"transform {i} ({got_types[i]}) has other arguments"


def breast(h: int, w: int, top: int, radius_rows: float, radius_cols: float, seed: int) -> np.ndarray:
    """uint16 (h, w): a textured half-ellipse against the left edge (the chest wall), background 0."""
    rows, cols = np.mgrid[:h, :w]
    inside = ((rows - top - radius_rows) / radius_rows) ** 2 + (cols / radius_cols) ** 2 < 1
    texture = np.random.default_rng(seed).integers(200, 4000, size=(h, w))
    return np.where(inside, rows * 100 + cols + texture, 0).astype(np.uint16)


def write_items(root: Path, spacing_mm: float | None = None) -> list[dict]:
    """Three datalist items written as PNGs: a right CC view stored facing left (mirrored by the chain) with a
    benign mask, a left MLO view with a malignant mask and no benign key, a left CC view with empty mask fields;
    ``spacing_mm`` goes into the pHYs chunk of every file."""
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


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_config_defaults_are_the_python_defaults(chain):
    """The configs alone (the paper's sizes) show mammogram_transforms()'s own defaults."""
    files, _, config_id, _, _ = CHAINS[chain]
    parser = parse(files)
    assert_same_chain(parser.get_parsed_content(config_id), python_chain(parser, chain, from_parser=False))


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_config_chain_equals_mammogram_transforms(items, chain):
    _, files, config_id, train, _ = CHAINS[chain]
    parser = parse(files)
    config, python = parser.get_parsed_content(config_id), python_chain(parser, chain)
    assert_same_chain(config, python)
    size = tuple(parser.get_parsed_content("image_size"))
    for seed in (0, 1):
        got, want = run(config, items, seed), run(python, items, seed)
        assert_identical(got, want)
        assert all(tuple(d["image"].shape) == (1, *size) for d in got)
    assert [bool(d["image"].meta["flipped_to_right"]) for d in got] == [True, False, False]  # R mirrored, L kept
    if chain != "inference":
        # the masks followed their image into the window (benign 20x20 px, malignant 12x20 px, the third none)
        assert [[int(m.sum()) for m in d["mask"]] for d in got] == [[400, 0], [0, 240], [0, 0]]
    if train:  # the random window shift and the augmentations are drawn: another seed, other outputs
        assert any(not torch.equal(a["image"], b["image"]) for a, b in zip(run(config, items, 0), got))


def test_the_cache_stops_at_the_end_of_the_deterministic_prefix():
    """train_cache (CacheDataset) keeps the transforms before the first random one: exactly mammogram_prefix."""
    parser = parse([TRAIN_CONFIG, TINY_CONFIG])
    train = parser.get_parsed_content("train#preprocessing")
    prefix = parser.get_parsed_content("mammogram_prefix")
    first_random = train.get_index_of_first(lambda t: isinstance(t, RandomizableTrait) or not isinstance(t, Transform))
    assert first_random == len(prefix) and isinstance(train.transforms[first_random], RandBestCenterWindowd)
    assert not any(isinstance(t, RandomizableTrait) for t in prefix)


def test_overrides_reach_the_blocks(items):
    sizes = {"image_size": [192, 128], "max_shift": [2, 3], "crop_iterations": 3, "crop_buffer": 2}
    parser = parse([TRAIN_CONFIG, TINY_CONFIG], **sizes, **{"augmentations#1#factors": 0.2})
    train = parser.get_parsed_content("train#preprocessing")
    window = next(t for t in train.transforms if isinstance(t, RandBestCenterWindowd))
    assert window.cropper.window == (192, 128) and window.max_shift == (2, 3) and window.cropper.iterations == 3
    crop = next(t for t in train.transforms if isinstance(t, CropBreastd))
    assert (crop.cropper.iterations, crop.cropper.buffer) == (3, 2)
    augmentations = mammogram_augmentations(["image"], MASK_KEYS, factors=0.2)
    python = mammogram_transforms(
        keys=["image"], mask_keys=MASK_KEYS, window=(192, 128), train=True, iterations=3, buffer=2, max_shift=(2, 3)
    )
    python = Compose(
        list(python.transforms)[: -len(augmentations)] + augmentations + parser.get_parsed_content("target_transforms")
    )
    assert_same_chain(train, python)
    assert_identical(run(train, items, 5), run(python, items, 5))
    validate = parser.get_parsed_content("validate#preprocessing")
    assert next(t for t in validate.transforms if isinstance(t, BestCenterWindowd)).cropper.window == (192, 128)
    assert all(tuple(d["image"].shape) == (1, 192, 128) for d in run(validate, items, 0))
    # inference.yaml is self-contained: the same ids, the same effect
    inference = parse([INFERENCE_CONFIG, TINY_INFERENCE_CONFIG], image_size=[192, 128], crop_iterations=3)
    chain = inference.get_parsed_content("preprocessing")
    assert_same_chain(chain, python_chain(inference, "inference"))
    crop = next(t for t in chain.transforms if isinstance(t, CropBreastd))
    assert chain.transforms[-2].cropper.window == (192, 128) and crop.cropper.iterations == 3


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_pixel_spacing_reaches_the_blocks_and_resamples_like_python(tmp_path, chain):
    """With `pixel_spacing` set, the config's ResampleToSpacingd and mammogram_transforms(pixel_spacing=...) are the
    same transform and give bit-identical outputs on files at half the model's resolution (0.25 mm files, a 0.5 mm
    model: every file halved before the crop, the masks with it)."""
    _, files, config_id, _, _ = CHAINS[chain]
    parser = parse(files, pixel_spacing=0.5)
    config = parser.get_parsed_content(config_id)
    python = python_chain(parser, chain)
    assert_same_chain(config, python)
    resample = next(t for t in config.transforms if isinstance(t, ResampleToSpacingd))
    assert resample.resampler.pixel_spacing == (0.5, 0.5)
    spaced = write_items(tmp_path, spacing_mm=0.25)
    for seed in (0, 1):
        assert_identical(run(config, spaced, seed), run(python, spaced, seed))
    got = run(config, spaced, 0)
    for d in got:  # the file's spacing stays in meta (maps on its grid carry it), the model's is added
        assert np.allclose(d["image"].meta["spacing"], 0.25) and np.allclose(d["image"].meta["model_spacing"], 0.5)
        assert not d["image"].meta["spacing_assumed"]
    if chain != "inference":  # the masks were halved with their image: 20x20 -> 10x10, 12x20 -> 6x10
        assert [[int(m.sum()) for m in d["mask"]] for d in got] == [[100, 0], [0, 60], [0, 0]]
