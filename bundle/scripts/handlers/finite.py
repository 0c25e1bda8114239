"""Stop a training stage at its first non-finite loss, with one line that says where, before anything is saved.

Ignite's ``TerminateOnNan`` ends the run as if it had finished, so the next stage would start from a broken model;
:class:`StopOnNonFinite` raises instead, before the epoch's validation and checkpoints.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from ignite.engine import Engine, Events
from monai.handlers import from_engine
from monai.utils import CommonKeys

from ..errors import UsageError
from ..networks.checkpoint_file import describe_non_finite, non_finite_tensors

#: the docs' section on what to do
_HELP = "lower --learning_rate (docs/training.md, 'Non-finite losses and weights')"


class TrainingDivergedError(UsageError):
    """A training stage stopped because its loss or its weights stopped being finite; the message says where."""


def _values(output: Any) -> list[float]:
    """Every number in ``output`` (a number, a tensor, or a list / tuple of them) as floats."""
    if isinstance(output, torch.Tensor):
        return [float(v) for v in output.detach().float().flatten().tolist()]
    if isinstance(output, (list, tuple)):
        return [v for item in output for v in _values(item)]
    if isinstance(output, (int, float)):
        return [float(output)]
    return []


class StopOnNonFinite:
    """Raise :class:`TrainingDivergedError` at the first non-finite loss, or at an epoch's end on non-finite weights.

    Attach it first among the trainer's handlers, so that it explains a failure before ``StatsHandler`` logs it.

    Args:
        stage: the stage's name, for the message.
        ckpt_dir: the stage's checkpoint folder, for the message; None: not named.
        output_transform: the loss from ``engine.state.output`` (None: MONAI's ``loss`` key).
    """

    def __init__(
        self,
        stage: str = "",
        ckpt_dir: str | os.PathLike | None = None,
        output_transform: Callable[[Any], Any] | None = None,
    ) -> None:
        self.stage = str(stage)
        self.ckpt_dir = Path(ckpt_dir) if ckpt_dir else None
        self.output_transform = output_transform or from_engine([CommonKeys.LOSS], first=True)

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.ITERATION_COMPLETED, self)
        engine.add_event_handler(Events.EXCEPTION_RAISED, self.explain)

    # -- the message -----------------------------------------------------------------------------------------------
    def _where(self, engine: Engine) -> str:
        state = engine.state
        length = state.epoch_length
        iteration = (state.iteration - 1) % length + 1 if length else state.iteration
        stage = f"stage {self.stage}, " if self.stage else ""
        return f"{stage}epoch {state.epoch}, iteration {iteration}{f'/{length}' if length else ''}"

    @staticmethod
    def _learning_rate(engine: Engine) -> str:
        optimizer = getattr(engine, "optimizer", None)
        groups = getattr(optimizer, "param_groups", None)
        return f" (learning rate {groups[0]['lr']:g})" if groups else ""

    def _kept(self) -> str:
        if self.ckpt_dir is None:
            return "the checkpoints on disk keep their last finite weights"
        kept = [name for name in ("last.pt", "model.pt") if (self.ckpt_dir / name).is_file()]
        if not kept:
            return f"nothing was saved in {self.ckpt_dir}"
        if len(kept) == 1:
            return f"{kept[0]} in {self.ckpt_dir} keeps its last finite weights"
        return f"{', '.join(kept)} in {self.ckpt_dir} keep their last finite weights"

    def _stop(self, engine: Engine, what: str) -> TrainingDivergedError:
        return TrainingDivergedError(
            f"{self._where(engine)}: {what}{self._learning_rate(engine)}; training stopped: {self._kept()}; {_HELP}"
        )

    @staticmethod
    def _weights(engine: Engine) -> dict[str, torch.Tensor]:
        network = getattr(engine, "network", None)
        network = getattr(network, "module", network)  # (Distributed)DataParallel
        return network.state_dict() if isinstance(network, torch.nn.Module) else {}

    # -- the checks ------------------------------------------------------------------------------------------------
    def __call__(self, engine: Engine) -> None:
        bad = [v for v in _values(self.output_transform(engine.state.output)) if not math.isfinite(v)]
        if bad:
            raise self._stop(engine, f"the loss is {bad[0]:g}".replace("nan", "NaN"))
        length = engine.state.epoch_length
        if length and engine.state.iteration % length == 0:  # the epoch's last step: before validation and saving
            found = non_finite_tensors(self._weights(engine))
            if found:
                raise self._stop(engine, f"the weights are not finite after this step: {describe_non_finite(found)}")

    def explain(self, engine: Engine, err: BaseException) -> None:
        """Raise a step's failure on non-finite values as one :class:`TrainingDivergedError`; re-raise the rest."""
        if isinstance(err, TrainingDivergedError):
            raise err
        if isinstance(err, RuntimeError) and "without overflow" in str(err):
            raise self._stop(engine, "the optimizer's step overflowed float32") from err
        found = non_finite_tensors(self._weights(engine)) if engine.state.iteration else []
        if found:
            first = next((line for line in str(err).splitlines() if line.strip()), "")
            raise self._stop(
                engine,
                f"the step failed ({type(err).__name__}: {first}) on weights that are not finite: "
                f"{describe_non_finite(found)}",
            ) from err
        raise err
