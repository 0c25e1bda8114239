"""What MLflow records of a training stage (``--tracking mlflow``): parameters and the merged configuration."""

from __future__ import annotations

import json
import os
from typing import Any

from monai.bundle import ConfigParser

from ..atomic import atomic_write


def save_config(folder: str | os.PathLike, config: Any) -> str:
    """Write ``config`` as ``<folder>/config.json`` atomically and return the file's path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "config.json")
    with atomic_write(path, "w") as f:
        json.dump(config, f, indent=1, default=str)
    return path


#: the hyper-parameters a tracked stage records (top-level config ids; per-stage ones as the stage's value)
TRACKED = tuple(
    "seed image_size pixel_spacing patch_size num_patches num_patches_eval t_global t_local gamma_c aggregation "
    "patch_shift centre_patches local_negatives local_depth local_width local_padding_mode global_backbone "
    "pool_in_breast lambda_sparsity learning_rate epochs batch_size val_interval early_stop_patience selection_metric "
    "amp train_cache".split()
)


def tracking_params(parser: ConfigParser, stage: str) -> dict[str, str]:
    """The parameters MLflow records for a stage."""
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


def _mlflow_handlers(parser: ConfigParser, handlers_id: str) -> list[dict]:
    handlers = parser.get(handlers_id) or []
    return [h for h in handlers if isinstance(h, dict) and str(h.get("_target_", "")).endswith("MLFlowHandler")]


def attach_tracked_config(
    parser: ConfigParser, handlers_id: str, folder: str | os.PathLike, params_id: str | None = None
) -> str | None:
    """Save the merged configuration as ``<folder>/config.json``, the artifact of the ``--tracking`` ``MLFlowHandler``.

    Args:
        parser: the running configuration, edited in place (call before the handlers are built).
        handlers_id: the config id of the handler list.
        folder: where ``config.json`` goes.
        params_id: a config id whose dict the handler records as the run's parameters.

    Returns:
        the file's path; None when nothing is tracked.
    """
    tracked = _mlflow_handlers(parser, handlers_id)
    if not tracked:
        return None
    path = save_config(folder, parser.get())
    for handler in tracked:
        if params_id is not None and params_id in parser:
            handler.setdefault("experiment_param", f"@{params_id}")
        if handler.get("artifacts") in (None, "@save_execute_config") and not parser.get("save_execute_config"):
            handler["artifacts"] = path
    return path


def track_stage(stage_parser: ConfigParser, stage: str) -> None:
    """Make a tracked stage record its parameters and merged configuration; call before the stage is built."""
    if not _mlflow_handlers(stage_parser, "train#handlers"):
        return
    params = tracking_params(stage_parser, stage)
    attach_tracked_config(stage_parser, "train#handlers", str(stage_parser.get_parsed_content("output_dir")))
    for handler in _mlflow_handlers(stage_parser, "train#handlers"):
        handler.setdefault("experiment_param", "@tracking_params")
    # setting an item resets what the parser resolved while reading the parameters: the stage is built afresh
    stage_parser["tracking_params"] = params
