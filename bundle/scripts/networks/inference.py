"""GLAM for inference and the model-zoo tools, and the settings an inference network is built with."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from monai.inferers import Inferer

from ..enums import OutputKey, Stage
from ..errors import UsageError
from .glam import GLAM
from .glam_settings import CHOSEN, FROM_CHECKPOINT, GLAM_DEFAULTS, GLAMSettings, coerce_text, setting_specs
from .settings import read_checkpoint_settings

#: the settings inference takes from the checkpoint's record unless the config overrides them
CHECKPOINT_SETTINGS = tuple(name for name, spec in setting_specs().items() if spec.inference == FROM_CHECKPOINT)
#: the settings inference chooses itself (M patches, gamma_c)
INFERENCE_CHOSEN = tuple(name for name, spec in setting_specs().items() if spec.inference == CHOSEN)


def checkpoint_settings(ckpt_path: str | os.PathLike) -> dict[str, Any]:
    """``name -> value`` of :data:`CHECKPOINT_SETTINGS` recorded in ``ckpt_path``, GLAM's default where unrecorded."""
    record = read_checkpoint_settings(ckpt_path) or {}
    return {name: record[name] if name in record else GLAM_DEFAULTS[name] for name in CHECKPOINT_SETTINGS}


def inference_settings(checkpoint: Mapping[str, Any], stage: str = FROM_CHECKPOINT, **settings: Any) -> dict[str, Any]:
    """The keyword arguments of :class:`GLAMSaliencyNet` for inference.

    Args:
        checkpoint: the checkpoint's settings (:func:`checkpoint_settings`).
        stage: ``"local"`` or ``"joint"``; :data:`FROM_CHECKPOINT`: joint when the settings hold the joint modules.
        settings: values of :data:`CHECKPOINT_SETTINGS` (:data:`FROM_CHECKPOINT`: the checkpoint's) and of
            :data:`INFERENCE_CHOSEN` (default: the paper's).

    Raises:
        ValueError: a name outside those two lists.
    """
    unknown = sorted(set(settings) - set(CHECKPOINT_SETTINGS) - set(INFERENCE_CHOSEN))
    if unknown:
        raise UsageError(f"inference_settings: unknown model settings {unknown}; known: {list(CHECKPOINT_SETTINGS)}")
    out: dict[str, Any] = {
        name: checkpoint[name] if _from_checkpoint(settings.get(name, FROM_CHECKPOINT)) else settings[name]
        for name in CHECKPOINT_SETTINGS
    }
    out.update({name: settings.get(name, GLAM_DEFAULTS[name]) for name in INFERENCE_CHOSEN})
    out = coerce_text(out)
    joint = Stage.JOINT.value if out["joint_modules"] else Stage.LOCAL.value
    out["stage"] = joint if _from_checkpoint(stage) else stage
    return out


def _from_checkpoint(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == FROM_CHECKPOINT


class GLAMSaliencyNet(GLAM):
    """GLAM whose ``forward`` returns S_c alone, as MONAI's bundle tools expect of a ``network_def``."""

    def __init__(self, settings: GLAMSettings | None = None, **overrides: Any) -> None:
        if GLAMSettings.of(settings, **overrides).stage == Stage.GLOBAL:
            raise UsageError("GLAMSaliencyNet returns S_c, which needs the local module: stage 'local' or 'joint'")
        super().__init__(settings, **overrides)

    def forward(self, image: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.forward_all(image)[OutputKey.SALIENCY.value]


class GLAMInferer(Inferer):
    """Runs a network's ``forward_all`` where it has one (the whole GLAM output dict), else the network itself."""

    def __call__(self, inputs: torch.Tensor, network: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        module = getattr(network, "module", network)
        if hasattr(module, "forward_all"):
            return module.forward_all(inputs, *args, **kwargs)
        return network(inputs, *args, **kwargs)
