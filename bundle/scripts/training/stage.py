"""The training stages and the run of one stage (``train.yaml``'s ``run_stage``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..enums import STAGES
from ..errors import UsageError


def _stage(stage: Any) -> str:
    stage = str(stage)
    if stage not in STAGES:
        raise UsageError(f"stage must be one of {STAGES} here, got {stage!r}")
    return stage


def previous_stage(stage: str) -> str | None:
    """The stage that trains before ``stage``; None for the first."""
    index = STAGES.index(_stage(stage))
    return STAGES[index - 1] if index > 0 else None


def previous_modules(stage: str, init: Any = None, modules: Sequence[str] | None = None) -> list[str] | None:
    """The submodules ``stage`` takes from its previous model; None: all of it."""
    if previous_stage(stage) is None and init and modules is not None:
        return list(modules)
    return None


def train_stage(
    stage: str,
    trainer: Any,
    best_metric: Any,
    ckpt_dir: str | os.PathLike,
    early_stop: Any = None,
) -> dict[str, Any]:
    """Run one stage's ``trainer`` and say what it selected.

    Args:
        stage: the stage's name (recorded in the summary).
        trainer: the stage's ``SupervisedTrainer`` (``train#trainer``).
        best_metric: its :class:`~scripts.handlers.training_state.BestMetricState` (``train#best_metric``).
        ckpt_dir: the stage's checkpoint folder.
        early_stop: the evaluator's early-stopping handler, or None; given the trainer here, which the config
            cannot name inside the evaluator the trainer holds.

    Returns:
        ``{"stage", "best_metric", "best_epoch" (-1: none), "model"}``.
    """
    if early_stop is not None:
        early_stop.set_trainer(trainer)
    trainer.run()
    return {
        "stage": stage,
        "best_metric": best_metric.best_metric,
        "best_epoch": best_metric.best_metric_epoch,
        "model": os.path.join(os.fspath(ckpt_dir), "model.pt"),
    }


def stages_to_run(stage: str) -> list[str]:
    """``"all"`` -> the three stages in order; one stage name -> that stage."""
    if stage == "all":
        return list(STAGES)
    if stage not in STAGES:
        raise UsageError(f"stage must be 'all' or one of {STAGES}, got {stage!r}")
    return [stage]
