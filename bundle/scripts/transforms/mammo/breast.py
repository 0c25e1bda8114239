"""Breast-region geometry on 2-D mammograms (numpy only): the authors' crop box and best-centre window.

Arrays here are 2-D ``(H, W)``: rows top-to-bottom, columns left-to-right. The MONAI transforms in
``array.py`` / ``dictionary.py`` wrap these functions; keeping them free of MONAI lets tests compare them
with independent computations.

The authors' preprocessing (docs/preprocessing.md):

- breast mask = pixels > 0, eroded 100 times with scipy's default 3x3 cross, largest 4-connected
  component, dilated 100 times; its bounding box plus up to 50 px at top, bottom and the side away
  from the chest wall is the crop;
- the 2944x1920 window is placed at a "best centre": CC views fix the column from the rightmost point
  of the opened mask (searched below the top third of the image) and search the row covering most
  pixels > 0 (ties to the image centre); MLO views fix the row from the bottom-most point as well;
  images smaller than the window are zero-padded (CC: top and bottom evenly; MLO: bottom; columns:
  right).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np
from scipy import ndimage as ndi

from scripts.data.geometry import as_2d, chest_wall_side

from ...errors import UsageError

__all__ = [
    "WindowPlacement",
    "best_center_window",
    "breast_crop",
    "breast_crop_box",
    "breast_share",
    "file_breast_box",
    "file_breast_mask",
    "chest_wall_side",
    "largest_component",
    "open_breast_mask",
    "open_breast_mask_exact",
    "shifted_window_start",
    "tissue_mask",
    "view_kind",
]

CC_LIKE_VIEWS = frozenset({"CC", "XCCL", "XCCM", "FB", "CV"})
MLO_LIKE_VIEWS = frozenset({"MLO", "ML", "LM", "LMO", "SIO", "ISO", "AT"})


def largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest 4-connected component of a 2-D boolean mask (all False if the mask is empty).

    4-connectivity is scipy's default for ``ndimage.label``, which is what the authors' crop uses; ties
    go to the component met first in raster order.
    """
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
    """Reference: ``binary_erosion(iterations)``, largest component, ``binary_dilation(iterations)``.

    This is the authors' operation verbatim in scipy terms (default cross structure, border_value=0);
    :func:`open_breast_mask` computes the same mask and is the one the transforms use.
    """
    fg = as_2d(foreground, "foreground").astype(bool)
    eroded = ndi.binary_erosion(fg, iterations=iterations) if iterations > 0 else fg
    comp = largest_component(eroded)
    if iterations > 0 and comp.any():
        comp = ndi.binary_dilation(comp, iterations=iterations)
    return comp


