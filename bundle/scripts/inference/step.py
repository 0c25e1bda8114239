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
from monai.data import MetaTensor

from ..handlers.throughput import LOAD_SECONDS_KEY
from ..networks.weights import as_flag
from ..precision import autocast
from .tables import error_record

__all__ = ["GLAMInferenceStep", "split_non_finite"]


def _item_path(item: Mapping[str, Any]) -> str:
    image = item["image"]
    return str(image.meta.get("filename_or_obj", "")) if isinstance(image, MetaTensor) else str(image)


def _count(values: torch.Tensor) -> str:
    nan = int(torch.isnan(values).sum())
    inf = int(torch.isinf(values).sum())
    return " and ".join(p for p in (f"{nan} NaN" if nan else "", f"{inf} Inf" if inf else "") if p)


def split_non_finite(
    items: list[Any], pred: dict[str, torch.Tensor]
) -> tuple[list[Any], dict[str, torch.Tensor] | None, list[dict[str, str]]]:
    """``(items, pred, errors)``: the images whose floating-point outputs (first dimension: the batch) are all
    finite with their outputs, and an errors.csv record for each other image naming the outputs that hold NaN or
    Inf (no success row, no map of NaN). ``pred`` is None when no image is left."""
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
                _item_path(items[i]),
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

    With ``amp`` the network runs under autocast to ``amp_dtype`` (bf16 by default); without it, on CUDA, in
    true float32 (TF32 off), so that ``precision: fp32`` gives float32 numbers on a GPU too.

    An image whose outputs hold NaN or Inf is an error (its errors.csv row names the outputs,
    :func:`split_non_finite`), not a prediction.

    Returns ``{"items", "errors", "pred", "load_s"}``; ``pred`` is ``None`` when every item of the batch failed.
    """

    def __init__(self, amp: bool | str = False, amp_dtype: torch.dtype = torch.bfloat16) -> None:
        self.amp = as_flag(amp, "amp")  # the command line gives text
        self.amp_dtype = amp_dtype

    def __call__(self, engine: Any, batch: Mapping[str, Any]) -> dict[str, Any]:
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
