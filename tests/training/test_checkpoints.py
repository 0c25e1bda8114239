"""The stage checkpointer (scripts/training/checkpoints.py) on real MONAI engines: atomic writes, the best model,
exact resumption, the previous stage, rank zero, and the selection metric."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from conftest import assert_identical
from ignite.engine import Events
from ignite.metrics import Metric
from monai.data import DataLoader
from monai.engines import SupervisedEvaluator, SupervisedTrainer
from monai.handlers import LrScheduleHandler, ValidationHandler

from scripts.handlers.training_state import BestMetricState
from scripts.networks.weights import plain_state_dict, save_atomic
from scripts.training import checkpoints as checkpoints_module
from scripts.training.checkpoints import StageCheckpointer

# ---------------------------------------------------------------------------------------------------------------
# StageCheckpointer on real MONAI engines: a linear model, scripted validation scores


class ScriptedScore(Metric):
    """A key metric whose value at trainer epoch e is ``scores[e]``."""

    def __init__(self, scores: dict[int, float]):
        self.scores = scores
        super().__init__()

    def reset(self):
        pass

    def update(self, output):
        pass

    def compute(self):
        raise NotImplementedError

    def completed(self, engine, name):
        engine.state.metrics[name] = self.scores[engine.state.epoch]


def _weights(network: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy (state dicts alias the live parameters)."""
    return {k: v.detach().clone() for k, v in network.state_dict().items()}


def _loader(n: int = 6):
    g = torch.Generator().manual_seed(0)
    data = [{"image": torch.randn(3, generator=g), "label": torch.randn(2, generator=g)} for _ in range(n)]
    return DataLoader(data, batch_size=2)


class Run:
    """One training stage: trainer, evaluator, best-metric record and checkpointer, as train.yaml wires them."""

    def __init__(
        self,
        ckpt_dir,
        scores,
        max_epochs,
        *,
        resume=False,
        previous_model=None,
        init_seed=0,
        stop_at=None,
        val_interval=1,
        n_data=6,
    ):
        torch.manual_seed(init_seed)
        self.network = torch.nn.Linear(3, 2)
        self.optimizer = torch.optim.Adam(self.network.parameters(), lr=0.05)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.7)
        self.best = BestMetricState()
        self.evaluator = SupervisedEvaluator(
            device="cpu",
            val_data_loader=_loader(2),
            network=self.network,
            key_val_metric={"score": ScriptedScore(scores)},
            val_handlers=[self.best],
        )
        self.checkpointer = StageCheckpointer(
            ckpt_dir,
            save_dict={
                "network": self.network,
                "optimizer": self.optimizer,
                "lr_scheduler": self.scheduler,
                "best_metric": self.best,
            },
            evaluator=self.evaluator,
            previous_model=previous_model,
            resume=resume,
        )
        self.trainer = SupervisedTrainer(
            device="cpu",
            max_epochs=max_epochs,
            train_data_loader=_loader(n_data),
            network=self.network,
            optimizer=self.optimizer,
            loss_function=torch.nn.MSELoss(),
            train_handlers=[
                LrScheduleHandler(self.scheduler, print_lr=False),
                ValidationHandler(validator=self.evaluator, interval=val_interval, epoch_level=True),
                self.checkpointer,
            ],
        )
        self.snapshots: dict[int, dict] = {}
        self.trainer.add_event_handler(Events.EPOCH_COMPLETED, self._snapshot)
        self.started_state: dict = {}
        self.trainer.add_event_handler(Events.STARTED, self._started)
        if stop_at is not None:  # the process "dies" right after the checkpoint of this epoch
            self.trainer.add_event_handler(Events.EPOCH_COMPLETED(once=stop_at), lambda e: e.terminate())

    def _snapshot(self, engine):
        self.snapshots[engine.state.epoch] = _weights(self.network)

    def _started(self, engine):
        self.started_state = {
            "epoch": engine.state.epoch,
            "iteration": engine.state.iteration,
            "max_epochs": engine.state.max_epochs,
            "scheduler_epoch": self.scheduler.last_epoch,
            "best": (self.best.best_metric, self.best.best_metric_epoch),
            "weights": _weights(self.network),
        }

    def run(self):
        self.trainer.run()
        return self


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.fixture
def save_log(monkeypatch):
    """Which file names the checkpointer writes, in order."""
    written: list[str] = []
    original = checkpoints_module.save_atomic

    def spy(obj, path):
        written.append(Path(path).name)
        return original(obj, path)

    monkeypatch.setattr(checkpoints_module, "save_atomic", spy)
    return written


