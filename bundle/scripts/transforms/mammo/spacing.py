"""Resampling to the model's pixel spacing (docs/preprocessing.md, "Pixel spacing").

The rest of the preprocessing only crops and pads, so a model sees lesions at the pixel scale it was trained on only
when its input has that scale. :class:`ResampleToSpacing` / :class:`ResampleToSpacingd` bring an image (and its
masks) to the model's spacing right after loading, so that every later step (the crop's iterations and buffer, the
window) counts model pixels. One policy, the same in training, evaluation, inference and the MONAI Label app; the
input's spacing is, in this order:

1. what the file states (``meta["spacing"]`` from the reader: DICOM PixelSpacing / ImagerPixelSpacing, the NIfTI /
   ITK affine, NRRD, PNG pHYs; its ``meta["spacing_source"]`` names which);
2. what the user states for this image: a datalist item's ``pixel_spacing`` (a number or ``[row, col]`` mm), source
   ``"datalist"``;
3. what the user states for every image whose file states none: the ``input_spacing`` option, source ``"option"``;
4. else an estimate (``fallback="fit_breast"``, source ``"fit_breast"``): the spacing at which the breast's bounding
   box (found as :class:`~scripts.transforms.CropBreast` finds it, plus its buffer) fits the model's window, keeping
   the aspect ratio (:func:`fit_breast_spacing`), so that the model sees the whole breast, smaller than it would at
   the true spacing, rather than a few per cent of it at full resolution. ``fallback="model"`` keeps the behaviour of
   earlier versions (the model's spacing assumed, nothing resampled, source ``"model"``): an explicit opt-in for
   images known to be at the model's spacing.

When the model's spacing is unknown (``pixel_spacing`` None, e.g. the authors' weights) nothing is resampled, as
before, and the input's spacing is still recorded when it is known (else NaN, source ``"unknown"``).

Resampling is MONAI's ``Resize`` to ``round(size * input spacing / model spacing)``, bilinear with Gaussian
anti-aliasing when shrinking for images, nearest-exact for masks. The output's metadata records what was used, on
every item so that batches collate: ``meta["spacing_used"]`` (the input's (row, col) mm, NaN when unknown),
``meta["spacing_source"]`` (as used: the reader's source, ``"datalist"``, ``"option"``, ``"fit_breast"``,
``"model"`` or ``"unknown"``), ``meta["model_spacing"]`` (NaN when unknown) and ``meta["spacing_assumed"]`` (True
when the input's spacing was not stated by the file or the user: estimated or assumed). ``meta["spacing"]`` (the
file's) is left as it is; MONAI's ``Resize`` scales the affine, which thus describes the resampled grid.

Both are invertible: the inverse resizes back to the input's size (anti-aliased when that shrinks, as the forward
step is) and restores the metadata, so ``Invertd`` puts maps computed on the model's grid onto the file's grid.
"""

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
    SPACING_RANGE_MM,
    as_pixel_spacing,
    as_spacing_range,
    format_spacing,
    spacing_in_range,
    usable_spacing,
)
from scripts.transforms.mammo.array import OPENING_SCALE_KEY, first_channel
from scripts.transforms.mammo.breast import file_breast_box
from scripts.transforms.mammo.dictionary import _check_shapes, _source

from ...errors import UsageError

__all__ = [
    "MODEL_SPACING_KEY",
    "OPENING_SCALE_KEY",
    "RESAMPLED_SHAPE_KEY",
    "SPACING_ASSUMED_KEY",
    "SPACING_FALLBACKS",
    "SPACING_IGNORED_KEY",
    "SPACING_KEY",
    "SPACING_RANGE_KEY",
    "SPACING_RANGE_MM",
    "SPACING_SOURCE_KEY",
    "SPACING_USED_KEY",
    "ResampleToSpacing",
    "ResampleToSpacingd",
    "as_pixel_spacing",
    "fit_breast_spacing",
    "format_spacing",
    "gaussian_smooth",
    "spacing_of",
]

