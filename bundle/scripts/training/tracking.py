"""What MLflow records of a training stage or an evaluation (``--tracking mlflow``): parameters and the merged
configuration."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from monai.bundle import ConfigParser

__all__ = ["TRACKED", "run_name", "tracking_params", "attach_tracked_config", "track_config_artifact", "track_stage"]

#: the hyper-parameters a tracked stage records (top-level config ids; per-stage ones as the stage's value)
TRACKED = (
    "seed",
    "image_size",
    "pixel_spacing",
    "patch_size",
    "num_patches",
    "num_patches_eval",
    "t_global",
    "t_local",
    "gamma_c",
    "aggregation",
    "patch_shift",
    "local_depth",
    "local_width",
    "global_backbone",
    "pool_in_breast",
    "lambda_sparsity",
    "learning_rate",
    "epochs",
    "batch_size",
    "val_interval",
    "early_stop_patience",
    "selection_metric",
    "amp",
    "train_cache",
)


def run_name(prefix: str, stage: str) -> str:
    """The MLflow run's default name, ``<prefix>_<stage>`` (``train_global``, ``evaluate_joint``)."""
    return f"{prefix}_{stage}"


def tracking_params(parser: ConfigParser, stage: str) -> dict[str, str]:
    """The parameters MLflow records for a stage (train.yaml's ``tracking_params``): the hyper-parameters in
    :data:`TRACKED` (a per-stage dict both as this stage's value and, as ``<name>_per_stage``, whole), the datalist's
    path and the sizes of its training and validation splits, and the metric that selects the best model."""
    from .preflight import per_stage

    params: dict[str, str] = {"stage": str(stage)}
    for name in TRACKED:
        if name not in parser:
            continue
        value = parser.get_parsed_content(name)
        if isinstance(value, dict) and stage in value:
            params[f"{name}_per_stage"] = json.dumps(value, sort_keys=True, default=str)
            value = per_stage(value, stage, name)
        params[name] = json.dumps(value, default=str) if isinstance(value, (dict, list, tuple)) else str(value)
    params["datalist"] = os.path.abspath(str(parser.get_parsed_content("datalist")))
    params["train_items"] = str(len(parser.get_parsed_content("train_datalist")))
    params["validation_items"] = str(len(parser.get_parsed_content("val_datalist")))
    params["selection"] = str(parser.get_parsed_content("selection")["metric"])
    return params


def attach_tracked_config(
    parser: ConfigParser, handlers_id: str, folder: str | os.PathLike, params_id: str | None = None
) -> str | None:
    """When MONAI's ``--tracking mlflow`` patched an ``MLFlowHandler`` into ``parser[handlers_id]``: save the merged
    configuration as ``<folder>/config.json`` and make it the handler's artifact (MONAI's own copy is off:
    train.yaml's ``save_execute_config: false``); with ``params_id``, the handler also records that config id's
    dict as the run's parameters. Returns the file's path, None when nothing is tracked. Call before the handlers
    are built: it edits their raw configuration in place, which MONAI reads when it builds a component."""
    handlers = parser.get(handlers_id) or []
    tracked = [h for h in handlers if isinstance(h, dict) and str(h.get("_target_", "")).endswith("MLFlowHandler")]
    if not tracked:
        return None
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "config.json")
    from ..atomic import atomic_write

    with atomic_write(path, "w") as f:
        json.dump(parser.get(), f, indent=1, default=str)
    for handler in tracked:
        if params_id is not None and params_id in parser:
            handler.setdefault("experiment_param", f"@{params_id}")
        # MONAI's own copy (`--save_execute_config true`) when asked for, else this one
        if handler.get("artifacts") in (None, "@save_execute_config") and not parser.get("save_execute_config"):
            handler["artifacts"] = path
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

    from ..atomic import atomic_write
    from ..commands import command_line_config

    tracked = [h for h in handlers or () if isinstance(h, MLFlowHandler) and not any(h.artifacts)]
    config = command_line_config() if config is None and tracked else config
    if not tracked or config is None:
        return None
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "config.json")
    with atomic_write(path, "w") as f:
        json.dump(config, f, indent=1, default=str)
    for handler in tracked:
        handler.artifacts = (path,)
    return path


def track_stage(stage_parser: ConfigParser, stage: str) -> None:
    """A tracked stage (MONAI's ``--tracking`` patched an ``MLFlowHandler`` into ``train#handlers``) records its
    parameters (:func:`tracking_params`, set as the config's ``tracking_params``) and its merged configuration
    (``<output_dir>/config.json``). Call before anything of the stage is built."""
    handlers = stage_parser.get("train#handlers") or []
    if not any(isinstance(h, dict) and str(h.get("_target_", "")).endswith("MLFlowHandler") for h in handlers):
        return
    params = tracking_params(stage_parser, stage)
    attach_tracked_config(stage_parser, "train#handlers", str(stage_parser.get_parsed_content("output_dir")))
    for handler in stage_parser.get("train#handlers"):
        if isinstance(handler, dict) and str(handler.get("_target_", "")).endswith("MLFlowHandler"):
            handler.setdefault("experiment_param", "@tracking_params")
    # setting an item resets what the parser resolved while reading the parameters: the stage is built afresh
    stage_parser["tracking_params"] = params
