"""Where an inference run's time went and how far it is: a progress line, then images/s and ``timing.json``."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from ignite.engine import Engine, Events
from ignite.handlers import BasicTimeProfiler

from ..atomic import atomic_write

logger = logging.getLogger(__name__)

#: an item's seconds of loading and preprocessing, carried into the step's output for timing.json
LOAD_SECONDS_KEY = "load_s"

TIMING_FILE = "timing.json"


#: the loggers of the inference workflow's own lines: its wing (the writer's warnings naming files, the output
#: folder), these handlers (progress, summary) and the weights (loaded strictly)
INFERENCE_LOGGERS = ("scripts.inference", "scripts.handlers", "scripts.networks")


def show_inference_log(level: int = logging.INFO) -> list[logging.Logger]:
    """Make the inference log lines reach stderr where no handler receives them; returns the loggers."""
    loggers = [logging.getLogger(name) for name in INFERENCE_LOGGERS]
    for package in loggers:
        if not package.hasHandlers():
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s - %(levelname)s - %(message)s"))
            package.addHandler(handler)
            if package.getEffectiveLevel() > level:
                package.setLevel(level)
    return loggers


def _images_in(output: Any) -> tuple[int, int]:
    """(good images, failed inputs) of one inference iteration's output."""
    if not isinstance(output, dict):
        return 0, 0
    return len(output.get("items", [])), len(output.get("errors", []))


def format_duration(seconds: float) -> str:
    """``"1:02:03"`` / ``"2:03"``: hours, minutes and seconds of a duration."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class InferenceThroughput:
    """Time an inference evaluator with Ignite's :class:`~ignite.handlers.BasicTimeProfiler`; log and write the result.

    Args:
        output_dir: where ``timing.json`` goes (None: only the log line).
        writer: the run's :class:`~scripts.inference.writer.GLAMInferenceWriter` (its ``stats()``), or None.
    """

    def __init__(self, output_dir: str | os.PathLike | None = None, writer: Any = None) -> None:
        self.output_dir = None if output_dir is None else Path(output_dir)
        self.writer = writer
        self.profiler = BasicTimeProfiler()
        self.images = self.errors = 0
        self.loading = 0.0
        self._start = 0.0
        self.summary: dict[str, Any] = {}

    def attach(self, engine: Engine) -> None:
        self.profiler.attach(engine)
        engine.add_event_handler(Events.STARTED, self._started)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self._count)
        engine.add_event_handler(Events.COMPLETED, self._completed)

    def _started(self, engine: Engine) -> None:
        self.images, self.errors, self.loading, self._start = 0, 0, 0.0, time.perf_counter()

    def _count(self, engine: Engine) -> None:
        good, failed = _images_in(engine.state.output)
        self.images += good
        self.errors += failed
        if isinstance(engine.state.output, dict):
            self.loading += float(engine.state.output.get(LOAD_SECONDS_KEY, 0.0))

    def summarise(self) -> dict[str, Any]:
        """The figures of the run so far; zero images in zero seconds for a run that never started."""
        writer = self.writer.stats() if self.writer is not None else {}
        if not self._start:
            return idle_summary(writer)
        wall = time.perf_counter() - self._start
        results = self.profiler.get_results()
        parts = {
            "model": float(results["processing_stats"]["total"]),
            "waiting_for_data": float(results["dataflow_stats"]["total"]),
            "waiting_for_writers": float(writer.get("waiting_for_writers_s", 0.0)),
        }
        parts["other"] = max(0.0, wall - sum(parts.values()))
        counts = (self.images, writer.get("failed", self.errors), writer.get("written", self.images))
        return _summary((*counts, writer.get("skipped", 0)), wall, parts, self.loading, writer)

    def _completed(self, engine: Engine) -> None:
        self.summary = self.summarise()
        logger.info(
            "inference: %d images in %.1f s (%.2f images/s; %d skipped as done before, %d failed); model %.0f %%, "
            "waiting for data %.0f %%, waiting for the writers %.0f %%",
            self.images,
            self.summary["wall_s"],
            self.summary["images_per_s"],
            self.summary["skipped"],
            self.summary["failed"],
            100 * self.summary["model_share"],
            100 * self.summary["waiting_for_data_share"],
            100 * self.summary["waiting_for_writers_share"],
        )
        if self.output_dir is not None:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            with atomic_write(self.output_dir / TIMING_FILE, "w") as f:
                json.dump(self.summary, f, indent=2)


WALL_PARTS = ("model", "waiting_for_data", "waiting_for_writers", "other")
WORK_KEYS = (
    "loading_s",
    "writing_s",
    "writing_maps_back_s",
    "writing_map_files_s",
    "writing_panel_s",
    "writing_dicom_s",
)


def idle_summary(writer: dict[str, Any] | None = None) -> dict[str, Any]:
    """timing.json's figures of a run that had nothing to do (the writer's counts kept)."""
    writer = writer or {}
    counts = (0, writer.get("failed", 0), writer.get("written", 0), writer.get("skipped", 0))
    return _summary(counts, 0.0, dict.fromkeys(WALL_PARTS, 0.0), 0.0, writer)


def _summary(counts: tuple, wall: float, parts: dict, loading: float, writer: dict) -> dict[str, Any]:
    """timing.json's figures, in its order, from (images, failed, written, skipped), the wall time and its parts."""
    images, failed, written, skipped = counts
    return {
        "images": images,
        "failed": failed,
        "written": written,
        "skipped": skipped,
        "wall_s": wall,
        "images_per_s": images / wall if wall > 0 else 0.0,
        "images_per_min": 60.0 * images / wall if wall > 0 else 0.0,
        **{f"{k}_s": v for k, v in parts.items()},
        **{f"{k}_share": v / wall if wall > 0 else 0.0 for k, v in parts.items()},
        "loading_s": loading,
        **{k: v for k, v in writer.items() if k.startswith("writing") or k == "writer_threads"},
    }