SPACING_KEY = "spacing"  # meta: the file's (row, col) mm, NaN when unknown (MammogramReader)
SPACING_SOURCE_KEY = "spacing_source"  # meta: where the spacing used comes from (see the module docstring)
SPACING_USED_KEY = "spacing_used"  # meta: the input's (row, col) mm the resampling used, NaN when unknown
MODEL_SPACING_KEY = "model_spacing"  # meta: the model's (row, col) mm the image was brought to, NaN when unknown
SPACING_ASSUMED_KEY = "spacing_assumed"  # meta: the input's spacing was estimated or assumed, not stated
RESAMPLED_SHAPE_KEY = "resampled_shape"  # meta: (H, W) after the resampling (the input's when not resampled)
SPACING_IGNORED_KEY = "spacing_ignored"  # meta: the file's (row, col) mm outside spacing_range (not used), else NaN
SPACING_RANGE_KEY = "spacing_range"  # meta: the plausible (low, high) mm the file's spacing was checked against
#: what happens to an image whose spacing nobody states (the model's being known)
SPACING_FALLBACKS = ("fit_breast", "model")
# interpolation modes that blend neighbours: they take align_corners and anti-aliasing, the nearest ones neither
_BLENDING_MODES = ("linear", "bilinear", "bicubic", "trilinear", "area")
# the estimate keeps this share of the window free, for the crop's rounding after the resampling
_FIT_MARGIN = 0.02
# ... and this many pixels on each side, where the anti-aliasing blur carries the breast's edge
_EDGE_SPREAD = 3


def spacing_of(img: Any) -> tuple[float, float] | None:
    """The ``(row, col)`` mm that ``img``'s metadata states (``meta["spacing"]``); None when absent, NaN or invalid."""
    meta = img.meta if isinstance(img, MetaTensor) else {}
    return usable_spacing(meta.get(SPACING_KEY))


def gaussian_smooth(img: torch.Tensor, sigma: Sequence[float]) -> torch.Tensor:
    """MONAI's ``GaussianSmooth(sigma)`` on a ``(C, *spatial)`` float tensor: the same kernels (``gaussian_1d``, erf,
    truncated at 4 sigma; sigma 0 is the identity), zero padding, one axis after the other, computed as a weighted
    sum of shifted views instead of convolutions. On a 2944x1920 mammogram with sigma 1.5 (a 4x shrink) it takes
    about 40 ms on one CPU thread where MONAI's single-channel convolutions take about 420 ms; the numbers agree to
    float32 rounding (tests/transforms/test_gaussian_smooth.py). Metadata of a ``MetaTensor`` is kept."""
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
    """``img`` (C, H, W) resized to ``size`` by MONAI's ``Resize`` (which also scales the affine), untraced: the
    caller records the step as its own. The anti-aliasing before a shrink is MONAI's (a Gaussian of sigma
    ``(factor - 1) / 2`` per axis, as ``Resize`` computes it), run by :func:`gaussian_smooth`."""
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
    """The input spacing (row, col) mm at which the breast of ``image`` fits the model's window: the fallback for an
    image whose spacing nobody states.

    The breast's box is the bounding box of the authors' breast mask of the file (:func:`file_breast_mask`: the opened
    mask of pixels > 0, ``iterations`` counted in the file's pixels, found on a copy of every k-th pixel, about 1024 px
    along the longer side), or of the largest tissue region where that mask misses the breast or takes a film's
    background for it, as the crop decides (:func:`file_breast_box`). The crop and the window of every resampled image
    open their masks with the same ``iterations`` file pixels (:class:`ResampleToSpacing` records the scale,
    ``meta["opening_scale"]``), so the crop holds what this box holds, an MLO's pectoral muscle and axilla included.
    Resampling multiplies the size by ``f = input spacing / model spacing``, so the crop is ``box_h * f + 2 buffer``
    rows (buffer at the top and the bottom) and ``box_w * f + buffer`` columns (buffer on the side away from the chest
    wall); ``f`` is the largest factor, the same on both axes (the aspect ratio is kept), that makes both fit the window
    with 2 % to spare: ``f = min((0.98 window_h - 2 buffer - 6) / box_h, (0.98 window_w - buffer - 6) / box_w)`` (6 px
    for the anti-aliasing blur, which carries the breast's edge about 2 px out). The window rule then has nothing to
    choose: a crop no larger than the window lies wholly inside it.

    Args:
        image: ``(C, H, W)`` or ``(H, W)``, as loaded (the chest wall on either side).
        model_spacing: the model's (row, col) mm.
        window: the model's window (rows, cols).
        iterations, buffer: the crop's (``crop_iterations`` in the file's pixels, ``crop_buffer`` in model pixels).

    Returns:
        ``(model_row * f, model_col * f)``, e.g. about 0.08 mm for a 4432 x 2864 mammogram whose breast fills it and a
        model of 0.4 mm with a 736 x 480 window. Raises ``ValueError`` for an image without a pixel > 0.
    """
    (top, bottom, left, right), _ = file_breast_box(first_channel(image), iterations)
    box_h, box_w = bottom - top, right - left
    win_h, win_w = (float(v) * (1.0 - _FIT_MARGIN) for v in window)
    # a buffer that leaves less than a quarter of the window (tiny test windows) counts as a quarter
    # minus 3 px per side: the anti-aliasing Gaussian (truncated at 4 sigma) spreads the breast's edge by about 2 px
    room_h = max(win_h - 2 * int(buffer) - 2 * _EDGE_SPREAD, win_h / 4)
    room_w = max(win_w - int(buffer) - 2 * _EDGE_SPREAD, win_w / 4)
    factor = min(room_h / box_h, room_w / box_w)
    row_mm, col_mm = as_pixel_spacing(model_spacing)
    return row_mm * factor, col_mm * factor


