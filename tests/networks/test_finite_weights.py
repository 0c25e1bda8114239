"""Finite or refused: the bundle's one checkpoint loader refuses weights holding NaN or Inf, naming the file, the
tensor and the count; every way a file can be unusable (empty, truncated, not a PyTorch file, pickled Python
objects, another model's weights) is one line naming the file; a save never writes non-finite tensors; the loss
turns a NaN probability into a NaN loss (not torch's assert); a non-finite inference output is an error record."""

from __future__ import annotations

import argparse
import math

import pytest
import torch
import torch.nn.functional as F

from scripts.errors import user_error
from scripts.networks import GLAMSaliencyNet
from scripts.networks.checkpoint_file import CheckpointError, NonFiniteError, non_finite_tensors, read_checkpoint
from scripts.networks.fast_inference import load_for_inference
from scripts.networks.weights import check_finite, load_checkpoint_file, load_weights, plain_state_dict, save_atomic

TINY = dict(patch_size=64, local_depth=18, local_width=4)
#: the tensor the tests corrupt (a convolution of the local module, as in the issue)
TENSOR = "local_network.dn_resnet.layer1.0.conv1.weight"


def tiny_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return plain_state_dict(GLAMSaliencyNet(**TINY))


def corrupt(state: dict[str, torch.Tensor], name: str = TENSOR, nan: int = 0, inf: int = 0) -> dict:
    """A copy of ``state`` whose tensor ``name`` holds ``nan`` NaN values then ``inf`` +Inf / -Inf values."""
    out = {k: v.clone() for k, v in state.items()}
    flat = out[name].view(-1)
    flat[:nan] = float("nan")
    flat[nan : nan + inf] = torch.tensor([float("inf"), float("-inf")]).repeat(inf)[:inf]
    return out


def one_line(err: BaseException) -> str:
    """What the command line prints: the user's error the excepthook finds in ``err``'s chain, as one line."""
    found = user_error(err)
    assert found is not None, f"not shown as a user's error: {err!r}"
    message = str(found)
    assert "\n" not in message.strip(), message
    return message


# -- non-finite weights --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("nan", "inf", "counts"), [(3, 0, "3 NaN values"), (0, 2, "2 Inf values"), (1, 1, "1 NaN and 1 Inf values")]
)
def test_load_weights_refuses_a_nan_or_inf_tensor_naming_file_tensor_and_count(tmp_path, nan, inf, counts):
    path = tmp_path / "model.pt"
    torch.save(corrupt(tiny_state(), nan=nan, inf=inf), path)
    network = GLAMSaliencyNet(**TINY)
    before = plain_state_dict(network)
    with pytest.raises(NonFiniteError) as err:
        load_weights(network, path)
    assert one_line(err.value).startswith(f"{path}: tensor {TENSOR} holds {counts}; the checkpoint is not usable")
    for key, value in plain_state_dict(network).items():  # nothing of the file went into the network
        assert torch.equal(value, before[key]), key


def test_load_for_inference_refuses_it_too_and_counts_every_bad_tensor(tmp_path):
    """The MONAI Label app and inference.yaml load through load_for_inference."""
    state = corrupt(corrupt(tiny_state(), nan=4), TENSOR.replace("conv1", "conv2"), inf=1)
    path = tmp_path / "two_bad.pt"
    torch.save(state, path)
    bad = [name for name, value in state.items() if value.is_floating_point() and not torch.isfinite(value).all()]
    assert len(bad) == 2  # independent of the loader: two tensors corrupted
    with pytest.raises(NonFiniteError, match=rf"tensor {TENSOR} holds 4 NaN values \(and 1 more tensor\(s\)"):
        load_for_inference(GLAMSaliencyNet(**TINY), path, precision="fp32")


def test_non_finite_tensors_counts_like_numpy():
    import numpy as np

    rng = np.random.default_rng(0)
    values = rng.normal(size=(5, 7)).astype(np.float32)
    values[rng.random((5, 7)) < 0.2] = np.nan
    values[0, 0], values[4, 6] = np.inf, -np.inf
    nested = {"a": torch.zeros(3), "b": {"c": torch.from_numpy(values), "d": torch.arange(4)}, "e": [torch.ones(2)]}
    assert non_finite_tensors(nested) == [("b.c", int(np.isnan(values).sum()), int(np.isinf(values).sum()))]
    assert non_finite_tensors({"a": torch.zeros(3), "steps": torch.arange(3)}) == []
    finite = {"x": torch.ones(2)}
    assert check_finite(finite, "f.pt") is finite


def test_a_last_pt_loads_its_network_and_its_non_finite_optimizer_state_is_refused(tmp_path):
    state = tiny_state()
    last = {"network": state, "optimizer": {"state": {0: {"exp_avg": torch.zeros(3)}}}, "trainer": {"epoch": 1}}
    save_atomic(last, tmp_path / "last.pt")
    network = load_weights(GLAMSaliencyNet(**TINY), tmp_path / "last.pt")
    assert all(torch.equal(v, state[k]) for k, v in plain_state_dict(network).items())
    last["optimizer"]["state"][0]["exp_avg"] = torch.tensor([0.0, float("nan"), 1.0])
    torch.save(last, tmp_path / "bad_last.pt")
    with pytest.raises(NonFiniteError, match=r"tensor optimizer.state.0.exp_avg holds 1 NaN value;"):
        load_checkpoint_file(tmp_path / "bad_last.pt")


