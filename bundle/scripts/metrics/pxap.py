"""Pixel average precision (PxAP, Choe et al. 2020, as clovaai/wsolevaluation computes it; paper appendix E).

Image-level PxAP averages per-image APs, dataset-level pools the histograms; both count only images with a lesion of
the class.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from ..errors import UsageError
from ._common import PerImageMetric, all_reduce_sum, check_inputs, nan_reduce

LEVELS = ("image", "dataset")


def pxap_bin_edges(step: float = 0.001) -> np.ndarray:
    """The wsolevaluation histogram edges: ``np.arange(0, 1, step)`` then 1, 2, 3 (float64)."""
    if not 0.0 < step < 1.0:
        raise UsageError(f"step must be in (0, 1), got {step!r}.")
    return np.append(np.arange(0, 1, step, dtype=np.float64), [1.0, 2.0, 3.0])


@lru_cache(maxsize=16)
def _comparison_edges_np(step: float, double: bool) -> np.ndarray:
    edges = pxap_bin_edges(step)
    np_dtype = np.float64 if double else np.float32
    rounded = edges.astype(np_dtype)
    below = rounded.astype(np.float64) < edges
    rounded[below] = np.nextafter(rounded[below], np_dtype(np.inf))
    # numpy's last bin is closed: a score equal to the last edge belongs to it
    rounded[-1] = np.nextafter(rounded[-1], np_dtype(np.inf))
    return rounded


@lru_cache(maxsize=16)
def _comparison_edges(step: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # cached per device: a host-to-device copy on every call would be a needless transfer
    return torch.from_numpy(_comparison_edges_np(step, dtype == torch.float64).copy()).to(device)


def compute_pxap_histograms(
    y_pred: torch.Tensor, y: torch.Tensor, step: float = 0.001, check_values: bool = True
) -> torch.Tensor:
    """Histograms of the scores of negative and positive pixels, per image and class.

    Args:
        y_pred: (B, C, H, W) scores in [0, 1].
        y: (B, C, H, W) binary masks.
        step: threshold spacing (wsolevaluation's ``cam_curve_interval``).
        check_values: validate score range and mask values (one host synchronisation).

    Returns:
        (B, C, 2, n_bins) int64 counts on the inputs' device, negatives then positives, ascending bins; scores outside
        the edges are dropped, as ``numpy.histogram`` drops them.
    """
    y_pred, y = check_inputs(y_pred, y, check_values)
    b, c = y_pred.shape[:2]
    n_bins = len(pxap_bin_edges(step)) - 1
    width = n_bins + 1  # one spare slot per histogram collects dropped (out-of-range or NaN) scores
    scores = y_pred if y_pred.dtype == torch.float64 else y_pred.float()  # upcasts are exact
    boundaries = _comparison_edges(step, scores.dtype, scores.device)
    # right=True: index i with boundaries[i-1] <= x < boundaries[i], i.e. bin i-1; 0 and len(edges) are out of range
    idx = torch.bucketize(scores.contiguous(), boundaries, right=True, out_int32=True)
    idx.sub_(1).add_(width).remainder_(width)  # -1 -> spare slot n_bins; n_bins (above the top) stays there
    idx.add_(y.to(torch.int32).mul_(width))
    groups = torch.arange(b * c, dtype=torch.int32, device=idx.device).view(b, c, 1, 1)
    idx.add_(groups * (2 * width))
    # index_add_ rather than bincount: CUDA bincount reads the maximum back to the host to size its output
    counts = torch.zeros(b * c * 2 * width, dtype=torch.int64, device=idx.device)
    ones = torch.ones(1, dtype=torch.int64, device=idx.device).expand(idx.numel())
    counts.index_add_(0, idx.view(-1), ones)
    return counts.view(b, c, 2, width)[..., :n_bins]


def average_precision_from_histograms(hist: torch.Tensor) -> torch.Tensor:
    """wsolevaluation's AP from (..., 2, n_bins) histograms (negatives, positives; ascending bins).

    Returns:
        (...) float64 AP; NaN where there is no positive pixel.
    """
    h = hist.to(torch.float64)
    tp = h[..., 1, :].flip(-1).cumsum(-1)
    fp = h[..., 0, :].flip(-1).cumsum(-1)
    num_pos = tp[..., -1:]
    predicted = tp + fp
    precision = tp / predicted  # 0/0 = NaN at thresholds above every score; masked out below
    recall = tp / num_pos
    terms = precision[..., 1:] * torch.diff(recall, dim=-1)
    ap = torch.where(predicted[..., 1:] != 0, terms, torch.zeros_like(terms)).sum(-1)
    return torch.where(num_pos[..., 0] > 0, ap, torch.full_like(ap, float("nan")))


class PxAPMetric(PerImageMetric):
    """PxAP as a MONAI cumulative metric, image- and dataset-level from one pass, in a fixed (C, 2, n_bins) buffer.

    Args:
        level: default level of ``aggregate``: ``"image"`` or ``"dataset"``.
        step: threshold spacing; 0.001 is the paper's.
        check_values: check the scores' range and the masks' values on every call.
    """

    def __init__(self, level: str = "image", step: float = 0.001, check_values: bool = True) -> None:
        if level not in LEVELS:
            raise UsageError(f"level must be one of {LEVELS}, got {level!r}.")
        self.level = level
        self.step = float(step)
        self.n_bins = len(pxap_bin_edges(self.step)) - 1
        self._hist: torch.Tensor | None = None
        super().__init__(check_values=check_values)

    def reset(self) -> None:
        super().reset()
        self._hist = None

    def _compute_tensor(self, y_pred: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[override]
        if y is None:
            raise UsageError("y (the ground-truth masks) is required.")
        hist = compute_pxap_histograms(y_pred, y, self.step, self.check_values)
        self._check_num_classes(y_pred)
        has_lesion = hist[..., 1, :].sum(-1) > 0  # (B, C)
        pooled = (hist * has_lesion[..., None, None]).sum(0)  # (C, 2, n_bins)
        if self._hist is None:
            self._hist = pooled
        elif self._hist.device != pooled.device:
            raise UsageError(
                f"y_pred is on {pooled.device} but earlier batches were on {self._hist.device}; "
                "keep one device per epoch or call reset()."
            )
        else:
            self._hist += pooled
        return average_precision_from_histograms(hist)

    def get_histograms(self) -> torch.Tensor:
        """(C, 2, n_bins) int64 histograms pooled over the lesion images of every rank."""
        if self._hist is None:
            raise UsageError("PxAPMetric has no data: call it on at least one batch before aggregate().")
        return all_reduce_sum(self._hist)

    def aggregate(self, reduction: str = "mean", level: str | None = None) -> torch.Tensor:  # type: ignore[override]
        """(C,) PxAP per class at ``level`` (default ``self.level``); NaN for a class without lesion images."""
        level = self.level if level is None else level
        if level not in LEVELS:
            raise UsageError(f"level must be one of {LEVELS}, got {level!r}.")
        if level == "image":
            return nan_reduce(self._values(), reduction)
        if reduction != "mean":
            raise UsageError(
                f"reduction={reduction!r} is only defined for level='image'; dataset-level PxAP is a single AP "
                "per class (use reduction='mean')."
            )
        return average_precision_from_histograms(self.get_histograms())
