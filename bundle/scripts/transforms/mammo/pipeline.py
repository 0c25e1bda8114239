"""GLAM's preprocessing as one per-image MONAI ``Compose`` for scripts and unit tests: load, resample to the model's
pixel spacing, flip, crop, window, standardise (+ augment).

The bundle's workflows do not call it: ``bundle/configs/train.yaml`` and ``inference.yaml`` write their chains out
transform by transform (``train#preprocessing``, ``validate#preprocessing``, ``preprocessing`` ...), so that each step
is a config id a preset or the command line can override. This function builds the same steps in the same order, with
every option open, for code that preprocesses an image outside a workflow.

Order and why: the resampling comes right after loading, so the crop's iterations and buffer and the window count
pixels at the model's scale (it is the identity when the model's spacing is unknown). Images are mirrored next so
every later step can assume the chest wall at column 0 (the authors crop first and flip afterwards; with the buffer
put on the side away from the chest wall the two orders give the same pixels). Masks are resampled nearest-exact and
binarised right after, so the geometric steps (which only cut and zero-pad, never interpolate) keep them exactly
0/1. Intensity augmentations come after standardisation, because standardisation would undo any global scale or
shift applied before it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from monai.data import ImageReader
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

from scripts.data.errors import DEFAULT_MAX_PIXELS
from scripts.data.readers import MammogramReader
from scripts.transforms.boxes import BoxesToMasksd
from scripts.transforms.mammo.dictionary import (
    BestCenterWindowd,
    CropBreastd,
    DropEmptyKeysd,
    FlipToRightd,
    RandBestCenterWindowd,
    StandardizeImaged,
)
from scripts.transforms.mammo.spacing import ResampleToSpacingd

__all__ = ["MASK_KEYS", "mammogram_augmentations", "mammogram_transforms"]

#: a datalist item's lesion masks, one per class (docs/data.md); stacked into ``mask`` for training
MASK_KEYS = ("mask_benign", "mask_malignant")


def mammogram_augmentations(
    keys: Sequence[str] = ("image",),
    mask_keys: Sequence[str] = MASK_KEYS,
    intensity: bool = True,
    vertical_flip_prob: float = 0.0,
    *,
    prob: float = 0.5,
    gamma: tuple[float, float] = (0.8, 1.25),
    factors: float = 0.1,
    offsets: float = 0.1,
) -> list[Callable]:
    """The training augmentations that follow standardisation (those of ``train#batch_transforms``).

    Args:
        keys, mask_keys: the images jittered, and the masks flipped with them.
        intensity: ``RandAdjustContrastd`` with gamma in ``gamma``, ``RandScaleIntensityd`` by a factor in
            1 +- ``factors`` and ``RandShiftIntensityd`` by +- ``offsets`` (standardised units), each with probability
            ``prob``.
        vertical_flip_prob: up-down flips (``RandFlipd`` on spatial axis 0, images and masks together) when > 0: an
            explicit opt-in. Left-right mirroring is never offered: every breast must keep facing right, as the
            authors' window rule and the trained weights assume.
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


def mammogram_transforms(
    keys: Sequence[str] = ("image",),
    mask_keys: Sequence[str] = MASK_KEYS,
    *,
    train: bool = False,
    augmentations: Sequence[Callable] | None = None,
    load: bool = True,
    apply_voi: bool = True,
    reader: ImageReader | None = None,
    pixel_spacing: float | Sequence[float] | None = None,
    input_spacing: float | Sequence[float] | None = None,
    spacing_fallback: str = "fit_breast",
    spacing_range: Sequence[float] | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    horizontal_flip: str = "NO",
    laterality_key: str | None = "laterality",
    crop: bool = True,
    buffer: int = 50,
    window: Sequence[int] = (2944, 1920),
    iterations: int = 100,
    view_key: str | None = "view",
    reference_compatible: bool = True,
    default_view: str | None = "CC",
    max_shift: Sequence[int] | int = (32, 32),
    standardize: bool = True,
) -> Compose:
    """The authors' preprocessing (docs/preprocessing.md) for datalist items
    ``{"image": path, "mask_benign"?: path, "boxes"?: [...], ...}``: drop empty mask fields, load, paint the ``boxes``
    into the masks of the classes without a mask file, resample to the model's pixel spacing, masks to 0/1 bytes,
    mirror the breast to face right, crop it, the best-centre window (random in training), standardise, then in
    training the augmentations. Every step but the loading runs on all keys, placed by the first image key; masks may
    be missing.

    Args:
        keys: image keys; the first one places the resampling, the crop and the window for all keys.
        mask_keys: optional per-image masks (missing, None or "" values are skipped); binarised (> 0.5 -> 1).
        train: the window shifted at random by up to ``max_shift`` px, then ``augmentations``.
        augmentations: transforms run after standardisation in training; default
            :func:`mammogram_augmentations` ``(keys, mask_keys)``.
        load: start with ``LoadImaged`` (False when the items already hold ``(1, H, W)`` tensors).
        apply_voi, reader: the images' reader (default :class:`~scripts.data.readers.MammogramReader`
            ``(apply_voi=apply_voi)``); masks always get ``MammogramReader(mask=True)``.
        pixel_spacing, input_spacing, spacing_fallback, spacing_range, max_pixels: see
            :class:`~scripts.transforms.mammo.spacing.ResampleToSpacingd` (``fallback`` there).
        horizontal_flip, laterality_key: see :class:`~scripts.transforms.mammo.dictionary.FlipToRightd`.
        crop, buffer, iterations: the authors' crop (skip it for images already cropped), its buffer and iterations.
        window, view_key, reference_compatible, default_view: see
            :class:`~scripts.transforms.mammo.dictionary.BestCenterWindowd`.
        standardize: per-image ``(x - mean) / max(std, 1e-5)`` of the images.

    Returns:
        a ``Compose``; its output images are ``(1, *window)`` float32 MetaTensors that remember every geometric
        step, so ``Invertd`` maps a window-sized map back to the file's geometry.

    Raises:
        ValueError: when ``keys`` is empty.
    """
    keys, mask_keys = list(keys), list(mask_keys)
    if not keys:
        raise ValueError("keys must name at least one image key")
    all_keys, source, window = keys + mask_keys, keys[0], tuple(window)
    chain: list[Callable] = [DropEmptyKeysd(mask_keys)] if mask_keys else []
    if load:
        image_reader = MammogramReader(apply_voi=apply_voi) if reader is None else reader
        chain.append(LoadImaged(keys=keys, reader=image_reader, image_only=True))
        if mask_keys:
            mask_reader = MammogramReader(mask=True)
            chain.append(LoadImaged(keys=mask_keys, reader=mask_reader, image_only=True, allow_missing_keys=True))
    if mask_keys == list(MASK_KEYS):
        chain.append(BoxesToMasksd(mask_keys, image_key=source, mask_files="keep"))
    chain.append(
        ResampleToSpacingd(
            all_keys,
            pixel_spacing=pixel_spacing,
            source_key=source,
            mode=["bilinear"] * len(keys) + ["nearest-exact"] * len(mask_keys),
            allow_missing_keys=True,
            input_spacing=input_spacing,
            fallback=spacing_fallback,
            window=window,
            iterations=iterations,
            buffer=buffer,
            spacing_range=spacing_range,
            max_pixels=max_pixels,
        )
    )
    if mask_keys:
        chain.append(AsDiscreted(keys=mask_keys, threshold=0.5, allow_missing_keys=True))
        chain.append(CastToTyped(keys=mask_keys, dtype=torch.uint8, allow_missing_keys=True))
    chain.append(
        FlipToRightd(
            all_keys,
            laterality_key=laterality_key,
            horizontal_flip=horizontal_flip,
            source_key=source,
            allow_missing_keys=True,
        )
    )
    if crop:
        chain.append(
            CropBreastd(all_keys, source_key=source, allow_missing_keys=True, iterations=iterations, buffer=buffer)
        )
    window_args = dict(
        source_key=source,
        view_key=view_key,
        window=window,
        reference_compatible=reference_compatible,
        iterations=iterations,
        default_view=default_view,
        allow_missing_keys=True,
    )
    chain.append(
        RandBestCenterWindowd(all_keys, max_shift=max_shift, **window_args)
        if train
        else BestCenterWindowd(all_keys, **window_args)
    )
    if standardize:
        chain.append(StandardizeImaged(keys))
    if train:
        chain.extend(mammogram_augmentations(keys, mask_keys) if augmentations is None else augmentations)
    return Compose(chain)
