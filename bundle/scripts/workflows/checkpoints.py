"""Checkpoints of a GLAM stage: the best model (by the key metric), the last epoch's full state, resumption and
the hand-over from the previous stage. Every file is written atomically (temporary file + rename), by rank 0 only,
and read back with ``torch.load(..., weights_only=True)``."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from ignite.engine import Engine, Events
from ignite.handlers import Checkpoint

__all__ = ["save_atomic", "plain_state_dict", "StageCheckpointer"]

logger = logging.getLogger(__name__)


def _is_rank_zero() -> bool:
    return not (torch.distributed.is_available() and torch.distributed.is_initialized()) or (
        torch.distributed.get_rank() == 0
    )


def save_atomic(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` to a temporary file in the target folder, then rename it over ``path`` (never a torn file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def plain_state_dict(network: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The network's state dict on the CPU, unwrapped from (Distributed)DataParallel: the model-zoo format."""
    module = getattr(network, "module", network)
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


class StageCheckpointer:
    """Best-model and last-epoch checkpoints of one training stage, resumption, and loading the previous stage.

    - on the evaluator's completion, when its key metric reached a new best: ``<ckpt_dir>/model.pt``, the
      network's plain CPU state dict;
    - after every training epoch (after validation): ``<ckpt_dir>/last.pt`` with every object in ``save_dict``
      (network, optimizer, scheduler, trainer state, best-metric record…);
    - when the trainer starts: with ``resume`` and an existing ``last.pt``, everything is restored from it and
      training continues after its epoch; otherwise, with ``previous_model`` (the previous stage's
      ``model.pt``), the network is loaded from it, strictly.

    Args:
        ckpt_dir: this stage's checkpoint folder.
        save_dict: name -> object with ``state_dict``/``load_state_dict``; must include ``network``; the trainer it
            is attached to is added as ``trainer`` (its epoch and iteration).
        evaluator: the validation evaluator whose best key metric selects ``model.pt``.
        previous_model: path of the previous stage's best model, required when given.
        resume: continue from ``last.pt`` when it exists.
    """

    def __init__(
        self,
        ckpt_dir: str | os.PathLike,
        save_dict: Mapping[str, Any],
        evaluator: Engine | None = None,
        previous_model: str | os.PathLike | None = None,
        resume: bool = False,
    ) -> None:
        if "network" not in save_dict:
            raise ValueError("save_dict must hold the 'network'")
        self.ckpt_dir = Path(ckpt_dir)
        self.save_dict = dict(save_dict)
        self.evaluator = evaluator
        self.previous_model = Path(previous_model) if previous_model else None
        self.resume = bool(resume)

    @property
    def best_path(self) -> Path:
        return self.ckpt_dir / "model.pt"

    @property
    def last_path(self) -> Path:
        return self.ckpt_dir / "last.pt"

    def attach(self, trainer: Engine) -> None:
        self.save_dict.setdefault("trainer", trainer)
        trainer.add_event_handler(Events.STARTED, self.load)
        trainer.add_event_handler(Events.EPOCH_COMPLETED, self.save_last)
        if self.evaluator is not None:
            self.evaluator.add_event_handler(Events.COMPLETED, self.save_best)

    def load(self, engine: Engine) -> None:
        if self.resume and self.last_path.is_file():
            checkpoint = torch.load(self.last_path, map_location="cpu", weights_only=True)
            missing = sorted(set(self.save_dict) - set(checkpoint))
            if missing:
                raise ValueError(f"{self.last_path} lacks {missing}: it was not written by this workflow")
            Checkpoint.load_objects(to_load=self.save_dict, checkpoint=checkpoint, strict=True)
            logger.info("resumed from %s (epoch %d)", self.last_path, engine.state.epoch)
            return
        if self.previous_model is not None:
            if not self.previous_model.is_file():
                raise FileNotFoundError(
                    f"previous stage's model {self.previous_model} not found: run the previous stage first "
                    "(or the default 'training', which runs all stages in order)"
                )
            state = torch.load(self.previous_model, map_location="cpu", weights_only=True)
            network = self.save_dict["network"]
            getattr(network, "module", network).load_state_dict(state, strict=True)
            logger.info("loaded the previous stage's model %s", self.previous_model)

    def save_last(self, engine: Engine) -> None:
        if not _is_rank_zero():
            return
        checkpoint = {}
        for name, obj in self.save_dict.items():
            if name == "network":
                checkpoint[name] = plain_state_dict(obj)
            else:
                checkpoint[name] = obj.state_dict()
        save_atomic(checkpoint, self.last_path)

    def save_best(self, evaluator: Engine) -> None:
        state = evaluator.state
        if _is_rank_zero() and getattr(state, "best_metric_epoch", -1) == state.epoch:
            save_atomic(plain_state_dict(self.save_dict["network"]), self.best_path)
            logger.info(
                "new best %s = %.4f at epoch %d: %s",
                state.key_metric_name,
                state.best_metric,
                state.epoch,
                self.best_path,
            )
