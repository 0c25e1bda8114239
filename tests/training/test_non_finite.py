"""Finite or refused in training and evaluation: a stage stops at its first non-finite loss with one line (stage,
epoch, iteration), exit status 1, before anything is saved, so last.pt / model.pt keep their last finite weights;
non-finite weights at an epoch's end and an optimizer step that overflows float32 are one line too; a previous
stage's model or a checkpoint to evaluate holding NaN or Inf is refused, naming the file and the tensor; evaluation
says what is wrong with an empty, truncated, pickled or foreign file in one line."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import BUNDLE_ROOT, TINY_CONFIG, TRAIN_CONFIG, workflow_command
from ignite.engine import Events
from monai.data import DataLoader
from monai.engines import SupervisedTrainer

from scripts.errors import user_error
from scripts.handlers.finite import StopOnNonFinite, TrainingDivergedError
from scripts.networks.checkpoint_file import CheckpointError, NonFiniteError
from scripts.networks.weights import load_checkpoint_file, load_weights, plain_state_dict
from scripts.training.checkpoints import StageCheckpointer

EVAL_CONFIG = TRAIN_CONFIG.parent / "evaluate.yaml"
META = str(TRAIN_CONFIG.parent / "metadata.json")


def one_line(err: BaseException) -> str:
    """What the command line prints for ``err`` (GLAMWorkflow): one line."""
    found = user_error(err)
    assert found is not None, f"not shown as a user's error: {err!r}"
    assert "\n" not in str(found).strip(), str(found)
    return str(found)


def _loader(n: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    data = [{"image": torch.randn(3, generator=g), "label": torch.randn(2, generator=g)} for _ in range(n)]
    return DataLoader(data, batch_size=2)  # 4 iterations per epoch


class NanAt:
    """MSE, NaN at the given (1-based, global) iterations: a loss that diverges exactly there."""

    def __init__(self, *iterations: int) -> None:
        self.iterations, self.calls = set(iterations), 0

    def __call__(self, pred, target):
        self.calls += 1
        loss = torch.nn.functional.mse_loss(pred, target)
        return loss * float("nan") if self.calls in self.iterations else loss


def _trainer(tmp_path, loss, max_epochs=2, lr=0.01, first=()):
    """A MONAI trainer of a linear model with the stop handler (after the handlers ``first``) and the checkpointer,
    as train.yaml orders them; returns (trainer, network, checkpointer)."""
    torch.manual_seed(0)
    network = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(network.parameters(), lr=lr)
    checkpointer = StageCheckpointer(tmp_path / "global", {"network": network, "optimizer": optimizer})
    stop = StopOnNonFinite(stage="global", ckpt_dir=tmp_path / "global")
    trainer = SupervisedTrainer(
        device="cpu",
        max_epochs=max_epochs,
        train_data_loader=_loader(),
        network=network,
        optimizer=optimizer,
        loss_function=loss,
        train_handlers=[*first, stop, checkpointer],
    )
    return trainer, network, checkpointer


# -- the stop handler on a real MONAI trainer ------------------------------------------------------------------------
def test_the_first_nan_loss_stops_the_stage_before_its_checkpoints(tmp_path):
    trainer, network, _ = _trainer(tmp_path, NanAt(7))  # epoch 2, iteration 3 of 4
    epochs_saved = []
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: epochs_saved.append(e.state.epoch))
    with pytest.raises(TrainingDivergedError) as err:
        trainer.run()
    folder = tmp_path / "global"
    assert one_line(err.value) == (
        "stage global, epoch 2, iteration 3/4: the loss is NaN (learning rate 0.01); training stopped: last.pt in "
        f"{folder} keeps its last finite weights; lower --learning_rate (docs/training.md, 'Non-finite losses and "
        "weights')"
    )
    assert epochs_saved == [1] and trainer.state.iteration == 7
    # the step of iteration 7 made the network NaN; last.pt holds epoch 1, finite
    assert not all(torch.isfinite(p).all() for p in network.parameters())
    last = load_checkpoint_file(folder / "last.pt")
    assert last["trainer"]["iteration"] == 4
    assert all(torch.isfinite(v).all() for v in last["network"].values())


class PoisonAt:
    """After the optimizer's step of ``iteration``, one weight becomes ``value`` (the loss stays finite)."""

    def __init__(self, iteration: int, value: float) -> None:
        self.iteration, self.value = iteration, value

    def attach(self, engine) -> None:
        engine.add_event_handler(Events.ITERATION_COMPLETED, self)

    def __call__(self, engine) -> None:
        if engine.state.iteration == self.iteration:
            with torch.no_grad():
                engine.network.bias[1] = self.value


