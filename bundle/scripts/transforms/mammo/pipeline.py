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

The bundle's configs write the same chains out as transform blocks (``bundle/configs/train.yaml``:
``mammogram_prefix``, ``train#region`` / ``validate#window``, ``train#window``, ``augmentations``;
``bundle/configs/inference.yaml``: ``preprocessing``), so a user sees and changes every argument there. The defaults
below are the values those blocks show, and ``tests/transforms/test_config_transforms.py`` checks that both build the
same transforms with the same arguments and outputs: change a default in both places.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from monai.transforms import (
    AsDiscreted,
    CastToTyped,
    Compose,
    LoadImaged,
    RandAdjustContrastd,
    RandFlipd,
    RandScaleIntensityd,
    RandShiftIntensityd,
)

from scripts.data.readers import MammogramReader
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

__all__ = [
    "mammogram_augmentations",
    "mammogram_cache_transforms",
    "mammogram_step_transforms",
    "mammogram_transforms",
]


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


#: the arguments of the builders that shape the chain up to the window (passed on by name)
_CHAIN_SETTINGS = (
    "load",
    "apply_voi",
    "pixel_spacing",
    "horizontal_flip",
    "laterality_key",
    "view_key",
    "crop",
    "iterations",
    "buffer",
    "reference_compatible",
    "default_view",
    "input_spacing",
    "spacing_fallback",
)


def _chain_to_window(
    keys: list[str],
    mask_keys: list[str],
    window: Sequence[int],
    window_step: type,
    max_shift: Sequence[int] | int,
    settings: dict,
) -> list[Callable]:
    """Drop empty mask fields, load, resample to the model's spacing, binarise the masks as bytes, mirror, crop, then
    ``window_step`` (``BestCenterWindowd``, ``RandBestCenterWindowd`` or ``BestCenterRegiond``) on every key."""
    all_keys = keys + mask_keys
    source = keys[0]
    chain: list[Callable] = []
    if mask_keys:
        chain.append(DropEmptyKeysd(mask_keys))
    if settings["load"]:
        chain.append(LoadImaged(keys=keys, reader=MammogramReader(apply_voi=settings["apply_voi"]), image_only=True))
        if mask_keys:
            chain.append(
                LoadImaged(keys=mask_keys, reader=MammogramReader(mask=True), image_only=True, allow_missing_keys=True)
            )
    # the image's spacing decides for its masks too; masks nearest-exact, so they stay 0/1 (0/255) before binarising
    modes = ["bilinear"] * len(keys) + ["nearest-exact"] * len(mask_keys)
    chain.append(
        ResampleToSpacingd(
            all_keys,
            pixel_spacing=settings["pixel_spacing"],
            source_key=source,
            mode=modes,
            allow_missing_keys=True,
            input_spacing=settings["input_spacing"],
            fallback=settings["spacing_fallback"],
            window=tuple(window),
            iterations=settings["iterations"],
            buffer=settings["buffer"],
        )
    )
    if mask_keys:
        chain.append(AsDiscreted(keys=mask_keys, threshold=0.5, allow_missing_keys=True))
        # 0/1 masks as bytes: a quarter of the memory (a training cache holds them; the targets are made float later)
        chain.append(CastToTyped(keys=mask_keys, dtype=torch.uint8, allow_missing_keys=True))
    chain.append(
        FlipToRightd(
            all_keys,
            laterality_key=settings["laterality_key"],
            horizontal_flip=settings["horizontal_flip"],
            source_key=source,
            allow_missing_keys=True,
        )
    )
    if settings["crop"]:
        crop_args = dict(iterations=settings["iterations"], buffer=settings["buffer"])
        chain.append(CropBreastd(all_keys, source_key=source, allow_missing_keys=True, **crop_args))
    window_args = dict(
        source_key=source,
        view_key=settings["view_key"],
        window=tuple(window),
        reference_compatible=settings["reference_compatible"],
        iterations=settings["iterations"],
        default_view=settings["default_view"],
        allow_missing_keys=True,
    )
    if window_step is not BestCenterWindowd:
        window_args["max_shift"] = max_shift
    chain.append(window_step(all_keys, **window_args))
    return chain


def _check_keys(keys: Sequence[str], mask_keys: Sequence[str]) -> tuple[list[str], list[str]]:
    keys, mask_keys = list(keys), list(mask_keys)
    if not keys:
        raise ValueError("keys must name at least one image key")
    return keys, mask_keys


