"""Resampling to the model's pixel spacing (docs/preprocessing.md, "Pixel spacing")."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.config import KeysCollection, NdarrayOrTensor
from monai.data import MetaTensor
from monai.data.meta_obj import get_track_meta
from monai.networks.layers import gaussian_1d
from monai.transforms import InvertibleTransform, MapTransform, Resize
from monai.utils import TraceKeys, convert_to_tensor, ensure_tuple_rep

from scripts.data.errors import DEFAULT_MAX_PIXELS, check_resampled_pixels
from scripts.data.geometry import (
    as_pixel_spacing,
    as_spacing_range,
    format_spacing,
    spacing_in_range,
    usable_spacing,
)
from scripts.transforms.mammo.array import OPENING_SCALE_KEY, _filename, first_channel
from scripts.transforms.mammo.breast import file_breast_box
from scripts.transforms.mammo.dictionary import _check_shapes, _source

from ...errors import UsageError

SPACING_KEY = "spacing"
SPACING_SOURCE_KEY = "spacing_source"
SPACING_USED_KEY = "spacing_used"
MODEL_SPACING_KEY = "model_spacing"
SPACING_ASSUMED_KEY = "spacing_assumed"  # estimated or assumed, not stated
RESAMPLED_SHAPE_KEY = "resampled_shape"
SPACING_IGNORED_KEY = "spacing_ignored"  # the file's, outside spacing_range
SPACING_RANGE_KEY = "spacing_range"
SPACING_FALLBACKS = ("fit_breast", "model")
# interpolation modes that blend neighbours: they take align_corners and anti-aliasing, the nearest ones neither
_BLENDING_MODES = ("linear", "bilinear", "bicubic", "trilinear", "area")
# the estimate keeps this share of the window free (the crop's rounding), and this many px a side (the blur)
_FIT_MARGIN = 0.02
_EDGE_SPREAD = 3


def spacing_of(img: Any) -> tuple[float, float] | None:
    """The ``(row, col)`` mm of ``meta["spacing"]``; None when absent or invalid."""
    meta = img.meta if isinstance(img, MetaTensor) else {}
    return usable_spacing(meta.get(SPACING_KEY))


def gaussian_smooth(img: torch.Tensor, sigma: Sequence[float]) -> torch.Tensor:
    """MONAI's ``GaussianSmooth(sigma)`` on a ``(C, *spatial)`` tensor, ten times faster (sums of shifted views)."""
    out = img
    for axis, s in enumerate(sigma):
        kernel = gaussian_1d(torch.as_tensor(float(s)), truncated=4.0, approx="erf").tolist()
        if len(kernel) == 1 or kernel.count(0.0) == len(kernel) - 1:  # a lone 1: the identity
            continue
        dim = axis + 1
        radius, n = (len(kernel) - 1) // 2, out.shape[dim]
        padded = torch.nn.functional.pad(out, [0, 0] * (out.ndim - dim - 1) + [radius, radius])
        acc = torch.zeros_like(out)
        for i, weight in enumerate(kernel):
            if weight != 0.0:
                acc.add_(padded.narrow(dim, i, n), alpha=weight)
        out = acc
    return out


def _resize(img: torch.Tensor, size: Sequence[int], mode: str, anti_aliasing: bool) -> torch.Tensor:
    """``img`` ``(C, H, W)`` resized by MONAI's ``Resize``, untraced, with ``Resize``'s anti-aliasing sigma."""
    blending = mode in _BLENDING_MODES
    size = tuple(int(s) for s in size)
    if anti_aliasing and blending and any(s < n for s, n in zip(size, img.shape[1:])):
        # Resize's own sigma, to the bit: float32 factors, (factor - 1) / 2, none below 0
        factors = torch.div(torch.Tensor(list(img.shape[1:])), torch.Tensor(size))
        sigma = torch.maximum(torch.zeros(factors.shape), (factors - 1) / 2).tolist()
        img = gaussian_smooth(convert_to_tensor(img, dtype=torch.float32, track_meta=get_track_meta()), sigma)
    resizer = Resize(
        spatial_size=size, mode=mode, align_corners=False if blending and mode != "area" else None, anti_aliasing=False
    )
    with resizer.trace_transform(False):
        return resizer(img)


