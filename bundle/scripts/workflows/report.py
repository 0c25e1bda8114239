"""The evaluation report of a GLAM model: every number of the paper's Table 1 from one pass over a split.

:class:`MetricsReport` is an Ignite handler for a MONAI ``SupervisedEvaluator`` whose postprocessing is
:class:`~scripts.workflows.postprocessing.GLAMOutputsd`. Per iteration it feeds the decollated outputs to the
bundle's metric objects (on the device of the maps): per map (``S_g``, and ``S_l``/``S_c`` when the model ran its
local module) a :class:`~scripts.metrics.SoftDiceMetric`, a :class:`~scripts.metrics.PxAPMetric` (per-image APs
plus the pooled histograms: memory does not grow with the split) and two
:class:`~scripts.metrics.PointingGameMetric` (hit rate; share of peaks on the image border), and one
``monai.metrics.ROCAUCMetric`` for the image-level probabilities ``y_global``. When the evaluator completes, the
per-image values and the aggregates are gathered across ranks by the metrics themselves (collective calls on every
rank), and rank 0 writes

- ``metrics.csv``: one row per image (image path, labels, ``y_global``, then per map and class soft Dice,
  image-level PxAP and the pointing-game hit (1/0); empty where undefined: the image has no lesion of that class);
- ``metrics.json``: the summary (per map and class: Dice mean/std, image-level PxAP mean/std, dataset-level PxAP,
  pointing-game hit rate and share of peaks on the border; per class: classification AUC, lesion and label counts)
  plus what was evaluated;

atomically, and prints the summary as a plain-text table in the layout of the paper's Table 1.

The two helpers :func:`check_checkpoint` and :func:`eval_split_items` validate what ``configs/evaluate.yaml``
is asked to evaluate before anything is built, so that bad arguments fail early with a message naming them.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from ignite.engine import Engine, Events
from monai.metrics import ROCAUCMetric
from monai.utils import string_list_all_gather

from ..atomic import atomic_write
from ..metrics import PointingGameMetric, PxAPMetric, SoftDiceMetric
from .postprocessing import MAP_KEYS
from .runner import STAGE_ORDER

__all__ = ["MetricsReport", "check_checkpoint", "eval_split_items", "format_table", "EVAL_SPLITS"]

logger = logging.getLogger(__name__)

EVAL_SPLITS = ("validation", "test")
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


def check_checkpoint(path: str | os.PathLike, stage: str) -> str:
    """Fail early, naming the file, when the checkpoint to evaluate is missing; returns ``path`` as a string.

    Raises:
        ValueError: ``stage`` is not one of the model's stages (``all`` trains, it cannot be evaluated).
        FileNotFoundError: ``path`` is not a file.
    """
    if stage not in STAGE_ORDER:
        raise ValueError(f"stage must be one of {STAGE_ORDER} to evaluate a model, got {stage!r}")
    if not Path(path).is_file():
        raise FileNotFoundError(
            f"checkpoint to evaluate not found: {path} (train the {stage!r} stage first, or point --ckpt_path at "
            "a model.pt / last.pt)"
        )
    return str(path)


def eval_split_items(datalist: Mapping[str, Sequence[Any]], split: str, source: Any = "datalist") -> list[Any]:
    """The items of the split to evaluate (``validation`` or ``test``); ``source`` names the datalist in errors.

    Raises:
        ValueError: an unknown split name, or a split that is missing or empty in the datalist.
    """
    if split not in EVAL_SPLITS:
        raise ValueError(f"eval_split must be one of {EVAL_SPLITS}, got {split!r}")
    items = datalist.get(split)
    if not items:
        raise ValueError(f"{source}: split {split!r} is missing or empty; nothing to evaluate")
    return list(items)


def _is_rank_zero() -> bool:
    return not (torch.distributed.is_available() and torch.distributed.is_initialized()) or (
        torch.distributed.get_rank() == 0
    )


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


def _image_path(batch_item: Any, output_item: Any, image_key: str) -> str:
    for item in (batch_item, output_item):
        image = item.get(image_key) if isinstance(item, Mapping) else None
        meta = getattr(image, "meta", None)
        if isinstance(meta, Mapping) and meta.get("filename_or_obj"):
            return str(meta["filename_or_obj"])
    return ""


class MetricsReport:
    """Accumulate GLAM's evaluation metrics per image and write the report when the evaluator completes.

    Expects ``engine.state.output`` to be the decollated list of :class:`GLAMOutputsd` dicts: per image the maps
    ``S_g`` (and ``S_l``, ``S_c``) (C, H, W) in [0, 1], ``lesion_mask`` (C, H, W) binary, ``y_global`` (C,) and
    ``label`` (C,); the image path comes from the ``meta["filename_or_obj"]`` of the batch's (or output's)
    ``image_key``. The set of maps is fixed by the first iteration (it depends on the model's stage).

    Under DDP every rank must run the evaluator on at least one image (the metrics' gathers are collective); rows
    are ordered rank by rank, and only rank 0 writes and prints.

    After completion, :attr:`summary` holds what ``metrics.json`` holds and :attr:`rows` the CSV rows (dicts).

    Args:
        output_dir: where ``metrics.json`` and ``metrics.csv`` go (created when missing).
        class_names: one name per channel, in channel order.
        info: extra entries for the JSON (what was evaluated: checkpoint, stage, split, datalist...).
        maps: the maps to report, in row order, where present in the outputs.
        pxap_step: threshold spacing of PxAP (0.001, as the paper).
        pointing_tolerance: pixels between a map's peak and a lesion pixel of its class that still count as a
            pointing-game hit.
        peak_border: pixels from the image edge within which a peak counts as on the border.
        check_values: let the metrics check score ranges and mask values (one host synchronisation per call).
        print_table: print the table to stdout at completion (rank 0).
        image_key, mask_key, score_key, label_key: keys of the decollated batch/output items.
        prefix: file name stem of the report files.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        class_names: Sequence[str] = ("benign", "malignant"),
        info: Mapping[str, Any] | None = None,
        maps: Sequence[str] = tuple(MAP_KEYS),
        pxap_step: float = 0.001,
        pointing_tolerance: float = 0.0,
        peak_border: float = 0.0,
        check_values: bool = True,
        print_table: bool = True,
        image_key: str = "image",
        mask_key: str = "lesion_mask",
        score_key: str = "y_global",
        label_key: str = "label",
        prefix: str = "metrics",
    ) -> None:
        self.output_dir = Path(output_dir)
        self.class_names = [str(c) for c in class_names]
        if len(set(self.class_names)) != len(self.class_names) or not self.class_names:
            raise ValueError(f"class_names must be distinct and non-empty, got {list(class_names)}")
        self.info = {str(k): (str(v) if isinstance(v, os.PathLike) else v) for k, v in (info or {}).items()}
        self.maps = list(maps)
        self.pxap_step = float(pxap_step)
        self.pointing_tolerance = float(pointing_tolerance)
        self.peak_border = float(peak_border)
        self.check_values = bool(check_values)
        self.print_table = bool(print_table)
        self.image_key, self.mask_key, self.score_key, self.label_key = image_key, mask_key, score_key, label_key
        self.prefix = prefix
        self.summary: dict[str, Any] = {}
        self.rows: list[dict[str, str]] = []
        self.table = ""
        self.reset()

    @property
    def json_path(self) -> Path:
        return self.output_dir / f"{self.prefix}.json"

    @property
    def csv_path(self) -> Path:
        return self.output_dir / f"{self.prefix}.csv"

    # -- accumulation ------------------------------------------------------------------------------------------
    def reset(self) -> None:
        self._present: list[str] | None = None
        self._dice: dict[str, SoftDiceMetric] = {}
        self._pxap: dict[str, PxAPMetric] = {}
        self._hit: dict[str, PointingGameMetric] = {}
        self._border: dict[str, PointingGameMetric] = {}
        self._auc = ROCAUCMetric(average="none")
        self._paths: list[str] = []

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.EPOCH_STARTED, lambda _: self.reset())
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.update)
        engine.add_event_handler(Events.COMPLETED, self.complete)

    def update(self, engine: Engine) -> None:
        outputs = engine.state.output
        if isinstance(outputs, Mapping):
            outputs = [outputs]
        batch = engine.state.batch if isinstance(engine.state.batch, list) else [None] * len(outputs)
        if not outputs:
            return
        for key in (self.mask_key, self.score_key, self.label_key):
            if key not in outputs[0]:
                raise ValueError(
                    f"MetricsReport: the evaluator's outputs lack {key!r} (keys {sorted(map(str, outputs[0]))}); "
                    "use GLAMOutputsd as postprocessing and dict targets (GLAMPrepareBatch(with_masks=True))"
                )
        present = [m for m in self.maps if m in outputs[0]]
        if self._present is None:
            if not present:
                raise ValueError(f"MetricsReport: none of the maps {self.maps} is in the evaluator's outputs")
            self._present = present
            for m in present:
                self._dice[m] = SoftDiceMetric(check_values=self.check_values)
                self._pxap[m] = PxAPMetric(level="dataset", step=self.pxap_step, check_values=self.check_values)
                # the range checks of the Dice already ran on these maps
                self._hit[m] = PointingGameMetric(tolerance=self.pointing_tolerance, check_values=False)
                self._border[m] = PointingGameMetric(border=self.peak_border, measure="border", check_values=False)
        elif present != self._present:
            raise ValueError(f"MetricsReport: maps changed within an evaluation ({self._present} -> {present})")
        masks = [o[self.mask_key] for o in outputs]
        for m in self._present:
            maps = [o[m] for o in outputs]
            self._dice[m](maps, masks)
            self._pxap[m](maps, masks)
            self._hit[m](maps, masks)
            self._border[m](maps, masks)
        scores = torch.stack([torch.as_tensor(o[self.score_key]).reshape(-1).float() for o in outputs])
        labels = torch.stack([torch.as_tensor(o[self.label_key]).reshape(-1).to(scores) for o in outputs])
        if scores.shape[1] != len(self.class_names) or labels.shape != scores.shape:
            raise ValueError(
                f"MetricsReport: {self.score_key!r} and {self.label_key!r} must have one value per class "
                f"{self.class_names}, got shapes {tuple(scores.shape)} and {tuple(labels.shape)}"
            )
        self._auc(scores, labels)
        self._paths.extend(_image_path(b, o, self.image_key) for b, o in zip(batch, outputs))

    # -- results -----------------------------------------------------------------------------------------------
    def compute(self) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """Per-image rows and the summary. Collective under DDP: call it on every rank."""
        if self._present is None:
            raise ValueError("MetricsReport: no image was evaluated (empty split?)")
        names = self.class_names
        paths = string_list_all_gather(self._paths)
        y_score, y_label = self._auc.get_buffer()
        per_image = {
            m: (self._dice[m].get_buffer(), self._pxap[m].get_buffer(), self._hit[m].get_buffer())
            for m in self._present
        }
        with warnings.catch_warnings(record=True) as caught:  # a class with one label value: AUC is NaN
            warnings.simplefilter("always")
            auc = [float(v) for v in self._auc.aggregate(average="none")]
        for w in caught:
            logger.warning("classification AUC: %s", w.message)
        maps_summary: dict[str, dict[str, dict[str, float | None]]] = {}
        for m in self._present:
            dice, pxap = self._dice[m], self._pxap[m]
            stats = {
                "dice_mean": dice.aggregate("mean"),
                "dice_std": dice.aggregate("std"),
                "pxap_image_mean": pxap.aggregate("mean", level="image"),
                "pxap_image_std": pxap.aggregate("std", level="image"),
                "pxap_dataset": pxap.aggregate("mean", level="dataset"),
                "pointing_game": self._hit[m].aggregate("mean"),
                "peak_on_border": self._border[m].aggregate("mean"),
            }
            stats_cpu = {k: v.cpu().tolist() for k, v in stats.items()}
            maps_summary[m] = {c: {k: _number(stats_cpu[k][i]) for k in MAP_STATS} for i, c in enumerate(names)}

        dice0 = per_image[self._present[0]][0]
        n_lesion = (~torch.isnan(dice0)).sum(0).cpu().tolist()
        scores = y_score.cpu().tolist()
        labels = y_label.cpu().tolist()
        n_positive = [int(sum(1 for row in labels if row[i] >= 0.5)) for i in range(len(names))]
        if not (len(paths) == len(scores) == dice0.shape[0]):
            raise RuntimeError(
                f"MetricsReport: gathered {len(paths)} paths, {len(scores)} scores, {dice0.shape[0]} maps"
            )
        per_image_cpu = {m: tuple(v.cpu().tolist() for v in values) for m, values in per_image.items()}
        rows = []
        for n, path in enumerate(paths):
            row = {"image": path}
            row.update({f"label_{c}": _label_cell(labels[n][i]) for i, c in enumerate(names)})
            row.update({f"y_global_{c}": _cell(scores[n][i]) for i, c in enumerate(names)})
            for m, (d, p, h) in per_image_cpu.items():
                row.update({f"{m}_dice_{c}": _cell(d[n][i]) for i, c in enumerate(names)})
                row.update({f"{m}_pxap_{c}": _cell(p[n][i]) for i, c in enumerate(names)})
                row.update({f"{m}_hit_{c}": _label_cell(h[n][i]) for i, c in enumerate(names)})
            rows.append(row)
        summary = {
            **self.info,
            "n_images": len(paths),
            "classes": list(names),
            "maps": list(self._present),
            "n_lesion_images": {c: int(n_lesion[i]) for i, c in enumerate(names)},
            "n_positive_labels": {c: n_positive[i] for i, c in enumerate(names)},
            "classification_auc": {c: _number(auc[i]) for i, c in enumerate(names)},
            "metrics": maps_summary,
            "pxap_step": self.pxap_step,
            "pointing_tolerance_px": self.pointing_tolerance,
            "peak_border_px": self.peak_border,
            "per_image_csv": self.csv_path.name,
        }
        return rows, summary

    def complete(self, engine: Engine | None = None) -> None:
        """Gather, then (rank 0) write ``metrics.json`` / ``metrics.csv`` and print the table."""
        self.rows, self.summary = self.compute()
        self.table = format_table(self.summary)
        if not _is_rank_zero():
            return
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(self.rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        with atomic_write(self.csv_path, "w") as f:
            f.write(buffer.getvalue())
        with atomic_write(self.json_path, "w") as f:
            f.write(json.dumps(self.summary, indent=2, allow_nan=False) + "\n")
        logger.info("evaluation report written to %s and %s", self.json_path, self.csv_path)
        if self.print_table:
            print(self.table, flush=True)


def _fmt(value: float | None, std: float | None = None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if std is None else f"{value:.3f} +/- {std:.3f}"


def format_table(summary: Mapping[str, Any]) -> str:
    """The summary as plain text in the paper's Table 1 layout: one row per map, per class (malignant first, as
    the paper) Dice mean +/- std, image-level PxAP mean +/- std, dataset-level PxAP, and classification AUC (of
    ``y_global``, so the same on every row)."""
    classes = list(summary["classes"])
    # the paper lists malignant before benign
    order = sorted(classes, key=lambda c: (c != "malignant", c != "benign"))
    groups = [
        ("Dice", lambda s, c: _fmt(s[c]["dice_mean"], s[c]["dice_std"])),
        ("image-level PxAP", lambda s, c: _fmt(s[c]["pxap_image_mean"], s[c]["pxap_image_std"])),
        ("dataset-level PxAP", lambda s, c: _fmt(s[c]["pxap_dataset"])),
        ("pointing game", lambda s, c: _fmt(s[c].get("pointing_game"))),
        ("classification AUC", lambda s, c: _fmt(summary["classification_auc"][c])),
    ]
    header_group = ["map"]
    header_class = [""]
    for name, _ in groups:
        header_group += [name] + [""] * (len(order) - 1)
        header_class += order
    body = []
    for m in summary["maps"]:
        stats = summary["metrics"][m]
        body.append([m] + [cell(stats, c) for _, cell in groups for c in order])
    widths = [max(len(r[i]) for r in [header_class, *body]) for i in range(len(header_class))]
    # a group title spans its class columns
    for g, (name, _) in enumerate(groups):
        first = 1 + g * len(order)
        span = sum(widths[first : first + len(order)]) + 2 * (len(order) - 1)
        if len(name) > span:
            widths[first + len(order) - 1] += len(name) - span

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    group_line = [header_group[0].ljust(widths[0])]
    for g, (name, _) in enumerate(groups):
        first = 1 + g * len(order)
        span = sum(widths[first : first + len(order)]) + 2 * (len(order) - 1)
        group_line.append(name.ljust(span))
    lesions = ", ".join(f"{c} {summary['n_lesion_images'][c]}" for c in order)
    positives = ", ".join(f"{c} {summary['n_positive_labels'][c]}" for c in order)
    title = f"GLAM evaluation: {summary.get('split', 'split')} split, {summary['n_images']} images"
    if summary.get("stage"):
        title += f", stage {summary['stage']}"
    lines = [
        title,
        *([f"checkpoint: {summary['checkpoint']}"] if summary.get("checkpoint") else []),
        f"images with a lesion mask: {lesions}; labelled positive: {positives}",
        "",
        "  ".join(group_line).rstrip(),
        line(header_class),
        "-" * (sum(widths) + 2 * (len(widths) - 1)),
        *(line(r) for r in body),
        "",
        "Dice and PxAP over the images with a lesion of the class (mean +/- std); pointing game: share of those images"
        f" whose map peaks within {summary.get('pointing_tolerance_px', 0):g} px of a lesion of the class; AUC of"
        " y_global (every row).",
    ]
    return "\n".join(lines)
