"""Array transforms that crop the K patches GLAM's local module sees, for data pipelines.

Each takes one channel-first image (C, H, W) and returns ``(patches, boxes)``: patches (K, C, ph, pw) and boxes
(K, 4) long (row, col, height, width), the same boxes the model itself would use (:mod:`scripts.patches`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from monai.config import NdarrayOrTensor
from monai.transforms import Randomizable, Transform
from monai.utils import convert_to_tensor

from ...errors import UsageError
from ...patches import _check_patch_count, as_pair, crop_patches, random_patch_boxes, select_patch_boxes

__all__ = ["SaliencyPatchCrop", "RandPatchCrop"]


def _as_image(**named: NdarrayOrTensor) -> torch.Tensor:
    """The one keyword argument as a (C, H, W) tensor; the keyword names it in the error (``_as_image(img=img)``)."""
    ((name, img),) = named.items()
    image = convert_to_tensor(img, track_meta=False)
    if image.ndim != 3:
        raise UsageError(f"{name} must be channel-first (C, H, W), got shape {tuple(image.shape)}")
    return image


class SaliencyPatchCrop(Transform):
    """Crop the K patches that Algorithm 1 selects from a saliency map (e.g. S_g of a frozen global module).

    Args:
        num_patches: K.
        patch_size: patch (rows, cols) in image pixels.

    ``__call__(img (C, H, W), saliency (C_s, h, w))`` -> ``(patches (K, C, ph, pw), boxes (K, 4))``. The map may
    have any resolution: windows are scaled by h / H and w / W as in the paper.
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
    """Crop K random patches inside the breast, non-overlapping where possible (stage 2's negatives).

    Args:
        num_patches: K.
        patch_size: patch (rows, cols) in image pixels.
        stride: grid step of candidate corners in pixels (default a quarter patch).

    ``__call__(img (C, H, W))`` -> ``(patches (K, C, ph, pw), boxes (K, 4))``. The foreground is the pixels above
    the image's minimum (the zero background and padding, or their standardised value, are excluded).
    Reproducible with ``set_random_state``.
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
