import numpy as np
import pytest
import torch
from references import numpy_top_t

from scripts.aggregation import ConcatTopTAggregation, FusionHead, GatedAttentionAggregation


def bag(b=3, k=5, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, k, 2, 6, 6, generator=g), torch.randn(b, k, d, generator=g)


def test_concat_pools_all_patches_of_a_class_jointly():
    maps, feats = bag()
    out = ConcatTopTAggregation(t=0.2)(maps, feats)
    # reference: put the K maps of a class side by side and pool the concatenated map
    side_by_side = maps.permute(0, 2, 3, 1, 4).reshape(3, 2, 6, 5 * 6).numpy()
    np.testing.assert_allclose(out["y_local"].numpy(), numpy_top_t(side_by_side, 0.2), rtol=1e-6)
    torch.testing.assert_close(out["z_local"], feats.mean(1))


def test_attention_weights_sum_to_one_and_equal_the_formula():
    maps, feats = bag()
    torch.manual_seed(0)
    att = GatedAttentionAggregation(in_features=16, hidden_features=8, t=0.25)
    out = att(maps, feats)
    torch.testing.assert_close(out["attention"].sum(1), torch.ones(3))
    a = att.attn_w(torch.tanh(att.attn_v(feats)) * torch.sigmoid(att.attn_u(feats))).squeeze(-1)
    alpha = torch.softmax(a, dim=1)
    torch.testing.assert_close(out["attention"], alpha)
    y_k = torch.from_numpy(numpy_top_t(maps.flatten(0, 1).numpy(), 0.25)).float().view(3, 5, 2)
    torch.testing.assert_close(out["y_local"], (alpha[..., None] * y_k).sum(1))
    torch.testing.assert_close(out["z_local"], (alpha[..., None] * feats).sum(1))


def test_attention_is_permutation_equivariant():
    maps, feats = bag()
    att = GatedAttentionAggregation(in_features=16, hidden_features=8)
    perm = torch.tensor([3, 0, 4, 1, 2])
    out, out_p = att(maps, feats), att(maps[:, perm], feats[:, perm])
    torch.testing.assert_close(out_p["attention"], out["attention"][:, perm])
    torch.testing.assert_close(out_p["y_local"], out["y_local"])
    torch.testing.assert_close(out_p["z_local"], out["z_local"])


def test_attention_mask_for_variable_number_of_patches():
    maps, feats = bag()
    att = GatedAttentionAggregation(in_features=16, hidden_features=8)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False], [False, True, False, True, False]])
    out = att(maps, feats, mask)
    assert (out["attention"][~mask] == 0).all()
    torch.testing.assert_close(out["attention"].sum(1), torch.ones(3))
    # an image with patches 0 and 1 only gives the same result as the bag of those two patches
    two = att(maps[1:2, :2], feats[1:2, :2])
    torch.testing.assert_close(out["y_local"][1:2], two["y_local"])
    with pytest.raises(ValueError, match="at least one patch"):
        att(maps, feats, torch.zeros(3, 5, dtype=torch.bool))


def test_bad_bags_are_rejected():
    maps, feats = bag()
    with pytest.raises(ValueError, match=r"patch_maps must be \(B, K, C, h, w\)"):
        ConcatTopTAggregation()(maps[0])
    with pytest.raises(ValueError, match="patch_features must be"):
        GatedAttentionAggregation(in_features=16)(maps, feats[:, :3])


def test_fusion_head_is_one_linear_layer_with_sigmoid():
    head = FusionHead(global_features=4, local_features=6)
    zg, zl = torch.randn(3, 4), torch.randn(3, 6)
    expected = torch.sigmoid(torch.cat([zg, zl], 1) @ head.linear.weight.T + head.linear.bias)
    torch.testing.assert_close(head(zg, zl), expected)
