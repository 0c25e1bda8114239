"""Training targets from datalist items: the per-class masks stacked into one (2, H, W) map."""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import torch
from monai.config import KeysCollection
from monai.transforms import MapTransform
from monai.utils import convert_to_tensor

from ..enums import MASK_KEYS
from ..errors import UsageError


class StackMasksd(MapTransform):
    """Stack the optional per-class (1, H, W) masks into ``d[output_key]`` (C, H, W), zeros for absent ones.

    An image without masks thus still counts for classification; localisation metrics skip empty classes.

    Args:
        keys: the per-class mask keys, in channel order.
        output_key: where the stacked mask goes.
        reference_key: the image whose spatial size the masks must have.
        remove_keys: drop the per-class keys afterwards, so that batches collate.
        dtype: of the stacked mask (``torch.uint8`` keeps a cached mask at a quarter of float32's bytes).
    """

    def __init__(
        self,
        keys: KeysCollection = MASK_KEYS,
        output_key: str = "mask",
        reference_key: str = "image",
        remove_keys: bool = True,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(keys, allow_missing_keys=True)
        self.dtype = dtype
        self.output_key = output_key
        self.reference_key = reference_key
        self.remove_keys = remove_keys

    def __call__(self, data: Mapping[Hashable, object]) -> dict[Hashable, object]:
        d = dict(data)
        if self.reference_key not in d:
            raise UsageError(f"StackMasksd: reference key {self.reference_key!r} is missing")
        size = tuple(d[self.reference_key].shape[-2:])
        channels: list[torch.Tensor] = []
        for key in self.keys:
            value = d.get(key)
            if value is None or (isinstance(value, str) and not value.strip()):
                channels.append(torch.zeros(size, dtype=self.dtype))
                continue
            if isinstance(value, str):  # a path: the loading transform did not run on this key
                raise UsageError(f"{key} is still a file path ({value!r}): load the masks before StackMasksd")
            mask = convert_to_tensor(value, track_meta=False, dtype=self.dtype)
            if mask.ndim == 3 and mask.shape[0] == 1:
                mask = mask[0]
            if tuple(mask.shape) != size:
                name = d.get("image_path") or (getattr(d[self.reference_key], "meta", {}) or {}).get("filename_or_obj")
                raise UsageError(f"{key} of shape {tuple(mask.shape)} does not match the image {size} ({name})")
            channels.append(mask)
        d[self.output_key] = torch.stack(channels)
        if self.remove_keys:
            for key in self.keys:
                d.pop(key, None)
        return d
