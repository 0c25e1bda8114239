"""The numbers of the evaluation report: collected per image through the validation's metric handlers, gathered
across ranks (:class:`ReportMetrics`), and turned into the per-image rows and the summary."""

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
from monai.utils import string_list_all_gather

from ..errors import UsageError
from ..handlers import FROC, PointingGame, PxAP, SoftDice
from ..metrics._common import nan_reduce
from ..metrics.breasts import breast_auc, breast_key
from ..metrics.buffer import CompactROCAUCMetric

# log filters match the report's logger name
logger = logging.getLogger(f"{__package__}.report")

#: summary entries per map and class, in the order of the paper's Table 1
MAP_STATS = tuple("dice_mean dice_std pxap_image_mean pxap_image_std pxap_dataset pointing_game peak_on_border".split())

#: the metric handlers of one map, by the suffix of their name (``<map>_<suffix>`` in ``engine.state.metrics``)
HANDLER_SUFFIXES = ("dice", "pxap", "hit", "border", "froc")


def _decollated(output: Any) -> list[Mapping[str, Any]]:
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
    """The metric handlers of one map by :data:`HANDLER_SUFFIXES`, as train.yaml's ``validate#metrics``."""

    def transform(output: Any) -> tuple[list[Any], list[Any]]:
        return from_engine([map_key, mask_key])(_decollated(output))

    return {
        "dice": SoftDice(output_transform=transform, check_values=check_values),
        "pxap": PxAP(level="dataset", step=pxap_step, output_transform=transform, check_values=check_values),
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
    """Everything the report is made of, from every rank, on the CPU (rows in rank order; per-image lists (N, C))."""

    maps: list[str]
    paths: list[str]
    scores: list[list[float]]
    labels: list[list[float]]
    #: map -> (soft Dice, image-level PxAP, pointing-game hit)
    per_image: dict[str, tuple[list[list[float]], list[list[float]], list[list[float]]]]
    #: per class: images with a lesion of the class
    n_lesion: list[int]
    auc: list[float]
    #: map -> :data:`MAP_STATS` and ``"froc"`` -> per class
    map_stats: dict[str, dict[str, list[Any]]]
    #: :func:`~scripts.metrics.breasts.breast_auc`'s result
    breast: dict[str, Any]
    #: per class: lesions over the split
    n_lesions: list[int]
    froc_rates: tuple[float, ...]


def _batch_path(batch_item: Any, output_item: Any, image_key: str) -> str:
    """The image file of one decollated item: the batch's ``image_path``, else its ``filename_or_obj``; or ``""``."""
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
    """:data:`MAP_STATS` and ``"froc"`` -> per-class values of one map, from its per-image details."""
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
    return os.path.normpath(os.path.abspath(str(path))) if path else ""


def _key_text(key: tuple | None) -> str:
    """A breast key as text for the ranks' string gather (``""`` for none)."""
    return "" if key is None else json.dumps(list(key))


class ReportMetrics:
    """Collects one evaluation's per-image values through the metric handlers, which the first update attaches.

    Args:
        class_names: one name per channel.
        maps: the maps to report, where present in the outputs.
        keys: the image, mask, score and label keys of the decollated items.
        items: the evaluated datalist items, which name each image's breast.
        handler_args: the keyword arguments of :func:`map_handlers` after the keys.
    """

    def __init__(
        self,
        class_names: Sequence[str],
        maps: Sequence[str],
        keys: Sequence[str],
        items: Sequence[Mapping[str, Any]] | None = None,
        **handler_args: Any,
    ) -> None:
        self.class_names = list(class_names)
        self.maps = list(maps)
        self._handler_args = handler_args
        self.breast_of = {_path_key(it.get("image")): breast_key(it) for it in items or () if isinstance(it, Mapping)}
        self.image_key, self.mask_key, self.score_key, self.label_key = keys
        self.present: list[str] | None = None
        self.handlers: dict[str, dict[str, PxAP | SoftDice | PointingGame | FROC]] = {}
        self.auc = CompactROCAUCMetric(average="none")
        self.paths: list[str] = []
        self.keys: list[str] = []
        self.classified: dict[str, Any] | None = None
        self._engine: Engine | None = None

    def update(self, engine: Engine) -> None:
        """Add one iteration's decollated outputs and their image paths."""
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
        """The image's breast key, from the batch item or the datalist item of its file; None: a breast of its own."""
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
        """The first update picks the maps present and attaches their handlers; later ones must have the same.

        Ignite runs an event's handlers from its live list, so handlers attached here take this iteration too.
        """
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
        """Take the handlers off the engine."""
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
        """Publish the image- and breast-level AUC per class in ``engine.state.metrics``; collective."""
        if self.classified is not None:
            return self.classified
        if self.present is None:
            raise UsageError("MetricsReport: no image was evaluated (empty split?)")
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
        """Everything collected, from every rank, once the handlers completed; collective."""
        if self.present is None:
            raise UsageError("MetricsReport: no image was evaluated (empty split?)")
        details = {
            m: {suffix: engine.state.metric_details[f"{m}_{suffix}"] for suffix in HANDLER_SUFFIXES}
            for m in self.present
        }
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
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            auc = [float(v) for v in self.auc.aggregate(average="none")]
        for w in caught:
            logger.warning("classification AUC: %s", w.message)
        return auc


def _number(value: float) -> float | None:
    value = float(value)
    return None if math.isnan(value) else value


def _rate(rate: float) -> str:
    """A false-positive rate as a metrics.json key: 1.0 -> "1"."""
    return f"{float(rate):g}"


def _cell(value: float) -> str:
    value = float(value)
    return "" if math.isnan(value) else repr(value)


def _label_cell(value: float) -> str:
    value = float(value)
    return str(int(value)) if value.is_integer() else _cell(value)


def per_image_rows(gathered: GatheredMetrics, class_names: Sequence[str]) -> list[dict[str, str]]:
    """One CSV row per image: path, labels, ``y_global``, then per map and class Dice, PxAP and pointing-game hit."""
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
    """The summary (``metrics.json``): info, counts, AUCs, per-map statistics and FROC; undefined: None."""
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
