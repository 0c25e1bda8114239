"""Dictionary versions of :mod:`.array`: crop the same K patch boxes from every key (image and its masks)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import torch
from monai.config import KeysCollection
from monai.transforms import MapTransform, Randomizable

from ...errors import UsageError
from ...patches import crop_patches
from .array import RandPatchCrop, SaliencyPatchCrop, _as_image


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
            raise UsageError(f"SaliencyPatchCropd: saliency_key {self.saliency_key!r} is not in the data")
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
