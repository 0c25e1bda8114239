"""Array transforms that crop the K patches GLAM's local module sees: ``(patches (K, C, ph, pw), boxes (K, 4))``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from monai.config import NdarrayOrTensor
from monai.transforms import Randomizable, Transform
from monai.utils import convert_to_tensor

from ...errors import UsageError
from ...patches import _check_patch_count, as_pair, crop_patches, random_patch_boxes, select_patch_boxes


def _as_image(**named: NdarrayOrTensor) -> torch.Tensor:
    """The one keyword argument as a (C, H, W) tensor; the keyword names it in the error."""
    ((name, img),) = named.items()
    image = convert_to_tensor(img, track_meta=False)
    if image.ndim != 3:
        raise UsageError(f"{name} must be channel-first (C, H, W), got shape {tuple(image.shape)}")
    return image


class SaliencyPatchCrop(Transform):
    """Crop the K patches that Algorithm 1 selects on a saliency map ``(C_s, h, w)`` of any resolution.

    Args:
        num_patches: K.
        patch_size: patch (rows, cols) in image pixels.
    """

    backend = [torch.Tensor.__name__, np.ndarray.__name__]

    def __init__(self, num_patches: int, patch_size: int | Sequence[int]) -> None:
        self.patch_size = as_pair(patch_size, "patch_size")
        self.num_patches = num_patches

    def __call__(self, img: NdarrayOrTensor, saliency: NdarrayOrTensor) -> tuple[torch.Tensor, torch.Tensor]:
        image = _as_image(img=img)
        s = _as_image(saliency=saliency).to(image.device)
        if not bool(torch.isfinite(s).all()):
            raise UsageError("saliency contains NaN or infinite values")
        image_size = tuple(image.shape[-2:])
        _check_patch_count(self.num_patches, s.shape[-2:], image_size, self.patch_size)
        boxes = select_patch_boxes(s[None], image_size, self.patch_size, self.num_patches)
        return crop_patches(image[None], boxes, self.patch_size)[0], boxes[0]


class RandPatchCrop(Randomizable, Transform):
    """Crop K random patches inside the breast (pixels above the image's minimum), non-overlapping where possible.

    Args:
        num_patches: K.
        patch_size: patch (rows, cols) in image pixels.
        stride: grid step of candidate corners in pixels (default a quarter patch).
    """

    backend = [torch.Tensor.__name__, np.ndarray.__name__]

    def __init__(self, num_patches: int, patch_size: int | Sequence[int], stride: int | None = None) -> None:
        if isinstance(num_patches, bool) or not isinstance(num_patches, int) or num_patches < 1:
            raise UsageError(f"num_patches must be a positive int, got {num_patches!r}")
        self.num_patches = num_patches
        self.patch_size = as_pair(patch_size, "patch_size")
        self.stride = stride
        self._seed = 0

    def randomize(self, data: object = None) -> None:
        self._seed = int(self.R.randint(0, 2**31 - 1))

    def __call__(self, img: NdarrayOrTensor, randomize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        image = _as_image(img=img)
        if randomize:
            self.randomize()
        generator = torch.Generator(device=image.device).manual_seed(self._seed)
        boxes = random_patch_boxes(image[None, :1], self.patch_size, self.num_patches, generator, self.stride)
        return crop_patches(image[None], boxes, self.patch_size)[0], boxes[0]
