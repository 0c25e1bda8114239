"""Where an inference run's time went: images per minute and the shares of the model, the writing and the waiting
for data, logged at the end and written to ``<output_dir>/timing.json``."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from ignite.engine import Engine, Events
from ignite.handlers import BasicTimeProfiler

from ..atomic import atomic_write

__all__ = ["InferenceThroughput"]

logger = logging.getLogger(__name__)


class InferenceThroughput:
    """Ignite handler over Ignite's :class:`~ignite.handlers.BasicTimeProfiler` for the inference evaluator.

    Reports, for the run: images (good ones, the model's inputs), wall seconds from the engine's start to its
    completion, images per minute, and the seconds and share of the wall time spent

    - ``model``: in the iteration (``GLAMInferenceStep``: the network on the batch, outputs to the CPU);
    - ``writing``: in the iteration-completed handlers (the writer: maps back onto each file, NIfTI, PNG, panel);
    - ``waiting_for_data``: waiting for the data loader (reading and preprocessing that the loader workers did not
      hide behind the model).

    Args:
        output_dir: where ``timing.json`` goes (None: only the log line).
    """

    def __init__(self, output_dir: str | os.PathLike | None = None) -> None:
        self.output_dir = None if output_dir is None else Path(output_dir)
        self.profiler = BasicTimeProfiler()
        self.images = 0
        self._start = 0.0
        self.summary: dict[str, Any] = {}

    def attach(self, engine: Engine) -> None:
        self.profiler.attach(engine)
        engine.add_event_handler(Events.STARTED, self._started)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self._count)
        engine.add_event_handler(Events.COMPLETED, self._completed)

    def _started(self, engine: Engine) -> None:
        self.images, self._start = 0, time.perf_counter()

    def _count(self, engine: Engine) -> None:
        output = engine.state.output
        self.images += len(output.get("items", [])) if isinstance(output, dict) else 0

    def _completed(self, engine: Engine) -> None:
        wall = time.perf_counter() - self._start
        results = self.profiler.get_results()
        parts = {
            "model": float(results["processing_stats"]["total"]),
            "writing": float(results["event_handlers_stats"]["ITERATION_COMPLETED"]["total"]),
            "waiting_for_data": float(results["dataflow_stats"]["total"]),
        }
        self.summary = {
            "images": self.images,
            "wall_s": wall,
            "images_per_min": 60.0 * self.images / wall if wall > 0 else 0.0,
            **{f"{k}_s": v for k, v in parts.items()},
            **{f"{k}_share": v / wall if wall > 0 else 0.0 for k, v in parts.items()},
        }
        logger.info(
            "inference: %d images in %.1f s (%.1f images/min); model %.0f %%, writing %.0f %%, "
            "waiting for data %.0f %%",
            self.images,
            wall,
            self.summary["images_per_min"],
            100 * self.summary["model_share"],
            100 * self.summary["writing_share"],
            100 * self.summary["waiting_for_data_share"],
        )
        if self.output_dir is not None:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            with atomic_write(self.output_dir / "timing.json", "w") as f:
                json.dump(self.summary, f, indent=2)
