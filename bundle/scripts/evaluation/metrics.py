"""The numbers of the evaluation report (:class:`~scripts.evaluation.report.MetricsReport`): collecting them per
image through the validation's metric handlers, gathering them across ranks, and turning them into the per-image
rows and the summary.

- :class:`ReportMetrics` attaches, per map, the bundle's Ignite metric handlers (the classes train.yaml's
  ``validate#metrics`` uses: :class:`~scripts.handlers.SoftDice`, :class:`~scripts.handlers.PxAP`,
  :class:`~scripts.handlers.PointingGame`, and :class:`~scripts.handlers.FROC`) with ``save_details=True``, so
  that, as in validation, each publishes its value in ``engine.state.metrics`` and its (N, C) per-image values,
  gathered across ranks, in ``engine.state.metric_details`` (what ``monai.handlers.MetricsSaver`` reads); plus one
  ``ROCAUCMetric`` for the image-level scores and, per image, the breast it belongs to. When the epoch completes
  (:meth:`ReportMetrics.classify`) it computes the image-level and the breast-level AUC
  (:func:`~scripts.metrics.breasts.breast_auc`) and publishes them in ``engine.state.metrics``
  (``classification_auc_<class>``, ``breast_auc_<class>``: what MLflow logs); at the end
  (:meth:`ReportMetrics.gather`, collective under DDP) it reads the handlers' details, adds the dataset-level PxAP of
  the pooled histograms and the FROC sensitivities, into a :class:`GatheredMetrics` on the CPU;
- :func:`per_image_rows` and :func:`report_summary` build the CSV rows and the JSON summary from it, without
  collective calls.
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from ignite.engine import Engine
from monai.handlers import from_engine
from monai.metrics import ROCAUCMetric
from monai.utils import string_list_all_gather

from ..errors import UsageError
from ..handlers import FROC, PointingGame, PxAP, SoftDice
from ..metrics._common import nan_reduce
from ..metrics.breasts import breast_auc, breast_key

__all__ = ["MAP_STATS", "map_handlers", "ReportMetrics", "GatheredMetrics", "per_image_rows", "report_summary"]

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

#: the metric handlers of one map, by the suffix of their name (``<map>_<suffix>`` in ``engine.state.metrics``)
HANDLER_SUFFIXES = ("dice", "pxap", "hit", "border", "froc")


def _decollated(output: Any) -> list[Mapping[str, Any]]:
    """The evaluator's output as a list of per-image dicts (one dict is one image)."""
    return [output] if isinstance(output, Mapping) else list(output)


def map_handlers(
    map_key: str,
    mask_key: str,
    pxap_step: float,
    pointing_tolerance: float,
    peak_border: float,
    check_values: bool,
    froc_radius: int = 8,
    froc_tolerance: float = 0.0,
    froc_max_candidates: int = 20,
) -> dict[str, PxAP | SoftDice | PointingGame | FROC]:
    """The metric handlers of one map, by :data:`HANDLER_SUFFIXES`: soft Dice, PxAP (per-image APs plus the pooled
    histograms of the dataset level: memory does not grow with the split), pointing-game hits and peaks on the
    image border, each keeping its (N, C) per-image values (``save_details=True``), and the lesion-level FROC
    (binned counts: memory does not grow either; its details are the images' lesion counts).

    Built like train.yaml's ``validate#metrics`` (``class_index=None``: the published value is the mean over the
    classes with a lesion image); the report reads the per-class numbers from the details."""

    def transform(output: Any) -> tuple[list[Any], list[Any]]:
        return from_engine([map_key, mask_key])(_decollated(output))

    return {
        "dice": SoftDice(output_transform=transform, check_values=check_values),
        "pxap": PxAP(level="dataset", step=pxap_step, output_transform=transform, check_values=check_values),
        # the range checks of the Dice already ran on these maps
        "hit": PointingGame(tolerance=pointing_tolerance, output_transform=transform, check_values=False),
        "border": PointingGame(border=peak_border, measure="border", output_transform=transform, check_values=False),
        "froc": FROC(
            radius=froc_radius,
            tolerance=froc_tolerance,
            max_candidates=froc_max_candidates,
            output_transform=transform,
            check_values=False,
        ),
    }


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
    #: map -> :data:`MAP_STATS` -> per class (and ``"froc"`` -> per class, the sensitivity at each FROC rate)
    map_stats: dict[str, dict[str, list[Any]]]
    #: :func:`~scripts.metrics.breasts.breast_auc`'s result: per class AUC over breasts, number of breasts, images
    #: without a patient or a laterality
    breast: dict[str, Any]
    #: per class: lesions (connected components of the masks) over the split, what the FROC's sensitivity counts
    n_lesions: list[int]
    #: the false-positive rates of the FROC sensitivities
    froc_rates: tuple[float, ...]


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


