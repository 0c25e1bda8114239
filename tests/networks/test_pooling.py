import numpy as np
import pytest
import torch
from references import numpy_top_t

from scripts.pooling import TopTPooling, num_top_values, top_t_pool


@pytest.mark.parametrize("size", [(1, 1), (3, 5), (46, 30), (92, 60), (184, 120), (17, 129)])
@pytest.mark.parametrize("t", [0.01, 0.03, 0.2, 0.3, 0.5, 1.0])
def test_top_t_pooling_equals_numpy_sort_and_mean(size, t):
    rng = np.random.default_rng(hash((size, t)) % 2**32)
    x = rng.random((3, 2) + size).astype(np.float32)
    pooled = TopTPooling(t)(torch.from_numpy(x))
    assert pooled.shape == (3, 2)
    np.testing.assert_allclose(pooled.numpy(), numpy_top_t(x, t), rtol=1e-5, atol=1e-6)


def test_top_t_k_values_from_the_spec():
    # 3% of the 184x120 S_0 map: 662.4 -> 662 values; a single value is always kept.
    assert num_top_values(184 * 120, 0.03) == 662
    assert num_top_values(46 * 30, 0.03) == 41
    assert num_top_values(10, 0.01) == 1


def test_t_equal_one_is_global_average_pooling():
    x = torch.rand(2, 2, 7, 9)
    torch.testing.assert_close(top_t_pool(x, 1.0), x.mean(dim=(-2, -1)))


@pytest.mark.parametrize("t", [0, -0.1, 1.5, float("nan"), "0.1", True])
def test_invalid_t_is_rejected_naming_the_argument(t):
    with pytest.raises(ValueError, match="t must be"):
        TopTPooling(t)


def test_pooling_rejects_maps_without_spatial_dims():
    with pytest.raises(ValueError, match="TopTPooling expects"):
        TopTPooling(0.1)(torch.rand(4, 2))
