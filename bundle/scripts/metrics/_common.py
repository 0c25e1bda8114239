"""Pieces shared by the per-image localisation metrics: input checks, batching, NaN-aware reductions, distributed
sum."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ignite.distributed as idist
import torch
from monai.metrics import CumulativeIterationMetric
from monai.utils import convert_to_tensor

from ..errors import UsageError
from .buffer import CompactCumulative

REDUCTIONS = ("mean", "std")


def check_inputs(y_pred: Any, y: Any, check_values: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a batch and return it as plain tensors (no copy unless half precision).

    Args:
        y_pred: (B, C, H, W) scores in [0, 1], any real dtype (bf16 / fp16 become float32).
        y: (B, C, H, W) binary masks.
        check_values: also check the scores' range (NaN fails) and the masks' values: one host synchronisation.

    Raises:
        ValueError: naming ``y_pred`` or ``y`` and the problem.
    """
    if not isinstance(y_pred, torch.Tensor):
        raise UsageError(f"y_pred must be a torch.Tensor of shape (B, C, H, W), got {type(y_pred).__name__}.")
    if not isinstance(y, torch.Tensor):
        raise UsageError(f"y must be a torch.Tensor of shape (B, C, H, W), got {type(y).__name__}.")
    y_pred = convert_to_tensor(y_pred, track_meta=False)
    y = convert_to_tensor(y, track_meta=False)
    if y_pred.dtype in (torch.bfloat16, torch.float16):  # autocast outputs: sums and sorts need float32's precision
        y_pred = y_pred.float()
    if y_pred.ndim != 4:
        raise UsageError(f"y_pred must be 4-D (B, C, H, W), got shape {tuple(y_pred.shape)}.")
    if y.ndim != 4:
        raise UsageError(f"y must be 4-D (B, C, H, W), got shape {tuple(y.shape)}.")
    if y_pred.shape != y.shape:
        raise UsageError(f"y_pred and y must have the same shape, got {tuple(y_pred.shape)} and {tuple(y.shape)}.")
    if y_pred.device != y.device:
        raise UsageError(f"y_pred and y must be on the same device, got {y_pred.device} and {y.device}.")
    if y_pred.is_complex() or y_pred.dtype == torch.bool:
        raise UsageError(f"y_pred must hold real scores in [0, 1], got dtype {y_pred.dtype}.")
    if check_values and y_pred.numel() > 0:
        # one stacked flag tensor so that both checks cost a single synchronisation
        pred_bad = ~((y_pred >= 0) & (y_pred <= 1))  # NaN compares False, so it is caught here
        mask_bad = (y != 0) & (y != 1)
        flags = torch.stack([pred_bad.any(), mask_bad.any()]).tolist()
        if flags[0]:
            n_nan = int(torch.isnan(y_pred).sum()) if y_pred.is_floating_point() else 0
            finite = y_pred[~torch.isnan(y_pred)] if n_nan else y_pred
            rng = f"[{finite.min().item():.6g}, {finite.max().item():.6g}]" if finite.numel() else "[]"
            raise UsageError(
                f"y_pred must contain scores in [0, 1] without NaN; got {n_nan} NaN value(s) and range {rng}."
            )
        if flags[1]:
            bad = torch.unique(y[mask_bad])[:5].tolist()
            raise UsageError(f"y must be a binary mask (values 0 and 1 only); found other values, e.g. {bad}.")
    return y_pred, y


def nan_reduce(values: torch.Tensor, reduction: str) -> torch.Tensor:
    """Reduce (N, C) per-image values over the images, ignoring NaN (class absent in that image).

    Returns:
        (C,) mean or population std (ddof=0); NaN for a class without a defined value.
    """
    if reduction not in REDUCTIONS:
        raise UsageError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}.")
    mean = torch.nanmean(values, dim=0)
    if reduction == "mean":
        return mean
    return torch.sqrt(torch.nanmean((values - mean) ** 2, dim=0))


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum a copy of ``tensor`` over all ranks; a copy without a process group."""
    if idist.get_world_size() <= 1:
        return tensor.clone()
    return idist.all_reduce(tensor.clone(), op="SUM")


class PerImageMetric(CompactCumulative, CumulativeIterationMetric):
    """Base of the metrics whose buffer holds one value per image and class, NaN where undefined.

    Args:
        check_values: check the scores' range and the masks' values on every call (one host synchronisation).
    """

    def __init__(self, check_values: bool = True) -> None:
        self._num_classes: int | None = None
        super().__init__()
        self.check_values = check_values

    def reset(self) -> None:
        super().reset()
        self._num_classes = None

    def _check_num_classes(self, y_pred: torch.Tensor) -> None:
        """Raise when C differs from the earlier calls': the buffer stacks (C,) rows."""
        num_classes = int(y_pred.shape[1]) if y_pred.ndim > 1 else None
        if self._num_classes is None:
            self._num_classes = num_classes
        elif num_classes != self._num_classes:
            raise UsageError(
                f"y_pred has {num_classes} classes but earlier batches had {self._num_classes}; "
                "call reset() before switching to another task."
            )

    def _compute_list(self, y_pred: Any, y: Any = None, **kwargs: Any) -> Any:
        if (
            isinstance(y_pred, Sequence)
            and isinstance(y, Sequence)
            and len(y_pred) == len(y) > 0
            and all(isinstance(t, torch.Tensor) for t in (*y_pred, *y))
            and len({tuple(t.shape) for t in (*y_pred, *y)}) == 1
        ):
            y_pred_b = torch.stack([convert_to_tensor(t, track_meta=False).detach() for t in y_pred])
            y_b = torch.stack([convert_to_tensor(t, track_meta=False).detach() for t in y])
            return self._compute_tensor(y_pred_b, y_b, **kwargs)
        if y is None:
            raise UsageError("y (the ground-truth masks) is required.")
        return super()._compute_list(y_pred, y, **kwargs)

    def _values(self) -> torch.Tensor:
        """(N, C) per-image values gathered from all ranks."""
        buffer = self.get_buffer()
        if not isinstance(buffer, torch.Tensor):
            raise UsageError(f"{type(self).__name__} has no data: call it on at least one batch before aggregate().")
        return buffer

    def aggregate(self, reduction: str = "mean") -> torch.Tensor:  # type: ignore[override]
        """(C,) mean or population std over the images with a lesion of the class; NaN for none."""
        return nan_reduce(self._values(), reduction)
