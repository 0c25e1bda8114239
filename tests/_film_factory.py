"""Digitised screen-film mammograms for tests, shaped like CBIS-DDSM's: a breast on a noisy background above 0, the
view's lettering (bright strokes) in a corner opposite the breast and near it on the same side, a ruler strip along the
far edge and metal clips (small, very bright discs) on and beside the breast. Each picture comes with the breast mask
it was drawn from, which tests measure the model's window against."""

from __future__ import annotations

import numpy as np

#: the brightest value of a film (12 bits, as CBIS-DDSM's scans)
WHITE = 4095


def _letters(image: np.ndarray, top: int, left: int, height: int, text: str, value: int) -> None:
    """Block capitals of ``text`` (``R``, ``C``, ``L``, ``M``, ``O``) drawn with strokes a sixth of their ``height``."""
    stroke, width = max(2, height // 6), int(height * 0.7)

    def bar(r0: float, c0: float, r1: float, c1: float) -> None:
        image[top + int(r0 * height) : top + int(r1 * height), x + int(c0 * width) : x + int(c1 * width)] = value

    s_r, s_c = stroke / height, stroke / width
    for i, letter in enumerate(text):
        x = left + i * int(width * 1.3)
        if letter in "RCLMO":
            bar(0, 0, 1, s_c)  # the left upright
        if letter in "RCO":
            bar(0, 0, s_r, 1)  # the top
        if letter in "CLO":
            bar(1 - s_r, 0, 1, 1)  # the bottom
        if letter in "MO":
            bar(0, 1 - s_c, 1, 1)  # the right upright
        if letter == "R":
            bar(0, 1 - s_c, 0.5, 1)
            bar(0.5 - s_r / 2, 0, 0.5 + s_r / 2, 1)
            bar(0.5, 0.5, 1, 0.5 + s_c)
        if letter == "M":
            bar(0, 0.5 - s_c / 2, 0.6, 0.5 + s_c / 2)


def _disc(image: np.ndarray, centre: tuple[float, float], radius: float, value: int) -> None:
    rows, cols = np.ogrid[: image.shape[0], : image.shape[1]]
    image[(rows - centre[0]) ** 2 + (cols - centre[1]) ** 2 <= radius**2] = value


def breast_shape(h: int, w: int, view: str) -> np.ndarray:
    """The breast of a left view facing right (chest wall at column 0), ``(h, w)`` bool. CC: half an ellipse centred
    on the chest wall, 72 % of the height tall and half the width deep. MLO: as tests/inference/test_breast_in_window's
    phantom, from the top edge (the axilla, 80 % of its widest) to its widest (about 0.33 h) at 60 % of the height and
    back to the chest wall at 93 %."""
    t = np.arange(h, dtype=np.float64)[:, None] / h
    cols = np.arange(w, dtype=np.float64)[None, :]
    if view == "CC":
        return ((t - 0.5) / 0.36) ** 2 + (cols / (0.5 * w)) ** 2 <= 1
    widest = 0.36 * 0.93 * h
    upper = 0.8 + 0.2 * np.clip(t / 0.6, 0, 1)
    lower = np.sqrt(np.clip(1 - ((t - 0.6) / 0.33) ** 2, 0, 1))
    return (cols < widest * np.where(t <= 0.6, upper, lower)) & (t < 0.93)


def film(
    h: int,
    w: int,
    view: str = "CC",
    laterality: str = "L",
    seed: int = 0,
    *,
    breast: bool = True,
    lettering: bool = True,
    ruler: bool = True,
    clips: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """A digitised film ``(h, w)`` uint16 and its breast mask (all False without ``breast``), as stored: a left
    breast's chest wall at column 0, a right one's at the last column.

    The background is 250-450 (a slope across the film) with noise of sd 60, never 0; the breast 900-3000 (a fatty
    rim 900-1300 within 4 % of its depth of the skin line, textured tissue inside, an MLO's pectoral muscle brighter);
    the lettering (``RCC``-like, 4.5 % of the height tall, white) in the corner opposite the breast and under it on the
    chest wall's side; the ruler a strip 3 % of the width wide along the far edge, 80 % of the height long, with dark
    ticks; the clips white discs of 1 % of the height, one on the breast and one beside its edge."""
    rng = np.random.default_rng(seed)
    rows = np.arange(h, dtype=np.float64)[:, None]
    cols = np.arange(w, dtype=np.float64)[None, :]
    image = 250 + 200 * cols / w + rng.normal(0, 60, size=(h, w))
    mask = breast_shape(h, w, view) if breast else np.zeros((h, w), dtype=bool)
    if breast:
        inner = breast_shape(h, w, view) & (cols > 0.04 * 0.5 * w)
        inner &= np.roll(mask, -int(0.02 * w), axis=1) & np.roll(mask, int(0.02 * h), axis=0)
        inner &= np.roll(mask, -int(0.02 * h), axis=0)
        tissue = 1600 + rng.integers(0, 1200, size=(h, w))
        if view == "MLO":
            tissue = tissue + 600 * (cols < 0.6 * 0.36 * 0.93 * h * (1 - rows / h / 0.45))
        image = np.where(mask, np.where(inner, tissue, 900 + rng.integers(0, 400, size=(h, w))), image)
    if ruler:
        strip = (slice(int(0.1 * h), int(0.9 * h)), slice(w - int(0.03 * w), w))
        image[strip] = 3000
        ticks = np.arange(int(0.1 * h), int(0.9 * h), max(4, int(0.02 * h)))
        image[ticks[:, None], np.arange(w - int(0.03 * w), w - int(0.015 * w))[None, :]] = 300
    if clips and breast:
        _disc(image, (0.45 * h, 0.2 * w), 0.01 * h, WHITE)
        _disc(image, (0.28 * h, 0.5 * w), 0.01 * h, WHITE)
    if laterality == "R":
        image, mask = np.ascontiguousarray(image[:, ::-1]), np.ascontiguousarray(mask[:, ::-1])
    if lettering:  # readable on either side: drawn after the mirroring
        size = int(0.045 * h)
        text = ("L" if laterality == "L" else "R") + ("CC" if view == "CC" else "MLO")
        for top, left, letters in ((0.04, 0.68, text), (0.945, 0.03, text[:2])):  # opposite; under the breast
            if laterality == "R":
                left = 1 - left - len(letters) * 0.7 * 1.3 * size / w
            _letters(image, int(top * h), int(left * w), size, letters, WHITE)
    return np.clip(np.rint(image), 1, WHITE).astype(np.uint16), mask
