"""A faster inference copy of a trained network: batch norms folded, channels-last memory, bf16 autocast;
``precision="fp32"`` returns the network unchanged."""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
from torch import nn

from ..errors import UsageError
from ..precision import autocast

PRECISIONS = ("auto", "bf16", "fp32")


def cpu_supports_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX); emulated bf16 is slower than float32."""
    cpu = getattr(torch, "cpu", None)
    try:
        return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())
    except AttributeError:  # a torch without these probes
        return False


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """``"bf16"`` or ``"fp32"`` for ``precision`` on ``device``; ``"auto"``: bf16 on CUDA and native-bf16 CPUs."""
    if precision not in PRECISIONS:
        raise UsageError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision != "auto":
        return precision
    kind = torch.device(device).type
    return "bf16" if kind == "cuda" or (kind == "cpu" and cpu_supports_bf16()) else "fp32"


def _as_float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _as_float32(v) for k, v in value.items()}
    return value


class AutocastInference(nn.Module):
    """Runs ``network`` without gradients under autocast with ``dtype``; float outputs as float32.

    Args:
        network: the network, e.g. a folded :class:`~scripts.networks.GLAMSaliencyNet`.
        dtype: the autocast dtype.
        channels_last: channels-last inputs.
    """

    def __init__(self, network: nn.Module, dtype: torch.dtype = torch.bfloat16, channels_last: bool = True) -> None:
        super().__init__()
        self.network = network
        self.dtype = dtype
        self.channels_last = bool(channels_last)

    def _run(self, fn: Any, image: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.channels_last:
            image = image.contiguous(memory_format=torch.channels_last)
        with torch.no_grad(), autocast(image.device.type, dtype=self.dtype):
            out = fn(image, *args, **kwargs)
        return _as_float32(out)

    def forward(self, image: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return self._run(self.network, image, *args, **kwargs)

    def forward_all(self, image: torch.Tensor, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        if not hasattr(self.network, "forward_all"):
            raise AttributeError(f"{type(self.network).__name__} has no forward_all")
        return self._run(self.network.forward_all, image, *args, **kwargs)

    def train(self, mode: bool = True) -> AutocastInference:
        if mode:
            raise UsageError("AutocastInference is for inference: it holds a network with folded batch norms")
        return super().train(False)

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}, channels_last={self.channels_last}"


def optimize_for_inference(model: nn.Module, precision: str = "auto", channels_last: bool = True) -> nn.Module:
    """An inference version of a trained ``model`` with the same forward contract.

    Args:
        model: a network with its weights loaded, on its device.
        precision: ``"fp32"``: ``model`` in eval mode; ``"bf16"``: a folded, channels-last copy under bf16 autocast;
            ``"auto"``: :func:`resolve_precision`.
        channels_last: channels-last memory for the bf16 copy.
    """
    try:
        device = next(model.parameters()).device
    except StopIteration:
        device = torch.device("cpu")
    if resolve_precision(precision, device) == "fp32":
        return model.eval()
    fast = model.fuse_for_inference() if hasattr(model, "fuse_for_inference") else copy.deepcopy(model).eval()
    if channels_last:
        fast = fast.to(memory_format=torch.channels_last)
    return AutocastInference(fast, torch.bfloat16, channels_last=channels_last).eval()


def load_for_inference(
    network: nn.Module, ckpt_path: str | os.PathLike, device: torch.device | str = "cpu", precision: str = "auto"
) -> nn.Module:
    """``network`` with the weights of ``ckpt_path`` loaded strictly, on ``device``, optimised for ``precision``.

    Raises:
        UsageError: no file at ``ckpt_path``: one line naming it and how to get weights (:data:`WEIGHTS_HELP`).
    """
    from .weights import WEIGHTS_HELP, load_weights

    if not os.path.isfile(ckpt_path):
        raise UsageError(f"model weights not found: {ckpt_path}: {WEIGHTS_HELP}")
    return optimize_for_inference(load_weights(network, ckpt_path).to(device), str(precision))
