"""Crop the K patches GLAM's local module sees, as MONAI array and dictionary transforms.

The array transforms take a channel-first (C, H, W) image and return ``(patches (K, C, ph, pw), boxes (K, 4))``,
the boxes the model itself would use (:mod:`scripts.patches`); the dictionary ones crop the same boxes from every key.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np
import torch
from monai.config import KeysCollection, NdarrayOrTensor
from monai.transforms import MapTransform, Randomizable, Transform
from monai.utils import convert_to_tensor

from ..patches import _check_patch_count, as_pair, crop_patches, random_patch_boxes, select_patch_boxes

__all__ = ["RandPatchCrop", "RandPatchCropd", "SaliencyPatchCrop", "SaliencyPatchCropd"]


def _as_image(**named: NdarrayOrTensor) -> torch.Tensor:
    """The one keyword argument as a (C, H, W) tensor; the keyword names it in the error."""
    ((name, img),) = named.items()
    image = convert_to_tensor(img, track_meta=False)
    if image.ndim != 3:
        raise ValueError(f"{name} must be channel-first (C, H, W), got shape {tuple(image.shape)}")
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
            raise ValueError("saliency contains NaN or infinite values")
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
            raise ValueError(f"num_patches must be a positive int, got {num_patches!r}")
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


def _crop_keys(transform: MapTransform, d: dict, boxes: torch.Tensor, patch_size: tuple[int, int]) -> dict:
    for key in transform.key_iterator(d):
        image = _as_image(**{str(key): d[key]})
        d[key] = crop_patches(image[None], boxes[None].to(image.device), patch_size)[0]
    return d


class SaliencyPatchCropd(MapTransform):
    """Crop the K Algorithm-1 patches chosen on ``d[saliency_key]`` from every key; boxes to ``d[box_key]``.

    Args:
        keys: keys to crop (image and masks, of one size).
        saliency_key: key of the saliency map (C_s, h, w).
        num_patches: K.
        patch_size: patch (rows, cols).
        box_key: where the (K, 4) boxes go.
        allow_missing_keys: skip absent keys.
    """

    def __init__(
        self,
        keys: KeysCollection,
        saliency_key: str,
        num_patches: int,
        patch_size: int | Sequence[int],
        box_key: str = "patch_boxes",
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.cropper = SaliencyPatchCrop(num_patches, patch_size)
        self.saliency_key = saliency_key
        self.box_key = box_key

    def __call__(self, data: Mapping[Hashable, object]) -> dict[Hashable, object]:
        d = dict(data)
        first = next(self.key_iterator(d), None)
        if first is None:
            return d
        if self.saliency_key not in d:
            raise ValueError(f"SaliencyPatchCropd: saliency_key {self.saliency_key!r} is not in the data")
        _, boxes = self.cropper(d[first], d[self.saliency_key])
        d[self.box_key] = boxes
        return _crop_keys(self, d, boxes, self.cropper.patch_size)


class RandPatchCropd(Randomizable, MapTransform):
    """Crop the same K random in-breast patches from every key; boxes to ``d[box_key]``.

    Args:
        keys: keys to crop; the first present one decides the foreground.
        num_patches: K.
        patch_size: patch (rows, cols).
        box_key: where the (K, 4) boxes go.
        stride: grid step of candidate corners in pixels.
        allow_missing_keys: skip absent keys.
    """

    def __init__(
        self,
        keys: KeysCollection,
        num_patches: int,
        patch_size: int | Sequence[int],
        box_key: str = "patch_boxes",
        stride: int | None = None,
        allow_missing_keys: bool = False,
    ) -> None:
        MapTransform.__init__(self, keys, allow_missing_keys)
        self.cropper = RandPatchCrop(num_patches, patch_size, stride)
        self.box_key = box_key

    def set_random_state(self, seed: int | None = None, state=None) -> RandPatchCropd:
        super().set_random_state(seed, state)
        self.cropper.set_random_state(seed, state)
        return self

    def randomize(self, data: object = None) -> None:
        self.cropper.randomize()

    def __call__(self, data: Mapping[Hashable, object]) -> dict[Hashable, object]:
        d = dict(data)
        first = next(self.key_iterator(d), None)
        if first is None:
            return d
        self.randomize()
        _, boxes = self.cropper(d[first], randomize=False)
        d[self.box_key] = boxes
        return _crop_keys(self, d, boxes, self.cropper.patch_size)


SaliencyPatchCropD = SaliencyPatchCropDict = SaliencyPatchCropd
RandPatchCropD = RandPatchCropDict = RandPatchCropd
