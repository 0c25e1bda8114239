"""What an inference run states about how each image was read: the laterality, the view and the pixel spacing
the preprocessing used and where each came from, and how much of the breast the model's window holds
(predictions.csv's columns, the panel's title), and what was assumed or missed (a note per image in errors.csv and the
log).

The share of the breast in the window (``breast_in_window``) is measured on the file's grid, against the tissue
breast of the whole file (:func:`~scripts.transforms.mammo.breast.tissue_mask`: the largest tissue region, found on the
thumbnail the panel is drawn from, with an opening that is a share of the picture and owes nothing to
``crop_iterations``): the mask pixels inside the model's window on the file (what it saw: the window clipped to the
crop, :func:`~.geometry.window_on_original`) over all mask pixels. The share falls below 1 where the breast's crop is
larger than the window, or where the crop's opening (``crop_iterations``) cut part of the breast away; it is 0 where
no tissue region is large enough to be a breast. A window holding less than :data:`MIN_BREAST_IN_WINDOW` of the breast
is refused (:func:`breast_refusal`): the image is an errors.csv row, not a prediction, and the label app's answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.data import MetaTensor

from ..data.cbis_ddsm import cbis_patient_id
from ..transforms.mammo.array import CROP_ITERATIONS_KEY, CROP_SOURCE_KEY, WINDOW_SOURCE_KEY
from ..transforms.mammo.breast import MIN_TISSUE_SHARE, breast_share, tissue_mask, view_kind
from ..transforms.mammo.spacing import (
    MODEL_SPACING_KEY,
    SPACING_IGNORED_KEY,
    SPACING_RANGE_KEY,
    SPACING_RANGE_MM,
    SPACING_SOURCE_KEY,
    SPACING_USED_KEY,
    format_spacing,
)
from ..transforms.thumbnail import THUMBNAIL_STEP_KEY, THUMBNAIL_SUFFIX
from .geometry import original_size, window_on_original

__all__ = [
    "BREAST_IN_WINDOW",
    "BREAST_KEYS",
    "MIN_BREAST_IN_WINDOW",
    "breast_in_window",
    "breast_note",
    "breast_refusal",
    "spacing_note",
    "image_facts",
    "image_notes",
    "patient_id",
]

#: the predictions.csv column (and item key) of the share of the breast inside the model's window
BREAST_IN_WINDOW = "breast_in_window"
#: the least share of the breast a window must hold for its image to be a prediction (:func:`breast_refusal`)
MIN_BREAST_IN_WINDOW = 0.5
# item key: whether a tissue region large enough to be a breast was found (set with BREAST_IN_WINDOW)
_BREAST_FOUND = "breast_found"
# item key: the share of the breast a window of the model's size can hold (below 1 for a breast larger than it)
_BREAST_REACHABLE = "breast_reachable"
#: the item keys :func:`breast_in_window` sets
BREAST_KEYS = (BREAST_IN_WINDOW, _BREAST_FOUND, _BREAST_REACHABLE)
# the crop's iterations when the metadata does not record them (the authors')
_DEFAULT_ITERATIONS = 100


def _meta(image: Any) -> Mapping[str, Any]:
    return image.meta if isinstance(image, MetaTensor) else {}


def _spacing_pair(value: Any) -> tuple[float, float]:
    flat = np.asarray(value if value is not None else (np.nan, np.nan), dtype=np.float64).reshape(-1)
    return (float(flat[0]), float(flat[1])) if flat.size >= 2 else (np.nan, np.nan)


def _range(meta: Mapping[str, Any]) -> str:
    low, high = _spacing_pair(meta.get(SPACING_RANGE_KEY, SPACING_RANGE_MM))
    return f"{low:g}-{high:g} mm"


def spacing_note(image: Any, window: Sequence[int] | None = None) -> str | None:
    """What was assumed about the pixel spacing of a preprocessed image (``MetaTensor``, after
    :class:`~scripts.transforms.ResampleToSpacingd`), for a log line and errors.csv; None when the spacing was stated
    (by the file, the datalist or ``input_spacing``) and used, or when the model has none (nothing resampled):

    - ``"pixel spacing not stated: estimated 0.31 mm, the breast fitted into the model's 736 x 480 window at 0.4
      mm"`` (``spacing_source`` ``fit_breast``; ``window`` is the model's, from the image's shape when not given);
    - ``"pixel spacing not stated: assumed the model's 0.4 mm (spacing_fallback: model)"``;
    - a file whose spacing lies outside the plausible range (``meta["spacing_ignored"]``) starts with ``"the file's
      pixel spacing 20 mm is outside the pixel sizes of mammograms (0.02-1 mm; the spacing_range option widens it),
      not used: "`` followed by what was used instead (the estimate, the model's, the datalist's or the option's)."""
    meta = _meta(image)
    source = str(meta.get(SPACING_SOURCE_KEY, ""))
    ignored = _spacing_pair(meta.get(SPACING_IGNORED_KEY))
    lead = "pixel spacing not stated: "
    if np.isfinite(ignored).all():
        lead = (
            f"the file's pixel spacing {format_spacing(ignored)} mm is outside the pixel sizes of mammograms "
            f"({_range(meta)}; the spacing_range option widens it), not used: "
        )
    elif source not in ("fit_breast", "model"):
        return None
    model = format_spacing(_spacing_pair(meta.get(MODEL_SPACING_KEY)))
    used = format_spacing(tuple(float(f"{v:.4g}") for v in _spacing_pair(meta.get(SPACING_USED_KEY))))
    if source == "model":
        return f"{lead}assumed the model's {model} mm (spacing_fallback: model)"
    if source == "fit_breast":
        rows, cols = (int(v) for v in (window if window is not None else tuple(image.shape[-2:])))
        fitted = f"the breast fitted into the model's {rows} x {cols} window at {model} mm"
        return f"{lead}estimated {used} mm, {fitted}"
    stated = {"datalist": "the datalist's", "option": "input_spacing's"}.get(source, source)
    return f"{lead}{stated} {used} mm used"


