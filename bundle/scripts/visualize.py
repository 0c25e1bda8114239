"""Pictures of GLAM's outputs: the image with its masks, and saliency maps as coloured overlays with the patches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["CLASS_COLOURS", "to_uint8", "overlay", "saliency_panel"]

#: overlay colours per class: benign green, malignant red
CLASS_COLOURS = ((0, 200, 0), (230, 0, 0))
PATCH_COLOUR = (40, 140, 255)


def to_uint8(image: np.ndarray) -> np.ndarray:
    """Min-max scale to 0..255 (a constant image gives zeros)."""
    image = np.asarray(image, dtype=np.float32)
    lo, hi = float(image.min()), float(image.max())
    if hi <= lo:
        return np.zeros(image.shape, np.uint8)
    return ((image - lo) / (hi - lo) * 255).astype(np.uint8)


def overlay(image: np.ndarray, maps: np.ndarray, strength: float = 0.8) -> np.ndarray:
    """Grey image (H, W) with per-class maps (C, H, W) in [0, 1] blended in the class colours -> (H, W, 3) uint8."""
    rgb = np.repeat(to_uint8(image)[..., None], 3, axis=2).astype(np.float32)
    for cls, m in enumerate(np.asarray(maps, dtype=np.float32)):
        alpha = np.clip(m, 0.0, 1.0)[..., None] * strength
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
    """Side by side: the image with its ground-truth masks (when given), then each map as an overlay with the
    patch boxes. ``image`` (H, W); ``maps`` name -> (C, H, W) in [0, 1] at the image's size; ``masks`` (C, H, W).

    Returns (H, n * (W + separator) - separator, 3) uint8.
    """
    image = np.asarray(image, dtype=np.float32)
    h, w = image.shape
    line = max(1, w // 240)
    panels = [
        overlay(image, 0.5 * (np.asarray(masks) > 0)) if masks is not None else overlay(image, np.zeros((0, h, w)))
    ]
    for m in maps.values():
        if tuple(np.asarray(m).shape[-2:]) != (h, w):
            raise ValueError(f"maps must have the image's size {(h, w)}, got {np.asarray(m).shape}")
        panel = overlay(image, m)
        if boxes is not None:
            draw_boxes(panel, boxes, line)
        panels.append(panel)
    out = np.full((h, len(panels) * (w + separator) - separator, 3), 255, np.uint8)
    for i, p in enumerate(panels):
        out[:, i * (w + separator) : i * (w + separator) + w] = p
    return out