def test_model_pt_is_written_only_on_a_new_best(tmp_path, save_log):
    scores = {1: 0.3, 2: 0.5, 3: 0.4, 4: 0.5, 5: 0.45}
    run = Run(tmp_path, scores, max_epochs=5).run()
    # independent: epochs whose score beats every earlier one (strictly)
    new_best = [e for e in scores if all(scores[e] > scores[p] for p in scores if p < e)]
    assert new_best == [1, 2]
    # per epoch: model.pt (validation, on a new best) then last.pt
    expected = [name for e in scores for name in (["model.pt"] if e in new_best else []) + ["last.pt"]]
    assert save_log == expected
    assert_identical(_load(tmp_path / "model.pt"), run.snapshots[2], "model.pt")
    last = _load(tmp_path / "last.pt")
    assert last["best_metric"] == {"best_metric": 0.5, "best_metric_epoch": 2}
    assert_identical(last["network"], run.snapshots[5], "last.pt network")
    assert dict(last["trainer"]) == {"epoch_length": 3, "iteration": 15, "max_epochs": 5}
    assert last["lr_scheduler"]["last_epoch"] == 5


@pytest.mark.parametrize(
    "scores, val_interval",
    [
        ({1: 0.5, 2: 0.3, 3: 0.4, 4: 0.45}, 1),  # the best (epoch 1) predates the interruption
        ({2: 0.5, 4: 0.3}, 2),  # validation every 2nd epoch: the resumed epoch 3 saves without validating
    ],
)
def test_resume_restores_everything_and_matches_an_uninterrupted_run(tmp_path, save_log, scores, val_interval):
    reference = Run(tmp_path / "ref", scores, max_epochs=4, val_interval=val_interval).run()
    # a run killed during epoch 3: its last checkpoint is epoch 2's
    Run(tmp_path / "cut", scores, max_epochs=4, val_interval=val_interval, stop_at=2).run()
    saved = _load(tmp_path / "cut" / "last.pt")
    best_file = (tmp_path / "cut" / "model.pt").read_bytes()
    save_log.clear()
    resumed = Run(tmp_path / "cut", scores, max_epochs=4, val_interval=val_interval, resume=True, init_seed=99).run()

    # restored at start: weights, trainer position, scheduler, best record (not the fresh init of seed 99)
    started = resumed.started_state
    assert (started["epoch"], started["iteration"], started["max_epochs"]) == (2, 6, 4)
    assert started["scheduler_epoch"] == 2
    assert started["best"] == (saved["best_metric"]["best_metric"], saved["best_metric"]["best_metric_epoch"])
    assert_identical(started["weights"], saved["network"], "restored weights")
    # only epochs 3 and 4 were trained, and no new best: model.pt is the reference's (and untouched)
    assert sorted(resumed.snapshots) == [3, 4]
    assert "model.pt" not in save_log
    assert (tmp_path / "cut" / "model.pt").read_bytes() == best_file
    assert_identical(_load(tmp_path / "cut" / "model.pt"), _load(tmp_path / "ref" / "model.pt"), "model.pt")
    # the final state is the uninterrupted run's, to the bit: weights, Adam moments, scheduler, trainer, best
    assert_identical(_load(tmp_path / "cut" / "last.pt"), _load(tmp_path / "ref" / "last.pt"), "last.pt")
    best_epoch = max(scores, key=lambda e: (scores[e], -e))
    assert _load(tmp_path / "ref" / "last.pt")["best_metric"] == {
        "best_metric": scores[best_epoch],
        "best_metric_epoch": best_epoch,
    }
    assert_identical(reference.snapshots[4], resumed.snapshots[4], "final weights")


def test_resume_extends_a_finished_stage_and_refuses_to_shorten_it(tmp_path):
    scores = {e: 0.1 * e for e in range(1, 5)}
    Run(tmp_path, scores, max_epochs=2).run()
    longer = Run(tmp_path, scores, max_epochs=3, resume=True).run()
    assert sorted(longer.snapshots) == [3]
    assert dict(_load(tmp_path / "last.pt")["trainer"])["iteration"] == 9
    with pytest.raises(ValueError, match="beyond this run's 2 epochs"):
        Run(tmp_path, scores, max_epochs=2, resume=True).run()


