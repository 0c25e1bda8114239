"""The preprocessing chains the configs build (the pipeline components they instantiate, or transform blocks written
out) are the chains of the Python builders: the same transforms in the same order, with the same arguments. Training
and validation run each chain in two halves (cached per image: ``mammogram_cache_transforms``; per step, on the
device: ``mammogram_step_transforms``), which together give ``mammogram_transforms()``'s images bit for bit (with the
same random draws) on synthetic mammograms; overrides of the size ids reach the chains."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import BUNDLE_ROOT, TINY_CONFIG, TRAIN_CONFIG, assert_identical
from monai.bundle import ConfigParser
from monai.transforms import (
    Compose,
    CopyItemsd,
    DeleteItemsd,
    EnsureTyped,
    RandomizableTrait,
    SelectItemsd,
    Transform,
)
from PIL import Image

from scripts.inference.inputs import inference_reader
from scripts.transforms import (
    BestCenterRegiond,
    BestCenterWindowd,
    CropBreastd,
    RandWindowShiftd,
    ResampleToSpacingd,
    mammogram_augmentations,
    mammogram_cache_transforms,
    mammogram_step_transforms,
    mammogram_transforms,
)
from scripts.transforms.targets import StackMasksd

INFERENCE_CONFIG = BUNDLE_ROOT / "configs" / "inference.yaml"
TINY_INFERENCE_CONFIG = TINY_CONFIG.parent / "tiny_inference.yaml"
MASK_KEYS = ["mask_benign", "mask_malignant"]
# chain name -> (config files without / with the tiny sizes, config id of the (cached) Compose, train, mask keys)
CHAINS = {
    "train": ([TRAIN_CONFIG], [TRAIN_CONFIG, TINY_CONFIG], "train#preprocessing", True, MASK_KEYS),
    "validate": ([TRAIN_CONFIG], [TRAIN_CONFIG, TINY_CONFIG], "validate#preprocessing", False, MASK_KEYS),
    "inference": ([INFERENCE_CONFIG], [INFERENCE_CONFIG, TINY_INFERENCE_CONFIG], "preprocessing", False, []),
}


def cached_targets() -> list:
    """What a cached item keeps, as plain tensors: the uint16 image, the uint8 masks, the float labels, the file, and
    in training the window's offset range."""
    return [
        EnsureTyped(keys="label", dtype=torch.float32, track_meta=False),
        EnsureTyped(keys=["image", "mask"], track_meta=False, allow_missing_keys=True),
        SelectItemsd(keys=["image", "image_path", "label", "mask", "window_shift_range"], allow_missing_keys=True),
    ]


#: the config id of each split chain's per-step half
STEP_IDS = {"train": "train#batch_transforms", "validate": "validate#batch_transforms"}


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


def _settings(parser: ConfigParser, train: bool) -> dict:
    settings = dict(
        window=parser.get_parsed_content("image_size"),
        iterations=parser.get_parsed_content("crop_iterations"),
        buffer=parser.get_parsed_content("crop_buffer"),
        pixel_spacing=parser.get_parsed_content("pixel_spacing"),
    )
    if train:
        settings["max_shift"] = parser.get_parsed_content("max_shift")
    return settings


def python_chain(parser: ConfigParser, chain: str, **settings) -> Compose:
    """The Python version of the config id ``CHAINS[chain][2]``: ``mammogram_transforms`` (inference), or for train
    and validate ``mammogram_cache_transforms`` between the config's own bookkeeping blocks (record the path, drop
    the masks GLAM's training does not use, stack the masks, keep the cached targets), with the parser's settings
    (``from_parser=False``: the builders' own defaults)."""
    _, _, _, train, mask_keys = CHAINS[chain]
    if settings.pop("from_parser", True):
        settings.update(_settings(parser, train))
    if chain == "inference":
        # inference's reader measures a thumbnail against the model's window at its spacing (the builders' defaults
        # where the settings give none)
        window, spacing = settings.get("window", (2944, 1920)), settings.get("pixel_spacing")
        settings.setdefault("reader", inference_reader(window=window, pixel_spacing=spacing))
        return mammogram_transforms(keys=["image"], mask_keys=mask_keys, train=train, **settings)
    settings.pop("augmentations", None)
    with_masks = not train or parser.get_parsed_content("train_with_masks")
    # the config's blocks name the mask keys even where GLAM's training drops the masks first (allow_missing_keys)
    cache = mammogram_cache_transforms(keys=["image"], mask_keys=mask_keys, train=train, **settings)
    drop = [DeleteItemsd(keys=[*MASK_KEYS, "boxes"])]  # the masks and the boxes painted into them
    head = [CopyItemsd(keys="image", names="image_path")] + ([] if with_masks else drop)
    stack = [StackMasksd(keys=MASK_KEYS, output_key="mask", dtype=torch.uint8)] if with_masks else []
    return Compose(head + list(cache.transforms) + stack + cached_targets())


