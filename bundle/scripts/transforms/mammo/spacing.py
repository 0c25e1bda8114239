"""Resampling to the model's pixel spacing (docs/preprocessing.md, "Pixel spacing").

The rest of the preprocessing only crops and pads, so a model sees lesions at the pixel scale it was trained on only
when its input has that scale. :class:`ResampleToSpacing` / :class:`ResampleToSpacingd` bring an image (and its
masks) from the spacing its file states to the model's, right after loading, so that every later step (the crop's
iterations and buffer, the window) counts model pixels:

- model spacing ``None`` (unknown, e.g. the authors' weights): identity, as before this step existed;
- input spacing known (``meta["spacing"]`` from the reader: DICOM PixelSpacing / ImagerPixelSpacing, the NIfTI / ITK
  affine, NRRD, PNG pHYs): resized by MONAI's ``Resize`` to ``round(size * input spacing / model spacing)``,
  bilinear with Gaussian anti-aliasing when shrinking for images, nearest-exact for masks;
- input spacing unknown (NaN, e.g. a PNG without pHYs): not resampled, the model's spacing is assumed;
  ``meta["spacing_assumed"]`` says so, so that inference can report it.

The metadata keeps the reader's ``meta["spacing"]`` (what the file states: the maps written on the file's grid carry
it) and adds ``meta["model_spacing"]`` (the model's, NaN when unknown) and ``meta["spacing_assumed"]``, on every item
so that batches collate; MONAI's ``Resize`` scales the affine, which thus describes the resampled grid.

Both are invertible: the inverse resizes back to the input's size (anti-aliased when that shrinks, as the forward
step is), so ``Invertd`` puts maps computed on the model's grid onto the file's pixel grid.
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
from monai.utils import TraceKeys, convert_to_numpy, convert_to_tensor, ensure_tuple_rep

from scripts.transforms.mammo.dictionary import _check_shapes, _source

__all__ = [
    "MODEL_SPACING_KEY",
    "SPACING_ASSUMED_KEY",
    "SPACING_KEY",
    "ResampleToSpacing",
    "ResampleToSpacingd",
    "as_pixel_spacing",
    "format_spacing",
    "gaussian_smooth",
    "spacing_of",
]

SPACING_KEY = "spacing"  # meta: the file's (row, col) mm, NaN when unknown (MammogramReader)
MODEL_SPACING_KEY = "model_spacing"  # meta: the model's (row, col) mm the image was brought to, NaN when unknown
SPACING_ASSUMED_KEY = "spacing_assumed"  # meta: the file's spacing was unknown and the model's was assumed
# interpolation modes that blend neighbours: they take align_corners and anti-aliasing, the nearest ones neither
_BLENDING_MODES = ("linear", "bilinear", "bicubic", "trilinear", "area")


def as_pixel_spacing(value: Any) -> tuple[float, float] | None:
    """``(row, col)`` mm from a number (isotropic) or two numbers; None for None / ``"null"`` / ``"none"`` / ``""``
    (unknown). Raises ``ValueError`` for anything else, e.g. zero, negative, a bool, one or three values. The one
    parser of a pixel spacing: the model setting (``GLAM(pixel_spacing=...)``) and this module's transforms use it."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    scalar = isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_))
    values = [value, value] if scalar else value
    try:
        if isinstance(values, (str, bool, np.bool_)):
            raise TypeError
        flat = np.asarray(convert_to_numpy(values, wrap_sequence=True), dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"pixel_spacing must be a number or (row, col) in mm, or None, got {value!r}") from None
    if flat.size != 2 or not (np.isfinite(flat).all() and (flat > 0).all()):
        raise ValueError(f"pixel_spacing must be one or two positive finite numbers (mm), or None, got {value!r}")
    return float(flat[0]), float(flat[1])


def spacing_of(img: Any) -> tuple[float, float] | None:
    """The ``(row, col)`` mm that ``img``'s metadata states (``meta["spacing"]``); None when absent, NaN or invalid."""
    meta = img.meta if isinstance(img, MetaTensor) else {}
    value = meta.get(SPACING_KEY)
    if value is None:
        return None
    flat = np.asarray(convert_to_numpy(value, wrap_sequence=True), dtype=np.float64).reshape(-1)
    return (float(flat[0]), float(flat[1])) if flat.size == 2 and np.isfinite(flat).all() and (flat > 0).all() else None


def format_spacing(spacing: Sequence[float]) -> str:
    """``"0.4"`` for isotropic, ``"0.4 x 0.5"`` (row x col) otherwise (for messages, in mm)."""
    row, col = (float(s) for s in spacing)
    return f"{row:g}" if np.isclose(row, col, rtol=1e-6) else f"{row:g} x {col:g}"


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


