"""Unit tests of the training workflow's parts, each against an independent computation: the balanced epoch
sampler, per-epoch seeding, the best-metric record, the stage checkpointer (atomic writes, best model, resume,
previous stage), GLAM's prepare-batch and the mask stacking."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_identical
from ignite.engine import Engine, Events
from ignite.metrics import Metric
from monai.data import DataLoader, Dataset
from monai.engines import SupervisedEvaluator, SupervisedTrainer
from monai.handlers import LrScheduleHandler, ValidationHandler
from monai.transforms import Compose, RandFlipd, RandGaussianNoised

from scripts.transforms.targets import StackMasksd
from scripts.workflows import (
    BalancedEpochSampler,
    BestMetricState,
    EpochSeeder,
    GLAMPrepareBatch,
    StageCheckpointer,
    plain_state_dict,
    positive_flags,
    save_atomic,
)
from scripts.workflows import checkpoints as checkpoints_module

# ---------------------------------------------------------------------------------------------------------------
# positive_flags


def test_positive_flags_any_lesion_label_and_missing_labels_are_negative():
    items = [
        {"image": "a", "label": [0, 1]},
        {"image": "b", "label": [0, 0]},
        {"image": "c", "label": [1, 1]},
        {"image": "d", "label": None},
        {"image": "e"},
        {"image": "f", "label": [1.0, 0.0]},
        {"image": "g", "label": [True, False]},
    ]
    assert positive_flags(items) == [True, False, True, False, False, True, True]


@pytest.mark.parametrize("bad", [[2, 0], [0, -1], [0.5, 0], [], "yes", [[0, 1], [1]], [float("nan"), 0]])
def test_positive_flags_bad_label_names_the_item(bad):
    items = [{"image": "ok.png", "label": [0, 1]}, {"image": "bad_one.png", "label": bad}]
    with pytest.raises(ValueError) as err:
        positive_flags(items)
    assert "item 1" in str(err.value) and "bad_one.png" in str(err.value)


# ---------------------------------------------------------------------------------------------------------------
# BalancedEpochSampler


def _flags(n_pos: int, n_neg: int, seed: int = 0) -> list[bool]:
    flags = np.array([True] * n_pos + [False] * n_neg)
    np.random.default_rng(seed).shuffle(flags)
    return flags.tolist()


def _epoch(sampler: BalancedEpochSampler, epoch: int) -> list[int]:
    sampler.set_epoch(epoch)
    return list(sampler)


def test_each_epoch_is_all_positives_plus_as_many_distinct_negatives():
    flags = _flags(7, 20)
    pos = {i for i, f in enumerate(flags) if f}
    neg = {i for i, f in enumerate(flags) if not f}
    sampler = BalancedEpochSampler(flags, seed=5)
    assert len(sampler) == 14
    for epoch in range(6):
        indices = _epoch(sampler, epoch)
        assert len(indices) == 14 and len(set(indices)) == 14  # no repeats
        assert pos <= set(indices)
        assert len(set(indices) & neg) == 7


def test_epochs_are_reshuffled_and_draw_different_negatives():
    flags = _flags(10, 30)
    sampler = BalancedEpochSampler(flags, seed=1)
    epochs = [_epoch(sampler, e) for e in range(5)]
    orders = {tuple(e) for e in epochs}
    negative_sets = {frozenset(i for i in e if not flags[i]) for e in epochs}
    assert len(orders) == 5 and len(negative_sets) == 5
    # positives are not simply listed first: the epoch is one shuffled sequence
    assert any(not all(flags[i] for i in e[:10]) for e in epochs)


def test_negatives_are_drawn_uniformly_over_epochs():
    flags = _flags(6, 18, seed=2)
    neg = [i for i, f in enumerate(flags) if not f]
    sampler = BalancedEpochSampler(flags, seed=0)
    n_epochs = 3000
    counts = dict.fromkeys(neg, 0)
    for epoch in range(n_epochs):
        for i in sampler.epoch_indices(epoch):
            if not flags[i]:
                counts[i] += 1
    p = 6 / 18  # each negative is one of the 6 drawn out of 18
    expected, sd = n_epochs * p, math.sqrt(n_epochs * p * (1 - p))
    assert all(abs(c - expected) < 5 * sd for c in counts.values()), counts


def test_same_epoch_same_indices_across_instances_and_calls():
    flags = _flags(5, 12)
    a = BalancedEpochSampler(flags, seed=3)
    b = BalancedEpochSampler(flags, seed=3)  # a fresh process resuming at epoch 4
    first = _epoch(a, 4)
    _epoch(a, 5)
    assert _epoch(a, 4) == first == _epoch(b, 4)
    assert _epoch(BalancedEpochSampler(flags, seed=4), 4) != first


@pytest.mark.parametrize("n_pos, n_neg, replicas", [(7, 20, 3), (6, 6, 4), (5, 1, 2)])
def test_rank_split_is_disjoint_and_covers_the_epoch(n_pos, n_neg, replicas):
    flags = _flags(n_pos, n_neg)
    full = BalancedEpochSampler(flags, seed=9).epoch_indices(2)
    shares = []
    for rank in range(replicas):
        s = BalancedEpochSampler(flags, seed=9, num_replicas=replicas, rank=rank)
        shares.append(_epoch(s, 2))
    n = len(full)
    per_rank = -(-n // replicas)
    assert all(len(share) == per_rank for share in shares)
    # position k of the padded epoch goes to rank k % replicas; padding repeats the epoch's first indices
    padded = (full * 2)[: per_rank * replicas]
    for rank, share in enumerate(shares):
        assert share == padded[rank::replicas]
    covered = [i for share in shares for i in share]
    assert set(covered) == set(full)
    assert len(covered) - n == per_rank * replicas - n  # only the padding is shared between ranks


def test_fewer_negatives_than_positives_uses_every_negative():
    flags = _flags(9, 3)
    sampler = BalancedEpochSampler(flags, seed=0)
    assert len(sampler) == 12
    for epoch in range(3):
        assert sorted(_epoch(sampler, epoch)) == list(range(12))


def test_no_positives_uses_every_image():
    sampler = BalancedEpochSampler([False] * 5, seed=0)
    assert sorted(_epoch(sampler, 0)) == list(range(5))


def test_no_negatives_and_negative_ratio():
    assert sorted(_epoch(BalancedEpochSampler([True] * 4), 1)) == [0, 1, 2, 3]
    flags = _flags(4, 20)
    sampler = BalancedEpochSampler(flags, negatives_per_positive=2.0)
    indices = _epoch(sampler, 0)
    assert len(indices) == 12 and sum(not flags[i] for i in indices) == 8


def test_sampler_rejects_bad_arguments():
    with pytest.raises(ValueError, match="non-empty"):
        BalancedEpochSampler([])
    with pytest.raises(ValueError, match="rank"):
        BalancedEpochSampler([True, False], num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="negatives_per_positive"):
        BalancedEpochSampler([True, False], negatives_per_positive=-1)


def test_sampler_drives_a_dataloader():
    flags = _flags(3, 10)
    sampler = BalancedEpochSampler(flags, seed=0)
    loader = DataLoader(list(range(len(flags))), batch_size=2, sampler=sampler)
    sampler.set_epoch(1)
    seen = torch.cat(list(loader)).tolist()
    assert seen == sampler.epoch_indices(1) and len(loader) == 3


# ---------------------------------------------------------------------------------------------------------------
# EpochSeeder


def _random_dataset(n: int = 6) -> Dataset:
    data = [{"img": np.full((1, 4, 4), float(i), dtype=np.float32)} for i in range(n)]
    transform = Compose([RandGaussianNoised(keys="img", prob=1.0, std=1.0), RandFlipd(keys="img", prob=0.5)])
    return Dataset(data, transform=transform)


def _draw(dataset: Dataset) -> list[np.ndarray]:
    return [np.asarray(dataset[i]["img"]) for i in range(len(dataset))]


def _engine_at(epoch: int) -> Engine:
    engine = Engine(lambda e, b: None)
    engine.state.epoch = epoch
    return engine


def test_epoch_seeder_same_epoch_same_transform_draws():
    dataset = _random_dataset()
    seeder = EpochSeeder(seed=7, datasets=[dataset])
    seeder(_engine_at(3))
    first = _draw(dataset)
    assert not np.array_equal(first[0], _draw(dataset)[0])  # the transforms are random ...
    seeder(_engine_at(3))
    again = _draw(dataset)
    # ... and reseeding with the epoch replays them, as does a fresh pipeline (a resumed process)
    fresh = _random_dataset()
    EpochSeeder(seed=7, datasets=[fresh])(_engine_at(3))
    from_fresh = _draw(fresh)
    for a, b, c in zip(first, again, from_fresh):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    seeder(_engine_at(4))
    assert not np.array_equal(first[0], _draw(dataset)[0])
    EpochSeeder(seed=8, datasets=[fresh])(_engine_at(3))
    assert not np.array_equal(first[0], _draw(fresh)[0])


def test_epoch_seeder_reseeds_targets_generators_and_global_rngs():
    flags = _flags(4, 8)
    sampler = BalancedEpochSampler(flags, seed=1)
    prepare = GLAMPrepareBatch(random_negatives=True, seed=1)
    gen = torch.Generator()
    seeder = EpochSeeder(seed=2, targets=[sampler, prepare, None], generators=[gen])
    batch = {"image": torch.zeros(2, 1, 8, 8), "label": torch.tensor([[0.0, 0.0], [1.0, 0.0]])}

    def draws():
        return (
            list(sampler),
            torch.rand(3, generator=prepare(batch)[3]["generator"]).tolist(),
            torch.rand(3, generator=gen).tolist(),
            torch.rand(3).tolist(),
            np.random.rand(3).tolist(),
            [random.random() for _ in range(3)],
        )

    seeder(_engine_at(5))
    assert sampler.epoch == 5 and prepare.epoch == 5
    first = draws()
    seeder(_engine_at(6))
    other = draws()
    seeder(_engine_at(5))
    assert draws() == first
    assert all(a != b for a, b in zip(first, other))


def test_epoch_seeder_makes_dataloader_workers_reproducible():
    """With worker processes, each worker reseeds the transforms from the loader generator's draw."""
    dataset = _random_dataset(8)
    gen = torch.Generator()
    loader = DataLoader(dataset, batch_size=2, num_workers=2, generator=gen)
    seeder = EpochSeeder(seed=0, datasets=[dataset], generators=[gen])

    def epoch(e):
        seeder(_engine_at(e))
        return torch.cat([b["img"] for b in loader])

    first = epoch(1)
    second = epoch(2)
    assert not torch.equal(first, second)
    assert torch.equal(epoch(1), first)