def _map_stats(
    details: Mapping[str, torch.Tensor], dataset_pxap: torch.Tensor, froc: torch.Tensor
) -> dict[str, list[Any]]:
    """:data:`MAP_STATS` -> one value per class (NaN where no image has a lesion of the class), from one map's
    per-image details (the same reductions as the metrics' ``aggregate``) and its dataset-level PxAP; ``"froc"`` ->
    per class the sensitivities at the FROC rates (``froc``: (C, rates))."""
    stats = {
        "dice_mean": nan_reduce(details["dice"], "mean"),
        "dice_std": nan_reduce(details["dice"], "std"),
        "pxap_image_mean": nan_reduce(details["pxap"], "mean"),
        "pxap_image_std": nan_reduce(details["pxap"], "std"),
        "pxap_dataset": dataset_pxap,
        "pointing_game": nan_reduce(details["hit"], "mean"),
        "peak_on_border": nan_reduce(details["border"], "mean"),
        "froc": froc,
    }
    return {k: v.cpu().tolist() for k, v in stats.items()}


def _path_key(path: Any) -> str:
    """An image path as the report matches it to a datalist item (absolute, normalised)."""
    return os.path.normpath(os.path.abspath(str(path))) if path else ""


def _key_text(key: tuple | None) -> str:
    """A breast key as text, for the ranks' string gather ("" for none)."""
    return "" if key is None else json.dumps(list(key))


