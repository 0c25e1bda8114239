"""Breast geometry on 2-D ``(H, W)`` mammograms (numpy only): the authors' crop box and best-centre window."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np
from scipy import ndimage as ndi

from scripts.data.geometry import as_2d, chest_wall_side

from ...errors import UsageError

CC_LIKE_VIEWS = frozenset({"CC", "XCCL", "XCCM", "FB", "CV"})
MLO_LIKE_VIEWS = frozenset({"MLO", "ML", "LM", "LMO", "SIO", "ISO", "AT"})


def largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest 4-connected component (scipy's default, as the authors') of a 2-D mask; ties to raster order."""
    labels, n = ndi.label(mask)
    if n == 0:
        return np.zeros(mask.shape, dtype=bool)
    sizes = np.bincount(labels.ravel())
    sizes[0] = 0
    return labels == int(np.argmax(sizes))


def _bbox(mask: np.ndarray) -> tuple[int, int, int, int]:
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    return int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1


def open_breast_mask_exact(foreground: np.ndarray, iterations: int = 100) -> np.ndarray:
    """The authors' opening in scipy terms: ``iterations`` erosions, largest component, ``iterations`` dilations."""
    fg = as_2d(foreground, "foreground").astype(bool)
    eroded = ndi.binary_erosion(fg, iterations=iterations) if iterations > 0 else fg
    comp = largest_component(eroded)
    if iterations > 0 and comp.any():
        comp = ndi.binary_dilation(comp, iterations=iterations)
    return comp


def open_breast_mask(foreground: np.ndarray, iterations: int = 100, method: str = "fast") -> np.ndarray:
    """Opened breast mask ``(H, W)`` bool: erosion, largest component, dilation (``iterations`` each).

    ``method="fast"`` thresholds city-block distance transforms, identical to :func:`open_breast_mask_exact` (the
    ``"exact"`` method) at a cost that does not grow with ``iterations``.
    """
    if method == "exact":
        return open_breast_mask_exact(foreground, iterations)
    if method != "fast":
        raise UsageError(f"method must be 'fast' or 'exact', got {method!r}")
    fg = as_2d(foreground, "foreground").astype(bool)
    if iterations <= 0 or not fg.any():
        return largest_component(fg)
    r0, r1, c0, c1 = _bbox(fg)
    # zero frame of 1 px around the foreground's box: the image border erodes like background
    sub = np.pad(fg[r0:r1, c0:c1], 1)
    dist = ndi.distance_transform_cdt(sub, metric="taxicab")[1:-1, 1:-1]
    eroded = np.zeros_like(fg)
    eroded[r0:r1, c0:c1] = dist > iterations
    comp = largest_component(eroded)
    if not comp.any():
        return comp
    h, w = fg.shape
    r0, r1, c0, c1 = _bbox(comp)
    r0, c0 = max(r0 - iterations, 0), max(c0 - iterations, 0)
    r1, c1 = min(r1 + iterations, h), min(c1 + iterations, w)
    dist = ndi.distance_transform_cdt(~comp[r0:r1, c0:c1], metric="taxicab")
    opened = np.zeros_like(fg)
    opened[r0:r1, c0:c1] = dist <= iterations
    return opened


MASK_SAMPLE_PIXELS = 1024


