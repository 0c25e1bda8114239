"""Box annotations of a datalist item: ``"boxes": [{"label": "benign" | "malignant", "box": [y0, x0, y1, x1]}, ...]``
in the image file's pixels (fractions allowed, ``y1`` / ``x1`` the far edges)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..enums import CLASS_NAMES
from ..errors import UsageError

#: the datalist field holding box annotations
BOXES_KEY = "boxes"


def parse_boxes(boxes: Any, where: str = "boxes") -> list[tuple[str, tuple[float, float, float, float]]]:
    """Validated ``(label, (y0, x0, y1, x1))`` pairs of a ``boxes`` field (None or [] gives []).

    Raises:
        ValueError: one line naming ``where`` and the first bad entry.
    """
    if boxes is None:
        return []
    if not isinstance(boxes, (list, tuple)):
        raise UsageError(f"{where}: must be a list of {{'label', 'box'}} entries, got {type(boxes).__name__}")
    out = []
    for i, entry in enumerate(boxes):
        if not isinstance(entry, Mapping) or "label" not in entry or "box" not in entry:
            raise UsageError(f"{where}[{i}]: must be {{'label': one of {list(CLASS_NAMES)}, 'box': [y0, x0, y1, x1]}}")
        label, box = str(entry["label"]).lower(), entry["box"]
        if label not in CLASS_NAMES:
            raise UsageError(f"{where}[{i}]: label must be one of {list(CLASS_NAMES)}, got {entry['label']!r}")
        if not isinstance(box, (list, tuple)) or len(box) != 4:
            raise UsageError(f"{where}[{i}]: box must be [y0, x0, y1, x1] (four numbers), got {box!r}")
        try:
            y0, x0, y1, x1 = (float(v) for v in box)
        except (TypeError, ValueError):
            raise UsageError(f"{where}[{i}]: box must be [y0, x0, y1, x1] (four numbers), got {box!r}") from None
        if not all(math.isfinite(v) and v >= 0 for v in (y0, x0, y1, x1)) or y1 <= y0 or x1 <= x0:
            raise UsageError(f"{where}[{i}]: box [y0, x0, y1, x1] needs 0 <= y0 < y1 and 0 <= x0 < x1, got {box!r}")
        out.append((label, (y0, x0, y1, x1)))
    return out