def python_steps(parser: ConfigParser, chain: str, from_parser: bool = True, **settings) -> Compose:
    """The Python version of the per-step half (``STEP_IDS``): ``mammogram_step_transforms`` on the stacked mask."""
    train = CHAINS[chain][3]
    if from_parser:
        settings.update({k: v for k, v in _settings(parser, train).items() if k in ("window", "max_shift")})
    return mammogram_step_transforms(keys=["image"], mask_keys=["mask"], train=train, **settings)


def full_chain(parser: ConfigParser, chain: str) -> Compose:
    """What the model sees: the config's cached chain, then its per-step chain (the inference chain is one piece)."""
    cached = parser.get_parsed_content(CHAINS[chain][2])
    if chain not in STEP_IDS:
        return cached
    return Compose(list(cached.transforms) + list(parser.get_parsed_content(STEP_IDS[chain]).transforms))


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


def stacked(d: dict) -> torch.Tensor:
    """The (2, H, W) uint8 masks of a one-piece chain's output, zeros for an absent class (as StackMasksd stacks)."""
    size = tuple(d["image"].shape[-2:])
    return torch.stack(
        [torch.as_tensor(d[k])[0] if k in d else torch.zeros(size, dtype=torch.uint8) for k in MASK_KEYS]
    )


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_config_defaults_are_the_python_defaults(chain):
    """The configs alone (the paper's sizes) show the Python builders' own defaults."""
    files, _, config_id, _, _ = CHAINS[chain]
    parser = parse(files)
    assert_same_chain(parser.get_parsed_content(config_id), python_chain(parser, chain, from_parser=False))
    if chain in STEP_IDS:
        assert_same_chain(parser.get_parsed_content(STEP_IDS[chain]), python_steps(parser, chain, from_parser=False))


@pytest.mark.parametrize(
    "chain, train_masks", [("inference", False), ("train", False), ("train", True), ("validate", False)]
)
def test_config_chain_equals_mammogram_transforms(items, chain, train_masks):
    """Blocks = builders; the cached half then the per-step half give mammogram_transforms()'s window, standardised
    and augmented with the same draws, bit for bit; the masks follow their image (GLAM's training drops them)."""
    _, files, config_id, train, mask_keys = CHAINS[chain]
    parser = parse(files, train_masks=train_masks)
    config, python = parser.get_parsed_content(config_id), python_chain(parser, chain)
    assert_same_chain(config, python)
    if chain in STEP_IDS:
        assert_same_chain(parser.get_parsed_content(STEP_IDS[chain]), python_steps(parser, chain))
    size = tuple(parser.get_parsed_content("image_size"))
    one_piece = mammogram_transforms(keys=["image"], mask_keys=mask_keys, train=train, **_settings(parser, train))
    for seed in (0, 1):
        got, want = run(full_chain(parser, chain), items, seed), run(one_piece, items, seed)
        assert all(tuple(d["image"].shape) == (1, *size) and d["image"].dtype == torch.float32 for d in got)
        for g, w in zip(got, want):
            assert torch.equal(torch.as_tensor(g["image"]), w["image"].as_tensor())
    if chain == "inference":
        assert [bool(d["image"].meta["flipped_to_right"]) for d in got] == [True, False, False]  # R mirrored, L kept
        return
    cached = run(config, items, 0)
    assert all(d["image"].dtype == torch.uint16 and type(d["image"]) is torch.Tensor for d in cached)
    assert [d["image_path"] for d in got] == [it["image"] for it in items]
    assert [d["label"].tolist() for d in got] == [it["label"] for it in items]
    if chain == "train" and not train_masks:
        assert all("mask" not in d for d in cached + got)
        return
    # the masks followed their image into the window (benign 20x20 px, malignant 12x20 px, the third none)
    assert [[int(m.sum()) for m in d["mask"]] for d in got] == [[400, 0], [0, 240], [0, 0]]
    assert all(d["mask"].dtype == torch.uint8 for d in cached)
    for g, w in zip(got, want):
        assert torch.equal(g["mask"], stacked(w))
    if train:  # the random window shift and the augmentations are drawn: another seed, other outputs
        assert any(
            not torch.equal(a["image"], b["image"]) for a, b in zip(run(full_chain(parser, chain), items, 0), got)
        )