def fit_breast_spacing(
    image: NdarrayOrTensor,
    model_spacing: Sequence[float],
    window: Sequence[int],
    iterations: int = 100,
    buffer: int = 50,
) -> tuple[float, float]:
    """The input spacing at which the breast of ``image`` fits the model's window: the fallback estimate.

    Args:
        image: ``(C, H, W)`` or ``(H, W)``, as loaded.
        model_spacing: the model's (row, col) mm.
        window: the model's window (rows, cols).
        iterations, buffer: the crop's (iterations in the file's pixels, buffer in model pixels).

    Returns:
        ``(model_row * f, model_col * f)``, ``f`` the largest factor that fits the crop in the window with 2 % and the
        anti-aliasing blur's 6 px to spare.

    Raises:
        ValueError: when no pixel is > 0.
    """
    (top, bottom, left, right), _ = file_breast_box(first_channel(image), iterations)
    box_h, box_w = bottom - top, right - left
    win_h, win_w = (float(v) * (1.0 - _FIT_MARGIN) for v in window)
    # a buffer that leaves less than a quarter of the window (tiny windows) counts as a quarter
    room_h = max(win_h - 2 * int(buffer) - 2 * _EDGE_SPREAD, win_h / 4)
    room_w = max(win_w - int(buffer) - 2 * _EDGE_SPREAD, win_w / 4)
    factor = min(room_h / box_h, room_w / box_w)
    row_mm, col_mm = as_pixel_spacing(model_spacing)
    return row_mm * factor, col_mm * factor


def _range_text(spacing_range: Sequence[float]) -> str:
    return f"{spacing_range[0]:g}-{spacing_range[1]:g} mm"


