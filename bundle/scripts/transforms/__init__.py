"""The bundle's MONAI transforms: mammogram preprocessing and GLAM's patch cropping (array / dictionary pairs)."""

from .mammo import (
    BestCenterWindow,
    BestCenterWindowd,
    CropBreast,
    CropBreastd,
    DropEmptyKeysd,
    FlipToRight,
    FlipToRightd,
    RandBestCenterWindow,
    RandBestCenterWindowd,
    ResampleToSpacing,
    ResampleToSpacingd,
    StandardizeImage,
    StandardizeImaged,
    mammogram_augmentations,
    mammogram_transforms,
)
from .patches import RandPatchCrop, RandPatchCropd, SaliencyPatchCrop, SaliencyPatchCropd
from .thumbnail import Thumbnail, Thumbnaild, thumbnail_step

__all__ = [
    "FlipToRight",
    "FlipToRightd",
    "CropBreast",
    "CropBreastd",
    "BestCenterWindow",
    "BestCenterWindowd",
    "RandBestCenterWindow",
    "RandBestCenterWindowd",
    "ResampleToSpacing",
    "ResampleToSpacingd",
    "StandardizeImage",
    "StandardizeImaged",
    "DropEmptyKeysd",
    "mammogram_transforms",
    "mammogram_augmentations",
    "SaliencyPatchCrop",
    "SaliencyPatchCropd",
    "RandPatchCrop",
    "RandPatchCropd",
    "Thumbnail",
    "Thumbnaild",
    "thumbnail_step",
]