def test_save_atomic_never_writes_non_finite_weights_and_keeps_the_file(tmp_path):
    path = tmp_path / "model.pt"
    save_atomic(tiny_state(), path)
    before = path.read_bytes()
    with pytest.raises(NonFiniteError) as err:
        save_atomic(corrupt(tiny_state(), inf=5), path)
    assert one_line(err.value) == (
        f"{path} not written: tensor {TENSOR} holds 5 Inf values; the file keeps its earlier content (if any)"
    )
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


# -- unusable files ------------------------------------------------------------------------------------------------
class _Pickled:
    pass


def _write_bad_files(folder) -> dict[str, tuple]:
    """name -> (path, the start of the expected message after the path)."""
    torch.save(tiny_state(), folder / "good.pt")
    data = (folder / "good.pt").read_bytes()
    files = {
        "empty": (b"", "is empty (0 bytes)"),
        "truncated": (data[: len(data) // 2], f"is truncated or damaged ({len(data) // 2} bytes;"),
        "text": (b"epoch,loss\n1,0.5\n", "is not a PyTorch checkpoint (17 bytes, starting b'epoc';"),
    }
    out = {}
    for name, (content, message) in files.items():
        (folder / f"{name}.pt").write_bytes(content)
        out[name] = (folder / f"{name}.pt", message)
    torch.save({"args": argparse.Namespace(lr=1), "model": tiny_state()}, folder / "pickled.pt")
    out["pickled"] = (folder / "pickled.pt", "holds Python objects (argparse.Namespace) besides tensors")
    torch.save({"encoder.weight": torch.zeros(2, 2), "head.bias": torch.zeros(2)}, folder / "foreign.pt")
    out["foreign"] = (folder / "foreign.pt", "do not match the network:")
    return out


@pytest.mark.parametrize("kind", ["empty", "truncated", "text", "pickled", "foreign"])
def test_each_unusable_file_is_one_line_naming_it(tmp_path, kind):
    path, message = _write_bad_files(tmp_path)[kind]
    with pytest.raises(ValueError) as err:
        load_weights(GLAMSaliencyNet(**TINY), path)
    line = one_line(err.value)
    assert str(path) in line and message in line, line
    if kind == "foreign":
        assert "missing key(s)" in line and "2 unexpected key(s) (encoder.weight, head.bias)" in line
    else:
        assert isinstance(err.value, CheckpointError)
    assert "Traceback" not in line and "\x1b" not in line  # torch's weights_only message has colour codes


def test_a_pickled_local_class_is_named_and_missing_files_stay_file_not_found(tmp_path):
    torch.save({"a": _Pickled()}, tmp_path / "obj.pt")
    with pytest.raises(CheckpointError, match=r"obj.pt holds Python objects \(.*_Pickled\) besides tensors"):
        read_checkpoint(tmp_path / "obj.pt")
    with pytest.raises(FileNotFoundError, match="nowhere.pt"):
        read_checkpoint(tmp_path / "nowhere.pt")


def test_the_settings_record_reader_says_the_same_one_line(tmp_path):
    """inference.yaml reads the checkpoint's settings record first: the same message as the loader's."""
    from scripts.networks.settings import read_checkpoint_settings

    path, message = _write_bad_files(tmp_path)["truncated"]
    with pytest.raises(CheckpointError) as err:
        read_checkpoint_settings(path)
    assert message in one_line(err.value) and str(path.resolve()) in str(err.value)


# -- the loss on NaN probabilities ---------------------------------------------------------------------------------
def test_bce_is_unchanged_for_finite_probabilities_and_nan_for_non_finite_ones():
    from scripts.losses import _bce

    torch.manual_seed(0)
    p = torch.rand(4, 2, requires_grad=True)
    target = torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    loss = _bce(p, target)
    loss.backward()
    reference_p = p.detach().clone().requires_grad_(True)
    reference = F.binary_cross_entropy(reference_p, target)
    reference.backward()
    assert torch.equal(loss.detach(), reference.detach()) and torch.equal(p.grad, reference_p.grad)
    # by hand: the mean of -[y log p + (1 - y) log(1 - p)]
    by_hand = -sum(math.log(p[i, j]) if target[i, j] else math.log(1 - p[i, j]) for i in range(4) for j in range(2)) / 8
    assert abs(float(loss) - float(by_hand)) < 1e-6
    for bad in (float("nan"), float("inf")):
        q = p.detach().clone()
        q[2, 1] = bad
        assert math.isnan(float(_bce(q, target)))  # torch's BCE raises "should be between 0 and 1" here