# ---------------------------------------------------------------------------------------------------------------
# GLAMPrepareBatch


def test_prepare_batch_random_patches_for_negatives_only():
    label = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    batch = {"image": torch.randn(5, 1, 16, 8), "label": label}
    image, target, args, kwargs = GLAMPrepareBatch(random_negatives=True)(batch, torch.device("cpu"))
    expected = [not any(row) for row in label.tolist()]
    assert kwargs["random_patch_mask"].tolist() == expected
    assert isinstance(kwargs["generator"], torch.Generator)
    assert torch.equal(image, batch["image"]) and torch.equal(target, label) and args == ()
    # global and joint training: no patch arguments; evaluation: labels and masks
    assert GLAMPrepareBatch()(batch)[3] == {}
    mask = torch.zeros(5, 2, 16, 8)
    _, target, _, kwargs = GLAMPrepareBatch(with_masks=True)({**batch, "mask": mask})
    assert set(target) == {"label", "mask"} and torch.equal(target["mask"], mask) and kwargs == {}


def test_prepare_batch_generator_depends_on_seed_and_epoch_only():
    batch = {"image": torch.zeros(1, 1, 4, 4), "label": torch.zeros(1, 2)}

    def draw(prepare, epoch):
        prepare.set_epoch(epoch)
        return torch.rand(4, generator=prepare(batch)[3]["generator"])

    a, b = GLAMPrepareBatch(random_negatives=True, seed=3), GLAMPrepareBatch(random_negatives=True, seed=3)
    first = draw(a, 2)
    assert torch.equal(draw(b, 2), first)
    assert not torch.equal(draw(a, 3), first)
    assert not torch.equal(draw(GLAMPrepareBatch(random_negatives=True, seed=4), 2), first)
    # within an epoch the generator goes on (the next batch gets other patches)
    a.set_epoch(2)
    gen = a(batch)[3]["generator"]
    torch.rand(4, generator=gen)
    assert not torch.equal(torch.rand(4, generator=a(batch)[3]["generator"]), first)