def test_the_cached_chains_are_deterministic_and_the_random_work_is_per_step():
    """train_cache / val_cache keep the whole cached chain (MONAI caches up to the first random transform: there is
    none), and every random transform runs in the per-step chain, the window shift first."""
    parser = parse([TRAIN_CONFIG, TINY_CONFIG])
    for config_id in ("train#preprocessing", "validate#preprocessing"):
        chain = parser.get_parsed_content(config_id)
        assert (
            chain.get_index_of_first(lambda t: isinstance(t, RandomizableTrait) or not isinstance(t, Transform)) is None
        )
    steps = parser.get_parsed_content("train#batch_transforms")
    assert isinstance(steps.transforms[0], RandWindowShiftd)
    assert [type(t).__name__ for t in steps.transforms if isinstance(t, RandomizableTrait)] == [
        "RandWindowShiftd",
        "RandAdjustContrastd",
        "RandScaleIntensityd",
        "RandShiftIntensityd",
    ]
    assert not any(
        isinstance(t, RandomizableTrait) for t in parser.get_parsed_content("validate#batch_transforms").transforms
    )


def test_overrides_reach_the_blocks(items):
    sizes = {"image_size": [192, 128], "max_shift": [2, 3], "crop_iterations": 3, "crop_buffer": 2}
    parser = parse([TRAIN_CONFIG, TINY_CONFIG], **sizes, **{"augmentations#1#factors": 0.2})
    train = parser.get_parsed_content("train#preprocessing")
    region = next(t for t in train.transforms if isinstance(t, BestCenterRegiond))
    assert region.cropper.window == (192, 128) and region.cropper.max_shift == (2, 3) and region.cropper.iterations == 3
    crop = next(t for t in train.transforms if isinstance(t, CropBreastd))
    assert (crop.cropper.iterations, crop.cropper.buffer) == (3, 2)
    steps = parser.get_parsed_content("train#batch_transforms")
    assert steps.transforms[0].cropper.window == (192, 128) and steps.transforms[0].cropper.max_shift == (2, 3)
    augmentations = mammogram_augmentations(["image"], ["mask"], factors=0.2)
    python = mammogram_step_transforms(
        keys=["image"], mask_keys=["mask"], window=(192, 128), train=True, max_shift=(2, 3), augmentations=augmentations
    )
    assert_same_chain(steps, python)
    assert_same_chain(train, python_chain(parser, "train"))
    whole = Compose(list(python_chain(parser, "train").transforms) + list(python.transforms))
    assert_identical(run(full_chain(parser, "train"), items, 5), run(whole, items, 5))
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
    """With `pixel_spacing` set, the config's ResampleToSpacingd and the builders' (pixel_spacing=...) are the same
    transform and give bit-identical outputs on files at half the model's resolution (0.25 mm files, a 0.5 mm model:
    every file halved before the crop, the masks with it)."""
    _, files, config_id, _, _ = CHAINS[chain]
    parser = parse(files, pixel_spacing=0.5, train_masks=True)
    config = parser.get_parsed_content(config_id)
    assert_same_chain(config, python_chain(parser, chain))
    resample = next(t for t in config.transforms if isinstance(t, ResampleToSpacingd))
    assert resample.resampler.pixel_spacing == (0.5, 0.5)
    spaced = write_items(tmp_path, spacing_mm=0.25)
    python = python_chain(parser, chain)
    if chain in STEP_IDS:
        python = Compose(list(python.transforms) + list(python_steps(parser, chain).transforms))
    for seed in (0, 1):
        assert_identical(run(full_chain(parser, chain), spaced, seed), run(python, spaced, seed))
    got = run(full_chain(parser, chain), spaced, 0)
    if chain == "inference":  # the file's spacing stays in meta (maps on its grid carry it), the model's is added
        for d in got:
            assert np.allclose(d["image"].meta["spacing"], 0.25) and np.allclose(d["image"].meta["model_spacing"], 0.5)
            assert not d["image"].meta["spacing_assumed"]
    else:  # the masks were halved with their image: 20x20 -> 10x10, 12x20 -> 6x10
        assert [[int(m.sum()) for m in d["mask"]] for d in got] == [[100, 0], [0, 60], [0, 0]]
