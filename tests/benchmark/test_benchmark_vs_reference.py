"""glam_benchmark/performance/vs_reference.py: the in-memory fix of the authors' window search and the stand-ins for the
modules their code imports (the timing itself is a benchmark, recorded in docs/performance.md)."""

import numpy as np
import torch

from glam_benchmark.performance import vs_reference as vs


def test_window_search_with_floor_division_matches_a_loop():
    rng = np.random.default_rng(0)
    maps = rng.random((2, 1, 9, 7)).astype(np.float32)
    maps[1, 0, 2:5, 4:7] += 3.0  # a clear best window whose column is not 0
    unused = lambda *a: (_ for _ in ()).throw(AssertionError("the avg path must not call the original"))  # noqa: E731
    corners = vs._max_window_with_floor_division(unused)(torch.from_numpy(maps), (3, 3))
    for b in range(2):
        sums = {(r, c): maps[b, 0, r : r + 3, c : c + 3].mean() for r in range(7) for c in range(5)}
        best = max(sums.values())
        expected = min(k for k, v in sums.items() if v == best)  # first maximum in row-major order
        assert tuple(corners[b, 0].tolist()) == expected and corners.dtype == torch.int64
    assert tuple(corners[1, 0].tolist()) == (2, 4)


def test_stand_in_conv3x3_is_a_padded_3x3_convolution_without_bias():
    conv = vs._conv3x3(4, 8, stride=2)
    assert conv.kernel_size == (3, 3) and conv.stride == (2, 2) and conv.padding == (1, 1) and conv.bias is None
    assert conv(torch.zeros(1, 4, 10, 10)).shape == (1, 8, 5, 5)
