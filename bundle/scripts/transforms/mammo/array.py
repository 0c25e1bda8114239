"""Mammogram preprocessing as MONAI array transforms on channel-first ``(C, H, W)`` images.

The geometric transforms decide from the first channel, apply to every channel and record themselves in
``applied_operations``, so that ``Invertd`` maps a saliency map back onto the original image.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from monai.config import NdarrayOrTensor
from monai.data import MetaTensor
from monai.data.meta_obj import get_track_meta
from monai.transforms import CropForeground, Flip, InvertibleTransform, Randomizable, Transform
from monai.utils import TraceKeys, TransformBackends, convert_to_numpy, convert_to_tensor

from scripts.transforms.mammo.breast import (
    WindowPlacement,
    best_center_window,
    breast_crop,
    chest_wall_side,
    shifted_window_start,
)

from ...errors import UsageError

FLIPPED_KEY = "flipped_to_right"
# model pixels per file pixel of a resampled image: the mask openings count the file's pixels
OPENING_SCALE_KEY = "opening_scale"
CROP_ITERATIONS_KEY = "crop_iterations"
CROP_SOURCE_KEY, WINDOW_SOURCE_KEY = "crop_source", "window_source"
HORIZONTAL_FLIP_VALUES = ("NO", "YES")


def first_channel(img: NdarrayOrTensor) -> np.ndarray:
    """The first channel of a ``(C, H, W)`` (or ``(H, W)``) image as a 2-D numpy array."""
    arr = convert_to_numpy(img.as_tensor() if isinstance(img, MetaTensor) else img)
    if arr.ndim == 3:
        return arr[0]
    if arr.ndim == 2:
        return arr
    raise UsageError(f"expected a (C, H, W) or (H, W) image, got shape {tuple(arr.shape)}")


def _meta(img: Any) -> dict:
    return img.meta if isinstance(img, MetaTensor) else {}


def opening_iterations(img: Any, iterations: int) -> int:
    """``iterations`` scaled by ``meta["opening_scale"]`` (rounded), or unchanged when the image has none."""
    scale = _meta(img).get(OPENING_SCALE_KEY)
    try:
        scale = float(np.asarray(convert_to_numpy(scale, wrap_sequence=True), dtype=np.float64).reshape(-1)[0])
    except (TypeError, ValueError, IndexError):
        return int(iterations)
    if not np.isfinite(scale) or scale <= 0 or scale == 1.0:
        return int(iterations)
    return int(round(int(iterations) * scale))


def _filename(img: Any, default: str = "<array>") -> str:
    meta = _meta(img)
    return str(meta.get("filename_or_obj") or meta.get("filename") or default)


def normalize_laterality(value: Any) -> str | None:
    """``"L"`` / ``"R"`` from L, left, R, right (any case); None otherwise."""
    text = ("" if value is None else str(value)).strip().upper()
    if text in ("L", "LEFT"):
        return "L"
    if text in ("R", "RIGHT"):
        return "R"
    return None


def _check_horizontal_flip(value: Any) -> str:
    text = str(value).strip().upper()
    if text not in HORIZONTAL_FLIP_VALUES:
        raise UsageError(f"horizontal_flip must be 'NO' or 'YES', got {value!r}")
    return text


class FlipToRight(InvertibleTransform):
    """Mirror the columns so that the breast faces right (chest wall at the left edge).

    The decision: an explicit ``flip``; else the laterality (argument or ``meta["laterality"]``: R views are mirrored,
    or L views when ``horizontal_flip="YES"``); else, or when the laterality was guessed from the pixels or the file
    name (``meta["laterality_source"]``), the chest wall side seen in the image. ``meta["flipped_to_right"]`` records
    the outcome for :class:`BestCenterWindow`.

    Args:
        horizontal_flip: ``"NO"`` (left breasts already face right) or ``"YES"``.
    """

    backend = Flip.backend

    def __init__(self, horizontal_flip: str = "NO") -> None:
        self.horizontal_flip = _check_horizontal_flip(horizontal_flip)
        self.flipper = Flip(spatial_axis=1)
        self._do_transform = False

    def should_flip(self, img: NdarrayOrTensor, laterality: Any = None, horizontal_flip: Any = None) -> bool:
        """Whether ``img`` ``(C, H, W)`` needs mirroring, by the class's rules."""
        lat = normalize_laterality(laterality)
        meta = _meta(img)
        # a guessed laterality says nothing of how the picture is stored: the chest wall decides then
        if lat is None and str(meta.get("laterality_source", "")) not in ("image", "filename"):
            lat = normalize_laterality(meta.get("laterality"))
        if lat is None:
            return chest_wall_side(first_channel(img)) == "right"
        hflip = self.horizontal_flip if horizontal_flip in (None, "") else _check_horizontal_flip(horizontal_flip)
        return lat == ("R" if hflip == "NO" else "L")

    def __call__(
        self,
        img: NdarrayOrTensor,
        laterality: Any = None,
        horizontal_flip: Any = None,
        flip: bool | None = None,
    ) -> torch.Tensor:
        """``img``: ``(C, H, W)``; returns the (possibly mirrored) image."""
        self._do_transform = bool(self.should_flip(img, laterality, horizontal_flip) if flip is None else flip)
        out = self.flipper(img) if self._do_transform else img
        out = convert_to_tensor(out, track_meta=get_track_meta())
        self.push_transform(out, replace=True)
        if isinstance(out, MetaTensor):
            out.meta[FLIPPED_KEY] = self._do_transform
        return out

    def inverse(self, data: torch.Tensor) -> torch.Tensor:
        transform = self.pop_transform(data)
        if isinstance(data, MetaTensor):
            data.meta.pop(FLIPPED_KEY, None)
        if not transform[TraceKeys.DO_TRANSFORM]:
            return data
        data.applied_operations.append(transform[TraceKeys.EXTRA_INFO])  # type: ignore[union-attr]
        return self.flipper.inverse(data)


