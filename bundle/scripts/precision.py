"""Mixed precision for the workflows' engines: bf16 autocast on the engine's own device, fp16 through MONAI.

MONAI's ``SupervisedTrainer`` / ``SupervisedEvaluator`` with ``amp=True`` wrap the forward pass in
``torch.autocast("cuda")`` and train through a ``GradScaler``. That is what float16 needs, but bfloat16 has
float32's exponent range and needs no loss scaling, and an autocast fixed to ``"cuda"`` does nothing on a CPU: a
CPU run with ``amp: true`` would silently stay in float32 and never exercise the bf16 path a GPU run takes. So the
workflows run bf16 in :class:`AutocastInferer`, which autocasts on the device of the batch, and leave MONAI's AMP
(with its scaler) to float16 on CUDA. :func:`amp_plan` makes that choice from the configs' ``amp`` /
``amp_dtype`` / ``device`` (train.yaml's ``autocast_dtype`` and ``engine_amp`` read its two halves: the inferers'
dtype, the engines' ``amp``).

Why the workflows keep their own inferer rather than MONAI's AMP alone: see above (bf16 on any device, no scaler).
The inference workflow (``scripts.inference.step``) and the fast inference copy (``scripts.networks.fast_inference``)
autocast inside their own forward step, under ``torch.no_grad``, without an engine: they need neither MONAI's AMP
nor this inferer, only :func:`autocast`.

This module is the one place that enters ``torch.autocast`` (tests/test_owners.py checks it): :func:`autocast` for
a forward pass in lower precision, :func:`full_precision` for the computations inside one that need float32 (the
losses' binary cross-entropy).
"""

from __future__ import annotations

from typing import Any

import torch
from monai.inferers import SimpleInferer
from monai.utils import str2bool

from .errors import UsageError

__all__ = [
    "AutocastInferer",
    "amp_plan",
    "as_dtype",
    "autocast",
    "full_precision",
]

_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def autocast(device_type: str, dtype: torch.dtype | None = torch.bfloat16, enabled: bool = True) -> torch.autocast:
    """``torch.autocast(device_type, dtype=dtype, enabled=enabled)``: the forward pass on ``device_type``
    (``"cuda"``, ``"cpu"``: the device of the inputs, so that a CPU run takes the path a GPU run takes) in ``dtype``
    (None: torch's default for the device); ``enabled=False`` runs it in the network's own precision."""
    return torch.autocast(device_type, dtype=dtype, enabled=enabled)


def full_precision(device_type: str) -> torch.autocast:
    """Autocast switched off on ``device_type`` for a block inside an autocast region: what it computes on float32
    inputs stays float32 (the losses' binary cross-entropy, which is not autocast-safe)."""
    return torch.autocast(device_type=device_type, enabled=False)


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.bfloat16`` or ``torch.float16`` from a dtype or its name (``bfloat16``, ``bf16``, ``torch.float16``,
    ``fp16`` ...): the configs' ``amp_dtype`` as MONAI's engines take it (``amp_kwargs``)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.bfloat16, torch.float16):
            raise UsageError(f"amp_dtype must be torch.bfloat16 or torch.float16, got {dtype}")
        return dtype
    key = str(dtype).strip().lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise UsageError(f"amp_dtype must be 'bfloat16' or 'float16', got {dtype!r}")
    return _DTYPES[key]


def amp_plan(amp: bool | str, amp_dtype: torch.dtype | str, device: torch.device | str) -> dict[str, Any]:
    """How an engine on ``device`` runs with the configs' ``amp`` and ``amp_dtype``.

    Returns ``{"autocast": dtype or None, "engine_amp": bool}``: ``autocast`` is the dtype
    :class:`AutocastInferer` autocasts the forward pass to (bf16 on any device; None when AMP is off or fp16),
    ``engine_amp`` the ``amp`` argument of MONAI's engines (True only for fp16, which needs their gradient scaler).

    Raises:
        ValueError: fp16 on a device other than CUDA (MONAI's autocast and scaler are CUDA-only), or an unknown dtype.
    """
    dtype = as_dtype(amp_dtype)
    if not str2bool(str(amp)):
        return {"autocast": None, "engine_amp": False}
    if dtype == torch.bfloat16:
        return {"autocast": torch.bfloat16, "engine_amp": False}
    if torch.device(device).type != "cuda":
        raise UsageError(
            f"amp_dtype float16 needs a CUDA device (MONAI's AMP and its gradient scaler), got device {device}; "
            "use amp_dtype bfloat16 on this device"
        )
    return {"autocast": None, "engine_amp": True}


class AutocastInferer(SimpleInferer):
    """``SimpleInferer`` whose forward pass runs under ``torch.autocast`` on the device of its input.

    The loss is computed after the inferer returns, outside autocast, in float32 (the losses cast their inputs),
    and the gradients flow back through the autocast casts; no gradient scaler is used (bf16 needs none).

    Args:
        dtype: the autocast dtype (``torch.bfloat16``); None runs in the network's own precision.
    """

    def __init__(self, dtype: torch.dtype | str | None = None) -> None:
        super().__init__()
        self.dtype = None if dtype is None else as_dtype(dtype)

    def __call__(self, inputs: torch.Tensor, network: Any, *args: Any, **kwargs: Any) -> Any:
        with autocast(inputs.device.type, dtype=self.dtype or torch.bfloat16, enabled=self.dtype is not None):
            return super().__call__(inputs, network, *args, **kwargs)