class ReportMetrics:
    """Collects the report's per-image values, iteration by iteration, through the bundle's metric handlers.

    One object per evaluation (:meth:`MetricsReport.reset <scripts.evaluation.report.MetricsReport.reset>` makes a
    fresh one, after :meth:`detach` of the previous one). The set of maps is fixed by the first update (it depends
    on the model's stage); that update attaches the maps' handlers to the engine under ``<map>_<suffix>`` names.
    Args as :class:`~scripts.evaluation.report.MetricsReport`.
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
        froc_radius: int = 8,
        froc_tolerance: float = 0.0,
        froc_max_candidates: int = 20,
        items: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.class_names = list(class_names)
        self.maps = list(maps)
        self._handler_args = dict(
            pxap_step=pxap_step,
            pointing_tolerance=pointing_tolerance,
            peak_border=peak_border,
            check_values=check_values,
            froc_radius=froc_radius,
            froc_tolerance=froc_tolerance,
            froc_max_candidates=froc_max_candidates,
        )
        #: image path -> breast key, from the evaluated datalist items (their patient_id, laterality, study)
        self.breast_of = {_path_key(it.get("image")): breast_key(it) for it in items or () if isinstance(it, Mapping)}
        self.image_key, self.mask_key, self.score_key, self.label_key = image_key, mask_key, score_key, label_key
        self.present: list[str] | None = None
        #: map -> suffix -> handler, attached to the engine by the first update
        self.handlers: dict[str, dict[str, PxAP | SoftDice | PointingGame | FROC]] = {}
        self.auc = ROCAUCMetric(average="none")
        self.paths: list[str] = []
        self.keys: list[str] = []
        self.classified: dict[str, Any] | None = None
        self._engine: Engine | None = None

    def update(self, engine: Engine) -> None:
        """Add one iteration: the engine's decollated outputs, with the paths of its decollated batch."""
        outputs = _decollated(engine.state.output)
        if not outputs:
            return
        self._check_keys(outputs[0])
        self._fix_maps(engine, outputs[0])
        self.auc(*self._scores_and_labels(outputs))
        batch = engine.state.batch if isinstance(engine.state.batch, list) else [None] * len(outputs)
        paths = [_batch_path(b, o, self.image_key) for b, o in zip(batch, outputs)]
        self.paths.extend(paths)
        self.keys.extend(_key_text(self._breast(b, p)) for b, p in zip(batch, paths))

    def _breast(self, batch_item: Any, path: str) -> tuple | None:
        """The image's breast: from the batch item where it carries patient_id and laterality, else from the datalist
        item of its file; None (a breast of its own) when neither states both."""
        key = breast_key(batch_item) if isinstance(batch_item, Mapping) else None
        return key if key is not None else self.breast_of.get(_path_key(path))

    def _check_keys(self, output: Mapping[str, Any]) -> None:
        for key in (self.mask_key, self.score_key, self.label_key):
            if key not in output:
                raise UsageError(
                    f"MetricsReport: the evaluator's outputs lack {key!r} (keys {sorted(map(str, output))}); "
                    "use GLAMOutputsd as postprocessing and dict targets (GLAMPrepareBatch(with_masks=True))"
                )

    def _fix_maps(self, engine: Engine, output: Mapping[str, Any]) -> None:
        """The first update picks the maps present and attaches their handlers, later ones must have the same.

        The handlers are attached while the engine fires ITERATION_COMPLETED: Ignite runs the handlers of an event
        from its live list, so they take this first iteration too (:meth:`gather` checks that every handler saw
        every image)."""
        present = [m for m in self.maps if m in output]
        if self.present is None:
            if not present:
                raise UsageError(f"MetricsReport: none of the maps {self.maps} is in the evaluator's outputs")
            self.present = present
            self._engine = engine
            for m in present:
                self.handlers[m] = map_handlers(m, self.mask_key, **self._handler_args)
                for suffix, handler in self.handlers[m].items():
                    handler.attach(engine, f"{m}_{suffix}")
        elif present != self.present:
            raise UsageError(f"MetricsReport: maps changed within an evaluation ({self.present} -> {present})")

    def detach(self) -> None:
        """Take the handlers off the engine (a new evaluation attaches its own)."""
        if self._engine is not None:
            for handlers in self.handlers.values():
                for handler in handlers.values():
                    handler.detach(self._engine)
        self._engine = None

    def _scores_and_labels(self, outputs: Sequence[Mapping[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
        scores = torch.stack([torch.as_tensor(o[self.score_key]).reshape(-1).float() for o in outputs])
        labels = torch.stack([torch.as_tensor(o[self.label_key]).reshape(-1).to(scores) for o in outputs])
        if scores.shape[1] != len(self.class_names) or labels.shape != scores.shape:
            raise UsageError(
                f"MetricsReport: {self.score_key!r} and {self.label_key!r} must have one value per class "
                f"{self.class_names}, got shapes {tuple(scores.shape)} and {tuple(labels.shape)}"
            )
        return scores, labels

    def classify(self, engine: Engine) -> dict[str, Any]:
        """The image-level and breast-level AUC per class, from every rank, published in ``engine.state.metrics``
        as ``classification_auc_<class>`` and ``breast_auc_<class>`` (defined values only) when the epoch completes,
        so that the handlers logging the epoch's metrics after the report (MLflow) log them. Collective under DDP:
        runs on every rank, once per evaluation (:meth:`gather` reuses it)."""
        if self.classified is not None:
            return self.classified
        if self.present is None:
            raise UsageError("MetricsReport: no image was evaluated (empty split?)")
        # the same collective calls, in the same order, on every rank
        paths = string_list_all_gather(self.paths)
        keys = [tuple(json.loads(k)) if k else None for k in string_list_all_gather(self.keys)]
        y_score, y_label = self.auc.get_buffer()
        auc = self._aggregate_auc()
        breast = breast_auc(y_score.cpu(), y_label.cpu(), keys)
        breast["auc"] = breast["auc"].tolist()
        logger.info(
            "breast-level AUC over %d breasts of %d images (%d without a patient_id or laterality: each a breast)",
            breast["breasts"],
            len(keys),
            breast["images_without_breast"],
        )
        for name, values in (("classification_auc", auc), ("breast_auc", breast["auc"])):
            for c, value in zip(self.class_names, values):
                if not math.isnan(value):
                    engine.state.metrics[f"{name}_{c}"] = value
        self.classified = {"paths": paths, "y_score": y_score, "y_label": y_label, "auc": auc, "breast": breast}
        return self.classified

    def gather(self, engine: Engine) -> GatheredMetrics:
        """Everything collected, from every rank, after the handlers completed (their ``EPOCH_COMPLETED`` put the
        gathered per-image values in ``engine.state.metric_details``). Collective under DDP: call it on every rank."""
        if self.present is None:
            raise UsageError("MetricsReport: no image was evaluated (empty split?)")
        details = {
            m: {suffix: engine.state.metric_details[f"{m}_{suffix}"] for suffix in HANDLER_SUFFIXES}
            for m in self.present
        }
        # the same collective calls, in the same order, on every rank
        classified = self.classify(engine)
        paths, y_score, y_label, auc = (classified[k] for k in ("paths", "y_score", "y_label", "auc"))
        map_stats = {
            m: _map_stats(
                details[m],
                self.handlers[m]["pxap"].metric_fn.aggregate(level="dataset"),
                self.handlers[m]["froc"].metric_fn.aggregate(),
            )
            for m in self.present
        }
        scores = y_score.cpu().tolist()
        n_rows = {int(v.shape[0]) for d in details.values() for v in d.values()}
        if n_rows != {len(paths)} or len(scores) != len(paths):
            raise RuntimeError(
                f"MetricsReport: gathered {len(paths)} paths, {len(scores)} scores, {sorted(n_rows)} per-image values"
            )
        dice0 = details[self.present[0]]["dice"]
        return GatheredMetrics(
            maps=list(self.present),
            paths=paths,
            scores=scores,
            labels=y_label.cpu().tolist(),
            per_image={m: tuple(d[k].cpu().tolist() for k in ("dice", "pxap", "hit")) for m, d in details.items()},
            n_lesion=(~torch.isnan(dice0)).sum(0).cpu().tolist(),
            auc=auc,
            map_stats=map_stats,
            breast=classified["breast"],
            n_lesions=[int(v) for v in details[self.present[0]]["froc"].sum(0).cpu().tolist()],
            froc_rates=self.handlers[self.present[0]]["froc"].metric_fn.rates,
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


def _rate(rate: float) -> str:
    """A false-positive rate as a metrics.json key: 0.25 -> "0.25", 1.0 -> "1"."""
    return f"{float(rate):g}"


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
    n_unscored: int = 0,
) -> dict[str, Any]:
    """The summary (``metrics.json``): ``info``, counts (``n_images`` the images scored, ``n_unscored`` those left
    out: every count and number is over the scored ones), per class the classification AUC and the breast-level AUC
    (with the numbers of breasts and of images without a patient or laterality), per map and class the
    :data:`MAP_STATS` and ``"froc"`` (the sensitivity at each false-positive rate, keyed ``"0.25"`` ... ``"4"``),
    then ``settings`` (what the numbers depend on: PxAP step, tolerances, the CSV's name). Undefined values are
    None."""
    names = list(class_names)
    n_positive = [int(sum(1 for row in gathered.labels if row[i] >= 0.5)) for i in range(len(names))]
    return {
        **info,
        "n_images": len(gathered.paths),
        "n_unscored": int(n_unscored),
        "classes": names,
        "maps": list(gathered.maps),
        "n_lesion_images": {c: int(gathered.n_lesion[i]) for i, c in enumerate(names)},
        "n_positive_labels": {c: n_positive[i] for i, c in enumerate(names)},
        "n_lesions": {c: int(gathered.n_lesions[i]) for i, c in enumerate(names)},
        "classification_auc": {c: _number(gathered.auc[i]) for i, c in enumerate(names)},
        "breast_auc": {c: _number(gathered.breast["auc"][i]) for i, c in enumerate(names)},
        "n_breasts": int(gathered.breast["breasts"]),
        "images_without_breast": int(gathered.breast["images_without_breast"]),
        "metrics": {
            m: {
                c: {
                    **{k: _number(stats[k][i]) for k in MAP_STATS},
                    "froc": {_rate(r): _number(v) for r, v in zip(gathered.froc_rates, stats["froc"][i])},
                }
                for i, c in enumerate(names)
            }
            for m, stats in gathered.map_stats.items()
        },
        **settings,
    }
