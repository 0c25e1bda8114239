"""Run GLAM's three training stages in order as one MONAI bundle workflow.

``train.yaml`` describes one stage, parameterised by its ``stage`` id (``global``, ``local`` or ``joint``), so
that every stage is a complete MONAI train workflow (its own trainer, evaluator, handlers and checkpoint folder)
that passes ``ConfigWorkflow.check_properties()``. :func:`run_stages` runs the stage named by ``stage``, or all
three in order for ``stage: all``: each in a fresh copy of the bundle's merged configuration (the config files,
presets, command-line overrides and the handlers MONAI's ``--tracking`` patched in), with ``stage`` set, so that
nothing of one stage's objects leaks into the next and every override applies to every stage.

train.yaml's ``training`` entry is :func:`run_training`: on the parser of the workflow that evaluates it (under
``python -m monai.bundle run training``, MONAI's own ``ConfigWorkflow``, built from the command line and the config
files MONAI read), it checks the command line and the data, then runs the stages; no second workflow is built and
nothing is read again. It joins the process group of a distributed run (``distributed: true``,
``multi_gpu_train.yaml``) when none is joined yet, and leaves what it joined. :class:`GLAMTrainingWorkflow` is the
same run from Python, a ``ConfigWorkflow`` whose ``run_id`` is ``training`` and which owns the process group from
``initialize`` to ``finalize`` (so that ``check_properties`` can build the DDP network).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import Any

import torch.distributed
from monai.bundle import ConfigParser, ConfigWorkflow
from monai.utils import str2bool

from ..distributed import destroy_distributed, init_distributed, quiet_other_ranks, rank
from .distributed import disable_on_other_ranks
from .stage import stages_to_run
from .tracking import track_stage

logger = logging.getLogger(__name__)

__all__ = ["run_stages", "run_training", "GLAMTrainingWorkflow"]


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
        track_stage(stage_parser, name)
        result = stage_parser.get_parsed_content(stage_run_id)
        results.append(result[-1] if isinstance(result, list) and result else result)
    return results


def _distributed(parser: ConfigParser) -> bool:
    return str2bool(str(parser.get("distributed", False)))


def _join_process_group(parser: ConfigParser) -> None:
    init_distributed(
        backend=parser.get_parsed_content("dist_backend"), timeout_s=parser.get_parsed_content("dist_timeout_s")
    )
    quiet_other_ranks(parser.get_parsed_content("log_level_other_ranks"))


def run_training(parser: ConfigParser | None = None) -> list[Any]:
    """train.yaml's ``training`` entry: the whole training run on ``parser`` (default: the parser evaluating this
    entry, :func:`scripts.commands.running_parser`: under ``python -m monai.bundle run training``, the one MONAI
    built from the command line and the config files).

    In order: the process group joined when the configuration asks for one and none is joined yet (a
    :class:`GLAMTrainingWorkflow` joined it in ``initialize``); the command line and the folders checked, and
    ``ckpt_root`` locked by rank 0 until the run ends (:func:`~scripts.training.preflight.preflight_training`); on a
    process group the ``rank_zero_first`` items built by rank 0 first; the data checked (``check_datalist``); the
    stages (:func:`run_stages`); the process group left if this call joined it. Returns one summary dict per stage
    (``stage``, ``best_metric``, ``best_epoch``, ``model``)."""
    from ..commands import running_parser
    from .distributed import rank_zero_first
    from .preflight import preflight_training, unlock_run

    parser = running_parser() if parser is None else parser
    joined, lock, started = False, None, False
    if _distributed(parser) and not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        _join_process_group(parser)
        joined = True
    try:
        lock = preflight_training(parser)
        if _distributed(parser):
            rank_zero_first(parser, parser.get("rank_zero_first", ["datalist"]))
        if "check_datalist" in parser:
            parser.get_parsed_content("check_datalist")
        started = True
        return run_stages(parser, str(parser.get_parsed_content("stage")))
    finally:
        unlock_run(lock, started)
        if joined:
            destroy_distributed()


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

    def initialize(self) -> Any:
        """Parse the configuration, join the process group if it is a distributed run, evaluate ``initialize``."""
        result = super().initialize()
        if _distributed(self.parser) and not self._joined_group:
            _join_process_group(self.parser)
            self._joined_group = True
        return result

    def finalize(self) -> Any:
        """Evaluate ``finalize``, then leave the process group this workflow joined."""
        try:
            return super().finalize()
        finally:
            if self._joined_group:
                destroy_distributed()
                self._joined_group = False
