"""Ignite metric handlers for soft Dice, PxAP, the pointing game, the lesion FROC and the ROC AUC, in the style of
``MeanDice``.

An undefined value (no lesion image; for the AUC, labels all alike) is published as ``empty_value`` with a warning:
a NaN key metric would freeze MONAI's best-metric selection.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable

import torch
from monai.handlers import IgniteMetricHandler

from ..errors import UsageError
from ..metrics import PointingGameMetric, PxAPMetric, SoftDiceMetric
from ..metrics.buffer import CompactROCAUCMetric
from ..metrics.froc import FROC_RATES, FROCMetric

_logger = logging.getLogger(__name__)


class _ClassReducedMetricHandler(IgniteMetricHandler):
    """Publishes one class (or the mean over classes) of a per-class metric's ``aggregate`` as a float."""

    #: why a value is undefined, for the warning; ``{what}`` is the class or "any class"
    what_undefined = "no image of this epoch has a lesion of {what}"

    def __init__(
        self,
        metric_fn: SoftDiceMetric | PxAPMetric | PointingGameMetric | FROCMetric | CompactROCAUCMetric,
        class_index: int | None,
        reduction: str,
        empty_value: float,
        output_transform: Callable,
        save_details: bool,
    ) -> None:
        if class_index is not None and (
            isinstance(class_index, bool) or not isinstance(class_index, int) or class_index < 0
        ):
            raise UsageError(f"class_index must be None or a non-negative int, got {class_index!r}.")
        if reduction not in ("mean", "std"):
            raise UsageError(f"reduction must be 'mean' or 'std', got {reduction!r}.")
        self.class_index = class_index
        self.reduction = reduction
        self.empty_value = float(empty_value)
        super().__init__(metric_fn=metric_fn, output_transform=output_transform, save_details=save_details)

    def _aggregate(self) -> torch.Tensor:
        return self.metric_fn.aggregate(reduction=self.reduction)

    def _warn(self, message: str) -> None:
        (self._engine.logger if self._engine is not None else _logger).warning(message)

    def compute(self) -> float:
        values = self._aggregate()  # (C,), collective under DDP: every rank gets the same values
        self._is_reduced = True
        if self.save_details:
            if self._engine is None or self._name is None:
                raise RuntimeError("please call the attach() function to connect expected engine first.")
            self._engine.state.metric_details[self._name] = self.metric_fn.get_buffer()
        per_class = values.tolist()
        name = self._name or type(self).__name__
        if self.class_index is not None:
            if self.class_index >= len(per_class):
                raise UsageError(f"class_index={self.class_index} but the predictions have {len(per_class)} classes.")
            value = per_class[self.class_index]
            if math.isnan(value):
                return self._undefined(name, f"class {self.class_index}")
            return value
        defined = [v for v in per_class if not math.isnan(v)]
        if not defined:
            return self._undefined(name, "any class")
        return sum(defined) / len(defined)

    def _undefined(self, name: str, what: str) -> float:
        """Warn that the value is undefined (n/a) and return ``empty_value``, which stands in for it."""
        self._warn(
            f"{name}: n/a ({self.what_undefined.format(what=what)}); engine.state.metrics holds "
            f"empty_value={self.empty_value} in its place, which the logs and model selection see"
        )
        return self.empty_value


class SoftDice(_ClassReducedMetricHandler):
    """Soft Dice (paper appendix E) over an epoch.

    Args:
        class_index: publish this class's value; None: the mean over the classes that have lesion images.
        reduction: ``"mean"`` or ``"std"`` (population std over the lesion images).
        empty_value: published when the value is undefined (no lesion image).
        output_transform: ``engine.state.output`` to ``(y_pred, y)``, e.g. ``from_engine(["pred", "label"])``.
        save_details: store the (N, C) per-image values in ``engine.state.metric_details[name]``.
        check_values: validate scores and masks on every iteration (one host synchronisation).
    """

    def __init__(
        self,
        class_index: int | None = None,
        reduction: str = "mean",
        empty_value: float = 0.0,
        output_transform: Callable = lambda x: x,
        save_details: bool = True,
        check_values: bool = True,
    ) -> None:
        metric = SoftDiceMetric(check_values=check_values)
        super().__init__(metric, class_index, reduction, empty_value, output_transform, save_details)