def test_resume_with_changed_data_or_a_foreign_file_raises(tmp_path):
    scores = {1: 0.1, 2: 0.2}
    Run(tmp_path, scores, max_epochs=1).run()
    with pytest.raises(ValueError, match="iterations per epoch"):
        Run(tmp_path, scores, max_epochs=2, resume=True, n_data=8).run()
    save_atomic({"network": {}}, tmp_path / "last.pt")
    with pytest.raises(ValueError, match="lacks"):
        Run(tmp_path, scores, max_epochs=2, resume=True).run()
    (tmp_path / "last.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=str(tmp_path / "last.pt")):
        Run(tmp_path, scores, max_epochs=2, resume=True).run()


def test_resume_without_last_pt_starts_afresh(tmp_path):
    scores = {1: 0.1}
    fresh = Run(tmp_path / "a", scores, max_epochs=1).run()
    resumed = Run(tmp_path / "b", scores, max_epochs=1, resume=True).run()
    assert resumed.started_state["epoch"] == 0
    assert_identical(resumed.snapshots[1], fresh.snapshots[1], "weights")


def test_previous_stage_model_is_loaded_strictly(tmp_path):
    torch.manual_seed(123)
    previous = torch.nn.Linear(3, 2)
    save_atomic(plain_state_dict(previous), tmp_path / "prev.pt")
    run = Run(tmp_path / "stage", {1: 0.1}, max_epochs=1, previous_model=tmp_path / "prev.pt").run()
    assert_identical(run.started_state["weights"], plain_state_dict(previous), "loaded weights")

    save_atomic(plain_state_dict(torch.nn.Linear(3, 4)), tmp_path / "wrong_shape.pt")
    save_atomic({**plain_state_dict(previous), "extra": torch.zeros(1)}, tmp_path / "extra_key.pt")
    for name in ("wrong_shape.pt", "extra_key.pt"):
        with pytest.raises(ValueError) as err:
            Run(tmp_path / name, {1: 0.1}, max_epochs=1, previous_model=tmp_path / name).run()
        assert str(tmp_path / name) in str(err.value)
    with pytest.raises(FileNotFoundError, match="previous stage"):
        Run(tmp_path / "x", {1: 0.1}, max_epochs=1, previous_model=tmp_path / "missing.pt").run()


def test_save_atomic_failure_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_atomic({"w": torch.arange(4.0)}, path)
    before = path.read_bytes()
    with pytest.raises(Exception):  # noqa: B017 - pickling a lambda fails half-way through torch.save
        save_atomic({"w": torch.ones(1000), "f": lambda: 0}, path)

    def torn_save(obj, f):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(OSError, match="disk full"):
        save_atomic({"w": torch.zeros(4)}, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["last.pt"]  # no temporary file left behind
    assert torch.equal(_load(path)["w"], torch.arange(4.0))


def test_checkpointer_failure_during_save_keeps_last_pt(tmp_path, monkeypatch):
    run = Run(tmp_path, {1: 0.1, 2: 0.2}, max_epochs=1).run()
    before = (tmp_path / "last.pt").read_bytes()
    real_save = torch.save

    def failing_save(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        raise OSError("killed after writing")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError):
        run.checkpointer.save_last(run.trainer)
    assert (tmp_path / "last.pt").read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["last.pt", "model.pt", "selection.json"]


def test_only_rank_zero_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoints_module.idist, "get_rank", lambda: 1)
    Run(tmp_path, {1: 0.1}, max_epochs=1).run()
    assert not tmp_path.exists() or os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "value, expected",
    [(True, True), (False, False), ("true", True), ("False", False), ("0", False), ("yes", True), (0, False)],
)
def test_resume_flag_from_the_command_line(tmp_path, value, expected):
    # fire hands `--resume false` over as the string 'false', which must not mean "resume"
    checkpointer = StageCheckpointer(tmp_path, {"network": torch.nn.Linear(1, 1)}, resume=value)
    assert checkpointer.resume is expected


def test_resume_flag_rejects_other_text(tmp_path):
    with pytest.raises(ValueError, match="resume"):
        StageCheckpointer(tmp_path, {"network": torch.nn.Linear(1, 1)}, resume="maybe")


@pytest.mark.parametrize("name", ["val_soft_dice", "val_pointing_game"])
def test_selection_metric_picks_the_key_metric_and_leaves_the_others_additional(name):
    from conftest import BUNDLE_ROOT, REPO_ROOT
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(
        [str(BUNDLE_ROOT / "configs" / "train.yaml"), str(REPO_ROOT / "tests" / "configs" / "tiny.yaml")]
    )
    parser.update({"stage": "global", "selection_metric": name, "selection": {"metric": name, "reason": "test"}})
    metrics = parser.get_parsed_content("validate#metrics")
    key = parser.get_parsed_content("validate#key_metric")
    additional = parser.get_parsed_content("validate#additional_metrics")
    assert list(key) == [name] and key[name] is metrics[name]
    assert set(additional) == set(metrics) - {name} and len(metrics) == 8


