"""What an inference run states about how each image was read: the laterality, the view and the pixel spacing
the preprocessing used and where each came from (predictions.csv's columns, the panel's title), and what was assumed
(a note per image in errors.csv and the log).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from monai.data import MetaTensor

from ..transforms.mammo.breast import view_kind
from ..transforms.mammo.spacing import (
    MODEL_SPACING_KEY,
    SPACING_SOURCE_KEY,
    SPACING_USED_KEY,
    format_spacing,
)

__all__ = ["spacing_note", "image_facts", "image_notes"]


def _meta(image: Any) -> Mapping[str, Any]:
    return image.meta if isinstance(image, MetaTensor) else {}


def _spacing_pair(value: Any) -> tuple[float, float]:
    flat = np.asarray(value if value is not None else (np.nan, np.nan), dtype=np.float64).reshape(-1)
    return (float(flat[0]), float(flat[1])) if flat.size >= 2 else (np.nan, np.nan)


def spacing_note(image: Any, window: Sequence[int] | None = None) -> str | None:
    """What was assumed about the pixel spacing of a preprocessed image (``MetaTensor``, after
    :class:`~scripts.transforms.ResampleToSpacingd`), for a log line and errors.csv; None when the spacing was stated
    (by the file, the datalist or ``input_spacing``) or when the model has none (nothing resampled):

    - ``"pixel spacing not stated: estimated 0.31 mm, the breast fitted into the model's 736 x 480 window at 0.4
      mm"`` (``spacing_source`` ``fit_breast``; ``window`` is the model's, from the image's shape when not given);
    - ``"pixel spacing not stated: assumed the model's 0.4 mm (spacing_fallback: model)"``."""
    meta = _meta(image)
    source = str(meta.get(SPACING_SOURCE_KEY, ""))
    if source not in ("fit_breast", "model"):
        return None
    model = format_spacing(_spacing_pair(meta.get(MODEL_SPACING_KEY)))
    if source == "model":
        return f"pixel spacing not stated: assumed the model's {model} mm (spacing_fallback: model)"
    used = format_spacing(tuple(float(f"{v:.4g}") for v in _spacing_pair(meta.get(SPACING_USED_KEY))))
    rows, cols = (int(v) for v in (window if window is not None else tuple(image.shape[-2:])))
    fitted = f"the breast fitted into the model's {rows} x {cols} window at {model} mm"
    return f"pixel spacing not stated: estimated {used} mm, {fitted}"


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def image_facts(item: Mapping[str, Any]) -> dict[str, Any]:
    """What predictions.csv states about how an image was read (``item``: the preprocessed item, its ``image`` a
    ``MetaTensor``): ``laterality`` / ``laterality_source`` and ``view`` / ``view_source`` as the preprocessing used
    them (a datalist item's value, source ``"datalist"``, before the file's; ``""`` and ``"unknown"`` when neither
    states one), and the input's pixel spacing used (``spacing_row_mm``, ``spacing_col_mm``, empty when unknown) with
    its ``spacing_source``."""
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
    return facts


def image_notes(
    item: Mapping[str, Any], window: Sequence[int] | None = None, default_view: str | None = "CC"
) -> list[str]:
    """Everything assumed about one image, for its log line and errors.csv note: an estimated or assumed pixel spacing
    (:func:`spacing_note`), a view that is unknown or not a CC- / MLO-like code (the ``default_view`` window rule was
    used), a laterality inferred from the image (the side of the chest wall decided the mirroring)."""
    facts = image_facts(item)
    notes = [note for note in [spacing_note(item["image"], window)] if note]
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
