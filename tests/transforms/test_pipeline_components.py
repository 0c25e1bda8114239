"""The named pipeline components (scripts/transforms/mammo/pipeline.py) that the configs instantiate build exactly the
chains the configs used to write out as transform blocks: the same transforms, in the same order, with the same
arguments, and the same outputs (random chains included, with the same seed) on synthetic mammograms.

The written-out blocks are kept below as they stood in bundle/configs/train.yaml and inference.yaml before the
components replaced them (the inference reader as ``inference_reader`` returns it, with its checks against the
model's window; since then with the box annotations painted into the masks after loading, and dropped with the masks
when training takes none), so the comparison stays independent of what the configs hold now; the last test checks
the configs themselves."""

from __future__ import annotations

import pytest
import torch
import yaml
from conftest import BUNDLE_ROOT, TINY_CONFIG, TRAIN_CONFIG, assert_identical
from monai.bundle import ConfigParser
from monai.transforms import Compose, Invertd
from test_config_transforms import INFERENCE_CONFIG, TINY_INFERENCE_CONFIG, assert_same_chain, run, write_items

from scripts.inference.inputs import inference_reader
from scripts.transforms.mammo.pipeline import (
    inference_loading,
    inference_preprocessing,
    mammogram_prefix,
    train_batch_transforms,
    train_preprocessing,
    validate_batch_transforms,
    validate_preprocessing,
)

