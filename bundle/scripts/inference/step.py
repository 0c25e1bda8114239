"""The inference evaluator's iteration (used from ``configs/inference.yaml``).

The pieces plug into a MONAI ``SupervisedEvaluator``: :class:`~.inputs.SafeDataset` turns a failing input into an
error record instead of an exception, :func:`~.inputs.collate_inference` stacks the good images and carries the
errors along, :class:`GLAMInferenceStep` is the evaluator's iteration (runs the inferer on the good images only), and
:class:`~.writer.GLAMInferenceWriter` (an Ignite handler) takes each image's outputs from there to its files.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ..networks.weights import as_flag
from .inputs import LOAD_SECONDS_KEY

__all__ = ["GLAMInferenceStep"]


@contextlib.contextmanager
def _exact_float32(device: torch.device) -> Iterator[None]:
    """On CUDA, convolutions and matrix products in true float32 (no TF32, which keeps 10 bits of mantissa and is
    PyTorch's default for cuDNN convolutions), restored afterwards; nothing to do elsewhere."""
    if device.type != "cuda":
        yield
        return
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


class GLAMInferenceStep:
    """The evaluator's iteration: run ``engine.inferer`` (:class:`~scripts.networks.GLAMInferer`, returning the GLAM
    output dict) on the batch's good images without gradients; floating-point outputs come back as float32 on the
    CPU whatever the network computed in (bf16 under autocast), so everything after the model is bf16-safe.

    With ``amp`` the network runs under ``torch.autocast(amp_dtype)`` (bf16 by default); without it, on CUDA, in
    true float32 (TF32 off), so that ``precision: fp32`` gives float32 numbers on a GPU too.

    Returns ``{"items", "errors", "pred", "load_s"}``; ``pred`` is ``None`` when every item of the batch failed.
    """

    def __init__(self, amp: bool | str = False, amp_dtype: torch.dtype = torch.bfloat16) -> None:
        self.amp = as_flag(amp, "amp")  # the command line gives text
        self.amp_dtype = amp_dtype

    def __call__(self, engine: Any, batch: Mapping[str, Any]) -> dict[str, Any]:
        pred = None
        if batch["image"] is not None:
            network = engine.network
            network.eval()
            device = next(network.parameters()).device
            image = batch["image"].to(device)
            precise = contextlib.nullcontext() if self.amp else _exact_float32(device)
            with torch.no_grad(), precise, torch.autocast(device.type, dtype=self.amp_dtype, enabled=self.amp):
                out = engine.inferer(image, network)
            pred = {
                k: (v.detach().float().cpu() if v.is_floating_point() else v.detach().cpu())
                for k, v in out.items()
                if isinstance(v, torch.Tensor)
            }
        return {
            "items": batch["items"],
            "errors": batch["errors"],
            "pred": pred,
            LOAD_SECONDS_KEY: float(batch.get(LOAD_SECONDS_KEY, 0.0)),
        }
