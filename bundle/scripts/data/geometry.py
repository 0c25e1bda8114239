"""A picture's geometry as reading, checking and the transforms need it: the pixel spacing rules and the chest wall's
side. It sits below the transforms, which load images with the readers, so that both can use it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from monai.utils import convert_to_numpy

from ..errors import UsageError

#: the pixel sizes (mm, both axes) a mammogram can plausibly have: full-field detectors are 0.05-0.1 mm, digitised
#: films 0.03-0.2 mm; 1 mm still admits a mammogram downsampled for research (docs/preprocessing.md)
SPACING_RANGE_MM = (0.02, 1.0)
#: a pixel size a datalist or a CSV states is below this (mm): catches micrometres or centimetres typed as mm
STATED_SPACING_LIMIT_MM = 10.0


def as_2d(image: Any, name: str = "image") -> np.ndarray:
    """``image`` as an ``(H, W)`` array (a ``(1, H, W)`` picture loses its channel).

    Raises:
        ValueError: naming ``name``, for any other shape.
    """
    arr = np.asarray(image)
    if arr.ndim == 3 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 2:
        raise UsageError(f"{name} must be 2-D (H, W) or (1, H, W), got shape {arr.shape}")
    return arr


def chest_wall_side(image: Any) -> str:
    """``"left"`` or ``"right"``: the half of the image with more tissue (ties go left).

    A breast is widest at the chest wall, so that half holds more tissue whatever the view.
    """
    arr = as_2d(image).astype(np.float64)
    arr = arr - arr.min()
    half = arr.shape[1] // 2
    left = arr[:, :half].sum()
    right = arr[:, arr.shape[1] - half :].sum()
    return "left" if left >= right else "right"


def as_pixel_spacing(value: Any) -> tuple[float, float] | None:
    """``(row, col)`` mm from a number (isotropic) or two numbers; None for None / ``"null"`` / ``"none"`` / ``""``.

    Raises:
        ValueError: for anything else, e.g. zero, negative, a bool, one or three values.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    scalar = isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_))
    values = [value, value] if scalar else value
    try:
        if isinstance(values, (str, bool, np.bool_)):
            raise TypeError
        flat = np.asarray(convert_to_numpy(values, wrap_sequence=True), dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise UsageError(f"pixel_spacing must be a number or (row, col) in mm, or None, got {value!r}") from None
    spacing = usable_spacing(flat)
    if spacing is None:
        raise UsageError(f"pixel_spacing must be one or two positive finite numbers (mm), or None, got {value!r}")
    return spacing


def format_spacing(spacing: Sequence[float]) -> str:
    """``"0.4"`` for isotropic, ``"0.4 x 0.5"`` (row x col) otherwise (for messages, in mm)."""
    row, col = (float(s) for s in spacing)
    return f"{row:g}" if np.isclose(row, col, rtol=1e-6) else f"{row:g} x {col:g}"


def as_spacing_range(value: Any, name: str = "spacing_range") -> tuple[float, float]:
    """``(low, high)`` mm from two finite numbers with ``0 < low <= high``; None gives :data:`SPACING_RANGE_MM`.

    Raises:
        ValueError: naming ``name``, for anything else.
    """
    if value is None:
        return SPACING_RANGE_MM
    try:
        if isinstance(value, (str, bool, np.bool_)):
            raise TypeError
        flat = np.asarray(convert_to_numpy(value, wrap_sequence=True), dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        flat = np.asarray([], dtype=np.float64)
    if flat.size != 2 or not (np.isfinite(flat).all() and 0 < flat[0] <= flat[1]):
        raise UsageError(f"{name} must be [low, high] in mm with 0 < low <= high, got {value!r}")
    return float(flat[0]), float(flat[1])


def usable_spacing(value: Any, spacing_range: Sequence[float] | None = None) -> tuple[float, float] | None:
    """``(row, col)`` mm when ``value`` holds two finite positive numbers (inside ``spacing_range``); else None.

    The one rule for whether a pixel spacing can be used (tests/test_owners.py keeps it the only one).
    """
    if value is None:
        return None
    flat = np.asarray(convert_to_numpy(value, wrap_sequence=True), dtype=np.float64).reshape(-1)
    if flat.size != 2 or not (np.isfinite(flat).all() and (flat > 0).all()):
        return None
    spacing = float(flat[0]), float(flat[1])
    return spacing if spacing_range is None or spacing_in_range(spacing, spacing_range) else None


def stated_spacing_ok(numbers: Sequence[Any]) -> bool:
    """Whether ``numbers`` are one or two spacings, each 0 < mm < :data:`STATED_SPACING_LIMIT_MM`."""
    return len(numbers) in (1, 2) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < STATED_SPACING_LIMIT_MM for v in numbers
    )


def spacing_in_range(spacing: Sequence[float], spacing_range: Sequence[float] = SPACING_RANGE_MM) -> bool:
    """Whether both of ``spacing``'s (row, col) mm lie in ``spacing_range``, bounds included."""
    low, high = (float(v) for v in spacing_range)
    return all(low <= float(s) <= high for s in spacing)