def _stated_spacing(value: Any, name: str, spacing_range: Sequence[float] | None = None) -> tuple[float, float] | None:
    """A user-stated spacing parsed, or None; bad or outside ``spacing_range`` is a ValueError naming ``name``."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    try:
        spacing = as_pixel_spacing(value)
    except ValueError as err:
        raise UsageError(f"{name}: {err}") from None
    if spacing is not None and spacing_range is not None and not spacing_in_range(spacing, spacing_range):
        raise UsageError(
            f"{name}: {format_spacing(spacing)} mm is outside the pixel sizes of mammograms, "
            f"{_range_text(spacing_range)} (the spacing_range option widens it)"
        )
    return spacing


class ResampleToSpacing(InvertibleTransform):
    """Resample a ``(C, H, W)`` image to ``pixel_spacing`` from its spacing as the module docstring chooses it.

    The output's metadata records ``spacing_used``, ``spacing_source``, ``model_spacing``, ``spacing_assumed``,
    ``spacing_ignored``, ``spacing_range`` and ``opening_scale``.

    Args:
        pixel_spacing: the model's ``(row, col)`` mm (a number: isotropic); None: nothing is resampled.
        mode: ``Resize`` mode: ``"bilinear"`` for images, ``"nearest-exact"`` for masks.
        anti_aliasing: Gaussian smoothing before shrinking, as MONAI's ``Resize``.
        rtol: spacings this close count as equal (a PNG states whole pixels per metre).
        input_spacing: (row, col) mm of inputs whose file states none.
        fallback: ``"fit_breast"`` or ``"model"``, for an image whose spacing nobody states.
        window: the model's window (rows, cols), which ``"fit_breast"`` needs.
        iterations, buffer: the crop's settings, for ``"fit_breast"``.
        spacing_range: plausible ``(low, high)`` mm; a file's spacing outside it is ignored, a stated one refused.
        max_pixels: the most pixels an image is resampled to; None: no cap.
    """

    backend = Resize.backend

    def __init__(
        self,
        pixel_spacing: float | Sequence[float] | None = None,
        mode: str = "bilinear",
        anti_aliasing: bool = True,
        rtol: float = 1e-3,
        input_spacing: float | Sequence[float] | None = None,
        fallback: str = "fit_breast",
        window: Sequence[int] | None = None,
        iterations: int = 100,
        buffer: int = 50,
        spacing_range: Sequence[float] | None = None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
    ) -> None:
        self.pixel_spacing = as_pixel_spacing(pixel_spacing)
        self.mode = str(mode)
        self.anti_aliasing = bool(anti_aliasing)
        self.rtol = float(rtol)
        self.spacing_range = as_spacing_range(spacing_range)
        # the range matters only where a spacing is used: when the model's is known
        checked = self.spacing_range if self.pixel_spacing is not None else None
        self.input_spacing = _stated_spacing(input_spacing, "input_spacing", checked)
        self.fallback = str(fallback)
        if self.fallback not in SPACING_FALLBACKS:
            raise UsageError(f"fallback must be one of {SPACING_FALLBACKS}, got {fallback!r}")
        self.window = None if window is None else tuple(int(v) for v in window)
        if self.window is not None and (len(self.window) != 2 or min(self.window) < 1):
            raise UsageError(f"window must be (rows, cols) of positive ints, got {window!r}")
        self.iterations = int(iterations)
        self.buffer = int(buffer)
        self.max_pixels = None if max_pixels is None else int(max_pixels)

    def file_spacing(self, img: NdarrayOrTensor) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
        """``(usable, ignored)``: the file's spacing when usable, and when outside ``spacing_range``."""
        from_file = spacing_of(img)
        if from_file is None or self.pixel_spacing is None or spacing_in_range(from_file, self.spacing_range):
            return from_file, None
        return None, from_file

    def choose(self, img: NdarrayOrTensor, stated: Any = None) -> tuple[tuple[float, float] | None, str]:
        """The input spacing and its source for ``img``; ``stated`` is a datalist's ``pixel_spacing``."""
        meta = img.meta if isinstance(img, MetaTensor) else {}
        name = _filename(img, "<image>")
        from_file, _ = self.file_spacing(img)
        if from_file is not None:
            return from_file, str(meta.get(SPACING_SOURCE_KEY, "") or "file")
        checked = self.spacing_range if self.pixel_spacing is not None else None
        from_item = _stated_spacing(stated, f"{name}: the datalist's pixel_spacing", checked)
        if from_item is not None:
            return from_item, "datalist"
        if self.input_spacing is not None:
            return self.input_spacing, "option"
        if self.pixel_spacing is None:
            return None, "unknown"
        if self.fallback == "model":
            return self.pixel_spacing, "model"
        if self.window is None:
            raise UsageError(
                f"ResampleToSpacing: {name} states no pixel spacing and fallback='fit_breast' has no window to fit the "
                "breast into: give window=(rows, cols) (the model's image_size), or fallback='model'"
            )
        try:
            estimate = fit_breast_spacing(img, self.pixel_spacing, self.window, self.iterations, self.buffer)
        except ValueError as err:
            raise UsageError(f"ResampleToSpacing: {name}: {err} to estimate the pixel spacing") from err
        return estimate, "fit_breast"

    def plan(self, img: NdarrayOrTensor, spacing: Sequence[float] | None = None, stated: Any = None) -> dict[str, Any]:
        """What to do with ``img`` (``size``, ``spacing``, ``source``, ...); ``spacing`` overrides every source."""
        shape = tuple(int(s) for s in img.shape[1:])
        if len(shape) != 2:
            raise UsageError(f"ResampleToSpacing expects a (C, H, W) image, got shape {tuple(img.shape)}")
        ignored = None
        if spacing is not None:
            source_spacing, source = as_pixel_spacing(spacing), "given"
        else:
            ignored = self.file_spacing(img)[1]
            source_spacing, source = self.choose(img, stated)
        out = {"size": shape, "resample": False, "spacing": source_spacing, "source": source, "ignored": ignored}
        out["assumed"] = source in ("fit_breast", "model")
        out["opening_scale"] = 1.0
        target = self.pixel_spacing
        if target is None or source_spacing is None:
            return out
        if all(abs(s / t - 1.0) <= self.rtol for s, t in zip(source_spacing, target)):
            return out  # not resampled: the file's pixels are the model's
        # the crop's opening counts the file's pixels (model pixels would cut an MLO's axilla away); one factor,
        # the geometric mean where the file's pixels are not square
        row, col = (float(s / t) for s, t in zip(source_spacing, target))
        out["opening_scale"] = row if row == col else float(np.sqrt(row * col))
        size = tuple(max(1, int(np.floor(n * s / t + 0.5))) for n, s, t in zip(shape, source_spacing, target))
        why = f"from {format_spacing(source_spacing)} mm ({source}) to the model's {format_spacing(target)} mm"
        check_resampled_pixels(_filename(img, "<image>"), shape, size, why, self.max_pixels)
        return {**out, "size": size, "resample": size != shape}

    def __call__(
        self,
        img: NdarrayOrTensor,
        spacing: Sequence[float] | None = None,
        plan: Mapping[str, Any] | None = None,
        mode: str | None = None,
        stated: Any = None,
    ) -> torch.Tensor:
        """``img``: ``(C, H, W)``; returns ``(C, H', W')`` at the model's spacing (float32 for blending modes).

        ``plan`` is another image's (the dictionary version's source), ``mode`` overrides ``self.mode`` and ``stated``
        is the datalist's ``pixel_spacing``.
        """
        plan = self.plan(img, spacing, stated) if plan is None else plan
        mode = self.mode if mode is None else str(mode)
        img = convert_to_tensor(img, track_meta=get_track_meta())
        out = img
        if plan["resample"]:
            out = _resize(img, plan["size"], mode, self.anti_aliasing)
            if mode not in _BLENDING_MODES:
                out = out.to(img.dtype)  # nearest copies values: masks stay bytes if they were
        extra = {
            "mode": mode,
            "anti_aliasing": self.anti_aliasing,
            "resampled": bool(plan["resample"]),
        }
        if isinstance(img, MetaTensor):  # restored by the inverse
            extra["spacing_source"] = str(img.meta.get(SPACING_SOURCE_KEY, ""))
        self.push_transform(out, orig_size=tuple(int(s) for s in img.shape[1:]), extra_info=extra)
        if isinstance(out, MetaTensor):
            nan = (np.nan, np.nan)
            used = plan["spacing"] if plan["spacing"] is not None else nan
            out.meta[SPACING_USED_KEY] = np.asarray(used, dtype=np.float64)
            out.meta[SPACING_SOURCE_KEY] = str(plan["source"])
            out.meta[MODEL_SPACING_KEY] = np.asarray(self.pixel_spacing or nan, dtype=np.float64)
            out.meta[SPACING_ASSUMED_KEY] = bool(plan["assumed"])
            out.meta[RESAMPLED_SHAPE_KEY] = np.asarray(out.shape[1:], dtype=np.int64)
            out.meta[SPACING_IGNORED_KEY] = np.asarray(plan.get("ignored") or nan, dtype=np.float64)
            out.meta[SPACING_RANGE_KEY] = np.asarray(self.spacing_range, dtype=np.float64)
            out.meta[OPENING_SCALE_KEY] = float(plan.get("opening_scale", 1.0))
        return out

    def inverse(self, data: torch.Tensor) -> torch.Tensor:
        transform = self.pop_transform(data)
        info = transform[TraceKeys.EXTRA_INFO]
        if info["resampled"]:
            # Invertd(nearest_interp=True) rewrites "mode" to "nearest"
            data = _resize(data, transform[TraceKeys.ORIG_SIZE], info["mode"], info["anti_aliasing"])
        if isinstance(data, MetaTensor):
            for key in _RECORDED_KEYS:
                data.meta.pop(key, None)
            if "spacing_source" in info:
                data.meta[SPACING_SOURCE_KEY] = info["spacing_source"]
        return data


