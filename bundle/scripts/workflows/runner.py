"""Run GLAM's three training stages in order from one bundle command.

``train.yaml`` describes one stage, parameterised by its ``stage`` id (``global``, ``local`` or ``joint``), so
that every stage is a complete MONAI train workflow (its own trainer, evaluator, handlers and checkpoint folder)
that passes ``ConfigWorkflow.check_properties()``. Its default ``training`` entry calls :func:`run_training`,
which runs the stage named by ``stage``, or all three in order for ``stage: all``: each in a fresh copy of the
running bundle's merged configuration (the config files, presets and command-line overrides), with ``stage``
set, so that nothing of one stage's objects leaks into the next and every override applies to every stage.
"""

from __future__ import annotations

import copy
import inspect
import logging
from typing import Any

from monai.bundle import ConfigParser

from ..enums import STAGES

__all__ = ["STAGE_ORDER", "run_training", "stages_to_run", "running_parser"]

#: the stages in training order (the vocabulary's order)
STAGE_ORDER = STAGES
logger = logging.getLogger(__name__)


def stages_to_run(stage: str) -> list[str]:
    """``"all"`` -> the three stages in order; one stage name -> that stage."""
    if stage == "all":
        return list(STAGE_ORDER)
    if stage not in STAGE_ORDER:
        raise ValueError(f"stage must be 'all' or one of {STAGE_ORDER}, got {stage!r}")
    return [stage]


def running_parser() -> ConfigParser:
    """The ``ConfigParser`` whose content is being evaluated (the caller of this config expression).

    MONAI evaluates ``$`` expressions inside ``ConfigParser.get_parsed_content``; the parser is found on the call
    stack there. Raises ``RuntimeError`` when called from outside a bundle config.
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


def run_training(stage: str, stage_run_id: str = "run_stage", parser: ConfigParser | None = None) -> list[Any]:
    """Run one stage or all three: for each, a deep copy of the bundle's merged config with ``stage`` set, whose
    ``stage_run_id`` entry (set determinism, check the data, ``train#trainer.run()``) is then evaluated.

    Args:
        stage: ``"all"``, ``"global"``, ``"local"`` or ``"joint"``.
        stage_run_id: the config id that runs one stage.
        parser: the running bundle's parser (found on the call stack when omitted).

    Returns:
        per stage, what the last entry of its ``stage_run_id`` list evaluated to (train.yaml: a summary dict).
    """
    parser = running_parser() if parser is None else parser
    results = []
    for name in stages_to_run(stage):
        logger.info("GLAM training: stage %s", name)
        stage_parser = ConfigParser(copy.deepcopy(parser.get()), globals=dict(parser.globals))
        stage_parser["stage"] = name
        result = stage_parser.get_parsed_content(stage_run_id)
        results.append(result[-1] if isinstance(result, list) and result else result)
    return results
