# ruff: noqa: F401
from .array import RandPatchCrop, SaliencyPatchCrop
from .dictionary import (
    RandPatchCropD,
    RandPatchCropd,
    RandPatchCropDict,
    SaliencyPatchCropD,
    SaliencyPatchCropd,
    SaliencyPatchCropDict,
)
