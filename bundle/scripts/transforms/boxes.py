"""Box annotations as lesion masks, so that boxes go through exactly the geometry masks go through (docs/data.md)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.data import MetaTensor
from monai.transforms import MapTransform, Transform

from ..data.boxes import BOXES_KEY, parse_boxes
from ..enums import CLASS_NAMES, MASK_KEYS
from ..errors import UsageError


class BoxesToMask(Transform):
    """Paint ``(y0, x0, y1, x1)`` boxes into a (1, H, W) uint8 mask: every pixel a box touches is 1."""

    def __call__(self, boxes: Sequence[Sequence[float]], shape: Sequence[int]) -> np.ndarray:
        h, w = int(shape[0]), int(shape[1])
        mask = np.zeros((1, h, w), dtype=np.uint8)
        for y0, x0, y1, x1 in boxes:
            r0, c0 = max(int(math.floor(y0)), 0), max(int(math.floor(x0)), 0)
            r1, c1 = min(int(math.ceil(y1)), h), min(int(math.ceil(x1)), w)
            mask[0, r0:r1, c0:c1] = 1
        return mask


class BoxesToMasksd(MapTransform):
    """Dictionary :class:`BoxesToMask`: an item's ``boxes`` into the per-class mask keys, after loading.

    Args:
        mask_keys: the per-class mask keys in the order of ``CLASS_NAMES``.
        image_key: the loaded (1, H, W) image whose size and metadata the masks take.
        boxes_key: the datalist field (removed, so that batches collate).
        mask_files: where a class has a mask file and boxes: ``"unite"`` them or ``"keep"`` the file's.
    """

    def __init__(
        self,
        mask_keys: Sequence[str] = MASK_KEYS,
        image_key: str = "image",
        boxes_key: str = BOXES_KEY,
        mask_files: str = "unite",
    ) -> None:
        super().__init__(list(mask_keys), allow_missing_keys=True)
        if len(self.keys) != len(CLASS_NAMES):
            raise UsageError(f"mask_keys must name one key per class {list(CLASS_NAMES)}, got {list(mask_keys)}")
        if mask_files not in ("unite", "keep"):
            raise UsageError(f"mask_files must be 'unite' or 'keep', got {mask_files!r}")
        self.image_key, self.boxes_key, self.mask_files = image_key, boxes_key, mask_files
        self.painter = BoxesToMask()

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        boxes = d.pop(self.boxes_key, None)
        image = d.get(self.image_key)
        where = f"{d.get('image_path') or getattr(image, 'meta', {}).get('filename_or_obj', '')}: boxes"
        entries = parse_boxes(boxes, where)
        if not entries:
            return d
        shape = tuple(image.shape[-2:])
        for key, cls in zip(self.keys, CLASS_NAMES):
            painted = self.painter([b for label, b in entries if label == cls], shape)
            if not painted.any():
                continue
            loaded = d.get(key)
            if loaded is not None and not isinstance(loaded, str):
                if self.mask_files == "keep":
                    continue
                if tuple(loaded.shape[-2:]) != shape:
                    raise UsageError(f"{key} of shape {tuple(loaded.shape[-2:])} does not match the image {shape}")
                painted = np.maximum(painted, (np.asarray(loaded) > 0).astype(np.uint8).reshape(painted.shape))
            meta = dict(getattr(image, "meta", {}) or {})
            d[key] = MetaTensor(torch.from_numpy(painted), meta=meta) if meta else torch.from_numpy(painted)
        return d
