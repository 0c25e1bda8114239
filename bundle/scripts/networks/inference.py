"""GLAM for inference and the model-zoo tools: one tensor out, the full output dict on request; and the settings an
inference network is built with (the checkpoint's record, overridden where the config says so)."""

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

__all__ = [
    "GLAMSaliencyNet",
    "GLAMInferer",
    "FROM_CHECKPOINT",
    "CHECKPOINT_SETTINGS",
    "INFERENCE_CHOSEN",
    "checkpoint_settings",
    "inference_settings",
]

#: the model settings a checkpoint's record gives the inference network (inference.yaml's ids of the same names,
#: ``checkpoint`` there): the record's settings with ``inference=FROM_CHECKPOINT``
CHECKPOINT_SETTINGS = tuple(name for name, spec in setting_specs().items() if spec.inference == FROM_CHECKPOINT)
#: the settings inference chooses itself (M patches, gamma_c): inference.yaml's value, else the record's default
INFERENCE_CHOSEN = tuple(name for name, spec in setting_specs().items() if spec.inference == CHOSEN)


def checkpoint_settings(ckpt_path: str | os.PathLike) -> dict[str, Any]:
    """``name -> value`` for each of :data:`CHECKPOINT_SETTINGS`: the value the checkpoint at ``ckpt_path`` records,
    GLAM's default (the paper's) for one it does not record or when the file does not exist. The file is read once
    (a ``ValueError`` names one that cannot be read)."""
    record = read_checkpoint_settings(ckpt_path) or {}
    return {name: record[name] if name in record else GLAM_DEFAULTS[name] for name in CHECKPOINT_SETTINGS}


def inference_settings(checkpoint: Mapping[str, Any], stage: str = FROM_CHECKPOINT, **settings: Any) -> dict[str, Any]:
    """The keyword arguments of :class:`GLAMSaliencyNet` (:meth:`GLAMSaliencyNet.from_settings`) for inference.

    Args:
        checkpoint: the checkpoint's settings (:func:`checkpoint_settings`).
        stage: ``"local"`` or ``"joint"``; :data:`FROM_CHECKPOINT`: joint when the settings have the joint modules
            (gated attention, fusion), local for the authors' released layout.
        settings: each of :data:`CHECKPOINT_SETTINGS`, :data:`FROM_CHECKPOINT` (the default) for the checkpoint's
            value; another value overrides it (the weights then load only when the record agrees, or for the
            settings that change no weight: ``t_global``, ``t_local``, ``global_pool_after_upsampling``; see
            ``scripts.networks.settings``); and each of :data:`INFERENCE_CHOSEN` (``num_patches_eval``, M patches
            per image, and ``gamma_c``, the weight of S_g in S_c: choices made here, the paper's values by default).

    Texts as the command line gives them (``false``, ``3``) are read as each setting's type
    (:class:`~scripts.networks.glam_settings.GLAMSettings`). A name outside those two lists is a ``ValueError``.
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
    """GLAM whose ``forward`` returns a single tensor, S_c (B, 2, H/4, W/4) in [0, 1] (channels benign, malignant),
    as MONAI's bundle tools expect of an inference ``network_def`` (``verify_net_in_out``, ``ckpt_export``,
    ``onnx_export``). :meth:`forward_all` returns the full GLAM output dict (``y_global``, ``patch_boxes``, S_g, S_l…),
    which the bundle's own inference uses through :class:`GLAMInferer`.

    Same parameters and state dict as :class:`~scripts.networks.glam.GLAM` (a training checkpoint loads strictly);
    the stage must run the local module (``local`` or ``joint``, default ``joint``) since S_c needs it.
    """

    def __init__(self, settings: GLAMSettings | None = None, **overrides: Any) -> None:
        if GLAMSettings.of(settings, **overrides).stage == Stage.GLOBAL:
            raise UsageError("GLAMSaliencyNet returns S_c, which needs the local module: stage 'local' or 'joint'")
        super().__init__(settings, **overrides)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> GLAMSaliencyNet:
        """``GLAMSaliencyNet(**settings)`` (e.g. :func:`inference_settings`): a config's ``_target_`` takes no
        ``**``."""
        return cls(**settings)

    def forward(self, image: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.forward_all(image)[OutputKey.SALIENCY.value]


class GLAMInferer(Inferer):
    """Runs a GLAM network and returns its whole output dict (``forward_all``: :class:`GLAMSaliencyNet`'s
    ``forward`` returns S_c only; other networks, such as the baselines, are called as they are)."""

    def __call__(self, inputs: torch.Tensor, network: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        module = getattr(network, "module", network)  # DistributedDataParallel
        if hasattr(module, "forward_all"):
            return module.forward_all(inputs, *args, **kwargs)
        return network(inputs, *args, **kwargs)