_RECORDED_KEYS = (
    MODEL_SPACING_KEY,
    SPACING_ASSUMED_KEY,
    SPACING_USED_KEY,
    RESAMPLED_SHAPE_KEY,
    SPACING_IGNORED_KEY,
    SPACING_RANGE_KEY,
    OPENING_SCALE_KEY,
)


class ResampleToSpacingd(MapTransform, InvertibleTransform):
    """Dictionary :class:`ResampleToSpacing`: ``source_key``'s spacing and size apply to every key.

    Args:
        keys: image and mask keys (a mask of another size is a ValueError).
        pixel_spacing: the model's ``(row, col)`` mm; None: identity.
        source_key: the image whose spacing decides.
        mode: one ``Resize`` mode, or one per key.
        spacing_key: the data field with a per-image spacing (None or ``""``: not stated).
        anti_aliasing, rtol, input_spacing, fallback, window, iterations, buffer, spacing_range, max_pixels: as in
            :class:`ResampleToSpacing`.
    """

    backend = ResampleToSpacing.backend

    def __init__(
        self,
        keys: KeysCollection,
        pixel_spacing: float | Sequence[float] | None = None,
        source_key: str = "image",
        mode: str | Sequence[str] = "bilinear",
        anti_aliasing: bool = True,
        rtol: float = 1e-3,
        allow_missing_keys: bool = False,
        spacing_key: str | None = "pixel_spacing",
        input_spacing: float | Sequence[float] | None = None,
        fallback: str = "fit_breast",
        window: Sequence[int] | None = None,
        iterations: int = 100,
        buffer: int = 50,
        spacing_range: Sequence[float] | None = None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.resampler = ResampleToSpacing(
            pixel_spacing=pixel_spacing,
            anti_aliasing=anti_aliasing,
            rtol=rtol,
            input_spacing=input_spacing,
            fallback=fallback,
            window=window,
            iterations=iterations,
            buffer=buffer,
            spacing_range=spacing_range,
            max_pixels=max_pixels,
        )
        self.source_key = source_key
        self.spacing_key = spacing_key
        self.mode = tuple(str(m) for m in ensure_tuple_rep(mode, len(self.keys)))

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict[Hashable, torch.Tensor]:
        d = dict(data)
        src = _source(self, d, self.source_key)
        _check_shapes(self, d, src)
        stated = d.get(self.spacing_key) if self.spacing_key else None
        if isinstance(stated, str) and not stated.strip():
            stated = None
        plan = self.resampler.plan(d[src], stated=stated)
        for key, mode in self.key_iterator(d, self.mode):
            d[key] = self.resampler(d[key], plan=plan, mode=mode)
        return d

    def inverse(self, data: Mapping[Hashable, torch.Tensor]) -> dict[Hashable, torch.Tensor]:
        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = self.resampler.inverse(d[key])  # the mode comes from the key's own record
        return d
