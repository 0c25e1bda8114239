"""GLAM for inference and the model-zoo tools: one tensor out, the full output dict on request; and the settings an
inference network is built with (the checkpoint's record, overridden where the config says so)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from monai.inferers import Inferer

from ..enums import OutputKey, Stage
from .glam import GLAM, checkpoint_setting
from .settings import read_checkpoint_settings
from .weights import as_flag

__all__ = [
    "GLAMSaliencyNet",
    "GLAMInferer",
    "FROM_CHECKPOINT",
    "CHECKPOINT_SETTINGS",
    "checkpoint_settings",
    "inference_settings",
]

#: the value of a model setting in inference.yaml that takes the checkpoint's (its record's, else GLAM's default)
FROM_CHECKPOINT = "checkpoint"
#: the model settings a checkpoint's record gives the inference network (inference.yaml's ids of the same names)
CHECKPOINT_SETTINGS = (
    "image_size",
    "pixel_spacing",
    "patch_size",
    "t_global",
    "t_local",
    "gammas",
    "local_depth",
    "local_width",
    "attention_hidden",
    "global_backbone",
    "pool_in_breast",
    "aggregation",
    "joint_modules",
    "global_pool_after_upsampling",
)
# GLAMSaliencyNet's settings that the command line may give as text: yes/no flags, integers and numbers
_FLAGS = ("global_pool_after_upsampling", "joint_modules", "pool_in_breast")
_INTEGERS = ("num_patches_eval", "attention_hidden")
_NUMBERS = ("t_global", "t_local", "gamma_c")


def checkpoint_settings(ckpt_path: str | os.PathLike) -> dict[str, Any]:
    """``name -> value`` for each of :data:`CHECKPOINT_SETTINGS`: the value the checkpoint at ``ckpt_path`` records,
    GLAM's default (the paper's) for one it does not record or when the file does not exist. The file is read once
    (a ``ValueError`` names one that cannot be read)."""
    record = read_checkpoint_settings(ckpt_path) or {}
    return {
        name: record[name] if name in record else checkpoint_setting(ckpt_path, name) for name in CHECKPOINT_SETTINGS
    }


def inference_settings(
    checkpoint: Mapping[str, Any],
    stage: str = FROM_CHECKPOINT,
    num_patches_eval: int | str = 1,
    gamma_c: float | str = 0.5,
    **settings: Any,
) -> dict[str, Any]:
    """The keyword arguments of :class:`GLAMSaliencyNet` (:meth:`GLAMSaliencyNet.from_settings`) for inference.

    Args:
        checkpoint: the checkpoint's settings (:func:`checkpoint_settings`).
        stage: ``"local"`` or ``"joint"``; :data:`FROM_CHECKPOINT`: joint when the settings have the joint modules
            (gated attention, fusion), local for the authors' released layout.
        num_patches_eval: M, patches per image (a choice made here: any value).
        gamma_c: weight of S_g in S_c (a choice made here).
        settings: each of :data:`CHECKPOINT_SETTINGS`, :data:`FROM_CHECKPOINT` (the default) for the checkpoint's
            value; another value overrides it (the weights then load only when the record agrees, or for the
            settings that change no weight: ``t_global``, ``t_local``, ``global_pool_after_upsampling``; see
            ``scripts.networks.settings``).

    Yes/no settings given as text (the command line's ``false``) become booleans, counts integers and the pooling
    numbers floats. A name outside :data:`CHECKPOINT_SETTINGS` is a ``ValueError``.
    """
    unknown = sorted(set(settings) - set(CHECKPOINT_SETTINGS))
    if unknown:
        raise ValueError(f"inference_settings: unknown model settings {unknown}; known: {list(CHECKPOINT_SETTINGS)}")
    out: dict[str, Any] = {
        name: checkpoint[name] if _from_checkpoint(settings.get(name, FROM_CHECKPOINT)) else settings[name]
        for name in CHECKPOINT_SETTINGS
    }
    out["num_patches_eval"], out["gamma_c"] = num_patches_eval, gamma_c
    for name in _FLAGS:
        out[name] = as_flag(out[name], name)
    for name in _INTEGERS:
        out[name] = int(out[name])
    for name in _NUMBERS:
        out[name] = float(out[name])
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

    def __init__(self, stage: str = Stage.JOINT, **kwargs: Any) -> None:
        if stage == Stage.GLOBAL:
            raise ValueError("GLAMSaliencyNet returns S_c, which needs the local module: stage 'local' or 'joint'")
        super().__init__(stage=stage, **kwargs)

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