class CropBreast(CropForeground):
    """The authors' breast crop (:func:`~scripts.transforms.mammo.breast.breast_crop`) as an invertible MONAI crop.

    Writes ``meta["crop_box"]`` ``[top, left, bottom, right]``, ``meta["crop_iterations"]`` and ``meta["crop_source"]``.

    Args:
        iterations: erosion / dilation iterations, in the file's pixels (:func:`opening_iterations`).
        buffer: pixels added at the three sides.
        chest_wall: ``"left"`` (after :class:`FlipToRight`), ``"right"`` or ``"auto"``.
        method: ``"fast"`` (distance transforms, identical result) or ``"exact"`` (scipy iterations).
    """

    def __init__(
        self,
        iterations: int = 100,
        buffer: int = 50,
        chest_wall: str = "left",
        method: str = "fast",
        lazy: bool = False,
    ) -> None:
        super().__init__(allow_smaller=True, lazy=lazy)
        self.iterations = int(iterations)
        self.buffer = int(buffer)
        self.chest_wall = chest_wall
        self.method = method

    def compute_bounding_box(self, img: NdarrayOrTensor) -> tuple[np.ndarray, np.ndarray]:
        """``(start, end)`` of the crop in ``img``'s spatial coordinates, end-exclusive."""
        start, end, _ = self.breast_box(img)
        return start, end

    def breast_box(self, img: NdarrayOrTensor) -> tuple[np.ndarray, np.ndarray, str]:
        """``(start, end, source)``, ``source`` ``"authors"`` or ``"tissue"``."""
        try:
            (start, end), source = breast_crop(
                first_channel(img),
                opening_iterations(img, self.iterations),
                self.buffer,
                self.chest_wall,
                self.method,
                name=_filename(img),
            )
        except ValueError as err:
            raise UsageError(f"CropBreast: {_filename(img)}: {err}") from err
        return np.asarray(start), np.asarray(end), source

    def crop_pad(self, img, box_start, box_end, mode=None, lazy=False, source="authors", **pad_kwargs):  # noqa: D102
        out = super().crop_pad(img, box_start, box_end, mode, lazy=lazy, **pad_kwargs)
        if isinstance(out, MetaTensor):
            out.meta["crop_box"] = np.concatenate([box_start, box_end]).astype(np.int64)
            out.meta[CROP_ITERATIONS_KEY] = self.iterations
            out.meta[CROP_SOURCE_KEY] = source
        return out

    def __call__(self, img: torch.Tensor, mode: str | None = None, lazy: bool | None = None, **pad_kwargs):  # type: ignore[override]
        """``img``: ``(C, H, W)``; returns ``(C, bottom - top, right - left)``."""
        start, end, source = self.breast_box(img)
        lazy = self.lazy if lazy is None else lazy
        return self.crop_pad(img, start, end, mode, lazy=lazy, source=source, **pad_kwargs)