def mammogram_transforms(
    keys: Sequence[str] = ("image",),
    mask_keys: Sequence[str] = ("mask_benign", "mask_malignant"),
    window: Sequence[int] = (2944, 1920),
    train: bool = False,
    *,
    load: bool = True,
    apply_voi: bool = True,
    pixel_spacing: float | Sequence[float] | None = None,
    horizontal_flip: str = "NO",
    laterality_key: str | None = "laterality",
    view_key: str | None = "view",
    crop: bool = True,
    iterations: int = 100,
    buffer: int = 50,
    reference_compatible: bool = True,
    default_view: str | None = "CC",
    input_spacing: float | Sequence[float] | None = None,
    spacing_fallback: str = "fit_breast",
    standardize: bool = True,
    max_shift: Sequence[int] | int = (32, 32),
    augmentations: Sequence[Callable] | None = None,
) -> Compose:
    """The authors' preprocessing (docs/preprocessing.md) for datalist items
    ``{"image": path, "mask_benign"?: path, ...}`` as one per-image chain: the chain of ``preprocessing`` in
    ``bundle/configs/inference.yaml`` (``mask_keys=()``), and, split in two (:func:`mammogram_cache_transforms` then
    :func:`mammogram_step_transforms`), of the training and validation chains of ``bundle/configs/train.yaml``.

    Args:
        keys: image keys; the first one places the crop and the window for all keys.
        mask_keys: optional per-image masks (missing, None or "" values are skipped); binarised (> 0.5 -> 1).
        window: ``(rows, cols)`` of the model input.
        train: add the random window shift (``max_shift`` px) and ``augmentations``.
        load: start with ``LoadImaged`` + :class:`~scripts.data.readers.MammogramReader` (False when the items
            already hold ``(1, H, W)`` tensors).
        apply_voi: apply DICOM VOI LUT / window when present.
        pixel_spacing: the model's ``(row, col)`` mm (a number: isotropic; ``pixel_spacing`` of the configs): images
            of known spacing are resampled to it (:class:`~scripts.transforms.mammo.spacing.ResampleToSpacingd`);
            None (the default): nothing is resampled.
        input_spacing, spacing_fallback: the spacing of images whose file (and datalist item, ``pixel_spacing``)
            states none, and what to do when nobody states it (``"fit_breast"``: estimate it so that the breast fits
            the window; ``"model"``: assume the model's); see
            :class:`~scripts.transforms.mammo.spacing.ResampleToSpacing`.
        horizontal_flip, laterality_key: see :class:`~scripts.transforms.mammo.dictionary.FlipToRightd`.
        view_key, reference_compatible, default_view: see
            :class:`~scripts.transforms.mammo.dictionary.BestCenterWindowd`.
        crop, iterations, buffer: the authors' crop (skip it for images that are already cropped).
        standardize: per-image ``(x - mean) / max(std, 1e-5)`` of the images.
        max_shift: the largest window shift (rows, cols) in training (``max_shift`` of ``train.yaml``).
        augmentations: transforms run after standardisation in training; default
            :func:`mammogram_augmentations` ``(keys, mask_keys)``.

    Returns:
        a ``Compose``; its output images are ``(1, *window)`` float32 MetaTensors that remember every geometric
        step, so ``Invertd`` maps a window-sized map back to the file's geometry.
    """
    given = locals()
    keys, mask_keys = _check_keys(keys, mask_keys)
    settings = {k: v for k, v in given.items() if k in _CHAIN_SETTINGS}
    step = RandBestCenterWindowd if train else BestCenterWindowd
    chain = _chain_to_window(keys, mask_keys, window, step, max_shift, settings)
    if standardize:
        chain.append(StandardizeImaged(keys))
    if train:
        chain.extend(mammogram_augmentations(keys, mask_keys) if augmentations is None else augmentations)
    return Compose(chain)


def mammogram_cache_transforms(
    keys: Sequence[str] = ("image",),
    mask_keys: Sequence[str] = ("mask_benign", "mask_malignant"),
    window: Sequence[int] = (2944, 1920),
    train: bool = False,
    *,
    load: bool = True,
    apply_voi: bool = True,
    pixel_spacing: float | Sequence[float] | None = None,
    horizontal_flip: str = "NO",
    laterality_key: str | None = "laterality",
    view_key: str | None = "view",
    crop: bool = True,
    iterations: int = 100,
    buffer: int = 50,
    reference_compatible: bool = True,
    default_view: str | None = "CC",
    input_spacing: float | Sequence[float] | None = None,
    spacing_fallback: str = "fit_breast",
    max_shift: Sequence[int] | int = (32, 32),
) -> Compose:
    """The deterministic half of :func:`mammogram_transforms` (same arguments), run once per image and cached:
    the prefix (load, resample, masks as bytes, mirror, crop), then in training the window's region grown by
    ``max_shift`` (:class:`~scripts.transforms.mammo.dictionary.BestCenterRegiond`, its offset range in
    ``d["window_shift_range"]``) or else the window itself, then the images as uint16
    (:class:`~scripts.transforms.mammo.dictionary.QuantizeToUint16d`). :func:`mammogram_step_transforms` finishes.
    """
    given = locals()
    keys, mask_keys = _check_keys(keys, mask_keys)
    settings = {k: v for k, v in given.items() if k in _CHAIN_SETTINGS}
    chain = _chain_to_window(
        keys, mask_keys, window, BestCenterRegiond if train else BestCenterWindowd, max_shift, settings
    )
    chain.append(QuantizeToUint16d(keys))
    return Compose(chain)


def mammogram_step_transforms(
    keys: Sequence[str] = ("image",),
    mask_keys: Sequence[str] = ("mask_benign", "mask_malignant"),
    window: Sequence[int] = (2944, 1920),
    train: bool = False,
    *,
    standardize: bool = True,
    max_shift: Sequence[int] | int = (32, 32),
    augmentations: Sequence[Callable] | None = None,
) -> Compose:
    """The per-step half of :func:`mammogram_transforms` (same arguments) on the output of
    :func:`mammogram_cache_transforms`, for one image on any device: in training the random window shift
    (:class:`~scripts.transforms.mammo.dictionary.RandWindowShiftd`), then the standardisation and, in training,
    the augmentations. Its random transforms come in :func:`mammogram_transforms`'s order, so with the same random
    state both draw the same numbers.
    """
    keys, mask_keys = _check_keys(keys, mask_keys)
    chain: list[Callable] = []
    if train:
        chain.append(
            RandWindowShiftd(keys + mask_keys, window=tuple(window), max_shift=max_shift, allow_missing_keys=True)
        )
    if standardize:
        chain.append(StandardizeImaged(keys))
    if train:
        chain.extend(mammogram_augmentations(keys, mask_keys) if augmentations is None else augmentations)
    return Compose(chain)