WRITTEN_OUT = """
image_size: [2944, 1920]
pixel_spacing: null
input_spacing: null
spacing_fallback: fit_breast
crop_iterations: 100
crop_buffer: 50
max_shift: [32, 32]
train_masks: false
train_with_masks: "$monai.utils.str2bool(str(@train_masks))"
accept_non_mammography: false
max_image_pixels: 178956970
panel_height: 1024
record_path:
  _target_: CopyItemsd
  keys: image
  names: image_path
stack_masks:
  _target_: scripts.transforms.targets.StackMasksd
  keys: [mask_benign, mask_malignant]
  output_key: mask
  dtype: $torch.uint8
target_transforms:
  - _target_: EnsureTyped
    keys: label
    dtype: $torch.float32
    track_meta: false
  - _target_: EnsureTyped
    keys: [image, mask]
    track_meta: false
    allow_missing_keys: true
  - _target_: SelectItemsd
    keys: [image, image_path, label, mask, window_shift_range]
    allow_missing_keys: true
mammogram_prefix:
  - _target_: scripts.transforms.DropEmptyKeysd
    keys: [mask_benign, mask_malignant]
  - _target_: LoadImaged
    keys: image
    reader: {_target_: scripts.data.readers.MammogramReader, apply_voi: true}
    image_only: true
  - _target_: LoadImaged
    keys: [mask_benign, mask_malignant]
    reader: {_target_: scripts.data.readers.MammogramReader, mask: true}
    image_only: true
    allow_missing_keys: true
  - _target_: scripts.transforms.boxes.BoxesToMasksd
    mask_keys: [mask_benign, mask_malignant]
    image_key: image
    mask_files: keep
  - _target_: scripts.transforms.ResampleToSpacingd
    keys: [image, mask_benign, mask_malignant]
    pixel_spacing: "@pixel_spacing"
    source_key: image
    mode: [bilinear, nearest-exact, nearest-exact]
    spacing_key: pixel_spacing
    input_spacing: "@input_spacing"
    fallback: "@spacing_fallback"
    window: "@image_size"
    iterations: "@crop_iterations"
    buffer: "@crop_buffer"
    allow_missing_keys: true
  - _target_: AsDiscreted
    keys: [mask_benign, mask_malignant]
    threshold: 0.5
    allow_missing_keys: true
  - _target_: CastToTyped
    keys: [mask_benign, mask_malignant]
    dtype: $torch.uint8
    allow_missing_keys: true
  - _target_: scripts.transforms.FlipToRightd
    keys: [image, mask_benign, mask_malignant]
    source_key: image
    laterality_key: laterality
    horizontal_flip: "NO"
    allow_missing_keys: true
  - _target_: scripts.transforms.CropBreastd
    keys: [image, mask_benign, mask_malignant]
    source_key: image
    iterations: "@crop_iterations"
    buffer: "@crop_buffer"
    allow_missing_keys: true
augmentations:
  - _target_: RandAdjustContrastd
    keys: image
    prob: 0.5
    gamma: [0.8, 1.25]
  - _target_: RandScaleIntensityd
    keys: image
    factors: 0.1
    prob: 0.5
  - _target_: RandShiftIntensityd
    keys: image
    offsets: 0.1
    prob: 0.5
train:
  preprocessing:
    _target_: Compose
    transforms: "$[@record_path] + ([] if @train_with_masks else [@train#drop_masks]) + @mammogram_prefix
      + @train#region + ([@stack_masks] if @train_with_masks else []) + @target_transforms"
  drop_masks:
    _target_: DeleteItemsd
    keys: [mask_benign, mask_malignant, boxes]
  region:
    - _target_: scripts.transforms.BestCenterRegiond
      keys: [image, mask_benign, mask_malignant]
      source_key: image
      view_key: view
      window: "@image_size"
      max_shift: "@max_shift"
      iterations: "@crop_iterations"
      reference_compatible: true
      default_view: CC
      allow_missing_keys: true
    - _target_: scripts.transforms.QuantizeToUint16d
      keys: image
  batch_transforms:
    _target_: Compose
    transforms: "$@train#window + @augmentations"
  window:
    - _target_: scripts.transforms.RandWindowShiftd
      keys: [image, mask]
      window: "@image_size"
      max_shift: "@max_shift"
      allow_missing_keys: true
    - _target_: scripts.transforms.StandardizeImaged
      keys: image
validate:
  preprocessing:
    _target_: Compose
    transforms: "$[@record_path] + @mammogram_prefix + @validate#window + [@stack_masks] + @target_transforms"
  batch_transforms:
    _target_: Compose
    transforms:
      - _target_: scripts.transforms.StandardizeImaged
        keys: image
  window:
    - _target_: scripts.transforms.BestCenterWindowd
      keys: [image, mask_benign, mask_malignant]
      source_key: image
      view_key: view
      window: "@image_size"
      iterations: "@crop_iterations"
      reference_compatible: true
      default_view: CC
      allow_missing_keys: true
    - _target_: scripts.transforms.QuantizeToUint16d
      keys: image
preprocessing:
  _target_: Compose
  transforms:
    - _target_: LoadImaged
      keys: image
      reader:
        _target_: scripts.data.readers.MammogramReader
        apply_voi: true
        accept_non_mammography: "@accept_non_mammography"
        max_pixels: "@max_image_pixels"
        kind_checks: "$not @accept_non_mammography"
        window: "@image_size"
        model_spacing: "@pixel_spacing"
      image_only: true
    - _target_: scripts.transforms.ResampleToSpacingd
      keys: image
      pixel_spacing: "@pixel_spacing"
      source_key: image
      mode: bilinear
      spacing_key: pixel_spacing
      input_spacing: "@input_spacing"
      fallback: "@spacing_fallback"
      window: "@image_size"
      iterations: "@crop_iterations"
      buffer: "@crop_buffer"
      allow_missing_keys: true
    - _target_: scripts.transforms.FlipToRightd
      keys: image
      source_key: image
      laterality_key: laterality
      horizontal_flip: "NO"
      allow_missing_keys: true
    - _target_: scripts.transforms.CropBreastd
      keys: image
      source_key: image
      iterations: "@crop_iterations"
      buffer: "@crop_buffer"
      allow_missing_keys: true
    - _target_: scripts.transforms.BestCenterWindowd
      keys: image
      source_key: image
      view_key: view
      window: "@image_size"
      iterations: "@crop_iterations"
      reference_compatible: true
      default_view: CC
      allow_missing_keys: true
    - _target_: scripts.transforms.StandardizeImaged
      keys: image
panel_pictures:
  - _target_: scripts.transforms.DropEmptyKeysd
    keys: [mask_benign, mask_malignant]
  - _target_: LoadImaged
    keys: [mask_benign, mask_malignant]
    reader: {_target_: scripts.data.readers.MammogramReader, mask: true}
    image_only: true
    allow_missing_keys: true
  - _target_: scripts.transforms.boxes.BoxesToMasksd
    mask_keys: [mask_benign, mask_malignant]
    mask_files: keep
  - _target_: scripts.transforms.Thumbnaild
    keys: [image, mask_benign, mask_malignant]
    max_rows: "@panel_height"
    allow_missing_keys: true
  - _target_: DeleteItemsd
    keys: [mask_benign, mask_malignant]
loading: "$monai.transforms.Compose([@preprocessing.transforms[0], *@panel_pictures, *@preprocessing.transforms[1:]])"
"""