def test_key_metric_names_the_choices_when_unknown():
    from scripts.handlers.training_state import key_metric

    with pytest.raises(
        ValueError, match=r"selection_metric 'val_dice' is not a validation metric; choose one of \['a', 'b'\]"
    ):
        key_metric({"b": 1, "a": 2}, "val_dice")


class _TwoModules(torch.nn.Module):
    """A network with two top-level submodules, as GLAM has ``global_network`` and ``local_network``."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(3, 2)
        self.second = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))


def test_previous_modules_take_only_the_named_submodules(tmp_path):
    torch.manual_seed(1)
    previous = _TwoModules()
    previous.second[1].running_mean.fill_(5.0)
    save_atomic(plain_state_dict(previous), tmp_path / "prev.pt")
    torch.manual_seed(2)
    network = _TwoModules()
    fresh = _weights(network)

    StageCheckpointer(
        tmp_path / "stage", {"network": network}, previous_model=tmp_path / "prev.pt", previous_modules=["first"]
    ).load(None)
    loaded = _weights(network)
    for key, value in loaded.items():
        expected = previous.state_dict()[key] if key.startswith("first.") else fresh[key]
        assert torch.equal(value, expected), key
    assert not torch.equal(loaded["second.1.running_mean"], previous.state_dict()["second.1.running_mean"])

    # None: the whole file, strictly (as before)
    StageCheckpointer(tmp_path / "all", {"network": network}, previous_model=tmp_path / "prev.pt").load(None)
    assert_identical(_weights(network), plain_state_dict(previous), "whole model")

    # a name the network lacks, a file without the module's weights, a module whose weights do not fit
    save_atomic({k: v for k, v in plain_state_dict(previous).items() if k.startswith("second.")}, tmp_path / "b.pt")
    save_atomic({"first.weight": torch.zeros(4, 3), "first.bias": torch.zeros(4)}, tmp_path / "shape.pt")
    cases = [("prev.pt", ["third"], "not a submodule"), ("b.pt", ["first"], "holds no weights of 'first'")]
    cases.append(("shape.pt", ["first"], r"first: 2 shape mismatch\(es\) \(weight \(4, 3\) vs \(2, 3\)"))
    for name, modules, message in cases:
        checkpointer = StageCheckpointer(
            tmp_path / "x", {"network": network}, previous_model=tmp_path / name, previous_modules=modules
        )
        with pytest.raises(ValueError, match=message) as err:
            checkpointer.load(None)
        assert str(tmp_path / name) in str(err.value)
    with pytest.raises(ValueError, match="list of submodule names"):
        StageCheckpointer(tmp_path / "y", {"network": network}, previous_modules="first")


def test_previous_modules_mapping_loads_a_whole_file_into_a_submodule(tmp_path):
    # {submodule: prefix}: "" takes the whole file (a CAM's model.pt under GMIC's global_network, which is one)
    torch.manual_seed(3)
    alone = torch.nn.Linear(3, 2)
    save_atomic(plain_state_dict(alone), tmp_path / "alone.pt")
    torch.manual_seed(4)
    network = _TwoModules()
    fresh = _weights(network)
    StageCheckpointer(
        tmp_path / "s", {"network": network}, previous_model=tmp_path / "alone.pt", previous_modules={"first": ""}
    ).load(None)
    loaded = _weights(network)
    assert torch.equal(loaded["first.weight"], alone.weight) and torch.equal(loaded["first.bias"], alone.bias)
    assert all(torch.equal(loaded[k], fresh[k]) for k in loaded if k.startswith("second."))
    # a named prefix: the file's "second." weights into "second"; an unknown prefix is named
    previous = _TwoModules()
    save_atomic(plain_state_dict(previous), tmp_path / "two.pt")
    StageCheckpointer(
        tmp_path / "t", {"network": network}, previous_model=tmp_path / "two.pt", previous_modules={"second": "second"}
    ).load(None)
    assert torch.equal(_weights(network)["second.0.weight"], previous.second[0].weight)
    with pytest.raises(ValueError, match="holds no weights of 'third'"):
        StageCheckpointer(
            tmp_path / "u",
            {"network": network},
            previous_model=tmp_path / "two.pt",
            previous_modules={"first": "third"},
        ).load(None)
    with pytest.raises(ValueError, match=r"mapping \{submodule: prefix in the file\}"):
        StageCheckpointer(tmp_path / "v", {"network": network}, previous_modules={"first": 1})


def _old_layout_last_pt(run: Run, path: Path) -> None:
    """``last.pt`` as StageCheckpointer wrote it before Ignite's ``Checkpoint`` did (0.10.0 and earlier): one
    ``torch.save`` of ``{name: state dict}`` over the save_dict and the trainer, the network as its plain CPU state
    dict, through the bundle's atomic write."""
    objects = {**run.checkpointer.save_dict, "trainer": run.trainer}
    state = {name: plain_state_dict(obj) if name == "network" else obj.state_dict() for name, obj in objects.items()}
    save_atomic(state, path)


