"""Atomic writes of the driver's outputs: JSON (trial records, step markers, timings), text (``results.md``) and
PNG (the figures). Atomic because a run can be interrupted at any moment and a resumed run trusts what exists."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def write_json(path: Path, content: Any) -> None:
    """``content`` as indented JSON; NaN is refused (it is not JSON)."""
    from scripts.atomic import atomic_write

    with atomic_write(path, "w") as f:
        f.write(json.dumps(content, indent=2, allow_nan=False) + "\n")


def write_text(path: Path, text: str) -> None:
    """``text`` as is."""
    from scripts.atomic import atomic_write

    with atomic_write(path, "w") as f:
        f.write(text)


def write_png(path: Path, rgb: np.ndarray) -> None:
    """An (H, W, 3) uint8 image as PNG."""
    from PIL import Image

    from scripts.atomic import atomic_write

    with atomic_write(path, "wb") as f:
        Image.fromarray(rgb).save(f, format="PNG")
