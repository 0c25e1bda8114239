"""Mixed precision: bf16 autocast on the batch's own device, fp16 through MONAI's engine AMP.

MONAI's ``amp=True`` autocasts on ``"cuda"`` only, so a CPU run would silently stay float32.
"""

from __future__ import annotations

from typing import Any

import torch
from monai.inferers import SimpleInferer
from monai.utils import str2bool

from .errors import UsageError

_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def autocast(device_type: str, dtype: torch.dtype | None = torch.bfloat16, enabled: bool = True) -> torch.autocast:
    """``torch.autocast`` on ``device_type`` (the inputs' device) in ``dtype`` (None: torch's default)."""
    return torch.autocast(device_type, dtype=dtype, enabled=enabled)


def full_precision(device_type: str) -> torch.autocast:
    """Autocast switched off on ``device_type``, for float32 blocks inside an autocast region."""
    return torch.autocast(device_type=device_type, enabled=False)


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.bfloat16`` or ``torch.float16`` from a dtype or a name (``bf16``, ``torch.float16``, ...)."""
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

    Returns:
        ``{"autocast": dtype or None, "engine_amp": bool}``: the :class:`AutocastInferer` dtype (bf16) and the MONAI
        engines' ``amp`` (fp16, which needs their gradient scaler).

    Raises:
        ValueError: fp16 on a device other than CUDA, or an unknown dtype.
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

    Args:
        dtype: the autocast dtype; None runs in the network's own precision.
    """

    def __init__(self, dtype: torch.dtype | str | None = None) -> None:
        super().__init__()
        self.dtype = None if dtype is None else as_dtype(dtype)

    def __call__(self, inputs: torch.Tensor, network: Any, *args: Any, **kwargs: Any) -> Any:
        with autocast(inputs.device.type, dtype=self.dtype or torch.bfloat16, enabled=self.dtype is not None):
            return super().__call__(inputs, network, *args, **kwargs)
