"""The evaluation report of a GLAM model: every number of the paper's Table 1 from one pass over a split.

:class:`MetricsReport` is an Ignite handler for a MONAI ``SupervisedEvaluator`` whose postprocessing is
:class:`~scripts.transforms.outputs.GLAMOutputsd`. It computes its numbers on the validation's path: on the
first iteration it attaches, per map (``S_g``, and ``S_l``/``S_c`` when the model ran its local module), the
metric handlers train.yaml's ``validate#metrics`` is made of (:class:`~scripts.handlers.SoftDice`,
:class:`~scripts.handlers.PxAP` at the dataset level, two :class:`~scripts.handlers.PointingGame`: hit rate and
share of peaks on the border, and the lesion-level :class:`~scripts.handlers.FROC`) with ``save_details=True``,
and feeds one ``monai.metrics.ROCAUCMetric`` with the image-level probabilities ``y_global``, noting each image's
breast (its datalist item's patient_id, laterality and study). When the epoch completes it computes the image- and
breast-level AUC and publishes them in ``engine.state.metrics`` (``classification_auc_<class>``,
``breast_auc_<class>``: MLflow logs them). When the evaluator completes, the handlers have gathered the per-image
values across ranks into ``engine.state.metric_details`` (collective calls on every rank); the report reduces
them, adds the dataset-level PxAP of the pooled histograms, the FROC sensitivities and the AUCs, and rank 0 writes

- ``metrics.csv``: one row per image (image path, labels, ``y_global``, then per map and class soft Dice,
  image-level PxAP and the pointing-game hit (1/0); empty where undefined: the image has no lesion of that class);
- ``metrics.json``: the summary (per map and class: Dice mean/std, image-level PxAP mean/std, dataset-level PxAP,
  pointing-game hit rate and share of peaks on the border, FROC sensitivity at 0.25 to 4 false positives per image;
  per class: classification AUC per image and per breast, lesion and label counts) plus what was evaluated;

atomically, and prints the summary as a plain-text table in the layout of the paper's Table 1.

The handler composes three collaborators, one per job: collecting and gathering the values through the metric
handlers (:class:`~scripts.evaluation.metrics.ReportMetrics`), computing the rows and the summary
(:func:`~scripts.evaluation.metrics.per_image_rows`, :func:`~scripts.evaluation.metrics.report_summary`)
and writing them (:mod:`scripts.evaluation.files`). The writing is not ``monai.handlers.MetricsSaver``'s: it
reads the same ``engine.state.metric_details``, but writes one ``<metric>_raw.csv`` per handler and a
``metrics.csv`` of name/value lines, where the report's files (read by the benchmark, the docs and the MONAI Label
app) hold one row per image with every map and class, and a summary with per-class statistics and the
dataset-level PxAP. A ``MetricsSaver`` attached to the evaluator beside the report can still write its files from
the report's handlers (``<map>_dice``, ``<map>_pxap``, ``<map>_hit``, ``<map>_border``), in another folder: its
``metrics.csv`` would replace the report's.

The two helpers :func:`check_checkpoint` and :func:`eval_split_items` validate what ``configs/evaluate.yaml``
is asked to evaluate before anything is built, so that bad arguments fail early with a message naming them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ignite.distributed as idist
from ignite.engine import Engine, Events
from monai.utils import str2bool

from ..distributed import rank, world_size
from ..enums import CLASS_NAMES, MAP_NAMES, STAGES, OutputKey
from ..errors import UsageError
from .files import format_table, write_report_files, write_unscored
from .metrics import MAP_STATS, ReportMetrics, per_image_rows, report_summary
from .unscored import ScoredLoader

__all__ = [
    "MetricsReport",
    "UnscoredImagesError",
    "check_checkpoint",
    "eval_split_items",
    "run_evaluation",
    "format_table",
    "EVAL_SPLITS",
    "MAP_STATS",
]

logger = logging.getLogger(__name__)

EVAL_SPLITS = ("validation", "test")
#: the unscored images named in the log (all of them are in unscored.csv)
_LOGGED_UNSCORED = 20


class UnscoredImagesError(UsageError):
    """Images of the split that the evaluation could not score, without ``skip_unscored``."""


def check_checkpoint(path: str | os.PathLike, stage: str) -> str:
    """Fail early, naming the file, when the checkpoint to evaluate is missing; returns ``path`` as a string.

    Raises:
        ValueError: ``stage`` is not one of the model's stages (``all`` trains, it cannot be evaluated).
        FileNotFoundError: ``path`` is not a file.
    """
    if stage not in STAGES:
        raise UsageError(f"stage must be one of {STAGES} to evaluate a model, got {stage!r}")
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
        raise UsageError(f"--eval_split must be one of {EVAL_SPLITS}, got {split!r}")
    items = datalist.get(split)
    if not items:
        other = next((s for s in EVAL_SPLITS if s != split and datalist.get(s)), None)
        hint = f"evaluate the {other} split with --eval_split {other}, or " if other else ""
        share = "VAL" if split == "validation" else "TEST"
        raise UsageError(
            f"{source}: split {split!r} is missing or empty; nothing to evaluate: {hint}give the datalist a {split} "
            f"split (tools/make_datalist.py --fractions TRAIN VAL TEST with {share} > 0, e.g. --fractions "
            "0.7 0.15 0.15)"
        )
    return list(items)


def run_evaluation(evaluator: Any, report: MetricsReport) -> dict[str, Any]:
    """Run ``evaluator`` over the split once and return what ``report`` (one of its handlers) wrote to
    ``metrics.json``: evaluate.yaml's last ``evaluating`` entry."""
    evaluator.run()
    return report.summary


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
        froc_radius: the FROC's candidates are the maxima of the ``(2 froc_radius + 1)`` px square around them.
        froc_tolerance: a FROC candidate within this many pixels of a lesion of its class finds it.
        froc_max_candidates: at most this many FROC candidates per map, class and image (the highest).
        items: the evaluated datalist items: their ``patient_id``, ``laterality`` (and ``study``) name the breast of
            each image, matched by the image's path (None: every image is a breast of its own, unless the batch
            items carry those keys).
        unscored: the evaluator's data (:class:`~scripts.evaluation.unscored.ScoredLoader`), whose markers name the
            images it could not score; None: every image is scored.
        skip_unscored: with images that could not be scored, report the others (the summary's ``n_unscored`` and the
            table's heading count them) instead of raising :class:`UnscoredImagesError`. Either way they are written
            to ``unscored.csv`` beside the report (with the header alone when there are none) and logged, on rank 0.
        check_values: let the metrics check score ranges and mask values (one host synchronisation per call).
        print_table: print the table to stdout at completion (rank 0).
        image_key, mask_key, score_key, label_key: keys of the decollated batch/output items.
        prefix: file name stem of the report files.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        class_names: Sequence[str] = CLASS_NAMES,
        info: Mapping[str, Any] | None = None,
        maps: Sequence[str] = MAP_NAMES,
        pxap_step: float = 0.001,
        pointing_tolerance: float = 0.0,
        peak_border: float = 0.0,
        froc_radius: int = 8,
        froc_tolerance: float = 0.0,
        froc_max_candidates: int = 20,
        items: Sequence[Mapping[str, Any]] | None = None,
        unscored: ScoredLoader | None = None,
        skip_unscored: bool | str = False,
        check_values: bool = True,
        print_table: bool = True,
        image_key: str = "image",
        mask_key: str = "lesion_mask",
        score_key: str = OutputKey.Y_GLOBAL.value,
        label_key: str = "label",
        prefix: str = "metrics",
    ) -> None:
        self.output_dir = Path(output_dir)
        self.class_names = [str(c) for c in class_names]
        if len(set(self.class_names)) != len(self.class_names) or not self.class_names:
            raise UsageError(f"class_names must be distinct and non-empty, got {list(class_names)}")
        self.info = {str(k): (str(v) if isinstance(v, os.PathLike) else v) for k, v in (info or {}).items()}
        self.maps = list(maps)
        self.pxap_step = float(pxap_step)
        self.pointing_tolerance = float(pointing_tolerance)
        self.peak_border = float(peak_border)
        self.froc_radius, self.froc_tolerance = int(froc_radius), float(froc_tolerance)
        self.froc_max_candidates = int(froc_max_candidates)
        self.items = list(items) if items is not None else None
        self.unscored = unscored
        self.skip_unscored = str2bool(str(skip_unscored))
        #: the images not scored, every rank's, in the split's order (``{"image", "reason"}``)
        self.unscored_images: list[dict[str, str]] = []
        self.check_values = bool(check_values)
        self.print_table = bool(print_table)
        self.image_key, self.mask_key, self.score_key, self.label_key = image_key, mask_key, score_key, label_key
        self.prefix = prefix
        self.summary: dict[str, Any] = {}
        self.rows: list[dict[str, str]] = []
        self.table = ""
        self.metrics: ReportMetrics | None = None
        self.reset()

    @property
    def json_path(self) -> Path:
        return self.output_dir / f"{self.prefix}.json"

    @property
    def csv_path(self) -> Path:
        return self.output_dir / f"{self.prefix}.csv"

    @property
    def unscored_path(self) -> Path:
        return self.output_dir / "unscored.csv"

    def reset(self) -> None:
        """Start a new evaluation: fresh metrics (the previous evaluation's handlers detached), no map chosen yet."""
        if getattr(self, "metrics", None) is not None:
            self.metrics.detach()
        self.metrics = ReportMetrics(
            self.class_names,
            self.maps,
            pxap_step=self.pxap_step,
            pointing_tolerance=self.pointing_tolerance,
            peak_border=self.peak_border,
            check_values=self.check_values,
            image_key=self.image_key,
            mask_key=self.mask_key,
            score_key=self.score_key,
            label_key=self.label_key,
            froc_radius=self.froc_radius,
            froc_tolerance=self.froc_tolerance,
            froc_max_candidates=self.froc_max_candidates,
            items=self.items,
        )

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.EPOCH_STARTED, lambda _: self.reset())
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.update)
        # the AUCs into engine.state.metrics before the handlers attached after the report log the epoch (MLflow)
        engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: self.metrics.classify(e))
        if self.unscored is not None:  # the images not scored, when the data ends
            self.unscored.on_end = self.check_unscored
        engine.add_event_handler(Events.COMPLETED, self.complete)

    def check_unscored(self, unscored: Sequence[Mapping[str, str]]) -> None:
        """The images this rank could not score (``unscored``, at the end of its data), gathered from every rank into
        :attr:`unscored_images`, written to ``unscored.csv`` and logged (rank 0); then, with any and without
        ``skip_unscored``, :class:`UnscoredImagesError` on every rank. Collective under DDP: every rank calls it.

        Raises:
            UnscoredImagesError: images not scored, without ``skip_unscored``.
            ValueError: a rank (or the only process) with no image scored: there is nothing to report.
        """
        mine = ([dict(e) for e in unscored], len(self.metrics.paths))
        ranks = idist.all_gather(mine) if world_size() > 1 else [mine]
        self.unscored_images = [entry for entries, _ in ranks for entry in entries]
        n, n_scored = len(self.unscored_images), sum(count for _, count in ranks)
        if rank() == 0:
            write_unscored(self.unscored_images, self.unscored_path)
            for entry in self.unscored_images[:_LOGGED_UNSCORED]:
                logger.warning("unscored image %s: %s", entry["image"], entry["reason"])
            if n > _LOGGED_UNSCORED:
                logger.warning("... and %d more unscored image(s), in %s", n - _LOGGED_UNSCORED, self.unscored_path)
        split = f"the {self.info['split']} split" if self.info.get("split") else "the split"
        if n and not self.skip_unscored:
            raise UnscoredImagesError(
                f"{n} image(s) of {split} could not be scored, each with its reason in {self.unscored_path}: fix them "
                "(or take them out of the datalist), or report the other images with --skip_unscored true"
            )
        empty = [r for r, (_, count) in enumerate(ranks) if count == 0]
        if empty:
            where = f"rank {empty[0]}'s block of {split} (run fewer processes)" if world_size() > 1 else split
            raise UsageError(f"no image of {where} could be scored ({n} unscored, in {self.unscored_path})")
        if n:
            logger.warning(
                "%d unscored image(s) skipped (skip_unscored), listed in %s: every number of the report is over the "
                "other %d image(s)",
                n,
                self.unscored_path,
                n_scored,
            )

    def update(self, engine: Engine) -> None:
        """Add the iteration's decollated outputs (one dict is one image), with the batch's image paths."""
        self.metrics.update(engine)

    def compute(self, engine: Engine) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """Per-image rows and the summary, once the metric handlers of ``engine`` completed. Collective under DDP:
        call it on every rank."""
        gathered = self.metrics.gather(engine)
        settings = {
            "pxap_step": self.pxap_step,
            "pointing_tolerance_px": self.pointing_tolerance,
            "peak_border_px": self.peak_border,
            "froc_radius_px": self.froc_radius,
            "froc_tolerance_px": self.froc_tolerance,
            "froc_max_candidates": self.froc_max_candidates,
            "per_image_csv": self.csv_path.name,
            "unscored_csv": self.unscored_path.name,
            "skip_unscored": self.skip_unscored,
        }
        return per_image_rows(gathered, self.class_names), report_summary(
            gathered, self.class_names, self.info, settings, n_unscored=len(self.unscored_images)
        )

    def complete(self, engine: Engine) -> None:
        """Gather, then (rank 0) write ``metrics.json`` / ``metrics.csv`` and print the table."""
        self.rows, self.summary = self.compute(engine)
        self.table = format_table(self.summary)
        if rank() != 0:
            return
        write_report_files(self.rows, self.summary, self.csv_path, self.json_path)
        logger.info("evaluation report written to %s and %s", self.json_path, self.csv_path)
        if self.print_table:
            print(self.table, flush=True)