@pytest.mark.parametrize("shape", [(3,), (3, 1), (3, 3), (3, 2, 1), (2, 2)])
def test_prepare_batch_bad_label_shape_raises(shape):
    batch = {"image": torch.zeros(3, 1, 4, 4), "label": torch.zeros(shape)}
    with pytest.raises(ValueError, match="label"):
        GLAMPrepareBatch()(batch)


def test_prepare_batch_missing_keys_and_bad_mask_raise():
    with pytest.raises(ValueError, match="'label'"):
        GLAMPrepareBatch()({"image": torch.zeros(1, 1, 4, 4)})
    batch = {"image": torch.zeros(2, 1, 4, 4), "label": torch.zeros(2, 2)}
    with pytest.raises(ValueError, match="'mask'"):
        GLAMPrepareBatch(with_masks=True)(batch)
    with pytest.raises(ValueError, match="'mask'"):
        GLAMPrepareBatch(with_masks=True)({**batch, "mask": torch.zeros(2, 2, 4, 5)})


# ---------------------------------------------------------------------------------------------------------------
# StackMasksd


def test_stack_masks_zeros_for_missing_masks():
    image = torch.zeros(1, 6, 4)
    malignant = torch.zeros(1, 6, 4)
    malignant[0, 2:4, 1] = 1
    out = StackMasksd(keys=["mask_benign", "mask_malignant"])({"image": image, "mask_malignant": malignant})
    assert out["mask"].shape == (2, 6, 4) and out["mask"].dtype == torch.float32
    assert torch.equal(out["mask"][0], torch.zeros(6, 4)) and torch.equal(out["mask"][1], malignant[0])
    assert "mask_benign" not in out and "mask_malignant" not in out
    for empty in (None, "", "  "):
        out = StackMasksd()({"image": image, "mask_benign": empty, "mask_malignant": np.ones((6, 4))})
        assert torch.equal(out["mask"], torch.stack([torch.zeros(6, 4), torch.ones(6, 4)]))
    kept = StackMasksd(remove_keys=False)({"image": image, "mask_benign": np.ones((6, 4))})
    assert "mask_benign" in kept


