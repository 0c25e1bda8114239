"""The numbers of the evaluation report (:class:`~scripts.workflows.report.MetricsReport`): collecting them per
image, gathering them across ranks, and turning them into the per-image rows and the summary.

- :class:`ReportMetrics` feeds each iteration's decollated outputs to the bundle's metric objects (per map a
  :class:`MapMetrics`, plus one ``ROCAUCMetric`` for the image-level scores) and, at the end, gathers everything
  (:meth:`ReportMetrics.gather`, collective under DDP) into a :class:`GatheredMetrics` on the CPU;
- :func:`per_image_rows` and :func:`report_summary` build the CSV rows and the JSON summary from it, without
  collective calls.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from monai.metrics import ROCAUCMetric
from monai.utils import string_list_all_gather

from ..metrics import PointingGameMetric, PxAPMetric, SoftDiceMetric

__all__ = ["MAP_STATS", "MapMetrics", "ReportMetrics", "GatheredMetrics", "per_image_rows", "report_summary"]

# the warnings keep the name of the module that computed them before it had its own (log filters use it)
logger = logging.getLogger(f"{__package__}.report")

#: summary entries per map and class, in the order of the paper's Table 1
MAP_STATS = (
    "dice_mean",
    "dice_std",
    "pxap_image_mean",
    "pxap_image_std",
    "pxap_dataset",
    "pointing_game",
    "peak_on_border",
)


class MapMetrics:
    """The metrics of one map, on the device of the maps: soft Dice, PxAP (per-image APs plus the pooled
    histograms, so memory does not grow with the split), pointing-game hits and peaks on the image border."""

    def __init__(self, pxap_step: float, pointing_tolerance: float, peak_border: float, check_values: bool) -> None:
        self.dice = SoftDiceMetric(check_values=check_values)
        self.pxap = PxAPMetric(level="dataset", step=pxap_step, check_values=check_values)
        # the range checks of the Dice already ran on these maps
        self.hit = PointingGameMetric(tolerance=pointing_tolerance, check_values=False)
        self.border = PointingGameMetric(border=peak_border, measure="border", check_values=False)

    def __call__(self, maps: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]) -> None:
        for metric in (self.dice, self.pxap, self.hit, self.border):
            metric(maps, masks)

    def per_image(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(N, C) soft Dice, image-level PxAP and pointing-game hit of every image (gathered across ranks)."""
        return self.dice.get_buffer(), self.pxap.get_buffer(), self.hit.get_buffer()

    def stats(self) -> dict[str, list[float]]:
        """:data:`MAP_STATS` -> one value per class (NaN where no image has a lesion of the class)."""
        stats = {
            "dice_mean": self.dice.aggregate("mean"),
            "dice_std": self.dice.aggregate("std"),
            "pxap_image_mean": self.pxap.aggregate("mean", level="image"),
            "pxap_image_std": self.pxap.aggregate("std", level="image"),
            "pxap_dataset": self.pxap.aggregate("mean", level="dataset"),
            "pointing_game": self.hit.aggregate("mean"),
            "peak_on_border": self.border.aggregate("mean"),
        }
        return {k: v.cpu().tolist() for k, v in stats.items()}


@dataclass
class GatheredMetrics:
    """Everything the report is made of, from every rank, on the CPU (rows in rank order)."""

    #: the maps reported, in row order
    maps: list[str]
    paths: list[str]
    #: (N, C) image-level scores and labels
    scores: list[list[float]]
    labels: list[list[float]]
    #: map -> (N, C) soft Dice, image-level PxAP, pointing-game hit
    per_image: dict[str, tuple[list[list[float]], list[list[float]], list[list[float]]]]
    #: per class: images with a lesion of the class (a defined Dice)
    n_lesion: list[int]
    #: per class: classification AUC of the scores (NaN where a class has one label value)
    auc: list[float]
    #: map -> :data:`MAP_STATS` -> per class
    map_stats: dict[str, dict[str, list[float]]]


