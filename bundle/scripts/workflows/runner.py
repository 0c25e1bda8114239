"""Run GLAM's three training stages in order as one MONAI bundle workflow.

``train.yaml`` describes one stage, parameterised by its ``stage`` id (``global``, ``local`` or ``joint``), so
that every stage is a complete MONAI train workflow (its own trainer, evaluator, handlers and checkpoint folder)
that passes ``ConfigWorkflow.check_properties()``. :func:`run_stages` runs the stage named by ``stage``, or all
three in order for ``stage: all``: each in a fresh copy of the bundle's merged configuration (the config files,
presets, command-line overrides and the handlers MONAI's ``--tracking`` patched in), with ``stage`` set, so that
nothing of one stage's objects leaks into the next and every override applies to every stage.

:class:`GLAMTrainingWorkflow` is that run as a ``ConfigWorkflow``: ``initialize`` joins the process group when the
configuration asks for one (``distributed: true``, ``multi_gpu_train.yaml``), ``run`` evaluates ``training`` with
the workflow's own parser handed to :func:`run_training`, ``finalize`` leaves the group. ``python -m monai.bundle run
training`` builds MONAI's plain ``ConfigWorkflow`` (its ``run`` has no way to name another class, and
``--workflow_name`` cannot import ``scripts`` before MONAI puts the bundle root on ``sys.path``); for that command
:func:`run_training` finds the running parser itself (:func:`running_parser`).
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from monai.bundle import ConfigParser, ConfigWorkflow
from monai.utils import str2bool

from ..enums import STAGES
from .distributed import destroy_distributed, disable_on_other_ranks, init_distributed, quiet_other_ranks, rank

__all__ = [
    "STAGE_ORDER",
    "GLAMTrainingWorkflow",
    "active_parser",
    "run_stages",
    "run_training",
    "stages_to_run",
    "running_parser",
    "tracking_params",
    "attach_tracked_config",
    "track_config_artifact",
]

#: the stages in training order (the vocabulary's order)
STAGE_ORDER = STAGES
logger = logging.getLogger(__name__)

#: the parser of the GLAMTrainingWorkflow whose ``run`` is under way (None under MONAI's plain ConfigWorkflow)
_ACTIVE_PARSER: ContextVar[ConfigParser | None] = ContextVar("glam_active_parser", default=None)


def stages_to_run(stage: str) -> list[str]:
    """``"all"`` -> the three stages in order; one stage name -> that stage."""
    if stage == "all":
        return list(STAGE_ORDER)
    if stage not in STAGE_ORDER:
        raise ValueError(f"stage must be 'all' or one of {STAGE_ORDER}, got {stage!r}")
    return [stage]


def running_parser() -> ConfigParser:
    """The ``ConfigParser`` whose content is being evaluated (the caller of this config expression).

    Only for ``python -m monai.bundle run``, whose plain ``ConfigWorkflow`` hands its parser to nothing: MONAI
    evaluates ``$`` expressions inside ``ConfigParser.get_parsed_content``, so the parser is found on the call stack
    there. :class:`GLAMTrainingWorkflow` passes its parser explicitly (:func:`active_parser`).

    Raises:
        RuntimeError: called from outside a bundle config.
    """
    frame = inspect.currentframe()
    try:
        while frame is not None:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, ConfigParser):
                return candidate
            frame = frame.f_back
    finally:
        del frame
    raise RuntimeError("running_parser() must be called from a bundle config expression (no ConfigParser found)")


def active_parser() -> ConfigParser:
    """The running training workflow's parser: the :class:`GLAMTrainingWorkflow`'s own, else (the plain
    ``monai.bundle run`` command) the one evaluating the calling config expression."""
    parser = _ACTIVE_PARSER.get()
    return running_parser() if parser is None else parser


@contextmanager
def _active(parser: ConfigParser) -> Iterator[None]:
    token = _ACTIVE_PARSER.set(parser)
    try:
        yield
    finally:
        _ACTIVE_PARSER.reset(token)


def run_stages(parser: ConfigParser, stage: str, stage_run_id: str = "run_stage") -> list[Any]:
    """Run one stage or all three: for each, a deep copy of ``parser``'s merged config with ``stage`` set, whose
    ``stage_run_id`` entry (set determinism, ``train#trainer.run()``, a summary) is then evaluated.

    On ranks other than 0 of a process group, the copy's logging and drawing handlers (the config's
    ``rank_zero_only`` class names, if it has that entry) are disabled before anything in it is built.

    Args:
        parser: the bundle's parser (its raw content is copied, never modified).
        stage: ``"all"``, ``"global"``, ``"local"`` or ``"joint"``.
        stage_run_id: the config id that runs one stage.

    Returns:
        per stage, what the last entry of its ``stage_run_id`` list evaluated to (train.yaml: a summary dict).
    """
    names = stages_to_run(stage)  # a bad stage name fails before anything is built
    this_rank = rank()
    rank_zero_only: Sequence[str] = ()
    if "rank_zero_only" in parser and this_rank != 0:
        rank_zero_only = parser.get_parsed_content("rank_zero_only")
    results = []
    for name in names:
        logger.info("GLAM training: stage %s", name)
        config = copy.deepcopy(parser.get())
        disable_on_other_ranks(config, rank_zero_only, rank_=this_rank)
        stage_parser = ConfigParser(config, globals=dict(parser.globals))
        stage_parser["stage"] = name
        _track_stage(stage_parser)
        result = stage_parser.get_parsed_content(stage_run_id)
        results.append(result[-1] if isinstance(result, list) and result else result)
    return results


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


def tracking_params(parser: ConfigParser, stage: str) -> dict[str, str]:
    """The parameters MLflow records for a stage (train.yaml's ``tracking_params``): the hyper-parameters in
    :data:`TRACKED` (a per-stage dict both as this stage's value and, as ``<name>_per_stage``, whole), the datalist's
    path and the sizes of its training and validation splits, and the metric that selects the best model."""
    from .cli import per_stage

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
    handlers: Sequence[Any], folder: str | os.PathLike, parser: ConfigParser | None = None
) -> str:
    """For built handlers (evaluate.yaml's ``handlers``): save the merged configuration of ``parser`` (the running
    one by default) as ``<folder>/config.json`` and make it the artifact of every ``MLFlowHandler`` among
    ``handlers`` that logs none (MONAI's own copy is off: train.yaml's ``save_execute_config: false``)."""
    from monai.handlers import MLFlowHandler

    from ..atomic import atomic_write

    parser = active_parser() if parser is None else parser
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "config.json")
    with atomic_write(path, "w") as f:
        json.dump(parser.get(), f, indent=1, default=str)
    for handler in handlers or ():
        if isinstance(handler, MLFlowHandler) and not any(handler.artifacts):
            handler.artifacts = (path,)
    return path


def _track_stage(stage_parser: ConfigParser) -> None:
    """A tracked stage records its parameters (``tracking_params``) and its merged configuration
    (``<output_dir>/config.json``)."""
    if stage_parser.get("train#handlers"):
        attach_tracked_config(
            stage_parser, "train#handlers", str(stage_parser.get_parsed_content("output_dir")), "tracking_params"
        )


def run_training(stage: str, stage_run_id: str = "run_stage", parser: ConfigParser | None = None) -> list[Any]:
    """:func:`run_stages` on ``parser``, by default the running training workflow's (:func:`active_parser`).

    train.yaml's ``training`` entry: ``$scripts.workflows.run_training(@stage)``.
    """
    return run_stages(active_parser() if parser is None else parser, stage, stage_run_id)


class GLAMTrainingWorkflow(ConfigWorkflow):
    """GLAM's multi-stage training as a MONAI bundle workflow that owns its process group.

    The same run as ``python -m monai.bundle run training`` (``run_id`` defaults to ``"training"``), from Python::

        wf = GLAMTrainingWorkflow(config_file=["configs/train.yaml"], meta_file="configs/metadata.json", stage="all")
        wf.initialize()
        summaries = wf.run()[-1]  # one dict per stage
        wf.finalize()

    With ``distributed: true`` (``multi_gpu_train.yaml``, under ``torchrun``) ``initialize`` joins the process
    group (``dist_backend``, ``dist_timeout_s``) and quiets the other ranks' logging, and ``finalize`` leaves it,
    also when ``training`` left it already. Every argument is ``ConfigWorkflow``'s, including ``tracking``: its
    handlers are patched into the merged configuration that every stage copies.
    """

    def __init__(self, *args: Any, run_id: str = "training", **kwargs: Any) -> None:
        super().__init__(*args, run_id=run_id, **kwargs)
        self._joined_group = False

    def _distributed(self) -> bool:
        return str2bool(str(self.parser.get("distributed", False)))

    def initialize(self) -> Any:
        """Parse the configuration, join the process group if it is a distributed run, evaluate ``initialize``."""
        result = super().initialize()
        if self._distributed() and not self._joined_group:
            init_distributed(
                backend=self.parser.get_parsed_content("dist_backend"),
                timeout_s=self.parser.get_parsed_content("dist_timeout_s"),
            )
            quiet_other_ranks(self.parser.get_parsed_content("log_level_other_ranks"))
            self._joined_group = True
        return result

    def run(self) -> Any:
        """Evaluate ``run_id`` (``training``), with this workflow's parser as the one the stages copy."""
        with _active(self.parser):
            return super().run()

    def finalize(self) -> Any:
        """Evaluate ``finalize``, then leave the process group this workflow joined."""
        try:
            return super().finalize()
        finally:
            if self._joined_group:
                destroy_distributed()
                self._joined_group = False
