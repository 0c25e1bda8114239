"""Per-epoch seeding and the best-metric record (scripts/handlers/training_state.py): same epoch, same draws."""

from __future__ import annotations

import random

import numpy as np
import torch
from ignite.engine import Engine
from monai.data import DataLoader, Dataset
from monai.transforms import Compose, RandFlipd, RandGaussianNoised
from test_sampler import _flags

from scripts.handlers.training_state import BestMetricState, EpochSeeder
from scripts.training.batch import GLAMPrepareBatch
from scripts.training.sampler import BalancedEpochSampler

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
