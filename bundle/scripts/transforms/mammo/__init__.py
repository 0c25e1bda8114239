"""Mammogram preprocessing transforms (docs/preprocessing.md) as MONAI array / dictionary pairs."""

from scripts.transforms.mammo.array import (
    BestCenterWindow,
    CropBreast,
    FlipToRight,
    RandBestCenterWindow,
    StandardizeImage,
)
from scripts.transforms.mammo.breast import (
    WindowPlacement,
    best_center_window,
    breast_crop_box,
    chest_wall_side,
    open_breast_mask,
    open_breast_mask_exact,
)
from scripts.transforms.mammo.dictionary import (
    BestCenterWindowd,
    CropBreastd,
    DropEmptyKeysd,
    FlipToRightd,
    RandBestCenterWindowd,
    StandardizeImaged,
)
from scripts.transforms.mammo.pipeline import mammogram_augmentations, mammogram_transforms
from scripts.transforms.mammo.spacing import (
    MODEL_SPACING_KEY,
    SPACING_ASSUMED_KEY,
    ResampleToSpacing,
    ResampleToSpacingd,
    as_pixel_spacing,
    format_spacing,
)

__all__ = [
    "BestCenterWindow",
    "BestCenterWindowd",
    "CropBreast",
    "CropBreastd",
    "DropEmptyKeysd",
    "FlipToRight",
    "FlipToRightd",
    "MODEL_SPACING_KEY",
    "RandBestCenterWindow",
    "RandBestCenterWindowd",
    "ResampleToSpacing",
    "ResampleToSpacingd",
    "SPACING_ASSUMED_KEY",
    "StandardizeImage",
    "StandardizeImaged",
    "WindowPlacement",
    "as_pixel_spacing",
    "best_center_window",
    "breast_crop_box",
    "chest_wall_side",
    "format_spacing",
    "mammogram_augmentations",
    "mammogram_transforms",
    "open_breast_mask",
    "open_breast_mask_exact",
]
