"""The overlay panel of one image: its thumbnail with the ground truth a datalist gives, each map shown with its
colour bars, the model's window and the patches, under a title saying how the image was read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..enums import CLASS_NAMES, LesionClass
from ..errors import UsageError
from ..transforms.thumbnail import THUMBNAIL_STEP_KEY, THUMBNAIL_SUFFIX
from ..visualize import reading_panel
from .files import bare_name


def _thumbnail(item: Mapping[str, Any], key: str) -> np.ndarray | None:
    value = item.get(f"{key}{THUMBNAIL_SUFFIX}")
    return None if value is None else np.asarray(torch.as_tensor(value).cpu().numpy(), dtype=np.float32)[0]


def _mask_thumbnails(item: Mapping[str, Any]) -> np.ndarray | None:
    """(C, h, w) thumbnails of the item's ground truth masks, zeros for a class without one; None without any."""
    masks = [_thumbnail(item, f"mask_{cls}") for cls in CLASS_NAMES]
    if all(m is None for m in masks):
        return None
    shape = next(m.shape for m in masks if m is not None)
    return np.stack([np.zeros(shape, np.float32) if m is None else m for m in masks])


def shown_name(path: str, stem: str | None = None) -> str:
    """The input as the panel's title names it: its file name led by the folders its ``stem`` names."""
    parts = Path(path).parts
    for k in range(1, len(parts)):
        if stem == "_".join([*parts[-1 - k : -1], bare_name(path)]):
            return "/".join(parts[-1 - k :])
    return parts[-1] if parts else str(path)


_SPACING_SOURCE_WORDS = {
    "fit_breast": "estimated: the breast fitted into the window",
    "model": "assumed: the model's",
    "datalist": "from the datalist",
    "option": "from input_spacing",
}


def panel_title_lines(
    file_name: str,
    scores: Sequence[float],
    labels: Sequence[int | str],
    maps: Sequence[str],
    with_masks: bool,
    facts: Mapping[str, Any] | None = None,
) -> list[str]:
    """The panel's title lines: the file, its scores and labels, how it was read and what the tiles show."""
    order = sorted(range(len(CLASS_NAMES)), key=lambda i: CLASS_NAMES[i] != LesionClass.MALIGNANT)
    scored = " · ".join(f"{CLASS_NAMES[i]} {scores[i]:.2f}" for i in order)
    truth = "" if labels[0] == "" else "   (labels: " + ", ".join(f"{CLASS_NAMES[i]} {labels[i]}" for i in order) + ")"
    lines = [f"{file_name}   {scored}{truth}"]
    if facts is not None:
        source = str(facts.get("spacing_source", ""))
        if facts.get("spacing_row_mm"):
            row, col = float(facts["spacing_row_mm"]), float(facts["spacing_col_mm"])
            spacing = f"{row:.3g}" if np.isclose(row, col) else f"{row:.3g} x {col:.3g}"
            spacing = f"{spacing} mm ({_SPACING_SOURCE_WORDS.get(source, source)})"
        else:
            spacing = "unknown (not resampled)"
        view = f"{facts['view']} ({facts.get('view_source', '')})" if facts.get("view") else "unknown"
        side = f"{facts['laterality']} ({facts.get('laterality_source', '')})" if facts.get("laterality") else "unknown"
        lines.append(f"pixel spacing {spacing} · view {view} · laterality {side}")
    tiles = f"image{' + ground truth outlined' if with_masks else ''} | " + " | ".join(maps)
    share = str((facts or {}).get("breast_in_window", "") or "")
    holds = ""
    if share:
        value = float(share)
        holds = f" (holds {value:.0%} of the breast)" if round(value, 3) >= 1.0 or value < 0.99 else ""
        holds = holds or f" (holds {value:.1%} of the breast)"
    lines.append(
        f"{tiles}   yellow: the model's window{holds} · blue: selected patches · colours per map, see its bars"
    )
    return lines


def add_title(panel: np.ndarray, lines: Sequence[str]) -> np.ndarray:
    """Put text lines above the panel in the largest font that fits its width (at most 1/30 of its height)."""
    from PIL import Image, ImageDraw, ImageFont

    width = panel.shape[1]
    size = max(12, panel.shape[0] // 30)
    font = ImageFont.load_default()
    while size >= 8:
        try:
            font = ImageFont.load_default(size=size)
        except TypeError:  # Pillow < 10.1: one fixed-size bitmap font
            break
        if max(font.getlength(t) for t in lines) <= width - 8:
            break
        size -= 1
    line_h = int(size * 1.25) + 2
    strip = Image.new("RGB", (width, line_h * len(lines) + 4), (255, 255, 255))
    draw = ImageDraw.Draw(strip)
    for i, text in enumerate(lines):
        draw.text((4, 2 + i * line_h), text, fill=(0, 0, 0), font=font)
    return np.concatenate([np.asarray(strip), panel], axis=0)


def overlay_panel(
    thumbnail: np.ndarray,
    maps: Mapping[str, np.ndarray],
    boxes: Sequence[tuple[int, int, int, int]],
    masks: np.ndarray | None,
    title: Sequence[str],
    step: int = 1,
    window: Sequence[int] | None = None,
) -> np.ndarray:
    """The titled :func:`~scripts.visualize.reading_panel` of one image at its thumbnail's resolution.

    Args:
        thumbnail: (h, w), every ``step``-th pixel of the image.
        maps: name -> (C, H, W) on the image's full grid.
        boxes: the patches (top, left, bottom, right) on the full grid, end-exclusive.
        masks: (C, h, w) thumbnails, or None.
        title: the title lines.
        step: the thumbnail's step.
        window: the model's window, as the boxes (None: not drawn).

    Returns:
        (rows, cols, 3) uint8.
    """
    sub = (slice(None), slice(None, None, step), slice(None, None, step))
    small_maps = {name: maps[name][sub] for name in maps}
    for name, m in small_maps.items():
        if m.shape[-2:] != thumbnail.shape:
            raise UsageError(f"{name} at step {step} has shape {m.shape[-2:]}, the thumbnail {thumbnail.shape}")

    def small(box: Sequence[int]) -> tuple[int, int, int, int]:  # end-exclusive boxes at the thumbnail's step
        top, left, bottom, right = (int(v) for v in box)
        return top // step, left // step, -(-bottom // step), -(-right // step)

    panel = reading_panel(
        thumbnail,
        small_maps,
        [small(b) for b in boxes],
        masks,
        None if window is None else small(window),
        classes=CLASS_NAMES,
    )
    return add_title(panel, title)


def item_panel(
    path: str,
    item: Mapping[str, Any],
    maps: Mapping[str, np.ndarray],
    boxes: Sequence[tuple[int, int, int, int]],
    window: Sequence[int] | None,
    scores: Sequence[float],
    labels: Sequence[int | str],
    facts: Mapping[str, Any],
) -> np.ndarray:
    """The titled panel of the preprocessed ``item`` for the file ``path``.

    Raises:
        ValueError: when the item has no thumbnail.
    """
    thumbnail = _thumbnail(item, "image")
    if thumbnail is None:
        raise UsageError(
            f"{path}: no image thumbnail to draw the panel on (the preprocessing needs "
            "scripts.transforms.Thumbnaild after loading, as configs/inference.yaml has it)"
        )
    masks = _mask_thumbnails(item)
    name = shown_name(path, item.get("output_stem"))
    title = panel_title_lines(name, scores, labels, list(maps), with_masks=masks is not None, facts=facts)
    step = int(item.get(THUMBNAIL_STEP_KEY, 1))
    return overlay_panel(thumbnail, maps, boxes, masks, title, step, window=window)
