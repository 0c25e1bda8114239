"""GLAM's three training stages in order, each a complete MONAI train workflow.

``train.yaml`` describes one stage, parameterised by its ``stage`` id (``global``, ``local`` or ``joint``);
:func:`run_stages` runs each stage to run in a fresh copy of the merged configuration (the config files, presets,
overrides and the handlers MONAI's ``--tracking`` patched in), so that nothing of one stage's objects leaks into the
next and every override applies to every stage. :class:`scripts.workflow.GLAMWorkflow` calls it for run id
``training``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import Any

from monai.bundle import ConfigParser

from ..distributed import rank
from .distributed import disable_on_other_ranks
from .stage import stages_to_run
from .tracking import track_stage

logger = logging.getLogger(__name__)

__all__ = ["run_stages"]


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
