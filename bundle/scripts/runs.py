"""What every workflow's run shares, as config components: training (train.yaml), evaluation (evaluate.yaml) and
inference read their folders and MLflow's records through these, so neither wing reaches into the other.

- :func:`save_config`: the merged configuration as ``<folder>/config.json``, the tracked run's artifact (training's
  :func:`scripts.training.tracking.attach_tracked_config` before its handlers are built; the evaluation's,
  :class:`scripts.training.workflow.GLAMWorkflow`, as MONAI's ``save_execute_config``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from .atomic import atomic_write

__all__ = ["save_config"]


def save_config(folder: str | os.PathLike, config: Any) -> str:
    """Write ``config`` (a merged configuration) as ``<folder>/config.json`` (atomically, the folder made when
    missing) and return the file's path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "config.json")
    with atomic_write(path, "w") as f:
        json.dump(config, f, indent=1, default=str)
    return path
