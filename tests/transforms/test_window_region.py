"""The cacheable half of the random window (BestCenterRegion: the window grown by max_shift; QuantizeToUint16) and its
per-step half (RandWindowShift): for every offset the pixels of RandBestCenterWindow, whose rule is
``shifted_window_start``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai.data import MetaTensor

from scripts.transforms.mammo import (
    BestCenterRegion,
    QuantizeToUint16,
    RandBestCenterWindow,
    RandWindowShift,
    RandWindowShiftd,
    StandardizeImage,
    WindowPlacement,
    window_shift_range,
)
from scripts.transforms.mammo.breast import shifted_window_start


def breast(h: int, w: int, seed: int) -> MetaTensor:
    """(1, h, w) float32: a textured half-ellipse against the left edge, background 0, integer values."""
    rows, cols = np.mgrid[:h, :w]
    inside = ((rows - h / 2) / (0.45 * h)) ** 2 + (cols / (0.8 * w)) ** 2 < 1
    texture = np.random.default_rng(seed).integers(1, 4000, size=(h, w))
    return MetaTensor(torch.from_numpy(np.where(inside, texture, 0).astype(np.float32))[None], meta={"view": "CC"})


@pytest.mark.parametrize("seed", range(30))
def test_clamping_into_the_range_is_the_shift_rule(seed):
    """For random placements (windows inside, overhanging or larger than the image) and every drawn offset,
    start + clamp(offset, range) is shifted_window_start's start."""
    rng = np.random.default_rng(seed)
    extent = (int(rng.integers(20, 80)), int(rng.integers(20, 80)))
    size = (int(rng.integers(10, 100)), int(rng.integers(10, 100)))
    start = (int(rng.integers(-30, extent[0])), int(rng.integers(-30, extent[1])))
    shift = (int(rng.integers(0, 12)), int(rng.integers(0, 12)))
    placement = WindowPlacement((0, 0), start, size, 0, 0, "CC")
    bounds = window_shift_range(placement, extent, shift)
    assert all(lo <= 0 <= hi for lo, hi in bounds)
    for dr in range(-shift[0], shift[0] + 1):
        for dc in range(-shift[1], shift[1] + 1):
            got = tuple(s + int(np.clip(o, lo, hi)) for s, o, (lo, hi) in zip(start, (dr, dc), bounds))
            assert got == shifted_window_start(placement, extent, (dr, dc))


@pytest.mark.parametrize("shape, window", [((90, 60), (64, 40)), ((40, 30), (64, 48)), ((70, 45), (70, 45))])
def test_region_then_shift_gives_the_random_windows_pixels(shape, window):
    """With the same random state, BestCenterRegion + RandWindowShift cut RandBestCenterWindow's window, also where
    the window overhangs or exceeds the image (zero padding) and where the region's margin reaches past it."""
    image = breast(*shape, seed=sum(shape))
    shift = (6, 5)
    region = BestCenterRegion(max_shift=shift, window=window, iterations=2)(image)
    assert tuple(region.shape[1:]) == (window[0] + 12, window[1] + 10)
    reference, per_step = (
        RandBestCenterWindow(max_shift=shift, window=window, iterations=2),
        RandWindowShift(window, shift),
    )
    reference.set_random_state(3)
    per_step.set_random_state(3)
    for _ in range(20):
        want = reference(image)
        got = per_step(region)
        assert torch.equal(got.as_tensor(), want.as_tensor())
    # without a draw the unshifted window: BestCenterWindow's
    unshifted = RandWindowShift(window, shift)(region, randomize=False)
    assert torch.equal(unshifted.as_tensor(), RandBestCenterWindow(max_shift=0, window=window, iterations=2)(image))


def test_the_shift_refuses_a_region_of_another_size_and_a_missing_range():
    region = torch.zeros(1, 30, 20)
    with pytest.raises(ValueError, match=r"not the window \(20, 10\) grown by max_shift \(4, 4\).*\(28, 18\)"):
        RandWindowShift((20, 10), 4)(region, torch.zeros(2, 2))
    with pytest.raises(ValueError, match="needs the region's window_shift_range"):
        RandWindowShift((22, 12), 4)(region)
    with pytest.raises(ValueError, match="run BestCenterRegiond first"):
        RandWindowShiftd(["image"], window=(22, 12), max_shift=4)({"image": region})


def test_quantize_keeps_integer_images_and_maps_others_linearly():
    integers = torch.tensor([[[0.0, 7.0, 4095.0]]])
    out = QuantizeToUint16()(MetaTensor(integers))
    assert out.dtype == torch.uint16 and out.tolist() == [[[0, 7, 4095]]]
    assert (out.meta["intensity_scale"], out.meta["intensity_offset"]) == (1.0, 0.0)
    # [-1, 0, 1]: offset -1, scale 2/65535; (0 + 1) / scale = 32767.5 rounds half to even
    signed = QuantizeToUint16()(MetaTensor(torch.tensor([[[-1.0, 0.0, 1.0]]])))
    assert signed.tolist() == [[[0, 32768, 65535]]]
    assert signed.meta["intensity_offset"] == -1.0 and signed.meta["intensity_scale"] == pytest.approx(2 / 65535)
    # fractions (a VOI LUT's output): zero stays 0, every value within half a step of its original
    x = torch.from_numpy(np.random.default_rng(0).uniform(0, 1000.5, (1, 50, 40)).astype(np.float32))
    x[0, :5] = 0
    q = QuantizeToUint16()(MetaTensor(x))
    back = q.as_tensor().double() * q.meta["intensity_scale"] + q.meta["intensity_offset"]
    assert (q[0, :5] == 0).all() and (back - x.double()).abs().max() <= q.meta["intensity_scale"] / 2 + 1e-9
    # the standardised model input does not need the original intensities
    torch.testing.assert_close(StandardizeImage()(q.as_tensor()), StandardizeImage()(x), rtol=0, atol=1e-4)