def test_an_earlier_versions_last_pt_resumes_to_the_uninterrupted_run(tmp_path):
    scores = {1: 0.5, 2: 0.3, 3: 0.6, 4: 0.45}
    reference = Run(tmp_path / "ref", scores, max_epochs=4).run()
    cut = Run(tmp_path / "cut", scores, max_epochs=4, stop_at=2).run()
    # the layout did not change: the file the old code writes is, byte for byte, the one written now
    _old_layout_last_pt(cut, tmp_path / "old.pt")
    assert (tmp_path / "old.pt").read_bytes() == (tmp_path / "cut" / "last.pt").read_bytes()
    # resume from the earlier version's file (not from one the new code wrote)
    os.replace(tmp_path / "old.pt", tmp_path / "cut" / "last.pt")
    resumed = Run(tmp_path / "cut", scores, max_epochs=4, resume=True, init_seed=7).run()
    assert resumed.started_state["epoch"] == 2 and resumed.started_state["best"] == (0.5, 1)
    assert sorted(resumed.snapshots) == [3, 4]
    assert_identical(resumed.snapshots[4], reference.snapshots[4], "final weights")
    assert_identical(_load(tmp_path / "cut" / "last.pt"), _load(tmp_path / "ref" / "last.pt"), "last.pt")
    # epoch 3 was a new best after the resume: model.pt is the reference's epoch-3 model, a plain state dict
    best = _load(tmp_path / "cut" / "model.pt")
    assert type(best) is dict and all(t.device.type == "cpu" for t in best.values())
    assert_identical(best, reference.snapshots[3], "model.pt")
    assert_identical(best, _load(tmp_path / "ref" / "model.pt"), "model.pt")


def test_checkpoint_files_are_ignites_and_replace_without_a_gap(tmp_path, monkeypatch):
    # Ignite's Checkpoint writes both files through the atomic DiskSaver; it never deletes a file before replacing it
    from ignite.handlers import Checkpoint, DiskSaver

    calls: list[str] = []
    original = Checkpoint.__call__

    def spy(self, engine, *args, **kwargs):
        assert isinstance(self.save_handler, DiskSaver) and self.save_handler._atomic
        calls.append(self.filename_pattern)
        return original(self, engine, *args, **kwargs)

    monkeypatch.setattr(Checkpoint, "__call__", spy)
    removed: list[str] = []
    monkeypatch.setattr(os, "unlink", lambda path, *a, **k: removed.append(str(path)))
    Run(tmp_path, {1: 0.1, 2: 0.2, 3: 0.15}, max_epochs=3).run()
    assert calls == ["model.pt", "last.pt", "model.pt", "last.pt", "last.pt"]
    assert removed == []  # neither the old model.pt / last.pt nor a temporary file was removed
    assert sorted(os.listdir(tmp_path)) == ["last.pt", "model.pt", "selection.json"]


def test_tensors_are_moved_to_the_cpu_only_when_elsewhere():
    from scripts.training.checkpoints import _on_cpu

    state = {"w": torch.ones(2), "nested": [{"step": torch.tensor(3.0)}, (1, "a")], "lr": 0.1}
    assert _on_cpu(state) is state  # on the CPU already: the very object, so the file is what torch.save writes

    class Elsewhere(torch.Tensor):  # a tensor that reports another device, moved by .cpu()
        @property
        def device(self):
            return torch.device("cuda", 0)

        def cpu(self):
            return torch.Tensor(self).clone()

    away = torch.arange(3.0).as_subclass(Elsewhere)
    moved = _on_cpu({"a": {"m": away}, "b": [away], "c": 5})
    assert type(moved["a"]["m"]) is torch.Tensor and torch.equal(moved["a"]["m"], torch.arange(3.0))
    assert type(moved["b"][0]) is torch.Tensor and moved["c"] == 5