#: small sizes (the synthetic images are about 300x180), and the options the components take from the configs
TINY = {"image_size": [192, 128], "crop_iterations": 5, "crop_buffer": 4, "max_shift": [4, 6], "panel_height": 100}


def written_out(**overrides) -> ConfigParser:
    """The written-out blocks with the tiny sizes and ``overrides``."""
    parser = ConfigParser()
    parser.read_config(yaml.safe_load(WRITTEN_OUT))
    for key, value in {**TINY, **overrides}.items():
        parser[key] = value
    return parser


def prefix_of(parser: ConfigParser) -> list:
    """The component's prefix with the parser's options (a config's ``mammogram_prefix`` block)."""
    return mammogram_prefix(
        pixel_spacing=parser.get_parsed_content("pixel_spacing"),
        input_spacing=parser.get_parsed_content("input_spacing"),
        spacing_fallback=parser.get_parsed_content("spacing_fallback"),
        window=parser.get_parsed_content("image_size"),
        iterations=parser.get_parsed_content("crop_iterations"),
        buffer=parser.get_parsed_content("crop_buffer"),
    )


def components(parser: ConfigParser, chain: str, augmentations: list | None = None) -> tuple[Compose, Compose]:
    """The cached half and the per-step half of ``chain`` built by the components with ``parser``'s options (for
    inference: the preprocessing and the loading); ``augmentations``: declared as data, passed in."""
    size = dict(window=parser.get_parsed_content("image_size"), iterations=parser.get_parsed_content("crop_iterations"))
    if chain == "train":
        shift = parser.get_parsed_content("max_shift")
        cached = train_preprocessing(
            prefix_of(parser), max_shift=shift, with_masks=parser.get_parsed_content("train_with_masks"), **size
        )
        return cached, train_batch_transforms(augmentations or [], window=size["window"], max_shift=shift)
    if chain == "validate":
        return validate_preprocessing(prefix_of(parser), **size), validate_batch_transforms()
    reader = inference_reader(
        apply_voi=True,
        accept_non_mammography=parser.get_parsed_content("accept_non_mammography"),
        max_pixels=parser.get_parsed_content("max_image_pixels"),
        window=size["window"],
        pixel_spacing=parser.get_parsed_content("pixel_spacing"),
    )
    preprocessing = inference_preprocessing(
        reader,
        pixel_spacing=parser.get_parsed_content("pixel_spacing"),
        input_spacing=parser.get_parsed_content("input_spacing"),
        spacing_fallback=parser.get_parsed_content("spacing_fallback"),
        buffer=parser.get_parsed_content("crop_buffer"),
        **size,
    )
    return preprocessing, inference_loading(preprocessing, panel_height=parser.get_parsed_content("panel_height"))


