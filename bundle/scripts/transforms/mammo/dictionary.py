"""Dictionary versions of the mammogram transforms: one decision on ``source_key``, applied to every key."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch
from monai.config import KeysCollection
from monai.data import MetaTensor
from monai.transforms import InvertibleTransform, MapTransform, Randomizable
from monai.transforms.croppad.dictionary import Cropd

from scripts.transforms.mammo.array import (
    BestCenterRegion,
    BestCenterWindow,
    CropBreast,
    FlipToRight,
    QuantizeToUint16,
    RandWindowShift,
    StandardizeImage,
    draw_window_offset,
    first_channel,
    parse_max_shift,
)
from scripts.transforms.mammo.breast import shifted_window_start

from ...errors import UsageError


def _spatial_shape(x: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in x.shape[1:])


def _name(x: Any, key: Hashable) -> str:
    meta = x.meta if isinstance(x, MetaTensor) else {}
    return str(meta.get("filename_or_obj") or meta.get("filename") or f"<{key}>")


def _check_shapes(transform: MapTransform, d: Mapping, source_key: Hashable) -> None:
    """Raise when a key's spatial shape differs from the source's: a mask of another size would be cut wrongly."""
    ref = _spatial_shape(d[source_key])
    for key in transform.key_iterator(d):
        shape = _spatial_shape(d[key])
        if shape != ref:
            raise UsageError(
                f"{type(transform).__name__}: {_name(d[key], key)} ({key!r}) has spatial shape {shape} but "
                f"{_name(d[source_key], source_key)} ({source_key!r}) has {ref}; masks must match their image"
            )


def _source(transform: MapTransform, d: Mapping, source_key: Hashable | None) -> Hashable:
    key = source_key if source_key is not None else transform.first_key(d)
    if isinstance(key, list) or key not in d:  # first_key gives [] when no key is present
        raise KeyError(f"{type(transform).__name__}: source key {source_key!r} is not in the data ({list(d)})")
    return key


class DropEmptyKeysd(MapTransform):
    """Remove ``keys`` whose value is None or ``""``, so that optional masks may be empty datalist fields."""

    def __init__(self, keys: KeysCollection) -> None:
        super().__init__(keys, allow_missing_keys=True)

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.keys:
            if key in d and (d[key] is None or (isinstance(d[key], str) and not d[key].strip())):
                del d[key]
        return d


class FlipToRightd(MapTransform, InvertibleTransform):
    """Dictionary :class:`~scripts.transforms.mammo.array.FlipToRight`: one decision, applied to all keys.

    Args:
        keys: image and mask keys.
        laterality_key: data field with L / R; else the source image's metadata.
        horizontal_flip: ``"NO"`` / ``"YES"``; the data field ``horizontal_flip_key`` overrides it per item.
        source_key: the image that decides when laterality is unknown (default: the first key present).
        facing_key: data field saying which way the stored breast faces (``"right"`` / ``"left"``); it decides alone.
    """

    def __init__(
        self,
        keys: KeysCollection,
        laterality_key: str | None = "laterality",
        horizontal_flip: str = "NO",
        horizontal_flip_key: str | None = "horizontal_flip",
        source_key: str | None = None,
        allow_missing_keys: bool = False,
        facing_key: str | None = "facing",
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.flipper = FlipToRight(horizontal_flip=horizontal_flip)
        self.facing_key = facing_key
        self.laterality_key = laterality_key
        self.horizontal_flip_key = horizontal_flip_key
        self.source_key = source_key

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict[Hashable, torch.Tensor]:
        d = dict(data)
        src = _source(self, d, self.source_key)
        laterality = d.get(self.laterality_key) if self.laterality_key else None
        hflip = d.get(self.horizontal_flip_key) if self.horizontal_flip_key else None
        facing = str(d.get(self.facing_key) or "").lower() if self.facing_key else ""
        if facing in ("right", "left"):
            do_flip = facing == "left"
        elif facing:
            raise UsageError(f"FlipToRightd: {self.facing_key!r} must be 'right' or 'left', got {facing!r}")
        else:
            do_flip = self.flipper.should_flip(d[src], laterality, hflip)
        for key in self.key_iterator(d):
            d[key] = self.flipper(d[key], flip=do_flip)
        return d

    def inverse(self, data: Mapping[Hashable, torch.Tensor]) -> dict[Hashable, torch.Tensor]:
        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = self.flipper.inverse(d[key])
        return d


class CropBreastd(Cropd):
    """Dictionary :class:`~scripts.transforms.mammo.array.CropBreast`: the box of ``source_key`` crops every key.

    Args:
        keys: image and mask keys.
        source_key: the image the box is computed on.
        iterations, buffer, chest_wall, method: as in ``CropBreast``.
    """

    def __init__(
        self,
        keys: KeysCollection,
        source_key: str = "image",
        iterations: int = 100,
        buffer: int = 50,
        chest_wall: str = "left",
        method: str = "fast",
        allow_missing_keys: bool = False,
    ) -> None:
        cropper = CropBreast(iterations=iterations, buffer=buffer, chest_wall=chest_wall, method=method)
        super().__init__(keys, cropper=cropper, allow_missing_keys=allow_missing_keys)
        self.source_key = source_key

    @property
    def requires_current_data(self) -> bool:
        return True

    def __call__(self, data: Mapping[Hashable, torch.Tensor], lazy: bool | None = None) -> dict[Hashable, torch.Tensor]:
        d = dict(data)
        src = _source(self, d, self.source_key)
        _check_shapes(self, d, src)
        start, end, source = self.cropper.breast_box(d[src])
        for key in self.key_iterator(d):
            d[key] = self.cropper.crop_pad(d[key], start, end, lazy=False, source=source)
        return d


class BestCenterWindowd(Cropd):
    """Dictionary :class:`~scripts.transforms.mammo.array.BestCenterWindow`: cut from all keys.

    Args:
        keys: image and mask keys.
        source_key: the image that places the window.
        view_key: data field with the view; else the source image's ``meta["view"]``.
        window, reference_compatible, iterations, method, default_view: as in ``BestCenterWindow``.
    """

    def __init__(
        self,
        keys: KeysCollection,
        source_key: str = "image",
        view_key: str | None = "view",
        window: Sequence[int] = (2944, 1920),
        reference_compatible: bool = True,
        iterations: int = 100,
        method: str = "fast",
        default_view: str | None = "CC",
        allow_missing_keys: bool = False,
    ) -> None:
        cropper = BestCenterWindow(
            window=window,
            reference_compatible=reference_compatible,
            iterations=iterations,
            method=method,
            default_view=default_view,
        )
        super().__init__(keys, cropper=cropper, allow_missing_keys=allow_missing_keys)
        self.source_key = source_key
        self.view_key = view_key

    @property
    def requires_current_data(self) -> bool:
        return True

    def _placement(self, d: Mapping[Hashable, Any]):
        src = _source(self, d, self.source_key)
        _check_shapes(self, d, src)
        view = d.get(self.view_key) if self.view_key else None
        return src, self.cropper.placement(d[src], view=str(view) if view else None)

    def __call__(self, data: Mapping[Hashable, torch.Tensor], lazy: bool | None = None) -> dict[Hashable, torch.Tensor]:
        d = dict(data)
        _, placement = self._placement(d)
        for key in self.key_iterator(d):
            d[key] = self.cropper.apply(d[key], placement, lazy=False)
        return d


class RandBestCenterWindowd(BestCenterWindowd, Randomizable):
    """:class:`BestCenterWindowd` shifted by one random offset (up to ``max_shift`` px) shared by all keys."""

    def __init__(self, keys: KeysCollection, max_shift: Sequence[int] | int = (32, 32), **kwargs: Any) -> None:
        super().__init__(keys, **kwargs)
        self.max_shift = parse_max_shift(max_shift)
        self._offset = (0, 0)

    def randomize(self, data: Any = None) -> None:
        self._offset = draw_window_offset(self.R, self.max_shift)

    def __call__(self, data: Mapping[Hashable, torch.Tensor], lazy: bool | None = None) -> dict[Hashable, torch.Tensor]:
        d = dict(data)
        self.randomize()
        src, placement = self._placement(d)
        start = shifted_window_start(placement, tuple(first_channel(d[src]).shape), self._offset)
        for key in self.key_iterator(d):
            d[key] = self.cropper.apply(d[key], placement, start=start, lazy=False)
        return d


class BestCenterRegiond(BestCenterWindowd):
    """Dictionary :class:`~scripts.transforms.mammo.array.BestCenterRegion`.

    The deterministic half of :class:`RandBestCenterWindowd` for a cache; :class:`RandWindowShiftd` is the other.

    Args:
        keys: image and mask keys.
        max_shift: the largest window shift (rows, cols).
        shift_range_key: where the ``(2, 2)`` offset range goes.
        kwargs: :class:`BestCenterWindowd`'s arguments.
    """

    def __init__(
        self,
        keys: KeysCollection,
        max_shift: Sequence[int] | int = (32, 32),
        shift_range_key: str = "window_shift_range",
        **kwargs: Any,
    ) -> None:
        super().__init__(keys, **kwargs)
        window = self.cropper
        self.cropper = BestCenterRegion(
            max_shift=max_shift,
            window=window.window,
            reference_compatible=window.reference_compatible,
            iterations=window.iterations,
            method=window.method,
            default_view=window.default_view,
        )
        self.shift_range_key = shift_range_key

    def __call__(self, data: Mapping[Hashable, torch.Tensor], lazy: bool | None = None) -> dict[Hashable, torch.Tensor]:
        d = dict(data)
        src, placement = self._placement(d)
        image_shape = tuple(first_channel(d[src]).shape)
        shift_range = None
        for key in self.key_iterator(d):
            d[key], shift_range = self.cropper.apply_region(d[key], placement, image_shape)
        d[self.shift_range_key] = torch.as_tensor(shift_range, dtype=torch.int64)
        return d


class RandWindowShiftd(Randomizable, MapTransform):
    """Dictionary :class:`~scripts.transforms.mammo.array.RandWindowShift`: one offset cuts every key's region.

    Args:
        keys: keys holding :class:`BestCenterRegiond` regions.
        window: ``(rows, cols)`` of the model input.
        max_shift: the regions' margin.
        shift_range_key: where ``BestCenterRegiond`` put the offset range.
    """

    backend = RandWindowShift.backend

    def __init__(
        self,
        keys: KeysCollection,
        window: Sequence[int] = (2944, 1920),
        max_shift: Sequence[int] | int = (32, 32),
        shift_range_key: str = "window_shift_range",
        allow_missing_keys: bool = False,
    ) -> None:
        MapTransform.__init__(self, keys, allow_missing_keys)
        self.cropper = RandWindowShift(window=window, max_shift=max_shift)
        self.shift_range_key = shift_range_key
        self._offset = (0, 0)

    def randomize(self, data: Any = None) -> None:
        self._offset = draw_window_offset(self.R, self.cropper.max_shift)

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict[Hashable, torch.Tensor]:
        d = dict(data)
        if self.shift_range_key not in d:
            raise UsageError(f"RandWindowShiftd: no {self.shift_range_key!r} in the data (run BestCenterRegiond first)")
        self.randomize()
        for key in self.key_iterator(d):
            d[key] = self.cropper.crop(d[key], d[self.shift_range_key], self._offset)
        return d


class QuantizeToUint16d(MapTransform):
    """Dictionary :class:`~scripts.transforms.mammo.array.QuantizeToUint16` (images, not masks)."""

    backend = QuantizeToUint16.backend

    def __init__(self, keys: KeysCollection, allow_missing_keys: bool = False) -> None:
        super().__init__(keys, allow_missing_keys)
        self.quantizer = QuantizeToUint16()

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict[Hashable, torch.Tensor]:
        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = self.quantizer(d[key])
        return d


class StandardizeImaged(MapTransform):
    """Dictionary :class:`~scripts.transforms.mammo.array.StandardizeImage` (images, not masks)."""

    backend = StandardizeImage.backend

    def __init__(self, keys: KeysCollection, eps: float = 1e-5, allow_missing_keys: bool = False) -> None:
        super().__init__(keys, allow_missing_keys)
        self.standardizer = StandardizeImage(eps=eps)

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict[Hashable, torch.Tensor]:
        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = self.standardizer(d[key])
        return d
