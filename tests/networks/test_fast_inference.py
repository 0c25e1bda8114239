"""optimize_for_inference: float32 is the network itself; bf16 (folded batch norms, channels-last, autocast) keeps the
forward contract and stays within a few thousandths of float32 on the same patches."""

import pytest
import torch

from scripts.networks import (
    AutocastInference,
    GLAMSaliencyNet,
    fast_inference,
    optimize_for_inference,
    resolve_precision,
)

SMALL = dict(patch_size=64, local_depth=18, local_width=8, global_backbone={"width": 8}, num_patches_eval=2)


@pytest.fixture(scope="module")
def network_and_image():
    torch.manual_seed(0)
    net = GLAMSaliencyNet(**SMALL).eval()
    image = torch.randn(2, 1, 320, 192, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference = net.forward_all(image)
    return net, image, reference


def test_fp32_is_the_network_itself(network_and_image):
    net, image, reference = network_and_image
    fast = optimize_for_inference(net, "fp32")
    assert fast is net and not fast.training
    with torch.no_grad():
        torch.testing.assert_close(fast(image), reference["saliency"], rtol=0, atol=0)


def test_bf16_keeps_the_contract_and_is_close_on_the_same_patches(network_and_image):
    net, image, reference = network_and_image
    fast = optimize_for_inference(net, "bf16")
    assert isinstance(fast, AutocastInference) and fast.network is not net  # a copy: the caller's network unchanged
    assert all(not isinstance(m, torch.nn.BatchNorm2d) for m in fast.network.local_network.modules())
    out = fast.forward_all(image, patch_boxes=reference["patch_boxes"])
    assert set(out) == set(reference)
    for key, value in reference.items():
        assert out[key].shape == value.shape and out[key].dtype == value.dtype, key
    # bf16 has 8 significant bits: 2^-8 = 0.4 % of a probability near 1, a few such roundings through the network
    for key in ("y_global", "y_local", "y_fusion", "saliency_global", "patch_maps", "saliency"):
        assert (out[key] - reference[key]).abs().max() < 8e-3, key
    torch.testing.assert_close(fast(image), fast.forward_all(image)["saliency"], rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(net(image), reference["saliency"], rtol=0, atol=0)  # the original still fp32
    with pytest.raises(ValueError, match="is for inference"):
        fast.train()


def test_precision_auto_follows_the_device(monkeypatch):
    monkeypatch.setattr(fast_inference, "cpu_supports_bf16", lambda: True)
    assert resolve_precision("auto", "cpu") == "bf16"
    assert resolve_precision("auto", "cuda") == "bf16"  # the folded, channels-last bf16 copy on a GPU
    monkeypatch.setattr(fast_inference, "cpu_supports_bf16", lambda: False)
    assert resolve_precision("auto", "cpu") == "fp32"
    assert resolve_precision("auto", "cuda") == "bf16"  # whatever the CPU
    assert resolve_precision("bf16", "cpu") == "bf16" and resolve_precision("fp32", "cuda") == "fp32"
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("fp16", "cpu")


def test_the_inference_config_loads_the_weights_then_optimises(tmp_path):
    """inference.yaml's ``network``: the checkpoint loaded strictly into ``network_def``, then the precision's
    version of it (bf16 on this CPU when it has bf16 convolutions)."""
    from conftest import BUNDLE_ROOT
    from monai.bundle import ConfigParser

    torch.manual_seed(0)
    tiny = dict(patch_size=64, local_depth=18, local_width=4)
    ckpt = tmp_path / "model.pt"
    torch.save(GLAMSaliencyNet(**tiny).state_dict(), ckpt)
    for precision in ("bf16", "fp32"):
        parser = ConfigParser()
        parser.read_config(str(BUNDLE_ROOT / "configs" / "inference.yaml"))
        parser.update({"ckpt_path": str(ckpt), "precision": precision, "device": "$torch.device('cpu')", **tiny})
        network = parser.get_parsed_content("network")
        assert isinstance(network, AutocastInference) == (precision == "bf16")
        weights = network.network if precision == "bf16" else network
        saved = torch.load(ckpt, weights_only=True)
        expected = {k.removeprefix("global_network."): v for k, v in saved.items() if k.startswith("global_network.")}
        torch.testing.assert_close(weights.global_network.state_dict(), expected)
    # a checkpoint of another network is refused with the file named (through the config: MONAI wraps the error)
    from scripts.networks.weights import load_weights

    torch.save({"not": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(
        ValueError,
        match=r"other.pt do not match the network: \d+ missing key\(s\) \(global_net.*1 unexpected key\(s\) \(not\)",
    ):
        load_weights(GLAMSaliencyNet(**tiny), tmp_path / "other.pt")
    wide = GLAMSaliencyNet(**{**tiny, "local_width": 8}).state_dict()
    torch.save(wide, tmp_path / "wide.pt")
    with pytest.raises(
        ValueError,
        match=r"checkpoint .*wide.pt was trained with other model settings .*local_width: checkpoint 8, network 4",
    ):
        load_weights(GLAMSaliencyNet(**tiny), tmp_path / "wide.pt")
    del wide["model_settings"]  # a checkpoint from before the settings record: the shapes tell
    torch.save(wide, tmp_path / "wide_old.pt")
    with pytest.raises(ValueError, match=r"wide_old.pt do not match the network: \d+ shape mismatch\(es\) \(local_net"):
        load_weights(GLAMSaliencyNet(**tiny), tmp_path / "wide_old.pt")
    torch.save([torch.zeros(1)], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="list.pt: not a state dict"):
        load_weights(GLAMSaliencyNet(**tiny), tmp_path / "list.pt")