def _range_text(spacing_range: Sequence[float]) -> str:
    return f"{spacing_range[0]:g}-{spacing_range[1]:g} mm"


def _stated_spacing(value: Any, name: str, spacing_range: Sequence[float] | None = None) -> tuple[float, float] | None:
    """A user-stated spacing (a datalist's ``pixel_spacing``, the ``input_spacing`` option) parsed, or None; a bad
    value, or one outside ``spacing_range`` (None: not checked), is a ``ValueError`` naming where it came from."""
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
    """Resample a ``(C, H, W)`` image from its pixel spacing to ``pixel_spacing``, the spacing chosen as the module
    docstring says (the file's, the datalist's, ``input_spacing``, else the fallback).

    Sizes are checked before they are used: a file's spacing outside ``spacing_range`` is not used (the next source
    decides, and ``meta["spacing_ignored"]`` records it for the image's note), a datalist's or ``input_spacing``
    outside it is a ``ValueError`` naming it, and a resampled size above ``max_pixels`` is refused (a
    :class:`~scripts.data.errors.MammogramReadError` naming the file) before anything is resampled.

    The output's metadata records the choice (``spacing_used``, ``spacing_source``, ``model_spacing``,
    ``spacing_assumed``, ``spacing_ignored``, ``spacing_range``) and the scale of the crop's mask opening
    (``opening_scale``: model pixels per file pixel, so that the crop opens the breast mask by ``iterations`` of the
    file's pixels, as the authors do and as the estimate does; 1 where nothing is resampled or a spacing is unknown);
    ``meta["spacing"]`` (the file's) is left as it is. The inverse restores the size and the metadata as they were.

    Args:
        pixel_spacing: the model's ``(row, col)`` mm (a number: isotropic); None: unknown, nothing is resampled.
        mode: ``Resize`` mode: ``"bilinear"`` for images, ``"nearest-exact"`` for masks (``"area"`` also works).
        anti_aliasing: Gaussian smoothing before shrinking (MONAI's ``Resize``, sigma ``(factor - 1) / 2``); ignored
            by the nearest modes.
        rtol: spacings within this relative difference count as equal (no resampling): a PNG states its spacing in
            whole pixels per metre, so 1.2 mm comes back as 1.2005 mm.
        input_spacing: (row, col) mm of the inputs whose file states none (the inference option of that name);
            None: not stated.
        fallback: for an image whose spacing nobody states: ``"fit_breast"`` (estimate it so that the breast fits
            ``window``, :func:`fit_breast_spacing`) or ``"model"`` (assume the model's: nothing resampled).
        window: the model's window (rows, cols); ``"fit_breast"`` needs it for an image whose spacing nobody states
            (a ``ValueError`` naming the file without it).
        iterations, buffer: the crop's settings (``crop_iterations``, ``crop_buffer``), for ``"fit_breast"``.
        spacing_range: the plausible ``(low, high)`` mm of an input's spacing (None:
            :data:`~scripts.data.geometry.SPACING_RANGE_MM`, 0.02-1 mm); checked when the model's spacing is known.
        max_pixels: the most pixels an image is resampled to (the decoded-size cap by default); None: no cap.
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
        """``(usable, ignored)``: the spacing ``img``'s file states when it may be used, else None; the one it
        states outside ``spacing_range`` (the model's spacing being known) as ``ignored``, else None."""
        from_file = spacing_of(img)
        if from_file is None or self.pixel_spacing is None or spacing_in_range(from_file, self.spacing_range):
            return from_file, None
        return None, from_file

    def choose(self, img: NdarrayOrTensor, stated: Any = None) -> tuple[tuple[float, float] | None, str]:
        """The input spacing and its source for ``img`` (``(C, H, W)``): the file's (when inside ``spacing_range``),
        ``stated`` (a datalist's ``pixel_spacing``), ``input_spacing``, else the fallback (``(None, "unknown")``
        when nothing is known and the model's spacing is unknown too)."""
        meta = img.meta if isinstance(img, MetaTensor) else {}
        name = str(meta.get("filename_or_obj") or meta.get("filename") or "<image>")
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
        """What to do with ``img`` (``(C, H, W)``; ``spacing`` overrides every source, ``stated`` is a datalist's
        ``pixel_spacing``): ``{"size": output (H, W), "resample": bool, "assumed": bool, "spacing": the input's
        (row, col) mm or None, "source": str, "ignored": the file's spacing left unused or None, "opening_scale":
        float}``. A size above ``max_pixels`` is refused here, before anything is resampled."""
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
        # the crop's mask opening counts the file's pixels, as the authors crop their full-resolution images, whatever
        # the spacing's source: a count of model pixels would open a 0.07 mm MLO by 40 mm at 0.4 mm and cut its
        # axilla away. One factor (the erosion is the same along both axes): the geometric mean where the file's
        # pixels are not square; an estimate keeps the aspect ratio, so its two factors are one
        row, col = (float(s / t) for s, t in zip(source_spacing, target))
        out["opening_scale"] = row if row == col else float(np.sqrt(row * col))
        size = tuple(max(1, int(np.floor(n * s / t + 0.5))) for n, s, t in zip(shape, source_spacing, target))
        meta = img.meta if isinstance(img, MetaTensor) else {}
        why = f"from {format_spacing(source_spacing)} mm ({source}) to the model's {format_spacing(target)} mm"
        check_resampled_pixels(
            str(meta.get("filename_or_obj") or meta.get("filename") or "<image>"), shape, size, why, self.max_pixels
        )
        return {**out, "size": size, "resample": size != shape}

    def __call__(
        self,
        img: NdarrayOrTensor,
        spacing: Sequence[float] | None = None,
        plan: Mapping[str, Any] | None = None,
        mode: str | None = None,
        stated: Any = None,
    ) -> torch.Tensor:
        """``img``: ``(C, H, W)``; returns ``(C, H', W')`` at the model's spacing, or ``img`` itself when nothing is
        resampled. ``plan``: :meth:`plan` of another image (the dictionary version's source image); ``mode``
        overrides ``self.mode``; ``stated``: the datalist's ``pixel_spacing`` of this image. Resampled outputs are
        float32 (nearest modes keep the input's dtype)."""
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


# what the forward step adds to the metadata (the inverse takes it away)
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
    """Dictionary :class:`ResampleToSpacing`: the spacing and the output size come from ``source_key`` (the image)
    and apply to every key, so masks keep matching their image (a mask of another size is a ``ValueError`` naming
    the file, the mask's own spacing is not used). A datalist item's ``pixel_spacing`` (``spacing_key``) states the
    image's spacing when its file does not.

    Args:
        keys: image and mask keys.
        pixel_spacing: the model's ``(row, col)`` mm (a number: isotropic); None: identity.
        source_key: the image whose spacing decides.
        mode: one ``Resize`` mode, or one per key: ``"bilinear"`` for images, ``"nearest-exact"`` for masks (0/1
            stay 0/1).
        spacing_key: the data field with a per-image spacing (a number or ``[row, col]`` mm; None or ``""``: not
            stated).
        anti_aliasing, rtol, input_spacing, fallback, window, iterations, buffer, spacing_range, max_pixels: as in
            ``ResampleToSpacing``.
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
