"""GLAM for inference and the model-zoo tools: one tensor out, the full output dict on request."""

from __future__ import annotations

from typing import Any

import torch
from monai.inferers import Inferer

from ..enums import OutputKey, Stage
from .glam import GLAM

__all__ = ["GLAMSaliencyNet", "GLAMInferer"]


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
