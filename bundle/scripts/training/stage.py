"""The stages and what one training stage runs: :func:`previous_modules` (which submodules of the model a stage
starts from it takes) and :func:`train_stage` (the stage's trainer run, and its summary: ``run_stage``'s last item).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..enums import STAGES, MapName, Stage

__all__ = [
    "STAGE_ORDER",
    "stages_to_run",
    "STAGE_MAPS",
    "previous_stage",
    "previous_modules",
    "train_stage",
]

#: the saliency map that validates (and selects) each stage: the map that stage trains
STAGE_MAPS = {Stage.GLOBAL: MapName.GLOBAL.value, Stage.LOCAL: MapName.LOCAL.value, Stage.JOINT: MapName.COMBINED.value}


def _stage(stage: Any) -> str:
    stage = str(stage)
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES} here, got {stage!r}")
    return stage


def previous_stage(stage: str) -> str | None:
    """The stage that trains before ``stage`` (its best model is where ``stage`` starts); None for the first."""
    index = STAGES.index(_stage(stage))
    return STAGES[index - 1] if index > 0 else None


def previous_modules(stage: str, init: Any = None, modules: Sequence[str] | None = None) -> list[str] | None:
    """The top-level submodules ``stage`` takes from the model it starts from (train.yaml's ``previous_modules``):
    ``modules`` for the global stage when it starts from a model ``init`` (the quick start: the global module only),
    else None (all of the previous stage's model, strictly)."""
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
        early_stop: the evaluator's early-stopping handler, or None (off): it is given the trainer to stop here,
            because the configuration cannot name the trainer inside the evaluator the trainer holds.

    Returns:
        ``{"stage", "best_metric", "best_epoch", "model"}``: the best key metric, its epoch (-1: none) and the
        path of the best model (``<ckpt_dir>/model.pt``).
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


#: the stages in training order (the vocabulary's order)
STAGE_ORDER = STAGES


def stages_to_run(stage: str) -> list[str]:
    """``"all"`` -> the three stages in order; one stage name -> that stage."""
    if stage == "all":
        return list(STAGE_ORDER)
    if stage not in STAGE_ORDER:
        raise ValueError(f"stage must be 'all' or one of {STAGE_ORDER}, got {stage!r}")
    return [stage]
