"""MONAI's model-zoo tools on the bundle: verify_net_in_out, ckpt_export (TorchScript) and onnx_export."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import BUNDLE_ROOT

from scripts.networks import GLAMSaliencyNet

TINY = {"patch_size": 64, "local_depth": 18, "local_width": 4}
TINY_ARGS = [arg for k, v in TINY.items() for arg in (f"--{k}", str(v))]


def tiny_args(ckpt) -> list[str]:
    """The tiny sizes, and ``ckpt_path``: inference.yaml builds ``network_def`` from the settings recorded in the
    checkpoint at ``ckpt_path`` (by default the shipped ``models/model.pt``, whose settings differ)."""
    return [*TINY_ARGS, "--ckpt_path", str(ckpt)]


def bundle_cli(*args: str) -> subprocess.CompletedProcess:
    # from the bundle folder, as the zoo runs its tools: `scripts` is importable from the working directory
    return subprocess.run(
        [sys.executable, "-m", "monai.bundle", *args, "--meta_file", "configs/metadata.json"],
        cwd=BUNDLE_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    net = GLAMSaliencyNet(**TINY).eval()
    path = tmp_path_factory.mktemp("ckpt") / "model.pt"
    torch.save(net.state_dict(), path)
    return net, path


def new_inputs():
    return [torch.randn(1, 1, 256, 160, generator=torch.Generator().manual_seed(7 + i)) for i in range(2)]


@pytest.mark.slow
def test_verify_net_in_out_at_the_metadata_shapes():
    res = bundle_cli("verify_net_in_out", "network_def", "--config_file", "configs/inference.yaml")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "data shape of network is verified with no error" in res.stderr + res.stdout


def test_ckpt_export_torchscript_equals_eager(tiny_checkpoint, tmp_path):
    net, ckpt = tiny_checkpoint
    out = tmp_path / "model.ts"
    res = bundle_cli(
        "ckpt_export", "network_def", "--filepath", str(out), "--ckpt_file", str(ckpt),
        "--config_file", "configs/inference.yaml", "--use_trace", "True", "--input_shape", "[1, 1, 256, 160]",
        *tiny_args(ckpt),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    ts = torch.jit.load(str(out))
    for x in new_inputs():
        with torch.no_grad():
            torch.testing.assert_close(ts(x), net(x), rtol=0, atol=1e-6)


def test_ckpt_export_scripted_as_the_model_zoo_ci_runs_it(tiny_checkpoint, tmp_path):
    """The zoo's verifier calls ckpt_export without use_trace: torch.jit.script compiles the network's code."""
    net, ckpt = tiny_checkpoint
    out = tmp_path / "model.ts"
    res = bundle_cli(
        "ckpt_export", "network_def", "--filepath", str(out), "--ckpt_file", str(ckpt),
        "--config_file", "configs/inference.yaml", *tiny_args(ckpt),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    ts = torch.jit.load(str(out))
    assert isinstance(ts, torch.jit.ScriptModule)
    # a scripted (not traced) module follows any input size, e.g. one it never saw
    other_size = torch.randn(2, 1, 320, 192, generator=torch.Generator().manual_seed(11))
    for x in [*new_inputs(), other_size]:
        with torch.no_grad():
            torch.testing.assert_close(ts(x), net(x), rtol=0, atol=1e-6)
            expected = net.forward_all(x)
            got = ts.forward_all(x)
        assert set(got) == set(expected)
        for key in expected:
            torch.testing.assert_close(got[key], expected[key], rtol=0, atol=1e-6, msg=key)


def test_onnx_export_equals_eager(tiny_checkpoint, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    net, ckpt = tiny_checkpoint
    out = tmp_path / "model.onnx"
    res = bundle_cli(
        "onnx_export", "network_def", "--filepath", str(out), "--ckpt_file", str(ckpt),
        "--config_file", "configs/inference.yaml", "--input_shape", "[1, 1, 256, 160]", "--use_trace", "True",
        # the TorchScript-based exporter: torch.export (torch's default) cannot trace data-dependent patch selection
        "--converter_kwargs", "{'dynamo': False, 'opset_version': 18}",
        *tiny_args(ckpt),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    for x in new_inputs():
        with torch.no_grad():
            np.testing.assert_allclose(session.run(None, {name: x.numpy()})[0], net(x).numpy(), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_shipped_model_exports_as_the_zoo_verifier_runs_it(tmp_path):
    """The model zoo's ci/verify_bundle.py torchscript step on the shipped models/model.pt: ckpt_export with the
    bundle's configs and no overrides (scripted). The TorchScript module equals the eager network at the metadata's
    input shape, and the output has the metadata's shape (which verify_net_in_out does not check)."""
    import json

    from monai.bundle import ConfigParser

    from scripts.networks.weights import load_weights

    out = tmp_path / "model.ts"
    res = bundle_cli(
        "ckpt_export", "network_def", "--filepath", str(out), "--ckpt_file", "models/model.pt",
        "--config_file", "configs/inference.yaml", "--bundle_root", ".",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    fmt = json.loads((BUNDLE_ROOT / "configs" / "metadata.json").read_text())["network_data_format"]
    parser = ConfigParser()
    parser.read_config(str(BUNDLE_ROOT / "configs" / "inference.yaml"))
    parser["bundle_root"] = str(BUNDLE_ROOT)
    net = load_weights(parser.get_parsed_content("network_def"), BUNDLE_ROOT / "models" / "model.pt").eval()
    ts = torch.jit.load(str(out))
    x = torch.randn(1, 1, *fmt["inputs"]["image"]["spatial_shape"], generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = net(x)
        torch.testing.assert_close(ts(x), expected, rtol=0, atol=1e-5)
    assert list(expected.shape) == [1, fmt["outputs"]["pred"]["num_channels"], *fmt["outputs"]["pred"]["spatial_shape"]]
