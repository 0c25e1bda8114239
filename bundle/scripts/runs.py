"""What every workflow's run shares, as config components: training (train.yaml), evaluation (evaluate.yaml) and
inference read their folders and MLflow's records through these, so neither wing reaches into the other.

- :func:`save_config`: the merged configuration as ``<folder>/config.json``, the tracked run's artifact (training's
  :func:`scripts.training.tracking.attach_tracked_config` before its handlers are built, the evaluation's
  :func:`track_config_artifact` after).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from .atomic import atomic_write

__all__ = ["save_config", "track_config_artifact"]


def save_config(folder: str | os.PathLike, config: Any) -> str:
    """Write ``config`` (a merged configuration) as ``<folder>/config.json`` (atomically, the folder made when
    missing) and return the file's path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "config.json")
    with atomic_write(path, "w") as f:
        json.dump(config, f, indent=1, default=str)
    return path


def track_config_artifact(
    handlers: Sequence[Any], folder: str | os.PathLike, config: dict[str, Any] | None = None
) -> str | None:
    """For built handlers (evaluate.yaml's ``handlers``): when one of them is an ``MLFlowHandler`` that logs no
    artifact, save the merged configuration as ``<folder>/config.json`` and make it that handler's artifact (MONAI's
    own copy is off: train.yaml's ``save_execute_config: false``). ``config``: the merged configuration, by default
    the one the ``monai.bundle run`` command line describes (:func:`scripts.commands.command_line_config`); from
    Python there is no such command, and nothing is saved (pass ``save_execute_config=<file>`` to MONAI's workflow
    for its own copy). Returns the file's path, or None."""
    from monai.handlers import MLFlowHandler

    from .commands import command_line_config

    tracked = [h for h in handlers or () if isinstance(h, MLFlowHandler) and not any(h.artifacts)]
    config = command_line_config() if config is None and tracked else config
    if not tracked or config is None:
        return None
    path = save_config(folder, config)
    for handler in tracked:
        handler.artifacts = (path,)
    return path
