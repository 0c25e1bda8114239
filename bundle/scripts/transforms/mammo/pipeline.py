"""The preprocessing chain of GLAM as one MONAI ``Compose``: load, resample to the model's pixel spacing, flip, crop,
window, standardise (+ augment).

Order and why: the resampling comes right after loading, so the crop's iterations and buffer and the window count
pixels at the model's scale (it is the identity when the model's spacing is unknown). Images are mirrored next so
every later step can assume the chest wall at column 0 (the authors crop first and flip afterwards; with the buffer
put on the side away from the chest wall the two orders give the same pixels). Masks are resampled nearest-exact and
binarised right after, so the geometric steps (which only cut and zero-pad, never interpolate) keep them exactly
0/1. Intensity augmentations come after standardisation, because standardisation would undo any global scale or
shift applied before it.

Training splits the chain in two (docs/performance.md): what is deterministic per image, up to the window's region
grown by the largest shift and the image stored as uint16 (:func:`mammogram_cache_transforms`), runs once per image
in the loader and is cached; the window shift, the standardisation and the augmentations
(:func:`mammogram_step_transforms`) run at every step on the device the model runs on, per image of the batch. For
the same random draws the two halves give :func:`mammogram_transforms`'s images.

The configs instantiate the components below by name with their sizes, one per config id of the same name:

- :func:`mammogram_prefix` (``mammogram_prefix``): drop empty mask fields, load, boxes into masks, resample, masks
  to 0/1 bytes, mirror, crop; shared by the training and validation chains;
- :func:`train_preprocessing` / :func:`train_batch_transforms` (``train#preprocessing`` / ``train#batch_transforms``):
  the cached half (the file's path, the prefix, the window's region grown by ``max_shift``, uint16, the stored
  targets) and the per-step half (window shift, standardisation, then the config's ``augmentations``, declared there
  as data);
- :func:`validate_preprocessing` / :func:`validate_batch_transforms` (``validate#preprocessing`` /
  ``validate#batch_transforms``): the same with the best-centre window itself, and the standardisation;
- :func:`inference_preprocessing` / :func:`inference_loading` (``preprocessing`` / ``loading`` of inference.yaml):
  the image-only chain the maps are inverted through, and what the data loader runs: the same transform objects with
  the panel's pictures taken right after loading.

The Python builders (:func:`mammogram_transforms` and its two halves) build the same chains with every option open;
``tests/transforms/test_config_transforms.py`` checks that both give the same transforms and outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from monai.data import ImageReader
from monai.transforms import (
    AsDiscreted,
    CastToTyped,
    Compose,
    CopyItemsd,
    DeleteItemsd,
    EnsureTyped,
    LoadImaged,
    RandAdjustContrastd,
    RandFlipd,
    RandScaleIntensityd,
    RandShiftIntensityd,
    SelectItemsd,
)

from scripts.data.boxes import BOXES_KEY
from scripts.data.errors import DEFAULT_MAX_PIXELS
from scripts.data.readers import MammogramReader
from scripts.transforms.boxes import BoxesToMasksd
from scripts.transforms.mammo.dictionary import (
    BestCenterRegiond,
    BestCenterWindowd,
    CropBreastd,
    DropEmptyKeysd,
    FlipToRightd,
    QuantizeToUint16d,
    RandBestCenterWindowd,
    RandWindowShiftd,
    StandardizeImaged,
)
from scripts.transforms.mammo.spacing import ResampleToSpacingd
from scripts.transforms.targets import StackMasksd
from scripts.transforms.thumbnail import Thumbnaild

__all__ = [
    "CACHED_KEYS",
    "MASK_KEYS",
    "PreprocessingSettings",
    "inference_loading",
    "inference_preprocessing",
    "mammogram_augmentations",
    "mammogram_cache_transforms",
    "mammogram_prefix",
    "mammogram_step_transforms",
    "mammogram_transforms",
    "train_batch_transforms",
    "train_preprocessing",
    "validate_batch_transforms",
    "validate_preprocessing",
]

#: a datalist item's lesion masks, one per class (docs/data.md); stacked into ``mask`` for training
MASK_KEYS = ("mask_benign", "mask_malignant")
#: what a cached training or validation item keeps (the disk cache stores plain tensors, no metadata)
CACHED_KEYS = ("image", "image_path", "label", "mask", "window_shift_range")


def mammogram_augmentations(
    keys: Sequence[str] = ("image",),
    mask_keys: Sequence[str] = ("mask_benign", "mask_malignant"),
    intensity: bool = True,
    vertical_flip_prob: float = 0.0,
    *,
    prob: float = 0.5,
    gamma: tuple[float, float] = (0.8, 1.25),
    factors: float = 0.1,
    offsets: float = 0.1,
) -> list[Callable]:
    """The default training augmentations that follow standardisation (the window shift is part of the
    window step, see :func:`mammogram_transforms`); ``augmentations`` of ``bundle/configs/train.yaml``.

    - intensity jitter on the images (``intensity``), each with probability ``prob`` (0.5):
      ``RandAdjustContrastd`` with gamma in ``gamma`` ([0.8, 1.25]), ``RandScaleIntensityd`` by a factor in
      1 +- ``factors`` (0.1) and ``RandShiftIntensityd`` by +- ``offsets`` (0.1, standardised units);
    - up-down flips (``RandFlipd`` on spatial axis 0, images and masks together) only when
      ``vertical_flip_prob > 0``: an explicit opt-in. Left-right mirroring (a flip about the vertical axis) is
      never offered: every breast must keep facing right, as the authors' window rule and the trained weights
      assume.
    """
    keys, mask_keys = list(keys), list(mask_keys)
    augs: list[Callable] = []
    if intensity:
        augs += [
            RandAdjustContrastd(keys=keys, prob=prob, gamma=tuple(gamma)),
            RandScaleIntensityd(keys=keys, factors=factors, prob=prob),
            RandShiftIntensityd(keys=keys, offsets=offsets, prob=prob),
        ]
    if vertical_flip_prob > 0:
        augs.append(RandFlipd(keys=keys + mask_keys, prob=vertical_flip_prob, spatial_axis=0, allow_missing_keys=True))
    return augs


#: the parts of a chain a setting shapes (a builder takes the settings of the parts it builds)
PREFIX, WINDOW, STEP = "prefix", "window", "step"


def _setting(default: Any, *parts: str) -> Any:
    return field(default=default, metadata={"parts": frozenset(parts)})


@dataclass(frozen=True)
class PreprocessingSettings:
    """Every setting of the preprocessing chains, with its default: the one place a setting is declared. Every
    builder of this module takes them by name (``**settings``) and refuses those of the parts it does not build
    (``prefix``: :func:`mammogram_prefix`; ``window``: the window step; ``step``: the per-step half).

    Attributes:
        load: start with ``LoadImaged`` (False when the items already hold ``(1, H, W)`` tensors).
        apply_voi: the default image reader's option (DICOM VOI LUT / window applied).
        reader: the images' reader (inference passes its own, with its refusal options); default
            :class:`~scripts.data.readers.MammogramReader` ``(apply_voi=apply_voi)``. Masks always get
            ``MammogramReader(mask=True)``.
        pixel_spacing: the model's ``(row, col)`` mm (a number: isotropic; ``pixel_spacing`` of the configs): images
            of known spacing are resampled to it (:class:`~scripts.transforms.mammo.spacing.ResampleToSpacingd`);
            None (the default): nothing is resampled.
        input_spacing, spacing_fallback: the spacing of images whose file (and datalist item, ``pixel_spacing``)
            states none, and what to do when nobody states it (``"fit_breast"``: estimate it so that the breast fits
            the window; ``"model"``: assume the model's); see
            :class:`~scripts.transforms.mammo.spacing.ResampleToSpacing`.
        spacing_range, max_pixels: the plausible pixel sizes of a file (mm; None: 0.02-1 mm) and the most pixels an
            image is resampled to (see :class:`~scripts.transforms.mammo.spacing.ResampleToSpacing`).
        horizontal_flip, laterality_key: see :class:`~scripts.transforms.mammo.dictionary.FlipToRightd`.
        crop, buffer: the authors' crop (skip it for images that are already cropped) and its buffer.
        window: ``(rows, cols)`` of the model input (also the ``fit_breast`` estimate's).
        iterations: the crop's iterations (also the window's and the estimate's breast box).
        view_key, reference_compatible, default_view: see
            :class:`~scripts.transforms.mammo.dictionary.BestCenterWindowd`.
        max_shift: the largest window shift (rows, cols) in training (``max_shift`` of ``train.yaml``).
        standardize: per-image ``(x - mean) / max(std, 1e-5)`` of the images.
    """

    load: bool = _setting(True, PREFIX)
    apply_voi: bool = _setting(True, PREFIX)
    reader: ImageReader | None = _setting(None, PREFIX)
    pixel_spacing: float | Sequence[float] | None = _setting(None, PREFIX)
    input_spacing: float | Sequence[float] | None = _setting(None, PREFIX)
    spacing_fallback: str = _setting("fit_breast", PREFIX)
    spacing_range: Sequence[float] | None = _setting(None, PREFIX)
    max_pixels: int | None = _setting(DEFAULT_MAX_PIXELS, PREFIX)
    horizontal_flip: str = _setting("NO", PREFIX)
    laterality_key: str | None = _setting("laterality", PREFIX)
    crop: bool = _setting(True, PREFIX)
    buffer: int = _setting(50, PREFIX)
    window: Sequence[int] = _setting((2944, 1920), PREFIX, WINDOW, STEP)
    iterations: int = _setting(100, PREFIX, WINDOW)
    view_key: str | None = _setting("view", WINDOW)
    reference_compatible: bool = _setting(True, WINDOW)
    default_view: str | None = _setting("CC", WINDOW)
    max_shift: Sequence[int] | int = _setting((32, 32), WINDOW, STEP)
    standardize: bool = _setting(True, STEP)

    @classmethod
    def given(cls, builder: str, parts: Sequence[str], settings: dict[str, Any]) -> PreprocessingSettings:
        """The settings a builder of ``parts`` was given by name; a name that is no setting, or a setting of a part
        it does not build, is a ``TypeError`` naming it and the builder."""
        for name in settings:
            owners = _SETTING_PARTS.get(name)
            if owners is None:
                raise TypeError(
                    f"{builder}() got an unexpected keyword argument {name!r} (the preprocessing settings: "
                    f"{', '.join(_SETTING_PARTS)})"
                )
            if not owners & set(parts):
                raise TypeError(
                    f"{builder}() takes no {name!r}: it is a setting of the {' / '.join(sorted(owners))} part, "
                    f"which {builder} does not build"
                )
        return cls(**settings)

    def prefix(self, keys: Sequence[str], mask_keys: Sequence[str]) -> list[Callable]:
        """The steps of :func:`mammogram_prefix` for these image and mask keys."""
        keys, mask_keys = _check_keys(keys, mask_keys)
        all_keys = keys + mask_keys
        source = keys[0]
        chain: list[Callable] = []
        if mask_keys:
            chain.append(DropEmptyKeysd(mask_keys))
        if self.load:
            image_reader = MammogramReader(apply_voi=self.apply_voi) if self.reader is None else self.reader
            chain.append(LoadImaged(keys=keys, reader=image_reader, image_only=True))
            if mask_keys:
                chain.append(
                    LoadImaged(
                        keys=mask_keys, reader=MammogramReader(mask=True), image_only=True, allow_missing_keys=True
                    )
                )
        if list(mask_keys) == list(MASK_KEYS):  # boxes painted into the classes without a mask file; then geometry
            chain.append(BoxesToMasksd(mask_keys, image_key=source, mask_files="keep"))
        # the image's spacing decides for its masks too; masks nearest-exact, so they stay 0/1 (0/255) before
        # binarising
        modes = ["bilinear"] * len(keys) + ["nearest-exact"] * len(mask_keys)
        chain.append(
            ResampleToSpacingd(
                all_keys,
                pixel_spacing=self.pixel_spacing,
                source_key=source,
                mode=modes,
                allow_missing_keys=True,
                input_spacing=self.input_spacing,
                fallback=self.spacing_fallback,
                window=tuple(self.window),
                iterations=self.iterations,
                buffer=self.buffer,
                spacing_range=self.spacing_range,
                max_pixels=self.max_pixels,
            )
        )
        if mask_keys:
            chain.append(AsDiscreted(keys=mask_keys, threshold=0.5, allow_missing_keys=True))
            # 0/1 masks as bytes: a quarter of the memory (a training cache holds them; the targets are made float
            # later)
            chain.append(CastToTyped(keys=mask_keys, dtype=torch.uint8, allow_missing_keys=True))
        chain.append(
            FlipToRightd(
                all_keys,
                laterality_key=self.laterality_key,
                horizontal_flip=self.horizontal_flip,
                source_key=source,
                allow_missing_keys=True,
            )
        )
        if self.crop:
            chain.append(
                CropBreastd(
                    all_keys, source_key=source, allow_missing_keys=True, iterations=self.iterations, buffer=self.buffer
                )
            )
        return chain

    def window_step(self, step: type, keys: Sequence[str]) -> Callable:
        """``step`` (``BestCenterWindowd``, ``RandBestCenterWindowd`` or ``BestCenterRegiond``) on ``keys``, placed
        by the first; ``max_shift`` for the two that shift."""
        window_args = dict(
            source_key=keys[0],
            view_key=self.view_key,
            window=tuple(self.window),
            reference_compatible=self.reference_compatible,
            iterations=self.iterations,
            default_view=self.default_view,
            allow_missing_keys=True,
        )
        if step is not BestCenterWindowd:
            window_args["max_shift"] = self.max_shift
        return step(list(keys), **window_args)

    def window_shift(self, keys: Sequence[str]) -> Callable:
        """The per-step random window shift on ``keys`` (:class:`~.dictionary.RandWindowShiftd`)."""
        return RandWindowShiftd(
            list(keys), window=tuple(self.window), max_shift=self.max_shift, allow_missing_keys=True
        )


#: setting name -> the parts of a chain it shapes
_SETTING_PARTS = {f.name: f.metadata["parts"] for f in fields(PreprocessingSettings)}


def _check_keys(keys: Sequence[str], mask_keys: Sequence[str]) -> tuple[list[str], list[str]]:
    keys, mask_keys = list(keys), list(mask_keys)
    if not keys:
        raise ValueError("keys must name at least one image key")
    return keys, mask_keys


def mammogram_prefix(
    keys: Sequence[str] = ("image",), mask_keys: Sequence[str] = MASK_KEYS, **settings: Any
) -> list[Callable]:
    """The deterministic start of every chain (``mammogram_prefix`` of ``bundle/configs/train.yaml``), for datalist
    items ``{"image": path, "mask_benign"?: path, "boxes"?: [...], ...}``: drop empty mask fields, load, paint the
    ``boxes`` into the masks of the classes without a mask file (:class:`~scripts.transforms.boxes.BoxesToMasksd`),
    resample to the model's pixel spacing, masks to 0/1 bytes, mirror the breast to face right, crop it. Every step
    but the loading runs on all keys, placed by the first image key; masks may be missing (``allow_missing_keys``).

    Args:
        keys, mask_keys: the image keys and the per-image masks (none: an image-only chain).
        settings: the :class:`PreprocessingSettings` of the prefix (``pixel_spacing``, ``window``, ``iterations``,
            ``buffer``, ``reader`` ...).
    """
    return PreprocessingSettings.given("mammogram_prefix", [PREFIX], settings).prefix(keys, mask_keys)


def mammogram_transforms(
    keys: Sequence[str] = ("image",),
    mask_keys: Sequence[str] = MASK_KEYS,
    *,
    train: bool = False,
    augmentations: Sequence[Callable] | None = None,
    **settings: Any,
) -> Compose:
    """The authors' preprocessing (docs/preprocessing.md) for datalist items
    ``{"image": path, "mask_benign"?: path, ...}`` as one per-image chain: the chain of ``preprocessing`` in
    ``bundle/configs/inference.yaml`` (``mask_keys=()``), and, split in two (:func:`mammogram_cache_transforms` then
    :func:`mammogram_step_transforms`), of the training and validation chains of ``bundle/configs/train.yaml``.

    Args:
        keys: image keys; the first one places the crop and the window for all keys.
        mask_keys: optional per-image masks (missing, None or "" values are skipped); binarised (> 0.5 -> 1).
        train: add the random window shift (``max_shift`` px) and ``augmentations``.
        augmentations: transforms run after standardisation in training; default
            :func:`mammogram_augmentations` ``(keys, mask_keys)``.
        settings: any :class:`PreprocessingSettings` (``window``, ``pixel_spacing``, ``max_shift``, ``standardize``
            ...).

    Returns:
        a ``Compose``; its output images are ``(1, *window)`` float32 MetaTensors that remember every geometric
        step, so ``Invertd`` maps a window-sized map back to the file's geometry.
    """
    given = PreprocessingSettings.given("mammogram_transforms", [PREFIX, WINDOW, STEP], settings)
    keys, mask_keys = _check_keys(keys, mask_keys)
    chain = given.prefix(keys, mask_keys) + [
        given.window_step(RandBestCenterWindowd if train else BestCenterWindowd, keys + mask_keys)
    ]
    if given.standardize:
        chain.append(StandardizeImaged(keys))
    if train:
        chain.extend(mammogram_augmentations(keys, mask_keys) if augmentations is None else augmentations)
    return Compose(chain)


def mammogram_cache_transforms(
    keys: Sequence[str] = ("image",), mask_keys: Sequence[str] = MASK_KEYS, *, train: bool = False, **settings: Any
) -> Compose:
    """The deterministic half of :func:`mammogram_transforms` (the settings of its prefix and window), run once per
    image and cached: the prefix (load, resample, masks as bytes, mirror, crop), then in training the window's region
    grown by ``max_shift`` (:class:`~scripts.transforms.mammo.dictionary.BestCenterRegiond`, its offset range in
    ``d["window_shift_range"]``) or else the window itself, then the images as uint16
    (:class:`~scripts.transforms.mammo.dictionary.QuantizeToUint16d`). :func:`mammogram_step_transforms` finishes.
    """
    given = PreprocessingSettings.given("mammogram_cache_transforms", [PREFIX, WINDOW], settings)
    keys, mask_keys = _check_keys(keys, mask_keys)
    chain = given.prefix(keys, mask_keys) + [
        given.window_step(BestCenterRegiond if train else BestCenterWindowd, keys + mask_keys),
        QuantizeToUint16d(keys),
    ]
    return Compose(chain)


def mammogram_step_transforms(
    keys: Sequence[str] = ("image",),
    mask_keys: Sequence[str] = MASK_KEYS,
    *,
    train: bool = False,
    augmentations: Sequence[Callable] | None = None,
    **settings: Any,
) -> Compose:
    """The per-step half of :func:`mammogram_transforms` (the settings of its step: ``window``, ``max_shift``,
    ``standardize``) on the output of :func:`mammogram_cache_transforms`, for one image on any device: in training
    the random window shift (:class:`~scripts.transforms.mammo.dictionary.RandWindowShiftd`), then the
    standardisation and, in training, the augmentations. Its random transforms come in :func:`mammogram_transforms`'s
    order, so with the same random state both draw the same numbers.
    """
    given = PreprocessingSettings.given("mammogram_step_transforms", [STEP], settings)
    keys, mask_keys = _check_keys(keys, mask_keys)
    chain: list[Callable] = []
    if train:
        chain.append(given.window_shift(keys + mask_keys))
    if given.standardize:
        chain.append(StandardizeImaged(keys))
    if train:
        chain.extend(mammogram_augmentations(keys, mask_keys) if augmentations is None else augmentations)
    return Compose(chain)


# -- the configs' chains (one component per config id; the arguments are the configs' size ids) ---------------------


def _record_path() -> Callable:
    """The image's file, kept for the reports (a cached image carries no metadata)."""
    return CopyItemsd(keys="image", names="image_path")


def _stack_masks() -> Callable:
    """The per-class masks as one ``(2, H, W)`` uint8 ``mask``, zeros for an absent class."""
    return StackMasksd(keys=list(MASK_KEYS), output_key="mask", dtype=torch.uint8)


def _cached_targets() -> list[Callable]:
    """What a cached item keeps (:data:`CACHED_KEYS`), as plain tensors: the uint16 image, the uint8 masks, the
    float labels, the file, and in training the window's offset range."""
    return [
        EnsureTyped(keys="label", dtype=torch.float32, track_meta=False),
        EnsureTyped(keys=["image", "mask"], track_meta=False, allow_missing_keys=True),
        SelectItemsd(keys=list(CACHED_KEYS), allow_missing_keys=True),
    ]


def train_preprocessing(prefix: Sequence[Callable], *, with_masks: bool = False, **settings: Any) -> Compose:
    """``train#preprocessing``: the training chain's cached half, run once per image in the loader.

    The file's path (``image_path``); the masks and boxes dropped before loading unless ``with_masks`` (GLAM's
    stages learn from the image labels; the U-Net baseline trains on the masks); ``prefix``
    (:func:`mammogram_prefix`, the config's ``@mammogram_prefix``: the same objects); the authors' best-centre window
    grown by ``max_shift`` px on every side (:class:`~scripts.transforms.mammo.dictionary.BestCenterRegiond`: every
    shifted window lies in it), the image as uint16; the masks stacked in ``mask`` when kept; the stored targets
    (:data:`CACHED_KEYS`). ``settings``: the window's :class:`PreprocessingSettings` (``window``, ``max_shift``,
    ``iterations``, ``view_key`` ...). :func:`train_batch_transforms` finishes the chain.
    """
    given = PreprocessingSettings.given("train_preprocessing", [WINDOW], settings)
    region = given.window_step(BestCenterRegiond, ["image", *MASK_KEYS])
    chain: list[Callable] = [_record_path()]
    if not with_masks:
        chain.append(DeleteItemsd(keys=[*MASK_KEYS, BOXES_KEY]))
    chain += [*prefix, region, QuantizeToUint16d(keys="image")]
    if with_masks:
        chain.append(_stack_masks())
    return Compose(chain + _cached_targets())


def train_batch_transforms(augmentations: Sequence[Callable] = (), **settings: Any) -> Compose:
    """``train#batch_transforms``: the training chain's per-step half, on the model's device, image by image: the
    window shifted by up to ``max_shift`` px (uniform, per axis) in the cached region, masks with it
    (:class:`~scripts.transforms.mammo.dictionary.RandWindowShiftd`), the image standardised, then
    ``augmentations`` (the config's ``@augmentations``, declared there as data: the same objects, in that order, so
    they draw their random numbers as they always did). ``settings``: ``window`` and ``max_shift``."""
    given = PreprocessingSettings.given("train_batch_transforms", [STEP], settings)
    return Compose([given.window_shift(["image", "mask"]), StandardizeImaged(keys="image"), *augmentations])


def validate_preprocessing(prefix: Sequence[Callable], **settings: Any) -> Compose:
    """``validate#preprocessing``: the validation chain's cached half: the file's path, ``prefix``
    (:func:`mammogram_prefix`), the authors' best-centre window (spec 8.3), the image as uint16, the masks stacked in
    ``mask``, the stored targets. ``settings``: the window's :class:`PreprocessingSettings`.
    :func:`validate_batch_transforms` finishes it."""
    given = PreprocessingSettings.given("validate_preprocessing", [WINDOW], settings)
    best_window = given.window_step(BestCenterWindowd, ["image", *MASK_KEYS])
    chain = [_record_path(), *prefix, best_window, QuantizeToUint16d(keys="image"), _stack_masks()]
    return Compose(chain + _cached_targets())


def validate_batch_transforms() -> Compose:
    """``validate#batch_transforms``: the image standardised, on the model's device."""
    return Compose([StandardizeImaged(keys="image")])


def inference_preprocessing(reader: ImageReader | None = None, **settings: Any) -> Compose:
    """``preprocessing`` of ``bundle/configs/inference.yaml``: :func:`mammogram_transforms` for the image alone, in
    one piece: load with ``reader`` (inference's, which refuses non-mammograms and oversized files; default
    :class:`~scripts.data.readers.MammogramReader` with the DICOM VOI LUT applied), resample to the model's pixel
    spacing, mirror, crop, the best-centre window, standardise. Every geometric step records itself, so
    ``Invertd`` over this ``Compose`` puts a window-sized map back on the file's grid. ``settings``: any
    :class:`PreprocessingSettings` (inference.yaml's ``spacing_range`` and ``max_image_pixels`` bound the spacings
    and the resampled size)."""
    return mammogram_transforms(["image"], [], reader=reader, **settings)


def inference_loading(preprocessing: Compose, *, panel_height: int | None = 1024) -> Compose:
    """``loading`` of ``bundle/configs/inference.yaml``, what the data loader runs per input: ``preprocessing``'s
    first transform (the loading), the panel's pictures, then the rest of ``preprocessing``: the same transform
    objects, so that ``Invertd(preprocessing)`` undoes what they recorded.

    The pictures are taken right after loading, before the preprocessing changes the image, so that nothing reads
    the file again: a datalist's masks (empty fields dropped) are loaded, its boxes painted into them, and the image
    and masks shrunk to at most ``panel_height`` rows (:class:`~scripts.transforms.thumbnail.Thumbnaild`; None: full
    resolution), then the masks are dropped: they take no part in the preprocessing the maps are inverted through."""
    steps = list(preprocessing.transforms)
    pictures = [
        DropEmptyKeysd(keys=list(MASK_KEYS)),
        LoadImaged(keys=list(MASK_KEYS), reader=MammogramReader(mask=True), image_only=True, allow_missing_keys=True),
        BoxesToMasksd(list(MASK_KEYS), mask_files="keep"),
        Thumbnaild(keys=["image", *MASK_KEYS], max_rows=panel_height, allow_missing_keys=True),
        DeleteItemsd(keys=list(MASK_KEYS)),
    ]
    return Compose([steps[0], *pictures, *steps[1:]])