#: chain -> the config ids of its two pieces
IDS = {
    "train": ("train#preprocessing", "train#batch_transforms"),
    "validate": ("validate#preprocessing", "validate#batch_transforms"),
    "inference": ("preprocessing", "loading"),
}


def whole(first: Compose, second: Compose, chain: str) -> Compose:
    """What an item goes through: the cached half then the per-step half (inference: the loading alone)."""
    return second if chain == "inference" else Compose(list(first.transforms) + list(second.transforms))


@pytest.mark.parametrize(
    "chain, options",
    [
        ("train", {"train_masks": False}),
        ("train", {"train_masks": True}),
        ("train", {"train_masks": True, "pixel_spacing": 0.5, "spacing_fallback": "model"}),
        ("validate", {}),
        ("validate", {"pixel_spacing": [0.5, 0.4], "input_spacing": 0.25}),
        ("inference", {}),
        ("inference", {"pixel_spacing": 0.5, "accept_non_mammography": True, "max_image_pixels": None}),
    ],
)
def test_components_build_the_written_out_chains(tmp_path, chain, options):
    """Same transforms and arguments, and bit-identical outputs for seeds 0 and 1 (the training chain's window shift
    and augmentations draw the same numbers: the augmentations are the config's own list, passed in)."""
    reference = written_out(**options)
    ours = components(written_out(**options), chain, written_out(**options).get_parsed_content("augmentations"))
    for config_id, built in zip(IDS[chain], ours):
        assert_same_chain(built, reference.get_parsed_content(config_id))
    items = write_items(tmp_path, spacing_mm=0.25 if "input_spacing" not in options else None)
    want_chain = whole(*(reference.get_parsed_content(i) for i in IDS[chain]), chain)
    for seed in (0, 1):
        got, want = run(whole(*ours, chain), items, seed), run(want_chain, items, seed)
        assert_identical(got, want)
    if chain == "train":  # the draws matter: another seed moves the window or changes the intensities
        assert any(not torch.equal(a["image"], b["image"]) for a, b in zip(run(whole(*ours, chain), items, 2), got))


def test_the_inference_loading_shares_the_preprocessing_objects_so_invertd_undoes_it(tmp_path):
    """The loading holds the preprocessing's own transforms around the panel pictures, so Invertd over the
    preprocessing brings a window-sized output back to the file's size and orientation."""
    parser = written_out()
    preprocessing, loading = components(parser, "inference")
    steps = list(preprocessing.transforms)
    assert loading.transforms[0] is steps[0] and all(a is b for a, b in zip(loading.transforms[6:], steps[1:]))
    assert len(loading.transforms) == len(steps) + 5
    items = write_items(tmp_path)
    out = loading(dict(items[0]))  # the right CC view stored facing left, 300x180, with a benign mask
    assert tuple(out["image"].shape) == (1, 192, 128) and "mask_benign" not in out
    assert tuple(out["mask_benign_thumbnail"].shape) == (1, 100, 60)  # every 3rd pixel: at most 100 rows
    out["image"] = out["image"].clone()
    out["image"][:] = 1 + torch.arange(out["image"].numel(), dtype=torch.float32).reshape(out["image"].shape)
    back = Invertd(keys="image", transform=preprocessing, orig_keys="image")(out)["image"]
    assert tuple(back.shape) == (1, 300, 180)
    # the window's values come back once each (the rest is the padding, 0), mirrored: its top-left pixel (1, at the
    # chest wall after the flip) lies on the file's right, where this right breast's chest wall is
    assert sorted(back[back > 0].tolist()) == list(range(1, 192 * 128 + 1))
    row, col = (int(i) for i in torch.nonzero(back[0] == 1)[0])
    assert col >= 90


