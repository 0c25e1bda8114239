"""Pointing game (Zhang et al., ECCV 2016): does the peak of a class's map fall on a lesion of that class?

A peak of a nearest-upsampled map counts at its block's centre; a constant map has no peak (a miss).
"""

from __future__ import annotations

import torch

from ..errors import UsageError
from ._common import PerImageMetric, check_inputs

POINTING_MEASURES = ("hit", "border")


def _run_length(equal: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """Length of the run of True in each row of ``equal`` (N, L) that begins at ``start`` (N,)."""
    positions = torch.arange(equal.shape[-1], device=equal.device)
    # the first False at or after start ends the run; none -> the row's end
    ends = torch.where(~equal & (positions >= start[:, None]), positions, equal.shape[-1]).amin(dim=-1)
    return ends - start


def map_peaks(y_pred: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Peak of every (B, C, H, W) map: rows, cols (B, C) (float, block centres) and ``valid`` (False: constant)."""
    b, c, h, w = y_pred.shape
    flat = y_pred.reshape(b * c, h * w)
    peak_value, index = flat.max(dim=-1)
    row, col = index // w, index % w
    maps = y_pred.reshape(b * c, h, w)
    picks = torch.arange(b * c, device=y_pred.device)
    along_row = maps[picks, row] == peak_value[:, None]  # (N, W): the peak's row
    along_col = maps[picks, :, col] == peak_value[:, None]  # (N, H): the peak's column
    run_c = _run_length(along_row, col)
    run_r = _run_length(along_col, row)
    centre_r = row.to(torch.float64) + (run_r - 1).to(torch.float64) / 2
    centre_c = col.to(torch.float64) + (run_c - 1).to(torch.float64) / 2
    valid = peak_value > flat.min(dim=-1).values
    return centre_r.reshape(b, c), centre_c.reshape(b, c), valid.reshape(b, c)


def compute_pointing_game(
    y_pred: torch.Tensor,
    y: torch.Tensor,
    tolerance: float = 0.0,
    border: float = 0.0,
    measure: str = "hit",
    check_values: bool = True,
) -> torch.Tensor:
    """Pointing game per image and class.

    Args:
        y_pred: (B, C, H, W) saliency maps in [0, 1].
        y: (B, C, H, W) binary lesion masks.
        tolerance: a hit when a lesion pixel lies within this many pixels of the peak.
        border: with ``measure="border"``, pixels from the image's edge that count as the border.
        measure: ``"hit"`` or ``"border"``.
        check_values: validate score range and mask values (one host synchronisation).

    Returns:
        (B, C) float64 1.0 / 0.0, NaN where the image has no lesion of that class.
    """
    if measure not in POINTING_MEASURES:
        raise UsageError(f"measure must be one of {POINTING_MEASURES}, got {measure!r}.")
    if not tolerance >= 0:
        raise UsageError(f"tolerance must be >= 0 pixels, got {tolerance}.")
    if not border >= 0:
        raise UsageError(f"border must be >= 0 pixels, got {border}.")
    y_pred, y = check_inputs(y_pred, y, check_values)
    b, c, h, w = y_pred.shape
    rows, cols, valid = map_peaks(y_pred)
    has_lesion = (y != 0).flatten(2).any(dim=-1)
    if measure == "border":
        edge = torch.minimum(torch.minimum(rows, (h - 1) - rows), torch.minimum(cols, (w - 1) - cols))
        value = (edge <= border) | ~valid
    else:
        # squared distance from the peak to the nearest lesion pixel, per image and class
        grid_r = torch.arange(h, device=y.device, dtype=torch.float64)
        grid_c = torch.arange(w, device=y.device, dtype=torch.float64)
        d2_rows = (grid_r[None, None, :] - rows[..., None]) ** 2  # (B, C, H)
        d2_cols = (grid_c[None, None, :] - cols[..., None]) ** 2  # (B, C, W)
        # min over lesion pixels of d2_rows[r] + d2_cols[c]: per row the nearest lesion column, then over rows
        inf = torch.tensor(float("inf"), device=y.device, dtype=torch.float64)
        lesion = y != 0
        nearest_in_row = torch.where(lesion, d2_cols[:, :, None, :], inf).amin(dim=-1)  # (B, C, H)
        d2 = (nearest_in_row + d2_rows).amin(dim=-1)
        value = (d2 <= float(tolerance) ** 2) & valid
    value = value.to(torch.float64)
    return torch.where(has_lesion, value, torch.full_like(value, float("nan")))


class PointingGameMetric(PerImageMetric):
    """Pointing-game hit rate (or share of peaks on the border) as a MONAI cumulative metric.

    ``get_buffer()`` gives (N, C) per-image 1 / 0 (NaN without a lesion of the class), ``aggregate()`` the (C,) rate.

    Args:
        tolerance, border, measure: as in :func:`compute_pointing_game`.
        check_values: check the scores' range and the masks' values on every call.
    """

    def __init__(
        self, tolerance: float = 0.0, border: float = 0.0, measure: str = "hit", check_values: bool = True
    ) -> None:
        super().__init__(check_values=check_values)
        if measure not in POINTING_MEASURES:
            raise UsageError(f"measure must be one of {POINTING_MEASURES}, got {measure!r}.")
        if not tolerance >= 0 or not border >= 0:
            raise UsageError(f"tolerance and border must be >= 0 pixels, got {tolerance} and {border}.")
        self.tolerance = float(tolerance)
        self.border = float(border)
        self.measure = measure

    def _compute_tensor(self, y_pred: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[override]
        if y is None:
            raise UsageError("y (the ground-truth masks) is required.")
        values = compute_pointing_game(y_pred, y, self.tolerance, self.border, self.measure, self.check_values)
        self._check_num_classes(y_pred)
        return values