class ResampleToSpacing(InvertibleTransform):
    """Resample a ``(C, H, W)`` image from the pixel spacing its metadata states to ``pixel_spacing``.

    See the module docstring for the three cases. The output's ``meta["model_spacing"]`` is ``pixel_spacing`` (NaN
    when None) and ``meta["spacing_assumed"]`` says whether the input's spacing was unknown while the model's is
    known; ``meta["spacing"]`` (the file's) is left as it is. The inverse restores the size and drops both keys.

    Args:
        pixel_spacing: the model's ``(row, col)`` mm (a number: isotropic); None: unknown, nothing is resampled.
        mode: ``Resize`` mode: ``"bilinear"`` for images, ``"nearest-exact"`` for masks (``"area"`` also works).
        anti_aliasing: Gaussian smoothing before shrinking (MONAI's ``Resize``, sigma ``(factor - 1) / 2``); ignored
            by the nearest modes.
        rtol: spacings within this relative difference count as equal (no resampling): a PNG states its spacing in
            whole pixels per metre, so 1.2 mm comes back as 1.2005 mm.
    """

    backend = Resize.backend

    def __init__(
        self,
        pixel_spacing: float | Sequence[float] | None = None,
        mode: str = "bilinear",
        anti_aliasing: bool = True,
        rtol: float = 1e-3,
    ) -> None:
        self.pixel_spacing = as_pixel_spacing(pixel_spacing)
        self.mode = str(mode)
        self.anti_aliasing = bool(anti_aliasing)
        self.rtol = float(rtol)

    def plan(self, img: NdarrayOrTensor, spacing: Sequence[float] | None = None) -> dict[str, Any]:
        """What to do with ``img`` (``(C, H, W)``; ``spacing`` overrides its metadata): ``{"size": output (H, W),
        "resample": bool, "assumed": bool}``."""
        shape = tuple(int(s) for s in img.shape[1:])
        if len(shape) != 2:
            raise ValueError(f"ResampleToSpacing expects a (C, H, W) image, got shape {tuple(img.shape)}")
        source = as_pixel_spacing(spacing) if spacing is not None else spacing_of(img)
        target = self.pixel_spacing
        if target is None or source is None:  # unknown input and a known model: the model's spacing is assumed
            return {"size": shape, "resample": False, "assumed": target is not None}
        if all(abs(s / t - 1.0) <= self.rtol for s, t in zip(source, target)):
            return {"size": shape, "resample": False, "assumed": False}
        size = tuple(max(1, int(np.floor(n * s / t + 0.5))) for n, s, t in zip(shape, source, target))
        return {"size": size, "resample": size != shape, "assumed": False}

    def __call__(
        self,
        img: NdarrayOrTensor,
        spacing: Sequence[float] | None = None,
        plan: Mapping[str, Any] | None = None,
        mode: str | None = None,
    ) -> torch.Tensor:
        """``img``: ``(C, H, W)``; returns ``(C, H', W')`` at the model's spacing, or ``img`` itself when nothing is
        resampled. ``plan``: :meth:`plan` of another image (the dictionary version's source image); ``mode``
        overrides ``self.mode``. Resampled outputs are float32 (nearest modes keep the input's dtype)."""
        plan = self.plan(img, spacing) if plan is None else plan
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
        self.push_transform(out, orig_size=tuple(int(s) for s in img.shape[1:]), extra_info=extra)
        if isinstance(out, MetaTensor):
            out.meta[MODEL_SPACING_KEY] = np.asarray(self.pixel_spacing or (np.nan, np.nan), dtype=np.float64)
            out.meta[SPACING_ASSUMED_KEY] = bool(plan["assumed"])
        return out

    def inverse(self, data: torch.Tensor) -> torch.Tensor:
        transform = self.pop_transform(data)
        info = transform[TraceKeys.EXTRA_INFO]
        if info["resampled"]:
            # Invertd(nearest_interp=True) rewrites "mode" to "nearest"
            data = _resize(data, transform[TraceKeys.ORIG_SIZE], info["mode"], info["anti_aliasing"])
        if isinstance(data, MetaTensor):
            data.meta.pop(MODEL_SPACING_KEY, None)
            data.meta.pop(SPACING_ASSUMED_KEY, None)
        return data


class ResampleToSpacingd(MapTransform, InvertibleTransform):
    """Dictionary :class:`ResampleToSpacing`: the spacing and the output size come from ``source_key`` (the image)
    and apply to every key, so masks keep matching their image (a mask of another size is a ``ValueError`` naming
    the file, the mask's own spacing is not used).

    Args:
        keys: image and mask keys.
        pixel_spacing: the model's ``(row, col)`` mm (a number: isotropic); None: identity.
        source_key: the image whose spacing decides.
        mode: one ``Resize`` mode, or one per key: ``"bilinear"`` for images, ``"nearest-exact"`` for masks (0/1
            stay 0/1).
        anti_aliasing, rtol: as in ``ResampleToSpacing``.
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
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.resampler = ResampleToSpacing(pixel_spacing=pixel_spacing, anti_aliasing=anti_aliasing, rtol=rtol)
        self.source_key = source_key
        self.mode = tuple(str(m) for m in ensure_tuple_rep(mode, len(self.keys)))

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict[Hashable, torch.Tensor]:
        d = dict(data)
        src = _source(self, d, self.source_key)
        _check_shapes(self, d, src)
        plan = self.resampler.plan(d[src])
        for key, mode in self.key_iterator(d, self.mode):
            d[key] = self.resampler(d[key], plan=plan, mode=mode)
        return d

    def inverse(self, data: Mapping[Hashable, torch.Tensor]) -> dict[Hashable, torch.Tensor]:
        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = self.resampler.inverse(d[key])  # the mode comes from the key's own record
        return d