def test_stack_masks_size_mismatch_names_the_key():
    data = {"image": torch.zeros(1, 6, 4), "mask_benign": torch.zeros(1, 6, 4), "mask_malignant": torch.zeros(6, 5)}
    with pytest.raises(ValueError, match="mask_malignant"):
        StackMasksd()(data)
    with pytest.raises(ValueError, match="reference"):
        StackMasksd()({"mask_benign": torch.zeros(6, 4)})
    with pytest.raises(ValueError, match="mask_benign.*path"):
        StackMasksd()({"image": torch.zeros(1, 6, 4), "mask_benign": "masks/a.png"})


# ---------------------------------------------------------------------------------------------------------------
# BestMetricState


def test_best_metric_state_survives_a_checkpoint_before_the_next_validation():
    evaluator = Engine(lambda e, b: None)
    evaluator.state.best_metric, evaluator.state.best_metric_epoch = -1, -1
    record = BestMetricState()
    record.attach(evaluator)
    record.load_state_dict({"best_metric": 0.7, "best_metric_epoch": 3})
    # a checkpoint written before the evaluator ran again (val_interval > 1) keeps the restored record
    assert record.state_dict() == {"best_metric": 0.7, "best_metric_epoch": 3}
    evaluator.run([0])
    assert (evaluator.state.best_metric, evaluator.state.best_metric_epoch) == (0.7, 3)
    # later the evaluator's own record is what gets saved
    evaluator.state.best_metric, evaluator.state.best_metric_epoch = 0.9, 6
    assert record.state_dict() == {"best_metric": 0.9, "best_metric_epoch": 6}


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
    assert sorted(os.listdir(tmp_path)) == ["last.pt", "model.pt"]


def test_only_rank_zero_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoints_module, "_is_rank_zero", lambda: False)
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
    parser.update({"stage": "global", "selection_metric": name})
    metrics = parser.get_parsed_content("validate#metrics")
    key = parser.get_parsed_content("validate#key_metric")
    additional = parser.get_parsed_content("validate#additional_metrics")
    assert list(key) == [name] and key[name] is metrics[name]
    assert set(additional) == set(metrics) - {name} and len(metrics) == 6


def test_key_metric_names_the_choices_when_unknown():
    from scripts.workflows import key_metric

    with pytest.raises(
        ValueError, match=r"selection_metric 'val_dice' is not a validation metric; choose one of \['a', 'b'\]"
    ):
        key_metric({"b": 1, "a": 2}, "val_dice")
