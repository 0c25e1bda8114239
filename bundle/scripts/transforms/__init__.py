"""The bundle's MONAI transforms: mammogram preprocessing and GLAM's patch cropping (array / dictionary pairs)."""
# ruff: noqa: F401

from .mammo import (
    BestCenterRegion,
    BestCenterRegiond,
    BestCenterWindow,
    BestCenterWindowd,
    CropBreast,
    CropBreastd,
    DropEmptyKeysd,
    FlipToRight,
    FlipToRightd,
    QuantizeToUint16,
    QuantizeToUint16d,
    RandBestCenterWindow,
    RandBestCenterWindowd,
    RandWindowShift,
    RandWindowShiftd,
    ResampleToSpacing,
    ResampleToSpacingd,
    StandardizeImage,
    StandardizeImaged,
)
from .patches import RandPatchCrop, RandPatchCropd, SaliencyPatchCrop, SaliencyPatchCropd
from .thumbnail import Thumbnail, Thumbnaild, thumbnail_step
