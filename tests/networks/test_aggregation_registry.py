"""GLAM picks its aggregation by name through one registry: lookups name the argument and the choices, a
registered aggregation is built, trained, frozen, exported and recorded by GLAM without an edit of glam.py, and the
paper's two keep their attributes, state-dict keys and initial weights."""

import numpy as np
import pytest
import torch
from references import numpy_top_t
from torch import nn

from scripts.aggregation import (
    AGGREGATIONS,
    PAPER_AGGREGATION,
    GatedAttentionAggregation,
    Registry,
    register_aggregation,
)
from scripts.networks import GLAM, GLAMSaliencyNet
from scripts.networks.settings import SETTINGS_KEY, decode_settings
from scripts.pooling import top_t_pool

TINY = {
    "patch_size": 64,
    "local_depth": 18,
    "local_width": 4,
    "num_patches_train": 3,
    "num_patches_eval": 2,
    "global_backbone": {"width": 4},
}


def image(b: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, 1, 256, 192, generator=torch.Generator().manual_seed(seed))


class MaxPatchAggregation(nn.Module):
    """A test aggregation with a weight: the largest top-t% pooled patch score and the largest z_k, both scaled by a
    learned gate sigmoid(g) (so that the weight gets a gradient from L_l in the local stage, as DDP requires).

    Forward: patch_maps (B, K, C, h, w), patch_features (B, K, D) -> y_local (B, C), z_local (B, D)."""

    def __init__(self, t: float) -> None:
        super().__init__()
        self.t = t
        self.gate = nn.Parameter(torch.full((1,), 2.0))

    def forward(self, patch_maps: torch.Tensor, patch_features: torch.Tensor) -> dict[str, torch.Tensor]:
        gate = torch.sigmoid(self.gate)
        y_patches = top_t_pool(patch_maps, self.t, start_dim=3)  # (B, K, C)
        return {"y_local": gate * y_patches.amax(dim=1), "z_local": gate * patch_features.amax(dim=1)}


@pytest.fixture
def max_patch():
    """``aggregation="max_patch"`` for the test's duration."""
    spec = register_aggregation(
        "max_patch", lambda in_features, hidden_features, t: MaxPatchAggregation(t), description="test"
    )
    yield spec
    AGGREGATIONS.unregister("max_patch")


# -- the registry ---------------------------------------------------------------------------------------------------
def test_the_papers_aggregations_are_registered_under_their_attributes():
    assert AGGREGATIONS.names[:2] == ("concat", "attention")
    assert AGGREGATIONS.look_up("concat", "aggregation").attribute == "concat_aggregation"
    attention = AGGREGATIONS.look_up("attention", "aggregation")
    assert attention.attribute == "attention" and attention.joint_module
    assert isinstance(attention.factory(16, 8, 0.25), GatedAttentionAggregation)
    assert PAPER_AGGREGATION == {"local": "concat", "joint": "attention"}


@pytest.mark.parametrize(
    "name,match",
    [
        ("max", r"^aggregation must be one of \('concat', 'attention'\), got 'max'$"),
        ("concta", r"got 'concta' \(By 'concta', did you mean 'concat'\?\)"),
        (" concat", r"got ' concat' \(did you mean 'concat'\?\)"),  # not silently stripped: the record keeps it
        (["concat"], r"aggregation must be one of .*got \['concat'\]"),
        ("Concat", r"got 'Concat'"),  # names keep their case (a checkpoint records them)
    ],
)
def test_unknown_names_are_refused_with_the_argument_and_the_choices(name, match):
    with pytest.raises(ValueError, match=match):
        AGGREGATIONS.look_up(name, "aggregation")
    with pytest.raises(ValueError, match=match.replace("^", "")):
        GLAM(aggregation=name, **TINY)


def test_a_registry_refuses_a_name_twice_and_bad_names():
    registry = Registry("things", "for a test")
    registry.register("one", "the first")(1)
    assert registry.look_up("one", "thing") == 1 and "one" in registry and len(registry) == 1
    with pytest.raises(ValueError, match="'one' is already registered"):
        registry.register("one")
    with pytest.raises(ValueError, match="identifier"):
        registry.register("not a name")(2)
    registry.unregister("one")
    with pytest.raises(ValueError, match=r"thing must be one of \(\), got 'one'"):
        registry.look_up("one", "thing")
    with pytest.raises(ValueError, match="attribute of aggregation 'bad' must be a Python identifier"):
        register_aggregation("bad", lambda d, h, t: nn.Identity(), attribute="bad.attr")
    assert "bad" not in AGGREGATIONS


def test_an_attribute_glam_already_has_is_refused():
    register_aggregation("clash", lambda d, h, t: MaxPatchAggregation(t), attribute="local_network")
    try:
        with pytest.raises(ValueError, match="aggregation 'clash': GLAM already has an attribute 'local_network'"):
            GLAM(aggregation="clash", **TINY)
    finally:
        AGGREGATIONS.unregister("clash")