def test_non_finite_weights_after_an_epochs_last_step_stop_before_validation(tmp_path):
    trainer, _, _ = _trainer(tmp_path, torch.nn.MSELoss(), first=[PoisonAt(4, float("inf"))])
    with pytest.raises(TrainingDivergedError) as err:
        trainer.run()
    assert one_line(err.value).startswith(
        "stage global, epoch 1, iteration 4/4: the weights are not finite after this step: tensor bias holds 1 Inf "
        f"value (learning rate 0.01); training stopped: nothing was saved in {tmp_path / 'global'}; "
    )
    assert not (tmp_path / "global" / "last.pt").exists()


def test_a_step_that_fails_on_non_finite_weights_is_explained(tmp_path):
    """Weights poisoned mid-epoch (finite loss until then): the next forward fails in the loss; the line says why."""

    def strict_loss(pred, target):
        if not torch.isfinite(pred).all():
            raise RuntimeError("all elements of input should be between 0 and 1")  # torch's BCE on NaN
        return torch.nn.functional.mse_loss(pred, target)

    trainer, _, _ = _trainer(tmp_path, strict_loss, first=[PoisonAt(2, float("nan"))])
    with pytest.raises(TrainingDivergedError) as err:
        trainer.run()
    assert one_line(err.value).startswith(
        "stage global, epoch 1, iteration 3/4: the step failed (RuntimeError: all elements of input should be "
        "between 0 and 1) on weights that are not finite: tensor bias holds 1 NaN value (learning rate 0.01)"
    )


def test_an_optimizer_step_that_overflows_float32_is_one_line(tmp_path):
    trainer, _, _ = _trainer(tmp_path, torch.nn.MSELoss(), lr=1e40)
    with pytest.raises(TrainingDivergedError) as err:
        trainer.run()
    assert one_line(err.value).startswith(
        "stage global, epoch 1, iteration 1/4: the optimizer's step overflowed float32 (learning rate 1e+40)"
    )
    assert "without overflow" in str(err.value.__cause__)


def test_other_failures_go_on_unchanged(tmp_path):
    def broken(pred, target):
        raise KeyError("not a divergence")

    trainer, _, _ = _trainer(tmp_path, broken)
    with pytest.raises(KeyError, match="not a divergence"):
        trainer.run()


def test_a_finite_run_is_untouched(tmp_path):
    trainer, network, _ = _trainer(tmp_path, torch.nn.MSELoss())
    trainer.run()
    assert trainer.state.epoch == 2 and all(torch.isfinite(p).all() for p in network.parameters())


def test_the_checkpointer_refuses_to_write_non_finite_weights(tmp_path):
    trainer, network, checkpointer = _trainer(tmp_path, torch.nn.MSELoss(), max_epochs=1)
    trainer.run()
    folder = tmp_path / "global"
    before = (folder / "last.pt").read_bytes()
    with torch.no_grad():
        network.weight[0, 1] = float("nan")
    with pytest.raises(NonFiniteError) as err:
        checkpointer.save_last(trainer)
    assert one_line(err.value).startswith(f"{folder / 'last.pt'} not written: tensor network.weight holds 1 NaN value")
    assert (folder / "last.pt").read_bytes() == before


# -- a previous stage's model --------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [float("nan"), float("-inf")])
@pytest.mark.parametrize("modules", [None, ["0"]])
def test_a_non_finite_previous_model_is_refused_naming_the_tensor(tmp_path, value, modules):
    torch.manual_seed(0)
    previous = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    state = plain_state_dict(previous)
    state["1.weight"][1, 2] = value  # the second module: refused even when only the first is taken
    torch.save(state, tmp_path / "model.pt")
    network = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    before = plain_state_dict(network)
    checkpointer = StageCheckpointer(
        tmp_path / "local", {"network": network}, previous_model=tmp_path / "model.pt", previous_modules=modules
    )
    with pytest.raises(NonFiniteError) as err:
        checkpointer.load(None)
    kind = "NaN" if math.isnan(value) else "Inf"
    assert one_line(err.value).startswith(
        f"{tmp_path / 'model.pt'}: tensor 1.weight holds 1 {kind} value; the checkpoint is not usable"
    )
    assert all(torch.equal(v, before[k]) for k, v in plain_state_dict(network).items())


# -- evaluation ------------------------------------------------------------------------------------------------------
def tiny_network(stage: str) -> torch.nn.Module:
    """The tiny GLAM of a stage, as train.yaml + tests/configs/tiny.yaml build it."""
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(TINY_CONFIG)])
    parser["stage"] = stage
    return parser.get_parsed_content("network_def")


@pytest.fixture(scope="module")
def tiny_model():
    """The joint stage's tiny GLAM, its state dict."""
    torch.manual_seed(0)
    return plain_state_dict(tiny_network("joint"))


def _evaluate(tmp_path: Path, datalist: str, ckpt: Path):
    from monai.bundle import ConfigWorkflow

    wf = ConfigWorkflow(
        config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG), str(EVAL_CONFIG)],
        meta_file=META,
        workflow_type="infer",
        datalist=datalist,
        ckpt_root=str(tmp_path / "models"),
        output_root=str(tmp_path / "out"),
        ckpt_path=str(ckpt),
        device="$torch.device('cpu')",
    )
    wf.initialize()
    wf.run()


