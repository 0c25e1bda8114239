"""A small copy of an image taken right after loading, for pictures of the results, so that no file is read twice."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping

import torch
from monai.config import KeysCollection, NdarrayOrTensor
from monai.transforms import MapTransform, Transform
from monai.utils import TransformBackends, convert_to_tensor

from ..errors import UsageError

THUMBNAIL_SUFFIX = "_thumbnail"
THUMBNAIL_STEP_KEY = "thumbnail_step"


def thumbnail_step(rows: int, max_rows: int | None) -> int:
    """The pixel step that brings ``rows`` to at most ``max_rows`` (None or 0: 1)."""
    if max_rows is not None and int(max_rows) < 0:
        raise UsageError(f"max_rows must be positive or None (full resolution), got {max_rows!r}")
    return int(math.ceil(int(rows) / int(max_rows))) if max_rows and int(rows) > int(max_rows) else 1


class Thumbnail(Transform):
    """Every ``step``-th pixel of a ``(C, H, W)`` image, as float32 without metadata (nothing to invert).

    Args:
        max_rows: the thumbnail's rows at most; None: full resolution.
    """

    backend = [TransformBackends.TORCH, TransformBackends.NUMPY]

    def __init__(self, max_rows: int | None = 1024) -> None:
        thumbnail_step(1, max_rows)  # validates
        self.max_rows = None if max_rows is None else int(max_rows)

    def __call__(self, img: NdarrayOrTensor, step: int | None = None) -> torch.Tensor:
        """``step`` overrides the one computed from ``img``'s rows."""
        data = convert_to_tensor(img, track_meta=False, dtype=torch.float32)
        if data.ndim != 3:
            raise UsageError(f"Thumbnail expects a (C, H, W) image, got shape {tuple(data.shape)}")
        step = thumbnail_step(data.shape[1], self.max_rows) if step is None else int(step)
        return data[:, ::step, ::step].contiguous()


class Thumbnaild(MapTransform):
    """Dictionary :class:`Thumbnail`: ``d[key + THUMBNAIL_SUFFIX]`` per key at ``source_key``'s step, so masks match.

    Args:
        keys: the image and, optionally, its masks.
        max_rows: the image thumbnail's rows at most; None: full resolution.
        source_key: the image whose rows decide the step (stored under ``THUMBNAIL_STEP_KEY``).
    """

    backend = Thumbnail.backend

    def __init__(
        self,
        keys: KeysCollection,
        max_rows: int | None = 1024,
        source_key: str = "image",
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.thumbnail = Thumbnail(max_rows)
        self.source_key = source_key

    def __call__(self, data: Mapping[Hashable, NdarrayOrTensor]) -> dict[Hashable, NdarrayOrTensor]:
        d = dict(data)
        if self.source_key not in d:
            raise KeyError(f"Thumbnaild: the source image {self.source_key!r} is not in the data")
        source = d[self.source_key]
        step = thumbnail_step(source.shape[1], self.thumbnail.max_rows)
        for key in self.key_iterator(d):
            if tuple(d[key].shape[1:]) != tuple(source.shape[1:]):
                raise UsageError(
                    f"Thumbnaild: {key!r} has shape {tuple(d[key].shape[1:])}, its image {tuple(source.shape[1:])}"
                )
            d[f"{key}{THUMBNAIL_SUFFIX}"] = self.thumbnail(d[key], step=step)
        d[THUMBNAIL_STEP_KEY] = step
        return d