class BestCenterWindow(CropForeground):
    """The authors' fixed-size window around the "best centre" of a breast facing right, zero-padded, invertible.

    Writes ``meta["best_center"]``, ``meta["window_start"]`` (negative: padding), ``meta["window_size"]`` and
    ``meta["window_source"]``.

    Args:
        window: ``(rows, cols)``.
        reference_compatible: reproduce the released code's 1-2 px conventions
            (:func:`~scripts.transforms.mammo.breast.best_center_window`).
        iterations, method: the breast-mask opening, as :class:`CropBreast`'s.
        default_view: window rule for unknown views; None makes them an error.
    """

    def __init__(
        self,
        window: Sequence[int] = (2944, 1920),
        reference_compatible: bool = True,
        iterations: int = 100,
        method: str = "fast",
        default_view: str | None = "CC",
        lazy: bool = False,
    ) -> None:
        super().__init__(allow_smaller=True, lazy=lazy)
        if len(window) != 2 or min(int(s) for s in window) < 1:
            raise UsageError(f"window must be (rows, cols) of positive ints, got {window!r}")
        self.window = (int(window[0]), int(window[1]))
        self.reference_compatible = reference_compatible
        self.iterations = int(iterations)
        self.method = method
        self.default_view = default_view

    def placement(self, img: NdarrayOrTensor, view: str | None = None, mirrored: bool | None = None) -> WindowPlacement:
        """Where the window goes on ``img`` ``(C, H, W)``."""
        meta = _meta(img)
        view = view or str(meta.get("view", "") or "") or None
        if mirrored is None:
            mirrored = bool(meta.get(FLIPPED_KEY, False))
        try:
            return best_center_window(
                first_channel(img),
                view,
                self.window,
                mirrored=mirrored,
                reference_compatible=self.reference_compatible,
                iterations=opening_iterations(img, self.iterations),
                method=self.method,
                default_view=self.default_view,
                name=_filename(img),
            )
        except ValueError as err:
            raise UsageError(f"BestCenterWindow: {_filename(img)}: {err}") from err

    def compute_bounding_box(self, img: NdarrayOrTensor) -> tuple[np.ndarray, np.ndarray]:
        p = self.placement(img)
        return np.asarray(p.start), np.asarray(p.end)

    def apply(
        self,
        img: torch.Tensor,
        placement: WindowPlacement,
        start: Sequence[int] | None = None,
        mode: str | None = None,
        lazy: bool | None = None,
    ) -> torch.Tensor:
        """Cut the window at ``start`` (default ``placement.start``) from ``img`` ``(C, H, W)``."""
        start_ = np.asarray(placement.start if start is None else start, dtype=np.int64)
        end_ = start_ + np.asarray(placement.size, dtype=np.int64)
        out = self.crop_pad(img, start_, end_, mode, lazy=self.lazy if lazy is None else lazy)
        if isinstance(out, MetaTensor):
            out.meta["best_center"] = np.asarray(placement.best_center, dtype=np.int64)
            out.meta["window_start"] = start_
            out.meta["window_size"] = np.asarray(placement.size, dtype=np.int64)
            out.meta[WINDOW_SOURCE_KEY] = placement.source
        return out

    def __call__(  # type: ignore[override]
        self,
        img: torch.Tensor,
        view: str | None = None,
        mirrored: bool | None = None,
        mode: str | None = None,
        lazy: bool | None = None,
    ) -> torch.Tensor:
        """``img``: ``(C, H, W)``; returns ``(C, *window)``."""
        return self.apply(img, self.placement(img, view, mirrored), mode=mode, lazy=lazy)


def parse_max_shift(max_shift: Sequence[int] | int) -> tuple[int, int]:
    shift = (int(max_shift), int(max_shift)) if np.isscalar(max_shift) else tuple(int(s) for s in max_shift)
    if len(shift) != 2 or min(shift) < 0:
        raise UsageError(f"max_shift must be one or two non-negative ints, got {max_shift!r}")
    return shift