def breast_in_window(item: Mapping[str, Any]) -> float | None:
    """The share of the breast inside the model's window, in [0, 1] (see the module's docstring), for a preprocessed
    ``item`` whose ``image_thumbnail`` was taken at loading (``inference_loading`` of the pipeline takes it); 0 when
    no tissue region is large enough to be a breast; None without a thumbnail or a window record. Computed once per
    item (kept under :data:`BREAST_IN_WINDOW`)."""
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
    """The share of the tissue breast's box (``mask``, ``k`` file pixels per pixel) a window of the model's size can
    hold at the model's scale: 1 where the box fits the window, less where the breast is larger than the window."""
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    size = np.asarray(original_size(meta), dtype=np.float64)
    shape = meta.get("resampled_shape")
    scale = np.asarray(shape, dtype=np.float64).reshape(-1)[:2] / size if shape is not None else np.ones(2)
    box = np.array([rows[-1] + 1 - rows[0], cols[-1] + 1 - cols[0]], dtype=np.float64) * k * scale
    window = np.asarray(meta["window_size"], dtype=np.float64).reshape(-1)[:2]
    return float(np.prod(np.minimum(1.0, window / np.maximum(box, 1.0))))


def breast_refusal(item: Mapping[str, Any]) -> str | None:
    """Why an image's window is no prediction, one line, or None when it holds enough of the breast: no tissue region
    large enough to be a breast, or a window holding less than :data:`MIN_BREAST_IN_WINDOW` of it
    (:func:`breast_in_window`); of a breast larger than the window at the model's scale, less than that share of what a
    window can hold (the window's size over the breast's box, per axis), so that such a breast stays a prediction whose
    note says it is larger than the window. The bundle's inference writes it as the image's errors.csv row, the label
    app answers it; None also where the share cannot be measured (no thumbnail)."""
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


def breast_note(item: Mapping[str, Any], window: Sequence[int] | None = None) -> str | None:
    """The note of an image whose window holds less than the whole breast (``breast_in_window`` below 1 at three
    decimals), naming the share and why: the breast's crop larger than the window at the spacing used (a stated
    spacing can make it so), else the crop's opening (``crop_iterations``) or the placement cut part of it away;
    None otherwise."""
    share = breast_in_window(item)
    if share is None or round(share, 3) >= 1.0:
        return None
    meta = _meta(item["image"])
    rows, cols = (int(v) for v in (window if window is not None else tuple(item["image"].shape[-2:])))
    text = f"the model's {rows} x {cols} window holds {share:.3f} of the breast (breast_in_window)"
    crop = np.asarray(meta.get("crop_box", (0, 0, 0, 0))).reshape(-1)[:4]
    crop_h, crop_w = int(crop[2] - crop[0]), int(crop[3] - crop[1])
    source = str(meta.get(SPACING_SOURCE_KEY, ""))
    used = _spacing_pair(meta.get(SPACING_USED_KEY))
    at = f"at {format_spacing(used)} mm ({source})" if np.isfinite(used).all() else "at the file's pixel size"
    if crop_h > rows or crop_w > cols:
        return f"{text}: {at} the breast's crop ({crop_h} x {crop_w} px) is larger than the window"
    iterations = int(meta.get(CROP_ITERATIONS_KEY, _DEFAULT_ITERATIONS))
    return (
        f"{text}: {at} the crop's mask opening ({iterations} erosions) cut part of it away; a smaller "
        "crop_iterations keeps it"
    )