def open_breast_mask(foreground: np.ndarray, iterations: int = 100, method: str = "fast") -> np.ndarray:
    """Opened breast mask ``(H, W)`` bool: erosion, largest component, dilation (``iterations`` each).

    ``method="fast"`` thresholds city-block distance transforms: ``iterations`` erosions with the 3x3
    cross remove exactly the pixels within taxicab distance ``iterations`` of the background (pixels
    outside the image count as background, scipy's border_value=0), and the dilation adds exactly the
    pixels within that distance of the component. The result is identical to
    :func:`open_breast_mask_exact`, at a cost that does not grow with ``iterations``; the dilation is
    computed only inside the component's box grown by ``iterations``.
    ``method="exact"`` calls :func:`open_breast_mask_exact`.
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


#: the breast mask of the whole file is found on a copy of about this many pixels along its longer side
MASK_SAMPLE_PIXELS = 1024


def file_breast_mask(image: np.ndarray, iterations: int = 100, step: int = 1) -> tuple[np.ndarray, int]:
    """The authors' breast mask of a whole file, cheaply: ``(mask, k)``, the opened mask of pixels > 0 (erosion,
    largest component, dilation, as :func:`open_breast_mask`) on every ``k``-th pixel of ``image``, with
    ``iterations // k`` erosions: the authors' crop counted in the file's own pixels.

    ``image`` ``(H, W)`` may itself be every ``step``-th pixel of the file (a thumbnail); ``k`` (a multiple of
    ``step``) is then the file's pixels per mask pixel, about :data:`MASK_SAMPLE_PIXELS` along the longer side.
    When the erosions leave nothing (a tiny or thin picture) the largest component of pixels > 0 stands for the
    breast. Raises ``ValueError`` for an image without a pixel > 0."""
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
    """The share of the breast ``mask`` (every ``k``-th pixel of the file, :func:`file_breast_mask`) inside ``box``
    ``(top, left, bottom, right)`` in the file's pixels, end-exclusive: the mask pixels whose file pixel lies in the
    box over all mask pixels. None (no box): 0."""
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


#: the tissue mask is found on a copy of block means, about this many pixels along the longer side
TISSUE_PIXELS = 512
#: the tissue mask's opening radius as a share of that copy's longer side (10 of its 512 pixels)
TISSUE_OPENING = 0.02
#: a tissue region smaller than this share of the picture is not a breast (lettering, a clip, a ruler)
MIN_TISSUE_SHARE = 0.03
#: the share of a picture's pixels exactly at its minimum from which that minimum is its background (digital images)
EXACT_BACKGROUND_SHARE = 0.05
#: the authors' crop or window stays unless it holds less of the tissue breast than the tissue's own by more than this
HOLD_MARGIN = 0.02
#: ... or, for a crop, unless its box is more than this many times the tissue breast's box (a film's background)
OVERSIZE = 2.0


def _block_means(arr: np.ndarray, j: int) -> np.ndarray:
    """Means of ``j`` x ``j`` blocks (the last ones padded with the edge's values)."""
    if j == 1:
        return arr.astype(np.float64)
    h, w = arr.shape
    pad = ((0, -(-h // j) * j - h), (0, -(-w // j) * j - w))
    blocks = np.pad(arr.astype(np.float32), pad, mode="edge")
    return blocks.reshape(blocks.shape[0] // j, j, blocks.shape[1] // j, j).mean(axis=(1, 3), dtype=np.float64)


def _otsu(values: np.ndarray) -> float:
    """Otsu's threshold of ``values`` (256 bins up to the 99.5th percentile, so that lettering does not stretch
    them): the largest value of the darker class."""
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
    """The value above which a pixel of ``picture`` is tissue, or None when nothing stands out from the background.

    A picture whose background is exact (at least :data:`EXACT_BACKGROUND_SHARE` of its pixels equal its minimum, as on
    digital mammograms and the authors' files): that minimum. Else (digitised film: a noisy background above 0) Otsu's
    threshold splits the darker background from the tissue, and the threshold is 0.4 of the way from the background's
    median up to it, so that the faint skin line stays tissue; tissue whose median does not lie above the background's
    99th percentile by at least the background's own spread (its 1st to 99th percentile) is none (a film of noise, or
    of a slope of the background)."""
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
    """The breast as the largest tissue region of a picture, whatever its scale, its lettering, rulers, tape or clips:
    ``(mask, k)``, ``mask`` a boolean picture of ``k`` x ``k`` file pixels per pixel (its pixel ``(i, j)`` covers the
    file's rows ``i k`` to ``(i + 1) k``), all False when no region is large enough to be a breast.

    The picture is the block means of ``image`` (about :data:`TISSUE_PIXELS` along the longer side), thresholded by
    :func:`tissue_threshold`, opened by a disc whose radius is :data:`TISSUE_OPENING` of the picture's longer side
    (beyond the border is background: a ruler or lettering along the edge goes), its largest component kept, its holes
    filled; a region under :data:`MIN_TISSUE_SHARE` of the picture is no breast. ``image`` ``(H, W)`` may be every
    ``step``-th pixel of the file (a thumbnail); ``k`` counts the file's pixels."""
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
    """Whether the box ``own`` (``top, left, bottom, right``) holds more of the tissue breast than ``authors`` by more
    than :data:`HOLD_MARGIN`."""
    return breast_share(tissue, k, authors) < breast_share(tissue, k, own) - HOLD_MARGIN


def file_breast_box(image: np.ndarray, iterations: int = 100) -> tuple[tuple[int, int, int, int], str]:
    """The breast's box on a whole file, ``((top, bottom, left, right), source)``, end-exclusive, as the crop finds it
    (:func:`breast_crop`): the box of the authors' mask (:func:`file_breast_mask`, source ``"authors"``) unless the
    tissue breast (:func:`tissue_mask`) shows it wrong (it holds clearly less of the tissue breast, or it is more than
    :data:`OVERSIZE` times the tissue breast's box), then the tissue breast's box (source ``"tissue"``). Raises
    ``ValueError`` for an image without a pixel > 0."""
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
    """The crop of a 2-D mammogram and where it came from: ``(((top, left), (bottom, right)), source)``.

    Source ``"authors"``: the authors' crop (:func:`breast_crop_box` with ``tissue=False``), kept wherever it holds
    the breast, so that clean digital images keep it to the pixel. Source ``"tissue"``: the same box and buffer
    around the tissue breast (:func:`tissue_mask`), used when the authors' crop holds clearly less of the tissue
    breast than that box (lettering or a ruler taken for the breast) or when the authors' mask's box is more than
    :data:`OVERSIZE` times the tissue breast's (a film's noisy background above 0 taken for the breast). With
    ``tissue=False``, or when no tissue region is large enough to be a breast, the authors' crop.
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


def breast_crop_box(
    image: np.ndarray,
    iterations: int = 100,
    buffer: int = 50,
    chest_wall: str = "left",
    method: str = "fast",
    name: str = "",
    tissue: bool = True,
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The crop of a 2-D mammogram: ``((top, left), (bottom, right))``, end-exclusive (:func:`breast_crop` without
    its source).

    The authors' crop (``tissue=False``, or where it holds the breast): the bounding box of the opened mask of pixels
    > 0, grown by up to ``buffer`` px at the top, the bottom and the side away from the chest wall (``chest_wall`` is
    ``"left"``, ``"right"`` or ``"auto"`` to decide with :func:`chest_wall_side`), never beyond the image. ``name``
    (the file) starts the warning given when the erosions remove the whole foreground.
    """
    return breast_crop(image, iterations, buffer, chest_wall, method, name, tissue)[0]


def view_kind(view: str | None, default: str | None = "CC") -> str:
    """``"CC"`` or ``"MLO"``: which of the authors' two window rules applies to a view code.

    CC-like: CC, XCCL, XCCM, FB, CV; MLO-like: MLO, ML, LM, LMO, SIO, ISO, AT. Unknown or missing
    views use ``default`` (``None`` makes them an error).
    """
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
    """Where the window sits on the (flipped, cropped) image, all in that image's pixel coordinates.

    ``start`` is the window's top-left pixel and may be negative or reach past the image: those parts
    are zero padding. ``best_center`` is the authors' ``(row, col)`` centre (their ``best_center``).
    """

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
    """The authors' window for a breast facing right (chest wall at column 0), see docs/preprocessing.md.

    Args:
        image: ``(H, W)`` or ``(1, H, W)``, already flipped to face right (and usually cropped).
        view: view code; CC-like views search the row, MLO-like ones take it from the bottom-most point.
        window: ``(rows, cols)`` of the window.
        mirrored: whether this image was mirrored to face right (matters only for
            ``reference_compatible``, see below).
        reference_compatible: reproduce the released code's integer conventions exactly (its
            ``best_center`` values): centre column = rightmost - cols//2 - 1 where "rightmost" of a
            mirrored image is one more than the pixel index (the code measures it as width - x on the
            unmirrored image), and for MLO centre row = bottom-most - rows//2 - 1. With ``False`` the
            window's last column is the rightmost breast column and (MLO) its last row the bottom-most
            breast row, as the spec's words say; the two differ by 1-2 px.
        iterations, method: the mask opening, as in :func:`open_breast_mask`.
        default_view: used when ``view`` is unknown (``None`` raises).
        name: the file, named by the warning given when the erosions remove the whole foreground.
        tissue: check the authors' window against the tissue breast (:func:`tissue_mask`): where it holds less of it
            than the same rule placed on the tissue breast (its mask for the opened mask and for the pixels > 0) by
            more than :data:`HOLD_MARGIN`, that window is the result (``source`` ``"tissue"``).

    Returns:
        a :class:`WindowPlacement`.
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
    """The best-centre rule on an image of ``shape``: ``opened`` its breast mask, ``positive`` the pixels the CC row
    search counts (> 0), ``nonzero`` the pixels whose last row caps an MLO's bottom-most point (!= 0)."""
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
    """Window start moved by ``offset`` (rows, cols), kept inside the padded canvas of the placement.

    The canvas is the union of the image and the unshifted window, so a shift never uncovers more
    padding than the deterministic window already had (the authors' noise rule: a window flush with
    the image edge only moves inwards).
    """
    out = []
    for start, size, extent, off in zip(placement.start, placement.size, image_shape, offset):
        lo = min(start, 0)
        hi = max(start + size, extent) - size
        out.append(int(np.clip(start + int(off), lo, hi)))
    return out[0], out[1]
