"""What an inference run states about how each image was read: the laterality, view and pixel spacing used and their
sources (predictions.csv, the panel's title), and what was assumed (a note per image in errors.csv and the log)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..data.geometry import SPACING_RANGE_MM
from ..data.header_facts import cbis_patient_id, text_view_laterality
from ..transforms.mammo.array import CROP_ITERATIONS_KEY, CROP_SOURCE_KEY, WINDOW_SOURCE_KEY, _meta
from ..transforms.mammo.breast import CC_LIKE_VIEWS, MLO_LIKE_VIEWS, view_kind
from ..transforms.mammo.coverage import BREAST_IN_WINDOW, breast_in_window
from ..transforms.mammo.spacing import (
    MODEL_SPACING_KEY,
    SPACING_IGNORED_KEY,
    SPACING_RANGE_KEY,
    SPACING_SOURCE_KEY,
    SPACING_USED_KEY,
    format_spacing,
)

# the crop's iterations when the metadata does not record them (the authors')
_DEFAULT_ITERATIONS = 100


def _spacing_pair(value: Any) -> tuple[float, float]:
    flat = np.asarray(value if value is not None else (np.nan, np.nan), dtype=np.float64).reshape(-1)
    return (float(flat[0]), float(flat[1])) if flat.size >= 2 else (np.nan, np.nan)


def _range(meta: Mapping[str, Any]) -> str:
    low, high = _spacing_pair(meta.get(SPACING_RANGE_KEY, SPACING_RANGE_MM))
    return f"{low:g}-{high:g} mm"


def spacing_note(image: Any, window: Sequence[int] | None = None) -> str | None:
    """The note of what was assumed about an image's pixel spacing; None when a stated spacing was used.

    Args:
        image: the preprocessed ``MetaTensor`` (after :class:`~scripts.transforms.ResampleToSpacingd`).
        window: the model's window (rows, cols); the image's shape when None.
    """
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


def breast_note(item: Mapping[str, Any], window: Sequence[int] | None = None) -> str | None:
    """The note of an image whose window holds less than the whole breast, naming the share and why."""
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
    """The note of an image whose crop or window was placed on the largest tissue region; None otherwise."""
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
    """What predictions.csv states about how an item was read; empty cells for what is unknown."""
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
    """The patient of an image: the datalist's ``patient_id``, else the file's PatientID, else ``""``."""
    given = _text(item.get("patient_id"))
    if given:
        return given
    stated = _text(_meta(item["image"]).get("patient_id"))
    return (cbis_patient_id(stated) or stated) if stated else ""


def _file_name_disagrees(item: Mapping[str, Any], facts: Mapping[str, str]) -> list[str]:
    """Notes for a laterality or view taken from a tag or the datalist while the file's name states another."""
    name = Path(str(_meta(item["image"]).get("filename_or_obj") or "")).name
    name_view, name_side = text_view_laterality(name)
    notes = []
    side, side_source = facts["laterality"], facts["laterality_source"]
    if name_side and side and side != name_side and side_source not in ("filename", "image"):
        notes.append(f"laterality {side} from {side_source}, while the file name states {name_side}: {side} was used")
    view, view_source = facts["view"], facts["view_source"]
    kinds = [
        view_kind(v, None) if v and v.upper() in CC_LIKE_VIEWS | MLO_LIKE_VIEWS else None for v in (view, name_view)
    ]
    if None not in kinds and kinds[0] != kinds[1] and view_source != "filename":
        notes.append(f"view {view} from {view_source}, while the file name states {name_view}: {view} was used")
    return notes


def image_notes(
    item: Mapping[str, Any], window: Sequence[int] | None = None, default_view: str | None = "CC"
) -> list[str]:
    """Everything assumed about one image, for its log line and errors.csv note."""
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
    notes += _file_name_disagrees(item, facts)
    if facts["laterality_source"] == "image":
        notes.append(f"laterality not stated: {facts['laterality'] or '?'} inferred from the side of the chest wall")
    elif not facts["laterality"] and str(item.get("facing", "")).lower() not in ("left", "right"):
        notes.append("laterality unknown: the side of the chest wall decided the mirroring")
    return notes