def tissue_note(item: Mapping[str, Any]) -> str | None:
    """The note of an image whose crop or window was placed on the largest tissue region because the authors' (the
    opened mask of pixels > 0) missed the breast, held clearly less of it, or took a film's background for it; None
    otherwise."""
    meta = _meta(item["image"])
    parts = [
        name for name, key in (("crop", CROP_SOURCE_KEY), ("window", WINDOW_SOURCE_KEY)) if meta.get(key) == "tissue"
    ]
    if not parts:
        return None
    return (
        f"the authors' {' and '.join(parts)} (the opened mask of pixels > 0) did not hold the breast: "
        f"the {' and '.join(parts)} {'was' if len(parts) == 1 else 'were'} placed on the largest tissue region instead"
    )


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def image_facts(item: Mapping[str, Any]) -> dict[str, Any]:
    """What predictions.csv states about how an image was read (``item``: the preprocessed item, its ``image`` a
    ``MetaTensor``): ``laterality`` / ``laterality_source`` and ``view`` / ``view_source`` as the preprocessing used
    them (a datalist item's value, source ``"datalist"``, before the file's; ``""`` and ``"unknown"`` when neither
    states one), the input's pixel spacing used (``spacing_row_mm``, ``spacing_col_mm``, empty when unknown) with
    its ``spacing_source``, the share of the breast in the model's window (``breast_in_window``, three decimals,
    :func:`breast_in_window`; empty when it cannot be measured) and the ``patient_id`` (:func:`patient_id`)."""
    meta = _meta(item["image"])
    facts: dict[str, Any] = {}
    for key in ("laterality", "view"):
        given = _text(item.get(key))
        if given:
            value, source = given.upper(), "datalist"
        else:
            value = _text(meta.get(key)).upper()
            source = _text(meta.get(f"{key}_source")) or ("file" if value else "unknown")
        facts[key], facts[f"{key}_source"] = value, source
    row_mm, col_mm = _spacing_pair(meta.get(SPACING_USED_KEY))
    known = np.isfinite(row_mm) and np.isfinite(col_mm)
    facts["spacing_row_mm"] = f"{row_mm:.6g}" if known else ""
    facts["spacing_col_mm"] = f"{col_mm:.6g}" if known else ""
    facts["spacing_source"] = _text(meta.get(SPACING_SOURCE_KEY)) or "unknown"
    share = breast_in_window(item)
    facts[BREAST_IN_WINDOW] = "" if share is None else f"{share:.3f}"
    facts["patient_id"] = patient_id(item)
    return facts


def patient_id(item: Mapping[str, Any]) -> str:
    """The patient an image belongs to, for breasts.csv: a datalist item's ``patient_id``, else the file's PatientID
    (a CBIS-DDSM per-view id such as ``Mass-Test_P_00173_LEFT_CC`` becomes the woman's ``P_00173``, as the
    datalists make it), else ``""`` (the image is then a breast of its own)."""
    given = _text(item.get("patient_id"))
    if given:
        return given
    stated = _text(_meta(item["image"]).get("patient_id"))
    return (cbis_patient_id(stated) or stated) if stated else ""


def image_notes(
    item: Mapping[str, Any], window: Sequence[int] | None = None, default_view: str | None = "CC"
) -> list[str]:
    """Everything assumed about one image, for its log line and errors.csv note: an estimated or assumed pixel spacing,
    or one the file states outside the plausible range (:func:`spacing_note`), a crop or window placed on the tissue
    breast (:func:`tissue_note`), a window that holds less than the whole breast (:func:`breast_note`), a view that is
    unknown or not a CC- / MLO-like code (the ``default_view`` window rule was used), a laterality inferred from the
    image (the side of the chest wall decided the mirroring)."""
    facts = image_facts(item)
    notes = [
        note for note in [spacing_note(item["image"], window), tissue_note(item), breast_note(item, window)] if note
    ]
    view = facts["view"]
    try:
        view_kind(view, None)
    except ValueError:
        rule = view_kind(default_view, None) if default_view else "CC"
        what = "view unknown" if not view else f"view {view!r} is not a CC- or MLO-like code"
        notes.append(f"{what}: the {rule} window rule was used")
    if facts["laterality_source"] == "image":
        notes.append(f"laterality not stated: {facts['laterality'] or '?'} inferred from the side of the chest wall")
    elif not facts["laterality"] and str(item.get("facing", "")).lower() not in ("left", "right"):
        notes.append("laterality unknown: the side of the chest wall decided the mirroring")
    return notes
