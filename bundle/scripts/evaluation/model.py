"""The network an evaluation builds, from the model settings its checkpoint records (as inference reads them)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..enums import STAGES
from ..errors import UsageError
from ..networks.glam_settings import GLAM_DEFAULTS
from ..networks.inference import CHECKPOINT_SETTINGS, FROM_CHECKPOINT, INFERENCE_CHOSEN, inference_settings
from ..networks.settings import SETTINGS_KEY, decode_settings, read_checkpoint_settings

logger = logging.getLogger(__name__)

#: besides CHECKPOINT_SETTINGS, what the evaluation network takes by the same rule (M, gamma_c)
EVALUATION_CHOICES = INFERENCE_CHOSEN


def checkpoint_record(path: str | os.PathLike) -> dict[str, Any] | None:
    """The settings record of a ``model.pt`` or a ``last.pt``'s ``network``; None when there is none."""
    record = read_checkpoint_settings(path)
    if record is not None or not Path(path).is_file():
        return record
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - read_checkpoint_settings read it already; only a race lands here
        raise UsageError(f"cannot read the checkpoint {path}: {type(err).__name__}: {err}") from err
    network = state.get("network") if isinstance(state, Mapping) else None
    tensor = network.get(SETTINGS_KEY) if isinstance(network, Mapping) else None
    return decode_settings(tensor) if isinstance(tensor, torch.Tensor) else None


def evaluation_settings(ckpt_path: str | os.PathLike, stage: str, **settings: Any) -> dict[str, Any]:
    """The keyword arguments of :class:`~scripts.networks.glam.GLAM` for evaluating ``ckpt_path`` at ``stage``.

    Args:
        ckpt_path: the checkpoint evaluated.
        stage: the stage the network runs (``global``, ``local``, ``joint``).
        settings: each of :data:`~scripts.networks.inference.CHECKPOINT_SETTINGS` and :data:`EVALUATION_CHOICES`, a
            value or ``"checkpoint"`` (the recorded value); one not given is the checkpoint's.

    Raises:
        UsageError: ``stage`` is not one of the model's stages (``all`` trains, it cannot be evaluated), or a name
            outside those lists.
        FileNotFoundError: no file at ``ckpt_path``.
    """
    if stage not in STAGES:
        raise UsageError(f"stage must be one of {STAGES} to evaluate a model, got {stage!r}")
    if not Path(ckpt_path).is_file():
        raise FileNotFoundError(
            f"checkpoint to evaluate not found: {ckpt_path} (train the {stage!r} stage first, or point --ckpt_path at "
            "a model.pt / last.pt)"
        )
    record = checkpoint_record(ckpt_path) or {}
    names = (*CHECKPOINT_SETTINGS, *EVALUATION_CHOICES)
    unknown = sorted(set(settings) - set(names))
    if unknown:
        raise UsageError(f"evaluation_settings: unknown model settings {unknown}; known: {list(names)}")
    checkpoint = {name: record.get(name, GLAM_DEFAULTS.get(name)) for name in names}
    chosen = {name: settings.get(name, FROM_CHECKPOINT) for name in names}
    sources: dict[str, list[str]] = {"the configuration": [], "the checkpoint": [], "GLAM's default": []}
    for name, value in chosen.items():
        given = not (isinstance(value, str) and value.strip().lower() == FROM_CHECKPOINT)
        where = "the configuration" if given else "the checkpoint" if name in record else "GLAM's default"
        sources[where].append(name)
        if name in EVALUATION_CHOICES and not given:  # inference_settings takes these as they are
            chosen[name] = checkpoint[name]
    result = inference_settings(checkpoint, stage=stage, **chosen)
    logger.info(
        "evaluation: model settings of %s from %s",
        ckpt_path,
        "; ".join(f"{where}: {', '.join(found)}" for where, found in sources.items() if found),
    )
    return result