def combine_rank_timings(reports: list[dict[str, Any]], merge_s: float = 0.0) -> dict[str, Any]:
    """timing.json of a run over several processes from each rank's report.

    Args:
        reports: per rank ``rank``, ``host``, ``device``, ``inputs``, ``error`` and ``timing`` (its ``summarise()``).
        merge_s: rank 0's time merging the tables after the last rank.

    Returns:
        every rank's figures under ``ranks``; counts and the time's parts summed, ``wall_s`` the slowest rank's (the
        ranks start together), shares of the summed wall times (``rank_seconds``), ``processes`` and ``ranks_failed``.
    """
    ranks = []
    for report in sorted(reports, key=lambda r: int(r["rank"])):
        timing = report.get("timing") or idle_summary()
        who = {k: report.get(k) for k in ("rank", "host", "device", "inputs", "error")}
        ranks.append({**who, **timing})
    wall = max((r["wall_s"] for r in ranks), default=0.0)
    rank_seconds = sum(r["wall_s"] for r in ranks)
    images = sum(r["images"] for r in ranks)
    total: dict[str, Any] = {
        k: sum(int(r.get(k, 0)) for r in ranks) for k in ("images", "failed", "written", "skipped")
    }
    total.update(
        processes=len(ranks),
        wall_s=wall,
        images_per_s=images / wall if wall > 0 else 0.0,
        images_per_min=60.0 * images / wall if wall > 0 else 0.0,
        rank_seconds=rank_seconds,
    )
    for part in WALL_PARTS:
        seconds = sum(r.get(f"{part}_s", 0.0) for r in ranks)
        total[f"{part}_s"] = seconds
        total[f"{part}_share"] = seconds / rank_seconds if rank_seconds > 0 else 0.0
    for key in WORK_KEYS:
        total[key] = sum(r.get(key, 0.0) for r in ranks)
    total.update(ranks_failed=[r["rank"] for r in ranks if r.get("error")], merge_s=float(merge_s), ranks=ranks)
    return total


class RankTimings:
    """Write a multi-process run's timing.json and log the run's and each rank's images/s.

    Args:
        output_dir: where ``timing.json`` goes.
    """

    def __init__(self, output_dir: str | os.PathLike) -> None:
        self.output_dir = Path(output_dir)
        self.summary: dict[str, Any] = {}

    def write(self, reports: list[dict[str, Any]], merge_s: float = 0.0) -> dict[str, Any]:
        self.summary = combine_rank_timings(reports, merge_s)
        total = self.summary
        logger.info(
            "inference on %d processes: %d images in %.1f s (%.2f images/s together; %d skipped as done before, %d "
            "failed); per rank %s images/s; model %.0f %%, waiting for data %.0f %%, waiting for the writers %.0f %% "
            "of the ranks' time",
            total["processes"],
            total["images"],
            total["wall_s"],
            total["images_per_s"],
            total["skipped"],
            total["failed"],
            " / ".join(f"{r['images_per_s']:.2f}" for r in total["ranks"]),
            100 * total["model_share"],
            100 * total["waiting_for_data_share"],
            100 * total["waiting_for_writers_share"],
        )
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with atomic_write(self.output_dir / TIMING_FILE, "w") as f:
            json.dump(total, f, indent=2)
        return total


class InferenceProgress:
    """Log how far the run is: ``inference: 120/4000 images, 5.1 images/s, about 12:40 left``.

    The total is the images this run reads; a tqdm bar is drawn on a terminal.

    Args:
        interval_s: seconds between log lines.
        bar: draw a tqdm bar (None: when stderr is a terminal).
    """

    def __init__(self, interval_s: float = 30.0, bar: bool | None = None) -> None:
        self.interval_s = float(interval_s)
        self.bar = bar
        self.total = self.done = 0
        self._start = self._last_log = 0.0
        self._bar: Any = None

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.STARTED, self._started)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self._update)
        engine.add_event_handler(Events.COMPLETED, self._completed)

    def _started(self, engine: Engine) -> None:
        loader = getattr(engine.state, "dataloader", None)
        self.total = len(loader.dataset) if loader is not None and hasattr(loader, "dataset") else 0
        self.done, self._start = 0, time.perf_counter()
        self._last_log = self._start
        show = sys.stderr.isatty() if self.bar is None else self.bar
        if show:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, unit="img", desc="inference", dynamic_ncols=True, mininterval=1.0)

    def line(self) -> str:
        """The progress line: images done of the total, images/s, the time left at that rate."""
        elapsed = time.perf_counter() - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if self.done >= self.total:
            left = f", done in {format_duration(elapsed)}"
        else:
            left = f", about {format_duration((self.total - self.done) / rate)} left" if rate > 0 else ""
        return f"inference: {self.done}/{self.total} images, {rate:.2f} images/s{left}"

    def _update(self, engine: Engine) -> None:
        good, failed = _images_in(engine.state.output)
        self.done += good + failed
        if self._bar is not None:
            self._bar.update(good + failed)
        now = time.perf_counter()
        if now - self._last_log >= self.interval_s:
            self._last_log = now
            logger.info("%s", self.line())

    def _completed(self, engine: Engine) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        logger.info("%s", self.line())
