"""The network an evaluation builds: the model settings its checkpoint records, as inference reads them.

evaluate.yaml is layered over train.yaml, whose model settings (``image_size``, ``patch_size``, ``local_depth``...)
are the paper's unless a preset changes them. A model trained with a preset used to need the same preset at
evaluation; inference never did, because every checkpoint the workflows write records the settings it was trained
with (``scripts.networks.settings``). :func:`evaluation_settings` gives evaluation the same reading, setting by
setting (each of :data:`~scripts.networks.inference.CHECKPOINT_SETTINGS`, plus M patches and gamma_c):

1. a value given on the ``monai.bundle run`` command line (``--patch_size 256``) is used as given: a setting that
   shapes the weights and contradicts the checkpoint is then refused when the weights load, naming each setting
   that differs, as inference refuses it; the choices that change no weight (``t_global``, ``t_local``,
   ``num_patches_eval``, ``gamma_c``, ``global_pool_after_upsampling``) may differ;
2. else the checkpoint's recorded value (a ``model.pt``, or a ``last.pt``'s ``network`` entry);
3. else the configuration's (train.yaml's ``glam_settings`` record, with the presets layered before evaluate.yaml: a
   checkpoint without a record, such as the baselines' or an older file, is built as before); the settings train.yaml
   does not name (``gammas``, ``attention_hidden``, ``joint_modules``, ``global_pool_after_upsampling``) are the
   record's defaults, GLAM's.

One log line says which settings came from where. The preprocessing's window and pixel spacing, and the
postprocessing's gamma_c, are read from the same settings (evaluate.yaml).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..networks.glam import GLAM, GLAM_DEFAULTS
from ..networks.glam_settings import GLAMSettings
from ..networks.inference import CHECKPOINT_SETTINGS, FROM_CHECKPOINT, INFERENCE_CHOSEN, inference_settings
from ..networks.settings import SETTINGS_KEY, decode_settings, read_checkpoint_settings

__all__ = [
    "EVALUATION_CHOICES",
    "checkpoint_record",
    "command_line_names",
    "evaluation_settings",
    "evaluation_network",
    "model_setting",
]

logger = logging.getLogger(__name__)

#: besides CHECKPOINT_SETTINGS, what the evaluation network takes from the same three places (M, gamma_c)
EVALUATION_CHOICES = INFERENCE_CHOSEN


def checkpoint_record(path: str | os.PathLike) -> dict[str, Any] | None:
    """The settings record of the checkpoint at ``path``: a ``model.pt``'s, or the ``network`` entry's of a
    ``last.pt``; None when the file does not exist or records none. A file that cannot be read is a ``ValueError``
    naming it."""
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


def command_line_names() -> set[str]:
    """The top-level ids given on this process's ``monai.bundle run`` command line (empty from Python)."""
    from ..commands import command_line

    given = command_line()
    return set() if given is None else {str(key).lstrip("+") for key in given[1]}


def evaluation_settings(
    ckpt_path: str | os.PathLike,
    stage: str,
    config: Mapping[str, Any] | GLAMSettings,
    explicit: Collection[str] | None = None,
) -> dict[str, Any]:
    """The keyword arguments of :class:`~scripts.networks.glam.GLAM` for evaluating ``ckpt_path`` at ``stage``.

    Args:
        ckpt_path: the checkpoint evaluated.
        stage: the stage the network runs (``global``, ``local``, ``joint``).
        config: the configuration's value of each setting it names, or its record (evaluate.yaml: train.yaml's
            ``glam_settings``, after the presets and the command line).
        explicit: the names given explicitly, used as given; default: those of the ``monai.bundle run`` command
            line (:func:`command_line_names`).

    See the module docstring for the order. A yes/no setting given as text becomes a boolean, counts integers.
    """
    record = checkpoint_record(ckpt_path) or {}
    config = config.as_kwargs() if isinstance(config, GLAMSettings) else config
    explicit = command_line_names() if explicit is None else set(explicit)
    checkpoint = {
        name: record.get(name, GLAM_DEFAULTS.get(name)) for name in (*CHECKPOINT_SETTINGS, *EVALUATION_CHOICES)
    }
    chosen: dict[str, Any] = {}
    sources: dict[str, list[str]] = {"command line": [], "checkpoint": [], "configuration": [], "GLAM default": []}
    for name in (*CHECKPOINT_SETTINGS, *EVALUATION_CHOICES):
        if name in explicit and name in config:
            chosen[name], where = config[name], "command line"
        elif name in record:
            chosen[name], where = FROM_CHECKPOINT, "checkpoint"
        elif name in config:
            chosen[name], where = config[name], "configuration"
        else:
            chosen[name], where = FROM_CHECKPOINT, "GLAM default"
        sources[where].append(name)
    for name in EVALUATION_CHOICES:  # inference_settings takes these as they are
        if chosen[name] == FROM_CHECKPOINT:
            chosen[name] = checkpoint[name]
    settings = inference_settings(checkpoint, stage=stage, **chosen)
    logger.info(
        "evaluation: model settings of %s from %s",
        ckpt_path,
        "; ".join(f"the {where}: {', '.join(names)}" for where, names in sources.items() if names),
    )
    return settings


def evaluation_network(settings: Mapping[str, Any], **extra: Any) -> GLAM:
    """``GLAM(**settings, **extra)`` (evaluate.yaml's ``network_def``: a config's ``_target_`` takes no ``**``)."""
    return GLAM(**{**settings, **extra})


def model_setting(settings: Mapping[str, Any], name: str) -> Any:
    """``settings[name]``: one setting of :func:`evaluation_settings`'s record as a config component, for the
    configuration's pieces that follow the checkpoint (evaluate.yaml: the preprocessing's window and pixel spacing, the
    data check's spacing, S_c's gamma_c)."""
    if name not in settings:
        raise KeyError(f"the model settings have no {name!r} (they have {sorted(settings)})")
    return settings[name]