def draw_window_offset(rng: np.random.RandomState, max_shift: tuple[int, int]) -> tuple[int, int]:
    return int(rng.randint(-max_shift[0], max_shift[0] + 1)), int(rng.randint(-max_shift[1], max_shift[1] + 1))


class RandBestCenterWindow(BestCenterWindow, Randomizable):
    """:class:`BestCenterWindow` moved by a uniform random offset of up to ``max_shift`` (rows, cols).

    The window stays inside the union of the image and the unshifted window, so a shift adds no padding.
    """

    def __init__(self, max_shift: Sequence[int] | int = (32, 32), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_shift = parse_max_shift(max_shift)
        self._offset = (0, 0)

    def randomize(self, data: Any = None) -> None:
        self._offset = draw_window_offset(self.R, self.max_shift)

    def __call__(  # type: ignore[override]
        self,
        img: torch.Tensor,
        view: str | None = None,
        mirrored: bool | None = None,
        randomize: bool = True,
        mode: str | None = None,
        lazy: bool | None = None,
    ) -> torch.Tensor:
        if randomize:
            self.randomize()
        p = self.placement(img, view, mirrored)
        start = shifted_window_start(p, tuple(first_channel(img).shape), self._offset)
        return self.apply(img, p, start, mode=mode, lazy=lazy)


def window_shift_range(
    placement: WindowPlacement, image_shape: tuple[int, int], max_shift: tuple[int, int]
) -> np.ndarray:
    """Per axis, the ``[low, high]`` offsets :func:`shifted_window_start` can reach within ``max_shift``.

    Returns:
        ``(2, 2)`` int64, rows for (rows, cols); clamping a drawn offset into it moves the window as
        ``shifted_window_start`` does.
    """
    out = np.zeros((2, 2), dtype=np.int64)
    for axis, (start, size, extent, shift) in enumerate(zip(placement.start, placement.size, image_shape, max_shift)):
        low = min(start, 0) - start
        high = max(start + size, extent) - size - start
        out[axis] = (max(-shift, low), min(shift, high))
    return out


class BestCenterRegion(BestCenterWindow):
    """The best-centre window grown by ``max_shift`` on every side, zero-padded: what a cache can hold.

    :class:`RandWindowShift` then cuts, per step, the pixels :class:`RandBestCenterWindow` would for the same offset,
    clamped into ``meta["window_shift_range"]``.

    Args:
        max_shift: the largest window shift (rows, cols).
        kwargs: :class:`BestCenterWindow`'s arguments.
    """

    def __init__(self, max_shift: Sequence[int] | int = (32, 32), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_shift = parse_max_shift(max_shift)

    def apply_region(
        self, img: torch.Tensor, placement: WindowPlacement, image_shape: tuple[int, int]
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Cut the region of ``placement`` from ``img``; returns ``(region, shift_range)``."""
        shift = np.asarray(self.max_shift, dtype=np.int64)
        start = np.asarray(placement.start, dtype=np.int64) - shift
        end = start + np.asarray(placement.size, dtype=np.int64) + 2 * shift
        shift_range = window_shift_range(placement, image_shape, self.max_shift)
        out = self.crop_pad(img, start, end, lazy=False)
        if isinstance(out, MetaTensor):
            out.meta["best_center"] = np.asarray(placement.best_center, dtype=np.int64)
            out.meta["window_start"] = np.asarray(placement.start, dtype=np.int64)
            out.meta["window_size"] = np.asarray(placement.size, dtype=np.int64)
            out.meta["window_shift_range"] = shift_range
        return out, shift_range

    def __call__(  # type: ignore[override]
        self, img: torch.Tensor, view: str | None = None, mirrored: bool | None = None, lazy: bool | None = None
    ) -> torch.Tensor:
        """``img``: ``(C, H, W)``; returns ``(C, rows + 2 max_shift_r, cols + 2 max_shift_c)``."""
        region, _ = self.apply_region(img, self.placement(img, view, mirrored), tuple(first_channel(img).shape))
        return region


class RandWindowShift(Randomizable, Transform):
    """Cut the model's window from a :class:`BestCenterRegion` at a random offset (tensor slicing, any device).

    The offset is drawn as :class:`RandBestCenterWindow` draws it, then clamped into the region's shift range.

    Args:
        window: ``(rows, cols)`` of the model input.
        max_shift: the region's margin (rows, cols).
    """

    backend = [TransformBackends.TORCH]

    def __init__(self, window: Sequence[int] = (2944, 1920), max_shift: Sequence[int] | int = (32, 32)) -> None:
        if len(window) != 2 or min(int(s) for s in window) < 1:
            raise UsageError(f"window must be (rows, cols) of positive ints, got {window!r}")
        self.window = (int(window[0]), int(window[1]))
        self.max_shift = parse_max_shift(max_shift)
        self._offset = (0, 0)

    def randomize(self, data: Any = None) -> None:
        self._offset = draw_window_offset(self.R, self.max_shift)

    def crop(self, region: torch.Tensor, shift_range: Any, offset: Sequence[int]) -> torch.Tensor:
        """The window at ``offset`` (clamped into ``shift_range``) of ``region`` ``(C, Hr, Wr)``."""
        expected = tuple(w + 2 * s for w, s in zip(self.window, self.max_shift))
        if tuple(region.shape[-2:]) != expected:
            raise UsageError(
                f"RandWindowShift: a region of spatial shape {tuple(region.shape[-2:])} is not the window "
                f"{self.window} grown by max_shift {self.max_shift} ({expected}); the cache and this transform disagree"
            )
        bounds = np.asarray(convert_to_numpy(shift_range), dtype=np.int64).reshape(2, 2)
        top, left = (s + int(np.clip(o, lo, hi)) for s, o, (lo, hi) in zip(self.max_shift, offset, bounds))
        return region[..., top : top + self.window[0], left : left + self.window[1]]

    def __call__(self, region: torch.Tensor, shift_range: Any = None, randomize: bool = True) -> torch.Tensor:
        """``shift_range`` defaults to ``region.meta["window_shift_range"]``; returns ``(C, rows, cols)``."""
        if randomize:
            self.randomize()
        if shift_range is None:
            shift_range = _meta(region).get("window_shift_range")
            if shift_range is None:
                raise UsageError("RandWindowShift needs the region's window_shift_range (argument or meta)")
        return self.crop(region, shift_range, self._offset)


class QuantizeToUint16(Transform):
    """Store intensities as uint16: a quarter of float32's bytes in a cache and on the way to the device.

    Integer images in [0, 65535] are kept exactly; others map linearly (meta ``intensity_scale``, ``intensity_offset``).
    """

    backend = [TransformBackends.TORCH]

    def __call__(self, img: NdarrayOrTensor) -> torch.Tensor:
        t = convert_to_tensor(img, track_meta=get_track_meta())
        plain = (t.as_tensor() if isinstance(t, MetaTensor) else t).detach()
        lowest, high = (float(v) for v in torch.aminmax(plain)) if plain.numel() else (0.0, 0.0)
        low = min(lowest, 0.0)
        # within [0, 65535] the cast is defined, and it is exact when the values are integers (the round trip says so)
        out = plain.to(torch.uint16) if low >= 0 and high <= 65535 else None
        if out is not None and torch.equal(out.to(plain.dtype), plain):
            scale, offset = 1.0, 0.0
        else:
            scale = (high - low) / 65535 if high > low else 1.0
            offset = low
            out = ((plain.to(torch.float64) - low) / scale).round_().clamp_(0, 65535).to(torch.uint16)
        if isinstance(t, MetaTensor):
            out = MetaTensor(out, meta=dict(t.meta), applied_operations=list(t.applied_operations))
            out.meta["intensity_scale"] = scale
            out.meta["intensity_offset"] = offset
        return out


class StandardizeImage(Transform):
    """Per-image standardisation ``(x - mean) / max(std, eps)`` in float64, returned as float32.

    MONAI's ``NormalizeIntensity`` has no such floor on a tiny std, which the authors' preprocessing has.
    """

    backend = [TransformBackends.TORCH]

    def __init__(self, eps: float = 1e-5) -> None:
        self.eps = float(eps)

    def __call__(self, img: NdarrayOrTensor) -> NdarrayOrTensor:
        t = convert_to_tensor(img, track_meta=get_track_meta())
        plain = t.as_tensor() if isinstance(t, MetaTensor) else t
        x64 = plain.detach().to(torch.float64)
        mean = x64.mean()
        std = x64.std(unbiased=False).clamp_min(self.eps)
        return ((t.to(torch.float64) - mean) / std).to(torch.float32)
