"""Per-epoch means of a loss's named terms and the learning rate, in ``engine.state.metrics`` for the loggers."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from monai.engines.utils import IterationEvents
from monai.utils import CommonKeys

LossComponents = Callable[[object, object], Mapping[str, torch.Tensor]]


class LossTerms:
    """Publish the epoch means of a trainer's loss terms (``loss_function.components(pred, label)``) and learning rate.

    The terms are recomputed without gradient at ``IterationEvents.LOSS_COMPLETED``, one call for every term.

    Args:
        prefix: prepended to each term's name.
        total_name: name (after ``prefix``) of the epoch mean of the loss; None leaves it out.
        lr_name: name of the learning rate; None leaves it out.
        components: the function that returns the terms; None uses ``engine.loss_function.components``.
    """

    def __init__(
        self,
        prefix: str = "train_",
        total_name: str | None = "loss_epoch",
        lr_name: str | None = "train_lr",
        components: LossComponents | None = None,
    ) -> None:
        self.prefix = prefix
        self.total_name = total_name
        self.lr_name = lr_name
        self.components = components
        self._sums: dict[str, torch.Tensor] = {}
        self._count = 0
        self._lr: float | None = None

    def attach(self, engine: Engine) -> None:
        """Register on a MONAI trainer (it fires ``IterationEvents.LOSS_COMPLETED``)."""
        engine.add_event_handler(Events.EPOCH_STARTED, self.epoch_started)
        engine.add_event_handler(IterationEvents.LOSS_COMPLETED, self.loss_completed)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self.epoch_completed)

    def epoch_started(self, engine: Engine) -> None:
        """Reset the sums; record the learning rate the epoch trains with."""
        # looked up here, not in attach: a MONAI trainer attaches its handlers before it sets its loss_function
        components = self.components or getattr(getattr(engine, "loss_function", None), "components", None)
        if components is None:
            raise TypeError("LossTerms needs `components` or a trainer whose loss_function has a components() method")
        self._components = components
        self._sums, self._count = {}, 0
        optimizer = getattr(engine, "optimizer", None)
        self._lr = float(optimizer.param_groups[0]["lr"]) if optimizer is not None else None

    def loss_completed(self, engine: Engine) -> None:
        """Add this iteration's terms and loss to the epoch's sums, on the loss's device."""
        output = engine.state.output
        with torch.no_grad():
            terms = dict(self._components(output[CommonKeys.PRED], output[CommonKeys.LABEL]))
        if self.total_name is not None:
            terms[self.total_name] = output[CommonKeys.LOSS]
        for name, value in terms.items():
            value = value.detach().double()  # float64 sums: the means are those of the float32 terms, to rounding
            self._sums[name] = self._sums[name] + value if name in self._sums else value
        self._count += 1

    def epoch_completed(self, engine: Engine) -> None:
        """Publish the epoch means and the learning rate in ``engine.state.metrics``."""
        if self._count:
            names = sorted(self._sums)  # the same order on every rank for the all-reduce
            sums = torch.stack([self._sums[n] for n in names] + [torch.ones_like(self._sums[names[0]]) * self._count])
            sums = idist.all_reduce(sums) if idist.get_world_size() > 1 else sums
            means = (sums[:-1] / sums[-1]).tolist()
            engine.state.metrics.update({f"{self.prefix}{n}": m for n, m in zip(names, means)})
        if self.lr_name is not None and self._lr is not None:
            engine.state.metrics[self.lr_name] = self._lr
