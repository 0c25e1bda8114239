import math

import pytest
import torch

from scripts.losses import GLAMLoss


def bce(p, y):
    return -(y * math.log(p) + (1 - y) * math.log(1 - p))


def outputs():
    return {
        "y_global": torch.tensor([[0.2, 0.9]]),
        "y_scales": torch.tensor([[[0.1, 0.8], [0.3, 0.9], [0.2, 0.6]]]),
        "saliency_scale0": torch.full((1, 2, 4, 4), 0.5),
        "saliency_scale1": torch.full((1, 2, 2, 2), 0.25),
        "saliency_scale2": torch.full((1, 2, 1, 1), 1.0),
        "y_local": torch.tensor([[0.4, 0.7]]),
        "patch_maps": torch.full((1, 3, 2, 2, 2), 0.1),
        "y_fusion": torch.tensor([[0.05, 0.95]]),
    }


def test_losses_against_hand_computed_values():
    y = torch.tensor([[0.0, 1.0]])
    lam = 0.01
    # global: per scale, BCE averaged over the 2 classes; L1 sums: 0.5*32 + 0.25*8 + 1*2 = 20
    l_g = sum((bce(a, 0) + bce(b, 1)) / 2 for a, b in [(0.1, 0.8), (0.3, 0.9), (0.2, 0.6)]) + lam * 20
    # local: L1 over the 3 patch maps: 0.1 * 3 * 2 * 4 = 2.4
    l_l = (bce(0.4, 0) + bce(0.7, 1)) / 2 + lam * 2.4
    l_f = (bce(0.05, 0) + bce(0.95, 1)) / 2
    assert GLAMLoss("global", lam)(outputs(), y).item() == pytest.approx(l_g, rel=1e-5)
    assert GLAMLoss("local", lam)(outputs(), y).item() == pytest.approx(l_l, rel=1e-5)
    assert GLAMLoss("joint", lam)(outputs(), y).item() == pytest.approx(l_g + l_l + l_f, rel=1e-5)
    assert set(GLAMLoss("joint", lam).components(outputs(), y)) == {
        "bce_global",
        "l1_global",
        "bce_local",
        "l1_local",
        "bce_fusion",
    }


def test_loss_errors():
    with pytest.raises(ValueError, match="stage must be"):
        GLAMLoss("fused")
    with pytest.raises(ValueError, match="lambda_sparsity"):
        GLAMLoss("global", -1.0)
    with pytest.raises(ValueError, match=r"target must be \(B, 2\)"):
        GLAMLoss("global")(outputs(), torch.tensor([1.0, 0.0]))
    out = outputs()
    del out["y_fusion"]
    with pytest.raises(ValueError, match="needs 'y_fusion'"):
        GLAMLoss("joint")(out, torch.tensor([[0.0, 1.0]]))