def _batch_path(batch_item: Any, output_item: Any, image_key: str) -> str:
    """The image file of one decollated item: the batch's ``image_path`` (the cached chains record it, since their
    cached images carry no metadata), else the ``meta["filename_or_obj"]`` of the batch's or the output's
    ``image_key``; empty when none has one."""
    if isinstance(batch_item, Mapping) and batch_item.get("image_path"):
        return str(batch_item["image_path"])
    for item in (batch_item, output_item):
        image = item.get(image_key) if isinstance(item, Mapping) else None
        meta = getattr(image, "meta", None)
        if isinstance(meta, Mapping) and meta.get("filename_or_obj"):
            return str(meta["filename_or_obj"])
    return ""


class ReportMetrics:
    """Collects the report's per-image values, iteration by iteration, in the bundle's metric objects.

    One object per evaluation (:meth:`MetricsReport.reset <scripts.workflows.report.MetricsReport.reset>` makes a
    fresh one). The set of maps is fixed by the first update (it depends on the model's stage). Args as
    :class:`~scripts.workflows.report.MetricsReport`.
    """

    def __init__(
        self,
        class_names: Sequence[str],
        maps: Sequence[str],
        pxap_step: float,
        pointing_tolerance: float,
        peak_border: float,
        check_values: bool,
        image_key: str,
        mask_key: str,
        score_key: str,
        label_key: str,
    ) -> None:
        self.class_names = list(class_names)
        self.maps = list(maps)
        self._map_metric_args = dict(
            pxap_step=pxap_step,
            pointing_tolerance=pointing_tolerance,
            peak_border=peak_border,
            check_values=check_values,
        )
        self.image_key, self.mask_key, self.score_key, self.label_key = image_key, mask_key, score_key, label_key
        self.present: list[str] | None = None
        self.map_metrics: dict[str, MapMetrics] = {}
        self.auc = ROCAUCMetric(average="none")
        self.paths: list[str] = []

    def update(self, outputs: Sequence[Mapping[str, Any]], batch: Sequence[Any]) -> None:
        """Add one iteration: ``outputs`` the decollated outputs, ``batch`` the decollated batch (or Nones)."""
        if not outputs:
            return
        self._check_keys(outputs[0])
        self._fix_maps(outputs[0])
        masks = [o[self.mask_key] for o in outputs]
        for m in self.present:
            self.map_metrics[m]([o[m] for o in outputs], masks)
        self.auc(*self._scores_and_labels(outputs))
        self.paths.extend(_batch_path(b, o, self.image_key) for b, o in zip(batch, outputs))

    def _check_keys(self, output: Mapping[str, Any]) -> None:
        for key in (self.mask_key, self.score_key, self.label_key):
            if key not in output:
                raise ValueError(
                    f"MetricsReport: the evaluator's outputs lack {key!r} (keys {sorted(map(str, output))}); "
                    "use GLAMOutputsd as postprocessing and dict targets (GLAMPrepareBatch(with_masks=True))"
                )

    def _fix_maps(self, output: Mapping[str, Any]) -> None:
        """The first update picks the maps present (and makes their metrics), later ones must have the same."""
        present = [m for m in self.maps if m in output]
        if self.present is None:
            if not present:
                raise ValueError(f"MetricsReport: none of the maps {self.maps} is in the evaluator's outputs")
            self.present = present
            self.map_metrics = {m: MapMetrics(**self._map_metric_args) for m in present}
        elif present != self.present:
            raise ValueError(f"MetricsReport: maps changed within an evaluation ({self.present} -> {present})")

    def _scores_and_labels(self, outputs: Sequence[Mapping[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
        scores = torch.stack([torch.as_tensor(o[self.score_key]).reshape(-1).float() for o in outputs])
        labels = torch.stack([torch.as_tensor(o[self.label_key]).reshape(-1).to(scores) for o in outputs])
        if scores.shape[1] != len(self.class_names) or labels.shape != scores.shape:
            raise ValueError(
                f"MetricsReport: {self.score_key!r} and {self.label_key!r} must have one value per class "
                f"{self.class_names}, got shapes {tuple(scores.shape)} and {tuple(labels.shape)}"
            )
        return scores, labels

    def gather(self) -> GatheredMetrics:
        """Everything collected, from every rank. Collective under DDP: call it on every rank."""
        if self.present is None:
            raise ValueError("MetricsReport: no image was evaluated (empty split?)")
        # the same collective calls, in the same order, on every rank
        paths = string_list_all_gather(self.paths)
        y_score, y_label = self.auc.get_buffer()
        per_image = {m: self.map_metrics[m].per_image() for m in self.present}
        auc = self._aggregate_auc()
        map_stats = {m: self.map_metrics[m].stats() for m in self.present}
        dice0 = per_image[self.present[0]][0]
        scores = y_score.cpu().tolist()
        if not (len(paths) == len(scores) == dice0.shape[0]):
            raise RuntimeError(
                f"MetricsReport: gathered {len(paths)} paths, {len(scores)} scores, {dice0.shape[0]} maps"
            )
        return GatheredMetrics(
            maps=list(self.present),
            paths=paths,
            scores=scores,
            labels=y_label.cpu().tolist(),
            per_image={m: tuple(v.cpu().tolist() for v in values) for m, values in per_image.items()},
            n_lesion=(~torch.isnan(dice0)).sum(0).cpu().tolist(),
            auc=auc,
            map_stats=map_stats,
        )

    def _aggregate_auc(self) -> list[float]:
        with warnings.catch_warnings(record=True) as caught:  # a class with one label value: AUC is NaN
            warnings.simplefilter("always")
            auc = [float(v) for v in self.auc.aggregate(average="none")]
        for w in caught:
            logger.warning("classification AUC: %s", w.message)
        return auc


def _number(value: float) -> float | None:
    """JSON has no NaN: undefined values become null."""
    value = float(value)
    return None if math.isnan(value) else value


def _cell(value: float) -> str:
    """CSV cell: shortest round-trip repr, empty where undefined."""
    value = float(value)
    return "" if math.isnan(value) else repr(value)


def _label_cell(value: float) -> str:
    """CSV cell of a label: an integer when it is one (0/1), else as :func:`_cell`."""
    value = float(value)
    return str(int(value)) if value.is_integer() else _cell(value)


def per_image_rows(gathered: GatheredMetrics, class_names: Sequence[str]) -> list[dict[str, str]]:
    """One CSV row per image: its path, labels, ``y_global``, then per map and class soft Dice, image-level PxAP
    and the pointing-game hit (1/0); empty where undefined (the image has no lesion of that class)."""
    rows = []
    for n, path in enumerate(gathered.paths):
        row = {"image": path}
        row.update({f"label_{c}": _label_cell(gathered.labels[n][i]) for i, c in enumerate(class_names)})
        row.update({f"y_global_{c}": _cell(gathered.scores[n][i]) for i, c in enumerate(class_names)})
        for m, (dice, pxap, hit) in gathered.per_image.items():
            row.update({f"{m}_dice_{c}": _cell(dice[n][i]) for i, c in enumerate(class_names)})
            row.update({f"{m}_pxap_{c}": _cell(pxap[n][i]) for i, c in enumerate(class_names)})
            row.update({f"{m}_hit_{c}": _label_cell(hit[n][i]) for i, c in enumerate(class_names)})
        rows.append(row)
    return rows


def report_summary(
    gathered: GatheredMetrics,
    class_names: Sequence[str],
    info: Mapping[str, Any],
    settings: Mapping[str, Any],
) -> dict[str, Any]:
    """The summary (``metrics.json``): ``info``, counts, per class the classification AUC, per map and class the
    :data:`MAP_STATS`, then ``settings`` (what the numbers depend on: PxAP step, tolerances, the CSV's name).
    Undefined values are None."""
    names = list(class_names)
    n_positive = [int(sum(1 for row in gathered.labels if row[i] >= 0.5)) for i in range(len(names))]
    return {
        **info,
        "n_images": len(gathered.paths),
        "classes": names,
        "maps": list(gathered.maps),
        "n_lesion_images": {c: int(gathered.n_lesion[i]) for i, c in enumerate(names)},
        "n_positive_labels": {c: n_positive[i] for i, c in enumerate(names)},
        "classification_auc": {c: _number(gathered.auc[i]) for i, c in enumerate(names)},
        "metrics": {
            m: {c: {k: _number(stats[k][i]) for k in MAP_STATS} for i, c in enumerate(names)}
            for m, stats in gathered.map_stats.items()
        },
        **settings,
    }
