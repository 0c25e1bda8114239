"""TorchScript and ONNX exports of the inference network give the eager model's S_c (CPU).

Tolerances: TorchScript (traced) within 1e-6 (the same kernels run), ONNX Runtime within 1e-5 (other kernels).
Patch selection is traced as tensor operations (argmax, masking, gathers), so the exported graphs follow the
data: they are checked on inputs other than the one traced. Sizes are fixed at export (the window is fixed).
"""

import numpy as np
import pytest
import torch

from scripts.networks import GLAMSaliencyNet

SHAPE = (1, 1, 256, 160)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    net = GLAMSaliencyNet(patch_size=64, local_depth=18, local_width=4, num_patches_eval=2).eval()
    # non-trivial batch-norm statistics, so that eval-mode normalisation is part of what is compared
    g = torch.Generator().manual_seed(1)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return net


def inputs(n=3):
    return [torch.randn(SHAPE, generator=torch.Generator().manual_seed(100 + i)) for i in range(n)]


def test_forward_is_one_tensor_equal_to_s_c(model):
    x = inputs(1)[0]
    with torch.no_grad():
        out, full = model(x), model.forward_all(x)
    assert isinstance(out, torch.Tensor) and out.shape == (1, 2, 64, 40)
    assert torch.equal(out, full["saliency"])


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_torchscript_trace_matches_eager_on_new_inputs(model, tmp_path):
    with torch.no_grad():
        traced = torch.jit.trace(model, inputs(1)[0], check_trace=False)
    path = tmp_path / "model.ts"
    traced.save(str(path))
    loaded = torch.jit.load(str(path))
    for x in inputs():
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=1e-6)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_onnx_export_matches_eager_on_new_inputs(model, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    path = tmp_path / "model.onnx"
    torch.onnx.export(
        model, (inputs(1)[0],), str(path), input_names=["image"], output_names=["pred"], opset_version=18, dynamo=False
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for x in inputs():
        got = session.run(None, {"image": x.numpy()})[0]
        with torch.no_grad():
            np.testing.assert_allclose(got, model(x).numpy(), rtol=0, atol=1e-5)
