"""Independent reference implementations (numpy and plain loops) that tests in several folders check the bundle's
torch code against: top-t% pooling, the paper's Algorithm 1, the pointing game, the ROC AUC."""

from __future__ import annotations

import math

import numpy as np


def numpy_top_t(x: np.ndarray, t: float) -> np.ndarray:
    """Independent reference: sort each map's values, average the largest k = max(1, round(n t))."""
    b, c = x.shape[:2]
    out = np.empty((b, c))
    for i in range(b):
        for j in range(c):
            values = np.sort(x[i, j].ravel())[::-1]
            k = max(1, int(round(values.size * t)))
            out[i, j] = values[:k].mean()
    return out


def loop_algorithm_1(saliency: np.ndarray, window: tuple[int, int], k: int) -> list[list[tuple[int, int]]]:
    """Straightforward reference: per image, min-max each class (constant map -> 0), sum the classes, then K
    times scan every window position in row-major order for the largest mean (first wins ties) and zero it."""
    results = []
    wh, ww = window
    for sample in saliency.astype(np.float64):
        total = np.zeros(sample.shape[1:])
        for cls in sample:
            span = cls.max() - cls.min()
            total += (cls - cls.min()) / span if span > 0 else 0.0
        corners = []
        for _ in range(k):
            best, best_pos = -np.inf, None
            for r in range(total.shape[0] - wh + 1):
                for c in range(total.shape[1] - ww + 1):
                    mean = total[r : r + wh, c : c + ww].mean()
                    if mean > best + 1e-9:
                        best, best_pos = mean, (r, c)
            corners.append(best_pos)
            r, c = best_pos
            total[r : r + wh, c : c + ww] = 0.0
        results.append(corners)
    return results


def loop_peak(m: np.ndarray) -> tuple[float, float, bool]:
    """Peak of one (H, W) map by loops: first maximal pixel row-major, then its runs right and down."""
    h, w = m.shape
    best, r, c = -math.inf, 0, 0
    for i in range(h):
        for j in range(w):
            if m[i, j] > best:
                best, r, c = m[i, j], i, j
    run_c = 0
    while c + run_c < w and m[r, c + run_c] == best:
        run_c += 1
    run_r = 0
    while r + run_r < h and m[r + run_r, c] == best:
        run_r += 1
    return r + (run_r - 1) / 2, c + (run_c - 1) / 2, bool(best > m.min())


def loop_pointing(pred: np.ndarray, mask: np.ndarray, tolerance: float, border: float, measure: str) -> np.ndarray:
    n, k, h, w = pred.shape
    out = np.full((n, k), np.nan)
    for i in range(n):
        for c in range(k):
            lesion = np.argwhere(mask[i, c] > 0)
            if len(lesion) == 0:
                continue
            r, col, valid = loop_peak(pred[i, c])
            if measure == "border":
                out[i, c] = float(min(r, h - 1 - r, col, w - 1 - col) <= border or not valid)
            else:
                dist = min(math.hypot(r - a, col - b) for a, b in lesion)
                out[i, c] = float(valid and dist <= tolerance)
    return out


def np_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney AUC: probability that a positive outscores a negative, ties counting one half."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0) + 0.5 * (diff == 0)).mean())
