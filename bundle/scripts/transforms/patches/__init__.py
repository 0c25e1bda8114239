from .array import RandPatchCrop, SaliencyPatchCrop
from .dictionary import (
    RandPatchCropD,
    RandPatchCropd,
    RandPatchCropDict,
    SaliencyPatchCropD,
    SaliencyPatchCropd,
    SaliencyPatchCropDict,
)

__all__ = [
    "SaliencyPatchCrop",
    "RandPatchCrop",
    "SaliencyPatchCropd",
    "SaliencyPatchCropD",
    "SaliencyPatchCropDict",
    "RandPatchCropd",
    "RandPatchCropD",
    "RandPatchCropDict",
]
