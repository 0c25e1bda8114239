"""The inference evaluator's iteration (``configs/inference.yaml``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ..handlers.throughput import LOAD_SECONDS_KEY
from ..networks.glam_settings import as_flag
from ..precision import autocast
from .inputs import item_path
from .tables import error_record


def _count(values: torch.Tensor) -> str:
    nan = int(torch.isnan(values).sum())
    inf = int(torch.isinf(values).sum())
    return " and ".join(p for p in (f"{nan} NaN" if nan else "", f"{inf} Inf" if inf else "") if p)


def split_non_finite(
    items: list[Any], pred: dict[str, torch.Tensor]
) -> tuple[list[Any], dict[str, torch.Tensor] | None, list[dict[str, str]]]:
    """Split a batch's images by whether their floating-point outputs are all finite.

    Returns:
        ``(items, pred, errors)``: the finite images and their outputs (``pred`` None when none is left), and an
        errors.csv record for each other image naming the outputs that hold NaN or Inf.
    """
    floats = {k: v for k, v in pred.items() if v.is_floating_point() and v.ndim > 0 and v.shape[0] == len(items)}
    if not floats:
        return items, pred, []
    finite = torch.stack([torch.isfinite(v.reshape(len(items), -1)).all(1) for v in floats.values()]).all(0)
    if bool(finite.all()):
        return items, pred, []
    errors = []
    for i in torch.nonzero(~finite).flatten().tolist():
        bad = [f"{k} holds {_count(v[i])} values" for k, v in floats.items() if not bool(torch.isfinite(v[i]).all())]
        errors.append(
            error_record(
                item_path(items[i]),
                f"NonFiniteOutput: the model's output is not finite ({'; '.join(bad)}): no maps written (are the "
                "checkpoint's weights finite? is the input an ordinary mammogram?)",
            )
        )
    keep = torch.nonzero(finite).flatten()
    if keep.numel() == 0:
        return [], None, errors
    return [items[i] for i in keep.tolist()], {k: v[keep] for k, v in pred.items()}, errors


@contextlib.contextmanager
def _exact_float32(device: torch.device) -> Iterator[None]:
    """On CUDA, convolutions and matrix products in true float32 (TF32, cuDNN's default, keeps 10 mantissa bits)."""
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
    """The evaluator's iteration: the inferer on the good images, outputs as float32 on the CPU.

    Args:
        amp: autocast to ``amp_dtype``; without it, true float32 on CUDA too (TF32 off).
        amp_dtype: the autocast type.
    """

    def __init__(self, amp: bool | str = False, amp_dtype: torch.dtype = torch.bfloat16) -> None:
        self.amp = as_flag(amp, "amp")  # the command line gives text
        self.amp_dtype = amp_dtype

    def __call__(self, engine: Any, batch: Mapping[str, Any]) -> dict[str, Any]:
        """``{"items", "errors", "pred", "load_s"}`` of one batch, ``pred`` None when every image failed."""
        pred = None
        items, errors = list(batch["items"]), list(batch["errors"])
        if batch["image"] is not None:
            network = engine.network
            network.eval()
            device = next(network.parameters()).device
            image = batch["image"].to(device)
            precise = contextlib.nullcontext() if self.amp else _exact_float32(device)
            with torch.no_grad(), precise, autocast(device.type, dtype=self.amp_dtype, enabled=self.amp):
                out = engine.inferer(image, network)
            pred = {
                k: (v.detach().float().cpu() if v.is_floating_point() else v.detach().cpu())
                for k, v in out.items()
                if isinstance(v, torch.Tensor)
            }
            items, pred, non_finite = split_non_finite(items, pred)
            errors += non_finite
        return {
            "items": items,
            "errors": errors,
            "pred": pred,
            LOAD_SECONDS_KEY: float(batch.get(LOAD_SECONDS_KEY, 0.0)),
        }
