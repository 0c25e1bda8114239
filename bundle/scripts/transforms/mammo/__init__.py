"""Mammogram preprocessing transforms (docs/preprocessing.md) as MONAI array / dictionary pairs."""
# ruff: noqa: F401

from scripts.transforms.mammo.array import (
    BestCenterRegion,
    BestCenterWindow,
    CropBreast,
    FlipToRight,
    QuantizeToUint16,
    RandBestCenterWindow,
    RandWindowShift,
    StandardizeImage,
    window_shift_range,
)
from scripts.transforms.mammo.breast import (
    WindowPlacement,
    best_center_window,
    breast_crop,
    chest_wall_side,
    open_breast_mask,
    open_breast_mask_exact,
)
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
from scripts.transforms.mammo.spacing import (
    MODEL_SPACING_KEY,
    SPACING_ASSUMED_KEY,
    SPACING_SOURCE_KEY,
    SPACING_USED_KEY,
    ResampleToSpacing,
    ResampleToSpacingd,
    as_pixel_spacing,
    fit_breast_spacing,
    format_spacing,
)