TENSOR = "local_network.dn_resnet.layer1.0.conv1.weight"


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_evaluation_refuses_a_non_finite_checkpoint_before_reading_data(tmp_path, tiny_datalist, tiny_model, value):
    state = {k: v.clone() for k, v in tiny_model.items()}
    state[TENSOR].view(-1)[:3] = value
    torch.save(state, tmp_path / "model.pt")
    with pytest.raises(RuntimeError) as err:  # MONAI wraps what a config expression raises
        _evaluate(tmp_path, tiny_datalist, tmp_path / "model.pt")
    kind = "NaN" if math.isnan(value) else "Inf"
    assert one_line(err.value).startswith(f"{tmp_path / 'model.pt'}: tensor {TENSOR} holds 3 {kind} values;")
    assert not (tmp_path / "out").exists()  # nothing evaluated, nothing written


@pytest.mark.parametrize("kind", ["empty", "truncated", "pickled", "foreign", "last"])
def test_evaluation_names_what_is_wrong_with_the_file(tmp_path, tiny_datalist, tiny_model, kind):
    import argparse

    ckpt = tmp_path / f"{kind}.pt"
    torch.save(tiny_model, tmp_path / "good.pt")
    data = (tmp_path / "good.pt").read_bytes()
    if kind == "empty":
        ckpt.write_bytes(b"")
    elif kind == "truncated":
        ckpt.write_bytes(data[: len(data) // 3])
    elif kind == "pickled":
        torch.save({"args": argparse.Namespace(lr=1e-3), "state_dict": tiny_model}, ckpt)
    elif kind == "foreign":
        torch.save(plain_state_dict(torch.nn.Linear(3, 2)), ckpt)
    else:  # a stage's last.pt, whose optimizer state went NaN
        torch.save({"network": tiny_model, "optimizer": {"m": torch.tensor([float("nan")])}, "trainer": {}}, ckpt)
    with pytest.raises(RuntimeError) as err:
        _evaluate(tmp_path, tiny_datalist, ckpt)
    line = one_line(err.value)
    expected = {
        "empty": f"checkpoint {ckpt} is empty (0 bytes)",
        "truncated": f"checkpoint {ckpt} is truncated or damaged ({len(data) // 3} bytes;",
        "pickled": f"checkpoint {ckpt} holds Python objects (argparse.Namespace) besides tensors",
        "foreign": f"model weights {ckpt} do not match the network: ",
        "last": f"{ckpt}: tensor optimizer.m holds 1 NaN value; the checkpoint is not usable",
    }[kind]
    assert line.startswith(expected), line
    if kind == "foreign":
        assert "2 unexpected key(s) (weight, bias)" in line
    else:
        assert isinstance(user_error(err.value), CheckpointError)


# -- the command line: a learning rate that makes the loss NaN -------------------------------------------------------
def _train(datalist: str, root: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [*workflow_command("training")]
    command += ["--config_file", f"['{TRAIN_CONFIG}','{TINY_CONFIG}']", "--meta_file", META]
    command += ["--datalist", datalist, "--ckpt_root", str(root / "models"), "--output_root", str(root / "out")]
    command += ["--stage", "global", "--epochs", "1", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(BUNDLE_ROOT)}
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_a_learning_rate_that_makes_the_loss_nan_stops_with_one_line_and_keeps_the_checkpoints(tmp_path, tiny_datalist):
    first = _train(tiny_datalist, tmp_path)  # a finished run at the tiny preset's learning rate
    assert first.returncode == 0, first.stderr[-3000:]
    folder = tmp_path / "models" / "global"
    before = {name: (folder / name).read_bytes() for name in ("model.pt", "last.pt")}

    diverged = _train(tiny_datalist, tmp_path, "--learning_rate", "1e30")  # afresh, over the finished run
    assert diverged.returncode == 1
    errors = [line for line in diverged.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in diverged.stderr, diverged.stderr[-3000:]
    (line,) = errors
    prefix = "error: TrainingDivergedError: stage global, epoch 1, iteration "
    assert line.startswith(prefix) and "/8: the loss is NaN (learning rate 1e+30); training stopped: " in line
    assert f"last.pt, model.pt in {folder} keep their last finite weights; lower --learning_rate" in line
    # the files of before, byte for byte, load into the network and are finite
    assert {name: (folder / name).read_bytes() for name in before} == before
    record = json.loads((folder / "selection.json").read_text())
    assert record["finished"] is False  # a rerun is refused until --resume / --overwrite says what to do
    network = tiny_network("global")
    for name in before:
        load_weights(network, folder / name)
        assert all(torch.isfinite(v).all() for v in network.state_dict().values() if v.is_floating_point())