class PxAP(_ClassReducedMetricHandler):
    """PxAP (paper appendix E) over an epoch.

    Args:
        level: ``"image"`` (mean of per-image APs) or ``"dataset"`` (AP of the pooled histograms).
        step: threshold spacing of the histograms (0.001 as in the paper).
        class_index, reduction, empty_value, output_transform, save_details, check_values: as in :class:`SoftDice`
            (``"std"`` at image level only).
    """

    def __init__(
        self,
        level: str = "image",
        class_index: int | None = None,
        reduction: str = "mean",
        step: float = 0.001,
        empty_value: float = 0.0,
        output_transform: Callable = lambda x: x,
        save_details: bool = True,
        check_values: bool = True,
    ) -> None:
        if level == "dataset" and reduction == "std":
            raise UsageError("reduction='std' is only defined for level='image' (dataset-level PxAP is one AP).")
        metric = PxAPMetric(level=level, step=step, check_values=check_values)
        super().__init__(metric, class_index, reduction, empty_value, output_transform, save_details)


class PointingGame(_ClassReducedMetricHandler):
    """Pointing-game hit rate (or share of map peaks on the image border) over an epoch.

    Args:
        tolerance, border, measure: as in :func:`~scripts.metrics.pointing_game.compute_pointing_game`.
        class_index, empty_value, output_transform, save_details, check_values: as in :class:`SoftDice`.
    """

    def __init__(
        self,
        tolerance: float = 0.0,
        border: float = 0.0,
        measure: str = "hit",
        class_index: int | None = None,
        empty_value: float = 0.0,
        output_transform: Callable = lambda x: x,
        save_details: bool = True,
        check_values: bool = True,
    ) -> None:
        metric = PointingGameMetric(tolerance=tolerance, border=border, measure=measure, check_values=check_values)
        super().__init__(metric, class_index, "mean", empty_value, output_transform, save_details)


class FROC(_ClassReducedMetricHandler):
    """Lesion sensitivity at ``rate`` false positives per image over an epoch.

    The details are the (N, C) lesion counts; ``handler.metric_fn.aggregate()`` and ``.curve()`` give every rate.

    Args:
        rate: the false positives per image whose sensitivity is published; one of ``rates``.
        rates, radius, tolerance, max_candidates: as in :class:`~scripts.metrics.froc.FROCMetric`.
        class_index, empty_value, output_transform, save_details, check_values: as in :class:`SoftDice`.
    """

    def __init__(
        self,
        rate: float = 1.0,
        rates=FROC_RATES,
        radius: int = 8,
        tolerance: float = 0.0,
        max_candidates: int = 20,
        class_index: int | None = None,
        empty_value: float = 0.0,
        output_transform: Callable = lambda x: x,
        save_details: bool = True,
        check_values: bool = True,
    ) -> None:
        metric = FROCMetric(
            rates=rates, radius=radius, tolerance=tolerance, max_candidates=max_candidates, check_values=check_values
        )
        if float(rate) not in metric.rates:
            raise UsageError(f"rate must be one of the rates {list(metric.rates)}, got {rate!r}.")
        self.rate_index = metric.rates.index(float(rate))
        super().__init__(metric, class_index, "mean", empty_value, output_transform, save_details)

    def _aggregate(self) -> torch.Tensor:
        return self.metric_fn.aggregate()[:, self.rate_index]


class ROCAUC(_ClassReducedMetricHandler):
    """Image-level ROC AUC over an epoch: MONAI's, per class, kept in growing buffers (:mod:`scripts.metrics.buffer`).

    Args:
        class_index: publish this class's AUC; None: the mean over the classes whose AUC is defined.
        empty_value: published when the AUC is undefined (the epoch's labels of the class all alike).
        output_transform: ``engine.state.output`` to ``(y_pred, y)``, the (B, C) scores and labels, e.g.
            ``from_engine(["y_global", "label"])``.
        save_details: store the (N, C) scores in ``engine.state.metric_details[name]``.
    """

    what_undefined = "the epoch's labels of {what} are all alike"

    def __init__(
        self,
        class_index: int | None = None,
        empty_value: float = 0.0,
        output_transform: Callable = lambda x: x,
        save_details: bool = False,
    ) -> None:
        metric = CompactROCAUCMetric(average="none")
        super().__init__(metric, class_index, "mean", empty_value, output_transform, save_details)

    def _aggregate(self) -> torch.Tensor:
        with warnings.catch_warnings():  # MONAI warns of an undefined class; _undefined says it with the metric's name
            warnings.filterwarnings("ignore", message="y values can not be all", category=UserWarning)
            values = self.metric_fn.aggregate()
        return torch.as_tensor(values, dtype=torch.float64).reshape(-1)
