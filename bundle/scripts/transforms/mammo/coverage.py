"""Where the model's window lies on the input file, and how much of the breast it holds (:func:`breast_refusal`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..thumbnail import THUMBNAIL_STEP_KEY, THUMBNAIL_SUFFIX
from .array import _meta
from .breast import MIN_TISSUE_SHARE, breast_share, tissue_mask

BREAST_IN_WINDOW = "breast_in_window"
MIN_BREAST_IN_WINDOW = 0.5
_BREAST_FOUND = "breast_found"
_BREAST_REACHABLE = "breast_reachable"
BREAST_KEYS = (BREAST_IN_WINDOW, _BREAST_FOUND, _BREAST_REACHABLE)


def original_size(meta: Mapping[str, Any]) -> tuple[int, int]:
    """(H, W) of the input file, from the reader's ``spatial_shape``."""
    return tuple(int(v) for v in np.asarray(meta["spatial_shape"]).reshape(-1)[:2])


def window_on_original(meta: Mapping[str, Any], original_size: Sequence[int]) -> tuple[int, int, int, int] | None:
    """The part of the original file the model's window saw: ``(top, left, bottom, right)``, or None."""
    H, W = int(original_size[0]), int(original_size[1])
    shape = meta.get("resampled_shape")
    h, w = (int(v) for v in np.asarray(shape).reshape(-1)[:2]) if shape is not None else (H, W)
    top, left = (int(v) for v in np.asarray(meta["window_start"]).reshape(-1)[:2])
    rows, cols = (int(v) for v in np.asarray(meta["window_size"]).reshape(-1)[:2])
    c0, c1, c2, c3 = (int(v) for v in np.asarray(meta["crop_box"]).reshape(-1)[:4])
    y0, y1 = max(c0 + top, c0), min(c0 + top + rows, c2)
    x0, x1 = max(c1 + left, c1), min(c1 + left + cols, c3)
    if y1 <= y0 or x1 <= x0:
        return None
    if bool(meta.get("flipped_to_right", False)):
        x0, x1 = w - x1, w - x0
    sy, sx = H / h, W / w
    box = (int(np.floor(y0 * sy)), int(np.floor(x0 * sx)), int(np.ceil(y1 * sy)), int(np.ceil(x1 * sx)))
    return max(0, box[0]), max(0, box[1]), min(H, box[2]), min(W, box[3])


def breast_in_window(item: Mapping[str, Any]) -> float | None:
    """The share of the breast inside the model's window of a preprocessed ``item``, computed once per item.

    Returns:
        a share in [0, 1] (0 when no region is large enough to be a breast), or None without an ``image_thumbnail``
        or a window record.
    """
    if BREAST_IN_WINDOW in item:
        return item[BREAST_IN_WINDOW]
    meta = _meta(item.get("image"))
    thumbnail = item.get(f"image{THUMBNAIL_SUFFIX}")
    share, found, reachable = None, None, 1.0
    if thumbnail is not None and "window_start" in meta and "crop_box" in meta and "spatial_shape" in meta:
        picture = np.asarray(torch.as_tensor(thumbnail).detach().cpu().numpy())
        mask, k = tissue_mask(picture, int(item.get(THUMBNAIL_STEP_KEY, 1)))
        found = bool(mask.any())
        share = breast_share(mask, k, window_on_original(meta, original_size(meta)))
        reachable = _reachable(meta, mask, k) if found else 1.0
    if isinstance(item, dict):
        item[BREAST_IN_WINDOW], item[_BREAST_FOUND] = share, found
        item[_BREAST_REACHABLE] = reachable if share is not None else 1.0
    return share


def _reachable(meta: Mapping[str, Any], mask: np.ndarray, k: int) -> float:
    """The share of the tissue breast's box a window of the model's size can hold at the model's scale."""
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    size = np.asarray(original_size(meta), dtype=np.float64)
    shape = meta.get("resampled_shape")
    scale = np.asarray(shape, dtype=np.float64).reshape(-1)[:2] / size if shape is not None else np.ones(2)
    box = np.array([rows[-1] + 1 - rows[0], cols[-1] + 1 - cols[0]], dtype=np.float64) * k * scale
    window = np.asarray(meta["window_size"], dtype=np.float64).reshape(-1)[:2]
    return float(np.prod(np.minimum(1.0, window / np.maximum(box, 1.0))))


def breast_refusal(item: Mapping[str, Any]) -> str | None:
    """Why an image's window is no prediction, in one line; None when it holds enough of the breast."""
    share = breast_in_window(item)
    if share is None:
        return None
    if item.get(_BREAST_FOUND) is False:
        return (
            f"BreastNotFound: no tissue region large enough to be a breast (at least {MIN_TISSUE_SHARE:.0%} of the "
            "image) was found: is the input a mammogram?"
        )
    needed = MIN_BREAST_IN_WINDOW * float(item.get(_BREAST_REACHABLE, 1.0))
    if share < needed:
        return (
            f"BreastNotInWindow: the model's window holds {share:.3f} of the breast (breast_in_window; at least "
            f"{needed:.3g} needed): the crop did not find the breast"
        )
    return None
