"""Run GLAM's three training stages in order as one MONAI bundle workflow.

``train.yaml`` describes one stage, parameterised by its ``stage`` id (``global``, ``local`` or ``joint``), so
that every stage is a complete MONAI train workflow (its own trainer, evaluator, handlers and checkpoint folder)
that passes ``ConfigWorkflow.check_properties()``. :func:`run_stages` runs the stage named by ``stage``, or all
three in order for ``stage: all``: each in a fresh copy of the bundle's merged configuration (the config files,
presets, command-line overrides and the handlers MONAI's ``--tracking`` patched in), with ``stage`` set, so that
nothing of one stage's objects leaks into the next and every override applies to every stage.

:class:`GLAMTrainingWorkflow` is that run as a ``ConfigWorkflow`` that hands its own parser to the stages:
``initialize`` joins the process group when the configuration asks for one (``distributed: true``,
``multi_gpu_train.yaml``), ``run`` checks the command line and the data, then runs the stages, ``finalize`` leaves
the group. ``python -m monai.bundle run training`` builds MONAI's plain ``ConfigWorkflow``, whose parser reaches no
config expression; its ``training`` entry (:func:`train_from_command_line`) builds a :class:`GLAMTrainingWorkflow`
from the same command line (MONAI's ``--workflow_name`` would need ``scripts`` importable before MONAI puts the
bundle root on ``sys.path``, which it is not from the repository root).
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Sequence
from typing import Any

from monai.bundle import ConfigParser, ConfigWorkflow
from monai.utils import str2bool

from .distributed import (
    destroy_distributed,
    disable_on_other_ranks,
    init_distributed,
    quiet_other_ranks,
    rank,
)
from .stage import stages_to_run
from .tracking import track_stage

logger = logging.getLogger(__name__)

__all__ = ["run_stages", "train_from_command_line", "GLAMTrainingWorkflow"]


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


def train_from_command_line() -> Any:
    """train.yaml's ``training`` entry under MONAI's plain ``ConfigWorkflow`` (``python -m monai.bundle run
    training ...``): a :class:`GLAMTrainingWorkflow` built from this process's command line (the same config
    files, metadata, logging, tracking and overrides), initialised, run and finalised. Returns its ``run()``.

    Raises:
        UsageError: this process is not a ``monai.bundle run`` command (the Python API): build the workflow
            yourself, ``GLAMTrainingWorkflow(config_file=..., meta_file=..., **overrides)``.
    """
    from ..commands import UsageError, command_line

    given = command_line()
    if given is None:
        raise UsageError(
            "train.yaml's `training` runs the stages through scripts.training.workflow.GLAMTrainingWorkflow: from "
            "Python, build GLAMTrainingWorkflow(config_file=..., meta_file=..., **overrides) (or pass "
            "workflow_name='scripts.training.workflow.GLAMTrainingWorkflow' to monai.bundle.run)"
        )
    arguments, overrides = given
    for name in ("run_id", "workflow_name"):  # this workflow runs `training` its own way
        arguments.pop(name, None)
    workflow = GLAMTrainingWorkflow(**arguments, **overrides)
    workflow.initialize()
    try:
        return workflow.run()
    finally:
        workflow.finalize()


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

    def run(self) -> list[Any]:
        """The command line and the folders checked (:func:`~scripts.training.preflight.preflight_training`), on a
        process group the ``rank_zero_first`` items built by rank 0 first, the data checked (``check_datalist``),
        then the stages (:func:`run_stages` on this workflow's parser). Returns ``[per-stage summaries]``: the last
        item is one summary dict per stage (``stage``, ``best_metric``, ``best_epoch``, ``model``)."""
        from .distributed import rank_zero_first
        from .preflight import preflight_training

        sys.path.insert(1, str(self._bundle_root()))  # as ConfigWorkflow.run: the bundle's `scripts` importable
        preflight_training(self.parser)
        if self._distributed():
            rank_zero_first(self.parser, self.parser.get("rank_zero_first", ["datalist"]))
        if "check_datalist" in self.parser:
            self.parser.get_parsed_content("check_datalist")
        return [run_stages(self.parser, str(self.parser.get_parsed_content("stage")))]

    def _bundle_root(self) -> Any:
        root = self.config_root_path
        return root.parent if root.name == "configs" else root

    def finalize(self) -> Any:
        """Evaluate ``finalize``, then leave the process group this workflow joined."""
        try:
            return super().finalize()
        finally:
            if self._joined_group:
                destroy_distributed()
                self._joined_group = False
