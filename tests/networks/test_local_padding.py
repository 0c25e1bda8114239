"""The local network's padding (``local_padding_mode``): replication hides the patch's edge from the convolutions,
is the same network as setting every padded convolution's mode after building it, survives batch-norm fusion and
TorchScript, and is recorded and compared in checkpoints (inference builds an older checkpoint with zeros)."""

import pytest
import torch
from torch import nn

from scripts.networks import GLAM, GLAMSaliencyNet, checkpoint_setting
from scripts.networks.inference import checkpoint_settings, inference_settings
from scripts.networks.local_network import LocalNetwork
from scripts.networks.settings import SETTINGS_KEY, decode_settings, encode_settings
from scripts.networks.weights import load_weights

TINY = {"patch_size": 64, "local_depth": 18, "local_width": 4, "global_backbone": {"width": 4}}


def random_statistics(net: nn.Module, seed: int = 1) -> nn.Module:
    """Eval-mode batch norms with non-trivial statistics and affine parameters, so that no layer is an identity."""
    g = torch.Generator().manual_seed(seed)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
    return net.eval()


def local_pair(seed: int = 0) -> tuple[LocalNetwork, LocalNetwork]:
    """The same weights with zero and with replicate padding."""
    torch.manual_seed(seed)
    zeros = random_statistics(LocalNetwork(depth=18, width=4))
    torch.manual_seed(seed)
    replicate = random_statistics(LocalNetwork(depth=18, width=4, padding_mode="replicate"))
    return zeros, replicate


def test_every_padded_convolution_replicates_and_the_weights_are_the_same():
    zeros, replicate = local_pair()
    padded = [m for m in replicate.modules() if isinstance(m, nn.Conv2d) and m.padding != (0, 0)]
    # the 7x7 stem and the two 3x3 convolutions of each of ResNet-18's eight blocks
    assert len(padded) == 1 + 2 * 8 and all(m.padding_mode == "replicate" for m in padded)
    assert all(m.padding_mode == "zeros" for m in zeros.modules() if isinstance(m, nn.Conv2d))
    # the 1x1 shortcuts and the head pad nothing; the max-pool keeps its own padding (it never sees a padded zero)
    assert all(m.padding == (0, 0) for m in replicate.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1))
    a, b = zeros.state_dict(), replicate.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_constant_patch_gives_a_constant_map_only_with_replicate_padding():
    """A convolution over a constant image padded by replication sees the same neighbourhood everywhere, so every
    layer's output is constant and so is the patch map; zeros make the border cells differ from the inside."""
    zeros, replicate = local_pair()
    patch = torch.full((1, 1, 64, 64), 0.7)
    with torch.no_grad():
        flat = replicate(patch)["patch_maps"]
        framed = zeros(patch)["patch_maps"]
    assert flat.shape == (1, 2, 16, 16)
    spread = lambda m: float((m.amax(dim=(-2, -1)) - m.amin(dim=(-2, -1))).max())  # noqa: E731
    assert spread(flat) < 1e-6
    assert spread(framed) > 1e-3
    # the inside, beyond the border's reach, is the same in both
    assert torch.allclose(framed[..., 8, 8], flat[..., 8, 8], atol=1e-6)


def test_the_option_is_the_network_whose_convolutions_are_switched_after_building():
    """GLAM(local_padding_mode="replicate") against a zero-padded GLAM from the same seed whose padded local
    convolutions are set to replicate afterwards: the same weights, the same maps and scores."""
    torch.manual_seed(0)
    built = GLAM(stage="local", local_padding_mode="replicate", **TINY).eval()
    torch.manual_seed(0)
    switched = GLAM(stage="local", **TINY).eval()
    for m in switched.local_network.modules():
        if isinstance(m, nn.Conv2d) and m.padding != (0, 0):
            m.padding_mode = "replicate"
    x = torch.randn(2, 1, 256, 192, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = built.forward_all(x), switched.forward_all(x)
    for key in ("patch_boxes", "patch_maps", "y_local", "saliency"):
        assert torch.equal(a[key], b[key]), key
    torch.manual_seed(0)
    with torch.no_grad():
        c = GLAM(stage="local", **TINY).eval().forward_all(x)
    assert torch.equal(a["patch_boxes"], c["patch_boxes"]) and not torch.allclose(a["patch_maps"], c["patch_maps"])


def test_fused_and_scripted_inference_keep_the_padding():
    torch.manual_seed(0)
    net = random_statistics(GLAMSaliencyNet(local_padding_mode="replicate", num_patches_eval=2, **TINY))
    x = torch.randn(1, 1, 256, 160, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        eager = net(x)
        fused = net.fuse_for_inference()
        assert all(
            m.padding_mode == "replicate"
            for m in fused.local_network.modules()
            if isinstance(m, nn.Conv2d) and m.padding != (0, 0)
        )
        torch.testing.assert_close(fused(x), eager, rtol=1e-5, atol=1e-6)
        scripted = torch.jit.script(net)
        torch.testing.assert_close(scripted(x), eager, rtol=1e-5, atol=1e-6)


def test_recorded_compared_and_refused_by_name(tmp_path):
    torch.manual_seed(0)
    trained = GLAM(local_padding_mode="replicate", **TINY)
    state = trained.state_dict()
    assert decode_settings(state[SETTINGS_KEY])["local_padding_mode"] == "replicate"
    GLAM(local_padding_mode="replicate", **TINY).load_state_dict(state)
    with pytest.raises(ValueError, match=r'local_padding_mode: checkpoint "replicate", network "zeros"'):
        GLAM(**TINY).load_state_dict(state)
    # a checkpoint from before the setting was trained with zeros: inference builds it so
    older = dict(GLAM(**TINY).state_dict())
    record = decode_settings(older[SETTINGS_KEY])
    del record["local_padding_mode"]
    older[SETTINGS_KEY] = encode_settings(record)
    path = tmp_path / "older.pt"
    torch.save(older, path)
    assert checkpoint_setting(path, "local_padding_mode") == "zeros"
    net = GLAMSaliencyNet(**inference_settings(checkpoint_settings(path)))
    load_weights(net, path)
    assert net.local_network.dn_resnet.conv1.padding_mode == "zeros"


@pytest.mark.parametrize("value", ["reflect", "circular", None])
def test_other_modes_are_refused_before_any_weight_is_drawn(value):
    with pytest.raises(ValueError, match=f"local_padding_mode must be one of .*got {value!r}"):
        GLAM(local_padding_mode=value, **TINY)
    with pytest.raises(ValueError, match="local network padding_mode must be one of"):
        LocalNetwork(padding_mode=value)