def test_the_configs_build_the_components():
    """Whatever the configs hold (written-out blocks or the components), their chains are the components' with the
    configs' options, at the paper's sizes and the tiny ones."""
    for files in ([TRAIN_CONFIG], [TRAIN_CONFIG, TINY_CONFIG], [INFERENCE_CONFIG, TINY_INFERENCE_CONFIG]):
        parser = ConfigParser()
        parser.read_config([str(f) for f in files])
        parser["bundle_root"] = str(BUNDLE_ROOT)
        if INFERENCE_CONFIG in files:  # no checkpoint: GLAM's defaults
            parser["ckpt_path"] = str(BUNDLE_ROOT / "models" / "no_such_checkpoint.pt")
            chains = ["inference"]
        else:
            chains = ["train", "validate"]
        for chain in chains:
            augmentations = parser.get_parsed_content("augmentations") if chain == "train" else None
            for config_id, built in zip(IDS[chain], components(parser, chain, augmentations)):
                assert_same_chain(parser.get_parsed_content(config_id), built)


def test_one_settings_record_reaches_every_builder_and_a_setting_of_another_part_is_refused():
    """Every builder reads its settings from PreprocessingSettings: a setting of a part it builds takes effect there
    (a field changed once changes every chain that has the step), one of a part it does not build (a built prefix's,
    say) or a misspelt one is a TypeError naming the builder and the setting."""
    from dataclasses import fields

    from scripts.transforms.mammo.dictionary import BestCenterRegiond, BestCenterWindowd, CropBreastd, RandWindowShiftd
    from scripts.transforms.mammo.pipeline import (
        PreprocessingSettings,
        mammogram_cache_transforms,
        mammogram_step_transforms,
        mammogram_transforms,
    )

    names = {f.name for f in fields(PreprocessingSettings)}
    assert {"pixel_spacing", "window", "iterations", "max_shift", "view_key", "standardize", "reader"} <= names
    prefix = mammogram_prefix(window=(64, 40))
    windows = {
        "mammogram_transforms": mammogram_transforms(view_key=None, default_view="MLO").transforms[-2],
        "mammogram_cache_transforms": mammogram_cache_transforms(view_key=None, default_view="MLO").transforms[-2],
        "train_preprocessing": [
            t
            for t in train_preprocessing(prefix, view_key=None, default_view="MLO").transforms
            if isinstance(t, BestCenterRegiond)
        ][0],
        "validate_preprocessing": [
            t
            for t in validate_preprocessing(prefix, view_key=None, default_view="MLO").transforms
            if isinstance(t, BestCenterWindowd)
        ][0],
        "inference_preprocessing": inference_preprocessing(view_key=None, default_view="MLO").transforms[-2],
    }
    for builder, step in windows.items():
        assert isinstance(step, BestCenterWindowd | BestCenterRegiond), builder
        assert (step.view_key, step.cropper.default_view) == (None, "MLO"), builder
    shifts = [
        train_batch_transforms(max_shift=(3, 5), window=(64, 40)).transforms[0],
        mammogram_step_transforms(train=True, max_shift=(3, 5), window=(64, 40)).transforms[0],
    ]
    for shift in shifts:
        assert isinstance(shift, RandWindowShiftd) and (shift.cropper.max_shift, shift.cropper.window) == (
            (3, 5),
            (64, 40),
        )
    assert not any(isinstance(t, CropBreastd) for t in inference_preprocessing(crop=False).transforms)
    assert any(isinstance(t, CropBreastd) for t in inference_preprocessing().transforms)

    with pytest.raises(TypeError, match=r"train_preprocessing\(\) takes no 'pixel_spacing'.*prefix"):
        train_preprocessing(prefix, pixel_spacing=0.2)
    with pytest.raises(TypeError, match=r"validate_preprocessing\(\) takes no 'standardize'.*step"):
        validate_preprocessing(prefix, standardize=False)
    with pytest.raises(TypeError, match=r"mammogram_prefix\(\) got an unexpected keyword argument 'standardise'"):
        mammogram_prefix(standardise=True)
