"""The localisation metrics' reduction over images (scripts.metrics._common.nan_reduce, now torch.nanmean): the same
bits as the masked sums it replaced, and numpy's nanmean / nanstd, on values with NaNs, all-NaN classes and none."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from scripts.metrics._common import nan_reduce


def masked_sum_reduce(values: torch.Tensor, reduction: str) -> torch.Tensor:
    """The implementation nan_reduce had before torch.nanmean (kept here as the reference)."""
    valid = ~torch.isnan(values)
    count = valid.sum(dim=0)
    zeros = torch.zeros_like(values)
    mean = torch.where(valid, values, zeros).sum(dim=0) / count
    if reduction == "mean":
        return mean
    sq_dev = torch.where(valid, (values - mean) ** 2, zeros)
    return torch.sqrt(sq_dev.sum(dim=0) / count)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    same_nans = torch.equal(a.isnan(), b.isnan())
    return a.dtype == b.dtype and same_nans and torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("rows", [0, 1, 3, 50, 20_000])
@pytest.mark.parametrize("reduction", ["mean", "std"])
def test_nan_reduce_matches_the_masked_sums_bit_for_bit(dtype, rows, reduction):
    g = torch.Generator().manual_seed(rows)
    values = (torch.rand(rows, 3, generator=g, dtype=torch.float64) * 2 - 0.5).to(dtype)
    values[torch.rand(rows, 3, generator=g) < 0.4] = float("nan")
    if rows:
        values[:, 2] = float("nan")  # a class no image has
    got, expected = nan_reduce(values, reduction), masked_sum_reduce(values, reduction)
    assert _same_bits(got, expected), (got, expected)


def test_nan_reduce_against_numpy_and_the_empty_cases():
    values = torch.tensor([[0.5, float("nan"), float("nan")], [1.0, 0.25, float("nan")], [0.0, 0.75, float("nan")]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy warns on the all-NaN class
        mean, std = np.nanmean(values.numpy(), axis=0), np.nanstd(values.numpy(), axis=0)
    np.testing.assert_allclose(nan_reduce(values, "mean").numpy(), mean, rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(nan_reduce(values, "std").numpy(), std, rtol=1e-6, equal_nan=True)
    # hand-computed: class 0 mean 0.5, std sqrt(((0)^2 + 0.5^2 + 0.5^2) / 3); class 1 mean 0.5, std 0.25
    assert nan_reduce(values, "mean")[:2].tolist() == [0.5, 0.5]
    assert nan_reduce(values, "std")[1].item() == 0.25
    assert nan_reduce(values, "std")[0].item() == pytest.approx((0.5 / 3) ** 0.5)
    assert torch.isnan(nan_reduce(torch.empty(0, 2), "mean")).all()
    assert torch.isnan(nan_reduce(torch.empty(0, 2), "std")).all()
    with pytest.raises(ValueError, match="reduction must be one of"):
        nan_reduce(values, "median")
