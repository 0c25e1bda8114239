"""What one training stage reads from ``train.yaml``, as named config components (``scripts.training.stage.…``).

``train.yaml`` describes one stage, chosen by its ``stage`` id. These functions turn the stage's name and the
configuration's plain values into what the stage's objects need, so that the configuration states values and names
components rather than computing them in ``$`` expressions:

- :func:`previous_model`: the previous stage's best model, which the stage starts from (for ``global``: none, or
  the model a preset names), and :func:`previous_modules`, which of its submodules;
- :func:`key_map`: the saliency map the stage is validated on (``S_g``, ``S_l``, ``S_c``);
- :func:`trainable_parameters`: what the optimizer updates (GLAM freezes what a stage does not train);
- :func:`train_stage`: runs the stage's trainer and returns its summary (``run_stage``'s last item).

The per-stage numbers (epochs, learning rate, batch size, sparsity weight) are read by
:func:`scripts.training.preflight.per_stage`; the stage's folders (``ckpt_dir``, ``output_dir``) are joined in
train.yaml.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from ..enums import STAGES, MapName, Stage
from ..errors import UsageError

__all__ = [
    "STAGE_ORDER",
    "stages_to_run",
    "STAGE_MAPS",
    "previous_stage",
    "previous_model",
    "previous_modules",
    "key_map",
    "trainable_parameters",
    "train_stage",
]

#: the saliency map that validates (and selects) each stage: the map that stage trains
STAGE_MAPS = {Stage.GLOBAL: MapName.GLOBAL.value, Stage.LOCAL: MapName.LOCAL.value, Stage.JOINT: MapName.COMBINED.value}


def _stage(stage: Any) -> str:
    stage = str(stage)
    if stage not in STAGES:
        raise UsageError(f"stage must be one of {STAGES} here, got {stage!r}")
    return stage


def previous_stage(stage: str) -> str | None:
    """The stage that trains before ``stage`` (its best model is where ``stage`` starts); None for the first."""
    index = STAGES.index(_stage(stage))
    return STAGES[index - 1] if index > 0 else None


def previous_model(ckpt_root: str | os.PathLike, stage: str, init: str | os.PathLike | None = None) -> str | None:
    """``<ckpt_root>/<previous stage>/model.pt``, the model ``stage`` starts from; for the global stage ``init`` (a
    model to start from, such as the quick start's shipped model; None: a fresh network)."""
    previous = previous_stage(stage)
    if previous is None:
        return None if init is None else os.fspath(init)
    return os.path.join(os.fspath(ckpt_root), previous, "model.pt")


def previous_modules(stage: str, init: Any = None, modules: Sequence[str] | None = None) -> list[str] | None:
    """The top-level submodules ``stage`` takes from the model it starts from (train.yaml's ``previous_modules``):
    ``modules`` for the global stage when it starts from a model ``init`` (the quick start: the global module only),
    else None (all of the previous stage's model, strictly)."""
    if previous_stage(stage) is None and init and modules is not None:
        return list(modules)
    return None


def key_map(stage: str) -> str:
    """The saliency map that validates ``stage`` (:data:`STAGE_MAPS`)."""
    return STAGE_MAPS[_stage(stage)]


def trainable_parameters(network: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters of ``network`` that require a gradient, in ``parameters()`` order: the optimizer's ``params``
    (the stage's frozen modules are left out, so Adam keeps no state for them)."""
    return [p for p in network.parameters() if p.requires_grad]


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
        raise UsageError(f"stage must be 'all' or one of {STAGE_ORDER}, got {stage!r}")
    return [stage]
