"""Pictures of GLAM's outputs: saliency maps as coloured overlays on the image, with the patches and the window."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy.ndimage import binary_erosion

from .enums import CLASS_NAMES
from .errors import UsageError

#: overlay colours per class: benign green, malignant red
CLASS_COLOURS = ((0, 200, 0), (230, 0, 0))
#: the patches' outline, and its name in the captions that describe it
PATCH_COLOUR = (40, 140, 255)
PATCH_COLOUR_NAME = "blue"
#: the model's window on the reading panel
WINDOW_COLOUR = (255, 215, 0)
#: the reading panel's colour scale of a map runs from 0 to max(map's maximum, this), so that noise is not blown up
MAP_SCALE_FLOOR = 0.05


def to_uint8(image: np.ndarray) -> np.ndarray:
    """Min-max scale to 0..255 (a constant image gives zeros)."""
    image = np.asarray(image, dtype=np.float32)
    lo, hi = float(image.min()), float(image.max())
    if hi <= lo:
        return np.zeros(image.shape, np.uint8)
    return ((image - lo) / (hi - lo) * 255).astype(np.uint8)


def overlay(image: np.ndarray, maps: np.ndarray, strength: float = 0.8, vmax: float = 1.0) -> np.ndarray:
    """Grey image (H, W) with per-class maps (C, H, W) blended in the class colours -> (H, W, 3) uint8."""
    rgb = np.repeat(to_uint8(image)[..., None], 3, axis=2).astype(np.float32)
    for cls, m in enumerate(np.asarray(maps, dtype=np.float32)):
        alpha = np.clip(m / np.float32(vmax), 0.0, 1.0)[..., None] * strength
        rgb = rgb * (1 - alpha) + np.asarray(CLASS_COLOURS[cls % len(CLASS_COLOURS)], np.float32) * alpha
    return rgb.astype(np.uint8)


def draw_boxes(rgb: np.ndarray, boxes: Sequence[Sequence[int]], width: int) -> None:
    """Outline boxes (top, left, height, width) on an (H, W, 3) image in place, ``width`` px thick."""
    h, w = rgb.shape[:2]
    for r, c, bh, bw in boxes:
        r0, c0, r1, c1 = max(0, r), max(0, c), min(h, r + bh), min(w, c + bw)
        for t in range(width):
            rgb[min(h - 1, r0 + t), c0:c1] = PATCH_COLOUR
            rgb[max(0, r1 - 1 - t), c0:c1] = PATCH_COLOUR
            rgb[r0:r1, min(w - 1, c0 + t)] = PATCH_COLOUR
            rgb[r0:r1, max(0, c1 - 1 - t)] = PATCH_COLOUR


def saliency_panel(
    image: np.ndarray,
    maps: Mapping[str, np.ndarray],
    boxes: Sequence[Sequence[int]] | None = None,
    masks: np.ndarray | None = None,
    separator: int = 4,
) -> np.ndarray:
    """Side by side: the image with its ground-truth masks, then each map as an overlay with the patch boxes.

    Args:
        image: (H, W).
        maps: name -> (C, H, W) in [0, 1] at the image's size.
        boxes: the patches (top, left, height, width).
        masks: (C, H, W), or None.
        separator: pixels between the tiles.

    Returns:
        (H, n * (W + separator) - separator, 3) uint8.
    """
    image = np.asarray(image, dtype=np.float32)
    h, w = image.shape
    line = max(1, w // 240)
    panels = [
        overlay(image, 0.5 * (np.asarray(masks) > 0)) if masks is not None else overlay(image, np.zeros((0, h, w)))
    ]
    for m in maps.values():
        if tuple(np.asarray(m).shape[-2:]) != (h, w):
            raise UsageError(f"maps must have the image's size {(h, w)}, got {np.asarray(m).shape}")
        panel = overlay(image, m)
        if boxes is not None:
            draw_boxes(panel, boxes, line)
        panels.append(panel)
    out = np.full((h, len(panels) * (w + separator) - separator, 3), 255, np.uint8)
    for i, p in enumerate(panels):
        out[:, i * (w + separator) : i * (w + separator) + w] = p
    return out


def draw_rectangle(rgb: np.ndarray, box: Sequence[int], colour: Sequence[int], width: int) -> None:
    """Outline ``box`` (top, left, bottom, right; end-exclusive) inside it on an (H, W, 3) image, in place."""
    top, left, bottom, right = (int(v) for v in box)
    h, w = rgb.shape[:2]
    top, left, bottom, right = max(0, top), max(0, left), min(h, bottom), min(w, right)
    if bottom <= top or right <= left:
        return
    t = max(1, min(int(width), (bottom - top + 1) // 2, (right - left + 1) // 2))
    rgb[top : top + t, left:right] = colour
    rgb[bottom - t : bottom, left:right] = colour
    rgb[top:bottom, left : left + t] = colour
    rgb[top:bottom, right - t : right] = colour


def outline(mask: np.ndarray, width: int) -> np.ndarray:
    """The pixels of a binary (H, W) ``mask`` within ``width`` px of its edge, inside it."""
    mask = np.asarray(mask, dtype=bool)
    return mask & ~binary_erosion(mask, iterations=max(1, int(width)), border_value=1)


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: one fixed-size bitmap font
        return ImageFont.load_default()


def _colour_bars(width: int, vmax: float, classes: Sequence[str], strength: float, font_size: int) -> np.ndarray:
    """The colour bars under a map tile: per class, the overlay's colour on mid-grey from 0 to ``vmax``, numbered."""
    from PIL import Image, ImageDraw

    font = _font(font_size)
    bar_h, text_h, pad = max(6, font_size), int(font_size * 1.3), 3
    strip = Image.new("RGB", (width, len(classes) * (bar_h + text_h + pad) + pad), (255, 255, 255))
    draw = ImageDraw.Draw(strip)
    margin = max(4, width // 20)
    length = max(2, width - 2 * margin)
    ramp = np.linspace(0.0, 1.0, length, dtype=np.float32)
    for i, name in enumerate(classes):
        colour = np.asarray(CLASS_COLOURS[i % len(CLASS_COLOURS)], np.float32)
        alpha = (ramp * strength)[:, None]
        row = (128.0 * (1 - alpha) + colour * alpha).astype(np.uint8)
        y = pad + i * (bar_h + text_h + pad)
        strip.paste(Image.fromarray(np.repeat(row[None], bar_h, axis=0)), (margin, y))
        draw.rectangle([margin - 1, y - 1, margin + length, y + bar_h], outline=(0, 0, 0))
        draw.text((margin + 3, y + max(0, (bar_h - font_size) // 2) - 1), name, fill=(255, 255, 255), font=font)
        for frac in (0.0, 0.5, 1.0):
            label = f"{vmax * frac:.2f}"
            x = margin + int(frac * (length - 1))
            draw.line([x, y + bar_h, x, y + bar_h + 3], fill=(0, 0, 0))
            tw = font.getlength(label) if hasattr(font, "getlength") else 6 * len(label)
            draw.text((min(max(0, x - tw / 2), width - tw), y + bar_h + 3), label, fill=(0, 0, 0), font=font)
    return np.asarray(strip)


def reading_panel(
    image: np.ndarray,
    maps: Mapping[str, np.ndarray],
    boxes: Sequence[Sequence[int]] = (),
    masks: np.ndarray | None = None,
    window: Sequence[int] | None = None,
    classes: Sequence[str] = CLASS_NAMES,
    floor: float = MAP_SCALE_FLOOR,
    strength: float = 0.8,
    separator: int = 6,
) -> np.ndarray:
    """Side by side: the image with its ground truth outlined, then each map with its colour bars.

    Args:
        image: (H, W).
        maps: name -> (C, H, W) at the image's size.
        boxes: the patches (top, left, bottom, right), end-exclusive.
        masks: (C, H, W) ground truth, or None.
        window: the model's window, as the boxes, or None.
        classes: the class names on the bars.
        floor: the least top of a map's colour scale.
        strength: the overlays' opacity at the top of the scale.
        separator: pixels between the tiles.

    Returns:
        (H + legend, n * (W + separator) - separator, 3) uint8.
    """
    from PIL import Image, ImageDraw

    image = np.asarray(image, dtype=np.float32)
    h, w = image.shape
    line = max(2, w // 160)
    font_size = int(np.clip(w // 22, 10, 28))
    tiles, legends = [], []
    tiles.append(overlay(image, np.zeros((0, h, w))))
    legends.append(None)
    for name, m in maps.items():
        m = np.asarray(m, dtype=np.float32)
        if tuple(m.shape[-2:]) != (h, w):
            raise UsageError(f"maps must have the image's size {(h, w)}, got {m.shape}")
        peak = float(m.max()) if m.size else 0.0
        vmax = max(peak, float(floor))
        tile = overlay(image, m, strength, vmax)
        tiles.append(tile)
        head = Image.new("RGB", (w, int(font_size * 1.5)), (255, 255, 255))
        caption = f"{name}: colours 0 to {vmax:.2f} (max {peak:.2f})"
        ImageDraw.Draw(head).text((4, 1), caption, fill=(0, 0, 0), font=_font(font_size))
        legends.append(np.concatenate([np.asarray(head), _colour_bars(w, vmax, classes, strength, font_size)]))
    for tile in tiles:
        for top, left, bottom, right in boxes:
            draw_rectangle(tile, (top, left, bottom, right), PATCH_COLOUR, line)
        if window is not None:
            draw_rectangle(tile, window, WINDOW_COLOUR, line)
    for cls, mask in enumerate(np.asarray(masks) > 0 if masks is not None else ()):  # on top: the truth is read first
        tiles[0][outline(mask, line)] = CLASS_COLOURS[cls % len(CLASS_COLOURS)]
    legend_h = max((lg.shape[0] for lg in legends if lg is not None), default=0)
    out = np.full((h + legend_h, len(tiles) * (w + separator) - separator, 3), 255, np.uint8)
    for i, (tile, legend) in enumerate(zip(tiles, legends)):
        x = i * (w + separator)
        out[:h, x : x + w] = tile
        if legend is not None:
            out[h : h + legend.shape[0], x : x + w] = legend
    return out