# -- a registered aggregation in GLAM -------------------------------------------------------------------------------
def test_a_registered_aggregation_is_built_used_and_recorded_by_glam(max_patch):
    torch.manual_seed(0)
    model = GLAM(stage="local", aggregation="max_patch", **TINY).eval()
    assert isinstance(model.max_patch_aggregation, MaxPatchAggregation) and model.aggregation_module() is (
        model.max_patch_aggregation
    )
    state = model.state_dict()
    assert {"max_patch_aggregation.gate", "attention.attn_v.weight"} <= set(state)
    assert decode_settings(state[SETTINGS_KEY])["aggregation"] == "max_patch"
    with torch.no_grad():
        out = model(image())
    assert "attention" not in out
    # y_l from the patch maps GLAM returns, computed independently: the largest top-t% score over the K patches,
    # gated
    maps = out["patch_maps"].numpy()  # (B, K, C, h, w)
    per_patch = np.stack([numpy_top_t(maps[:, k], 0.2) for k in range(maps.shape[1])], axis=1)  # (B, K, C)
    gate = 1.0 / (1.0 + np.exp(-2.0))  # sigmoid of the gate's initial value
    np.testing.assert_allclose(out["y_local"].numpy(), gate * per_patch.max(axis=1), rtol=1e-6)


@pytest.mark.parametrize("stage", ["global", "local", "joint"])
def test_a_registered_aggregation_trains_in_its_stages_only(max_patch, stage):
    from scripts.losses import GLAMLoss

    torch.manual_seed(0)
    model = GLAM(stage=stage, aggregation="max_patch", **TINY).train()
    out = model(image())
    GLAMLoss(stage=stage, lambda_sparsity=1e-3)(out, torch.tensor([[1.0, 0.0], [0.0, 1.0]])).backward()
    trainable = {n.split(".")[0] for n, p in model.named_parameters() if p.requires_grad}
    with_grad = {n.split(".")[0] for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum()}
    expected = {
        "global": {"global_network"},
        "local": {"local_network", "max_patch_aggregation"},
        # the joint stage trains the chosen aggregation, not the gated attention it holds for its checkpoints
        "joint": {"global_network", "local_network", "max_patch_aggregation", "fusion"},
    }[stage]
    assert trainable == with_grad == expected


def test_a_registered_aggregation_exports_with_torchscript(max_patch):
    torch.manual_seed(0)
    net = GLAMSaliencyNet(stage="joint", aggregation="max_patch", **TINY).eval()
    scripted = torch.jit.script(net)
    x = image(1, seed=3)
    with torch.no_grad():
        expected, got = net.forward_all(x), scripted.forward_all(x)
    assert set(got) == set(expected)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=1e-6, msg=key)
    # scripting compiled a copy: the eager network's modules and state dict are as they were
    assert "scripted_aggregation" not in net._modules and "scripted_aggregation.gate" not in net.state_dict()


def test_registering_an_aggregation_leaves_other_networks_unchanged(max_patch):
    torch.manual_seed(0)
    with_registration = GLAM(**TINY).state_dict()
    AGGREGATIONS.unregister("max_patch")
    try:
        torch.manual_seed(0)
        without = GLAM(**TINY).state_dict()
    finally:
        register_aggregation("max_patch", max_patch.factory)
    assert with_registration.keys() == without.keys()
    for key in without:
        assert torch.equal(with_registration[key], without[key]), key


def test_a_checkpoint_of_another_aggregation_is_refused(max_patch):
    saved = GLAM(aggregation="max_patch", **TINY).state_dict()
    with pytest.raises(ValueError, match='aggregation: checkpoint "max_patch", network null'):
        GLAM(**TINY).load_state_dict(saved)


# -- the paper's aggregations keep their layout ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs,active,held",
    [
        ({"stage": "local"}, "concat_aggregation", {"concat_aggregation", "attention"}),
        ({"stage": "joint"}, "attention", {"concat_aggregation", "attention"}),
        ({"stage": "joint", "aggregation": "concat"}, "concat_aggregation", {"concat_aggregation", "attention"}),
        ({"stage": "local", "aggregation": "attention"}, "attention", {"concat_aggregation", "attention"}),
        (
            {"stage": "local", "aggregation": "concat", "joint_modules": False},
            "concat_aggregation",
            {"concat_aggregation"},
        ),
    ],
)
def test_the_papers_aggregations_per_stage(kwargs, active, held):
    model = GLAM(**{**TINY, **kwargs})
    assert model.aggregation_module() is getattr(model, active)
    assert {name for name, _ in model.named_children()} - {"global_network", "local_network", "fusion"} == held
    if not kwargs.get("joint_modules", True):
        assert model.attention is None and model.fusion is None  # the authors' inference layout
