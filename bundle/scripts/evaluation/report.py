"""The evaluation report of a GLAM model: every number of the paper's Table 1 from one pass over a split."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ignite.distributed as idist
from ignite.engine import Engine, Events
from monai.utils import str2bool

from ..enums import CLASS_NAMES, MAP_NAMES, OutputKey
from ..errors import UsageError
from .files import format_table, write_report_files, write_unscored
from .metrics import ReportMetrics, per_image_rows, report_summary
from .unscored import ScoredLoader

logger = logging.getLogger(__name__)

EVAL_SPLITS = ("validation", "test")
#: the unscored images named in the log
_LOGGED_UNSCORED = 20


class UnscoredImagesError(UsageError):
    """Images of the split that the evaluation could not score, without ``skip_unscored``."""


def eval_split_items(datalist: Mapping[str, Sequence[Any]], split: str, source: Any = "datalist") -> list[Any]:
    """The items of the split to evaluate; ``source`` names the datalist in errors.

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


class MetricsReport:
    """Ignite handler accumulating GLAM's evaluation metrics per image and writing the report on completion.

    Under DDP every rank needs at least one image (the gathers are collective); rank 0 writes the files.

    Args:
        output_dir: where ``metrics.json`` and ``metrics.csv`` go (created when missing).
        class_names: one name per channel, in channel order.
        info: extra entries for the JSON (what was evaluated: checkpoint, stage, split, datalist...).
        maps: the maps to report, in row order, where present in the outputs.
        pxap_step: threshold spacing of PxAP (0.001, as the paper).
        pointing_tolerance, peak_border: as in :func:`~scripts.metrics.pointing_game.compute_pointing_game`.
        froc_radius, froc_tolerance, froc_max_candidates: as in :class:`~scripts.metrics.froc.FROCMetric`.
        items: the evaluated datalist items, whose ``patient_id`` and ``laterality`` name each image's breast.
        unscored: the evaluator's :class:`~scripts.evaluation.unscored.ScoredLoader`; None: every image is scored.
        skip_unscored: report the other images instead of raising :class:`UnscoredImagesError`.
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
        self.handler_args = {
            "pxap_step": float(pxap_step),
            "pointing_tolerance": float(pointing_tolerance),
            "peak_border": float(peak_border),
            "check_values": bool(check_values),
            "froc_radius": int(froc_radius),
            "froc_tolerance": float(froc_tolerance),
            "froc_max_candidates": int(froc_max_candidates),
        }
        self.items = list(items) if items is not None else None
        self.unscored = unscored
        self.skip_unscored = str2bool(str(skip_unscored))
        self.unscored_images: list[dict[str, str]] = []
        self.print_table = bool(print_table)
        self.image_key, self.mask_key, self.score_key, self.label_key = image_key, mask_key, score_key, label_key
        self.json_path = self.output_dir / f"{prefix}.json"
        self.csv_path = self.output_dir / f"{prefix}.csv"
        self.unscored_path = self.output_dir / "unscored.csv"
        self.summary: dict[str, Any] = {}
        self.rows: list[dict[str, str]] = []
        self.table = ""
        self.metrics: ReportMetrics | None = None
        self.reset()

    def reset(self) -> None:
        """Start a new evaluation with fresh metrics."""
        if getattr(self, "metrics", None) is not None:
            self.metrics.detach()
        keys = (self.image_key, self.mask_key, self.score_key, self.label_key)
        self.metrics = ReportMetrics(self.class_names, self.maps, keys, self.items, **self.handler_args)

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.EPOCH_STARTED, lambda _: self.reset())
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.update)
        # the AUCs in engine.state.metrics before the handlers attached after the report log the epoch
        engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: self.metrics.classify(e))
        if self.unscored is not None:
            self.unscored.on_end = self.check_unscored
        engine.add_event_handler(Events.COMPLETED, self.complete)

    def check_unscored(self, unscored: Sequence[Mapping[str, str]]) -> None:
        """Gather every rank's unscored images into :attr:`unscored_images`, write and log them (rank 0); collective.

        Raises:
            UnscoredImagesError: images not scored, without ``skip_unscored``.
            ValueError: a rank (or the only process) with no image scored: there is nothing to report.
        """
        mine = ([dict(e) for e in unscored], len(self.metrics.paths))
        ranks = idist.all_gather(mine) if idist.get_world_size() > 1 else [mine]
        self.unscored_images = [entry for entries, _ in ranks for entry in entries]
        n, n_scored = len(self.unscored_images), sum(count for _, count in ranks)
        if idist.get_rank() == 0:
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
            where = f"rank {empty[0]}'s block of {split} (run fewer processes)" if idist.get_world_size() > 1 else split
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
        """Add the iteration's decollated outputs."""
        self.metrics.update(engine)

    def compute(self, engine: Engine) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """Per-image rows and the summary, once the metric handlers completed; collective."""
        gathered = self.metrics.gather(engine)
        args = self.handler_args
        settings = {
            "pxap_step": args["pxap_step"],
            "pointing_tolerance_px": args["pointing_tolerance"],
            "peak_border_px": args["peak_border"],
            "froc_radius_px": args["froc_radius"],
            "froc_tolerance_px": args["froc_tolerance"],
            "froc_max_candidates": args["froc_max_candidates"],
            "per_image_csv": self.csv_path.name,
            "unscored_csv": self.unscored_path.name,
            "skip_unscored": self.skip_unscored,
        }
        return per_image_rows(gathered, self.class_names), report_summary(
            gathered, self.class_names, self.info, settings, n_unscored=len(self.unscored_images)
        )

    def complete(self, engine: Engine) -> None:
        """Gather, then (rank 0) write the report and print the table."""
        self.rows, self.summary = self.compute(engine)
        self.table = format_table(self.summary)
        if idist.get_rank() != 0:
            return
        write_report_files(self.rows, self.summary, self.csv_path, self.json_path)
        logger.info("evaluation report written to %s and %s", self.json_path, self.csv_path)
        if self.print_table:
            print(self.table, flush=True)