def file_breast_mask(image: np.ndarray, iterations: int = 100, step: int = 1) -> tuple[np.ndarray, int]:
    """The authors' breast mask of a whole file on every ``k``-th pixel: ``(mask, k)``.

    Args:
        image: ``(H, W)``, possibly every ``step``-th pixel of the file (a thumbnail).
        iterations: erosions in the file's pixels (``iterations // k`` on the copy).
        step: the file's pixels per pixel of ``image``.

    Returns:
        the opened mask of pixels > 0 (their largest component where the erosions leave nothing) and ``k``.

    Raises:
        ValueError: when no pixel is > 0.
    """
    arr = as_2d(image)
    step = max(1, int(step))
    j = max(1, int(np.ceil(max(arr.shape) / MASK_SAMPLE_PIXELS)))
    fg = arr[::j, ::j] > 0
    if not fg.any():
        raise UsageError("no pixel > 0: cannot locate the breast")
    k = j * step
    opened = open_breast_mask(fg, int(iterations) // k)
    return (opened if opened.any() else largest_component(fg)), k


def breast_share(mask: np.ndarray, k: int, box: tuple[int, int, int, int] | None) -> float:
    """The share of ``mask`` (every ``k``-th file pixel) inside ``box`` ``(top, left, bottom, right)``; 0 for no box."""
    total = int(mask.sum())
    if box is None or total == 0:
        return 0.0
    top, left, bottom, right = (int(v) for v in box)
    r0, c0 = -(-max(top, 0) // k), -(-max(left, 0) // k)  # the first sampled row / col at or after the box's start
    r1, c1 = -(-max(bottom, 0) // k), -(-max(right, 0) // k)
    return float(mask[r0:r1, c0:c1].sum()) / total


def _opened_or_fallback(image: np.ndarray, iterations: int, method: str, name: str = "") -> np.ndarray:
    fg = image > 0
    if not fg.any():
        raise UsageError("no pixel > 0: cannot locate the breast (all-zero or all-negative image)")
    opened = open_breast_mask(fg, iterations, method)
    if not opened.any():
        warnings.warn(
            f"{name + ': ' if name else ''}{iterations} erosions removed the whole foreground of a {image.shape} "
            "image; using the largest "
            "component of pixels > 0 instead (lower `iterations` for small images)",
            stacklevel=3,
        )
        opened = largest_component(fg)
    return opened


TISSUE_PIXELS = 512
TISSUE_OPENING = 0.02
#: a tissue region smaller than this share of the picture is not a breast (lettering, a clip, a ruler)
MIN_TISSUE_SHARE = 0.03
EXACT_BACKGROUND_SHARE = 0.05
# the authors' box stays unless the tissue breast's holds more by HOLD_MARGIN or is OVERSIZE times smaller
HOLD_MARGIN = 0.02
OVERSIZE = 2.0


def _block_means(arr: np.ndarray, j: int) -> np.ndarray:
    if j == 1:
        return arr.astype(np.float64)
    h, w = arr.shape
    pad = ((0, -(-h // j) * j - h), (0, -(-w // j) * j - w))
    blocks = np.pad(arr.astype(np.float32), pad, mode="edge")
    return blocks.reshape(blocks.shape[0] // j, j, blocks.shape[1] // j, j).mean(axis=(1, 3), dtype=np.float64)


def _otsu(values: np.ndarray) -> float:
    """Otsu's threshold over 256 bins up to the 99.5th percentile (lettering does not stretch them)."""
    lo, hi = float(values.min()), float(np.percentile(values, 99.5))
    if hi <= lo:
        return lo
    hist, edges = np.histogram(np.clip(values, lo, hi), bins=256, range=(lo, hi))
    centres = (edges[:-1] + edges[1:]) / 2
    w0 = np.cumsum(hist, dtype=np.float64)
    w1 = w0[-1] - w0
    m0 = np.cumsum(hist * centres)
    mu0, mu1 = m0 / np.maximum(w0, 1), (m0[-1] - m0) / np.maximum(w1, 1)
    return float(edges[1 + int(np.argmax(w0 * w1 * (mu0 - mu1) ** 2))])


def tissue_threshold(picture: np.ndarray) -> float | None:
    """The value above which a pixel of ``picture`` is tissue, or None when nothing stands out.

    An exact background (at least :data:`EXACT_BACKGROUND_SHARE` of pixels at the minimum) is that minimum; else 0.4 of
    the way from the background's median up to Otsu's threshold, so that the faint skin line stays tissue.
    """
    lo = float(picture.min())
    if float(np.mean(picture == lo)) >= EXACT_BACKGROUND_SHARE:
        return lo
    otsu = _otsu(picture)
    background, tissue = picture[picture <= otsu], picture[picture > otsu]
    if tissue.size == 0:
        return None
    low, median, high = np.percentile(background, [1, 50, 99])
    if float(np.median(tissue)) <= high + (high - low):
        return None
    return float(median + 0.4 * (otsu - median))


def tissue_mask(image: np.ndarray, step: int = 1) -> tuple[np.ndarray, int]:
    """The breast as the largest tissue region of a picture, whatever its lettering, rulers or clips.

    Args:
        image: ``(H, W)``, possibly every ``step``-th pixel of the file.
        step: the file's pixels per pixel of ``image``.

    Returns:
        ``(mask, k)``: a boolean picture of ``k`` x ``k`` file pixels per pixel, all False when no region holds
        :data:`MIN_TISSUE_SHARE` of the picture.
    """
    arr = as_2d(image)
    j = max(1, int(np.ceil(max(arr.shape) / TISSUE_PIXELS)))
    picture = _block_means(arr, j)
    k = j * max(1, int(step))
    empty = np.zeros(picture.shape, dtype=bool)
    threshold = tissue_threshold(picture)
    if threshold is None:
        return empty, k
    tissue = picture > threshold
    radius = max(1, int(round(TISSUE_OPENING * max(picture.shape))))
    core = largest_component(ndi.distance_transform_edt(np.pad(tissue, 1))[1:-1, 1:-1] > radius)
    if not core.any():
        return empty, k
    region = ndi.binary_fill_holes((ndi.distance_transform_edt(~core) <= radius) & tissue)
    if region.sum() < MIN_TISSUE_SHARE * region.size:
        return empty, k
    return region, k


def _box_on_file(mask: np.ndarray, k: int, shape: tuple[int, int]) -> tuple[int, int, int, int]:
    """``(top, bottom, left, right)`` of ``mask`` (``k`` file pixels per pixel) on a file of ``shape``."""
    top, bottom, left, right = _bbox(mask)
    return top * k, min(bottom * k, shape[0]), left * k, min(right * k, shape[1])


def _area(box: tuple[int, int, int, int]) -> int:
    return (box[1] - box[0]) * (box[3] - box[2])


def _tissue_holds_more(tissue: np.ndarray, k: int, authors: tuple[int, int, int, int], own: tuple[int, ...]) -> bool:
    return breast_share(tissue, k, authors) < breast_share(tissue, k, own) - HOLD_MARGIN


def file_breast_box(image: np.ndarray, iterations: int = 100) -> tuple[tuple[int, int, int, int], str]:
    """The breast's box on a whole file as the crop finds it: ``((top, bottom, left, right), source)``.

    Raises:
        ValueError: when no pixel is > 0.
    """
    arr = as_2d(image)
    opened, k = file_breast_mask(arr, iterations)
    authors = _box_on_file(opened, k, arr.shape)
    tissue, kt = tissue_mask(arr)
    if not tissue.any():
        return authors, "authors"
    own = _box_on_file(tissue, kt, arr.shape)
    as_box = lambda b: (b[0], b[2], b[1], b[3])  # noqa: E731 - (top, left, bottom, right) for breast_share
    if _tissue_holds_more(tissue, kt, as_box(authors), as_box(own)) or _area(authors) > OVERSIZE * _area(own):
        return own, "tissue"
    return authors, "authors"


def _buffered(
    box: tuple[int, int, int, int], shape: tuple[int, int], buffer: int, chest_wall: str
) -> tuple[tuple[int, int], tuple[int, int]]:
    top, bottom, left, right = box
    h, w = shape
    top -= min(top, buffer)
    bottom += min(h - bottom, buffer)
    if chest_wall == "left":
        right += min(w - right, buffer)
    else:
        left -= min(left, buffer)
    return (top, left), (bottom, right)


def breast_crop(
    image: np.ndarray,
    iterations: int = 100,
    buffer: int = 50,
    chest_wall: str = "left",
    method: str = "fast",
    name: str = "",
    tissue: bool = True,
) -> tuple[tuple[tuple[int, int], tuple[int, int]], str]:
    """The crop of a 2-D mammogram and its source: ``(((top, left), (bottom, right)), source)``.

    ``"tissue"`` (the box around :func:`tissue_mask`) replaces the authors' crop where that holds clearly less of the
    breast or is over :data:`OVERSIZE` times its box (lettering or a film's background taken for the breast).
    """
    img = as_2d(image)
    if chest_wall == "auto":
        chest_wall = chest_wall_side(img)
    if chest_wall not in ("left", "right"):
        raise UsageError(f"chest_wall must be 'left', 'right' or 'auto', got {chest_wall!r}")
    mask = _opened_or_fallback(img, iterations, method, name)
    authors_box = _bbox(mask)
    authors = _buffered(authors_box, img.shape, buffer, chest_wall)
    if not tissue:
        return authors, "authors"
    breast, k = tissue_mask(img)
    if not breast.any():
        return authors, "authors"
    own_box = _box_on_file(breast, k, img.shape)
    own = _buffered(own_box, img.shape, buffer, chest_wall)
    flat = lambda b: (b[0][0], b[0][1], b[1][0], b[1][1])  # noqa: E731
    if _tissue_holds_more(breast, k, flat(authors), flat(own)) or _area(authors_box) > OVERSIZE * _area(own_box):
        return own, "tissue"
    return authors, "authors"


def view_kind(view: str | None, default: str | None = "CC") -> str:
    """``"CC"`` or ``"MLO"``: which window rule applies to a view code; unknown views use ``default`` (None: error)."""
    code = (view or "").strip().upper()
    if code in CC_LIKE_VIEWS:
        return "CC"
    if code in MLO_LIKE_VIEWS:
        return "MLO"
    if default is None:
        raise UsageError(f"unknown view {view!r}: expected one of {sorted(CC_LIKE_VIEWS | MLO_LIKE_VIEWS)}")
    return view_kind(default, None)


@dataclass(frozen=True)
class WindowPlacement:
    """Where the window sits on the (flipped, cropped) image; a negative or overhanging ``start`` is padding."""

    best_center: tuple[int, int]
    start: tuple[int, int]
    size: tuple[int, int]
    rightmost: int
    bottommost: int
    view: str
    source: str = "authors"

    @property
    def end(self) -> tuple[int, int]:
        return self.start[0] + self.size[0], self.start[1] + self.size[1]


def _extreme_points(opened: np.ndarray) -> tuple[int, int]:
    """(rightmost column below the top third, bottom-most row) of the opened mask."""
    ignore = int(opened.shape[0] * (1 / 3))
    cols = np.flatnonzero(opened[ignore:].any(axis=0))
    if cols.size == 0:  # the mask lies entirely in the top third
        cols = np.flatnonzero(opened.any(axis=0))
    rows = np.flatnonzero(opened.any(axis=1))
    return int(cols[-1]), int(rows[-1])


def best_center_window(
    image: np.ndarray,
    view: str | None,
    window: tuple[int, int] = (2944, 1920),
    *,
    mirrored: bool = False,
    reference_compatible: bool = True,
    iterations: int = 100,
    method: str = "fast",
    default_view: str | None = "CC",
    name: str = "",
    tissue: bool = True,
) -> WindowPlacement:
    """The authors' window for a breast facing right (chest wall at column 0).

    Args:
        image: ``(H, W)`` or ``(1, H, W)``, flipped to face right.
        view: CC-like views search the row, MLO-like ones take it from the bottom-most point.
        window: ``(rows, cols)``.
        mirrored: whether the image was mirrored (matters only for ``reference_compatible``).
        reference_compatible: reproduce the released code's integer conventions (its ``best_center``); False places
            the window's last column (and an MLO's last row) on the breast's, as the paper says: 1-2 px apart.
        iterations, method: the mask opening, as in :func:`open_breast_mask`.
        default_view: used for an unknown ``view`` (None raises).
        name: the file, for the warning when the erosions remove the whole foreground.
        tissue: use the same rule on the tissue breast where the authors' window holds less of it by more than
            :data:`HOLD_MARGIN` (``source`` ``"tissue"``).
    """
    img = as_2d(image)
    kind = view_kind(view, default_view)
    opened = _opened_or_fallback(img, iterations, method, name)
    placement = _placement(img.shape, opened, img > 0, img != 0, kind, window, mirrored, reference_compatible)
    if not tissue:
        return placement
    breast, k = tissue_mask(img)
    if not breast.any():
        return placement
    rows, cols = np.minimum(np.arange(img.shape[0]) // k, breast.shape[0] - 1), np.arange(img.shape[1]) // k
    full = breast[rows][:, np.minimum(cols, breast.shape[1] - 1)]
    own = _placement(img.shape, full, full, full, kind, window, mirrored, reference_compatible)
    if _tissue_holds_more(breast, k, (*placement.start, *placement.end), (*own.start, *own.end)):
        return replace(own, source="tissue")
    return placement


def _placement(
    shape: tuple[int, int],
    opened: np.ndarray,
    positive: np.ndarray,
    nonzero: np.ndarray,
    kind: str,
    window: tuple[int, int],
    mirrored: bool,
    reference_compatible: bool,
) -> WindowPlacement:
    """The best-centre rule: ``positive`` the pixels the CC row search counts, ``nonzero`` those capping an MLO."""
    win_h, win_w = (int(window[0]), int(window[1]))
    half_h, half_w = win_h // 2, win_w // 2
    h, w = shape
    rightmost, bottommost = _extreme_points(opened)

    if reference_compatible:
        center_col = rightmost + int(bool(mirrored)) - half_w - 1
    else:
        center_col = rightmost + 1 - win_w + half_w

    if kind == "CC":
        com_row = h // 2
        if h <= win_h:
            center_row = com_row
        else:
            # rows whose window lies inside the image, scored by pixels > 0 in the window's columns
            col_lo = center_col - half_w
            col_hi = min(center_col + (win_w - half_w) + max(-col_lo, 0), w)
            col_lo = max(col_lo, 0)
            counts = np.concatenate([[0], np.cumsum(positive[:, col_lo:col_hi].sum(axis=1, dtype=np.int64))])
            rows = np.arange(half_h, h - (win_h - half_h) + 1)
            scores = counts[rows - half_h + win_h] - counts[rows - half_h]
            best = rows[scores == scores.max()]
            center_row = int(best[np.argmin((best - com_row) ** 2)])
    else:
        # empty rows at the bottom of the window's columns cap the bottom-most point
        nonzero_rows = np.flatnonzero(nonzero[:, -win_w:].any(axis=1))
        bottom = min(int(nonzero_rows[-1]), bottommost) if nonzero_rows.size else bottommost
        center_row = bottom - half_h - 1 if reference_compatible else bottom + 1 - win_h + half_h

    if h < win_h:
        top = -((win_h - h) // 2) if kind == "CC" else 0
    else:
        top = int(np.clip(center_row - half_h, 0, h - win_h))
    left = 0 if w < win_w else int(np.clip(center_col - half_w, 0, w - win_w))
    return WindowPlacement(
        best_center=(int(center_row), int(center_col)),
        start=(top, left),
        size=(win_h, win_w),
        rightmost=rightmost,
        bottommost=bottommost,
        view=kind,
    )


def shifted_window_start(
    placement: WindowPlacement, image_shape: tuple[int, int], offset: tuple[int, int]
) -> tuple[int, int]:
    """Window start moved by ``offset``, kept inside the union of the image and the unshifted window."""
    out = []
    for start, size, extent, off in zip(placement.start, placement.size, image_shape, offset):
        lo = min(start, 0)
        hi = max(start + size, extent) - size
        out.append(int(np.clip(start + int(off), lo, hi)))
    return out[0], out[1]
