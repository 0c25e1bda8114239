"""Ignite handlers of GLAM's workflows: per-epoch seeding, the best-metric record and the key metric by name."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import ignite.distributed as idist
import numpy as np
import torch
from ignite.engine import Engine, Events
from monai.data.utils import set_rnd

from ..errors import UsageError


def _metric_name(selection: Mapping[str, Any] | str) -> str:
    """The metric's name from a selection record (``{"metric": ...}``) or the name itself."""
    return str(selection["metric"] if isinstance(selection, Mapping) else selection)


def key_metric(metrics: Mapping[str, Any], name: Mapping[str, Any] | str) -> dict[str, Any]:
    """``{name: metrics[name]}``: the evaluator's ``key_val_metric`` chosen by name (or selection record)."""
    name = _metric_name(name)
    if name not in metrics:
        raise UsageError(f"selection_metric {name!r} is not a validation metric; choose one of {sorted(metrics)}")
    return {name: metrics[name]}


class EpochSeeder:
    """At every epoch's start, reseed every source of randomness from (seed, epoch, rank) alone.

    Ignite's ``DeterministicEngine`` misses the random states of MONAI's transforms, which a resumed run replays.

    Args:
        seed: base seed.
        targets: objects with ``set_epoch(epoch)`` (samplers, :class:`~scripts.training.batch.GLAMPrepareBatch`).
        datasets: datasets whose random transforms are reseeded.
        generators: ``torch.Generator`` objects (e.g. the DataLoader's) to reseed.
    """

    def __init__(
        self,
        seed: int = 0,
        targets: Sequence[Any] = (),
        datasets: Sequence[Any] = (),
        generators: Sequence[torch.Generator] = (),
    ) -> None:
        self.seed = int(seed)
        self.targets = [t for t in targets if t is not None]
        self.datasets = [d for d in datasets if d is not None]
        self.generators = [g for g in generators if g is not None]

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.EPOCH_STARTED, self)

    def __call__(self, engine: Engine) -> None:
        epoch = int(engine.state.epoch)
        # the rank keeps data-parallel processes from drawing the same numbers; samplers, which must agree on one
        # permutation across ranks, keep (seed, epoch) via set_epoch
        epoch_seed = (self.seed * 1_000_003 + epoch * 1_009 + idist.get_rank()) % (2**31)
        for target in self.targets:
            target.set_epoch(epoch)
        for dataset in self.datasets:
            set_rnd(dataset, epoch_seed)
        for generator in self.generators:
            generator.manual_seed(epoch_seed)
        torch.manual_seed(epoch_seed)
        np.random.seed(epoch_seed)
        random.seed(epoch_seed)


class BestMetricState:
    """Checkpointable record of an evaluator's best key metric (MONAI keeps it on the evaluator's state only)."""

    def __init__(self, evaluator: Engine | None = None) -> None:
        self.evaluator = evaluator
        self.best_metric = -1.0
        self.best_metric_epoch = -1
        self._restored = False

    def attach(self, engine: Engine) -> None:
        self.evaluator = engine
        engine.add_event_handler(Events.STARTED, self._restore)
        engine.add_event_handler(Events.COMPLETED, self._record)

    def _restore(self, engine: Engine) -> None:
        # the later record wins, whichever direction the metric is compared in
        if self._restored and self.best_metric_epoch > getattr(engine.state, "best_metric_epoch", -1):
            engine.state.best_metric = self.best_metric
            engine.state.best_metric_epoch = self.best_metric_epoch
        self._restored = False

    def _record(self, engine: Engine) -> None:
        self.best_metric = float(getattr(engine.state, "best_metric", -1.0))
        self.best_metric_epoch = int(getattr(engine.state, "best_metric_epoch", -1))

    def state_dict(self) -> dict[str, Any]:
        # a restored record not yet handed to the evaluator (no validation since the resume) is the current one
        if self.evaluator is not None and not self._restored:
            self._record(self.evaluator)
        return {"best_metric": self.best_metric, "best_metric_epoch": self.best_metric_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_metric = float(state["best_metric"])
        self.best_metric_epoch = int(state["best_metric_epoch"])
        self._restored = True
