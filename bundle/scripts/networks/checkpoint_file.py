"""Reading one checkpoint file with ``weights_only=True``, every way it can be unusable said in one line naming it,
and finding tensors that hold NaN or Inf."""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import UsageError

#: how a zip and a legacy pickled checkpoint begin
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_MAGIC = b"\x80"


class CheckpointError(UsageError):
    """A checkpoint file that cannot be used; the message names the file and what is wrong with it."""


class NonFiniteError(CheckpointError):
    """Weights that hold NaN or Inf values (read from a file, or about to be written to one)."""


def _first_line(text: Any, limit: int = 160) -> str:
    line = next((part.strip() for part in str(text).splitlines() if part.strip()), "")
    line = line.split(". ")[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def read_checkpoint(path: str | os.PathLike, what: str = "checkpoint") -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True)``.

    Raises:
        FileNotFoundError: ``path`` is not a file (the message names it).
        CheckpointError: empty, truncated, not a PyTorch file, or Python objects that ``weights_only`` refuses.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as err:
        raise CheckpointError(f"cannot read {what} {path}: {err.strerror or err}") from err
    if size == 0:
        raise CheckpointError(f"{what} {path} is empty (0 bytes): an interrupted copy or save? copy the file again")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
        if "weights only" in str(err).lower() or found:
            kind = f" ({found.group(1)})" if found else ""
            raise CheckpointError(
                f"{what} {path} holds Python objects{kind} besides tensors, which a weights-only load refuses (they "
                "could run code): save the state dict alone, torch.save(model.state_dict(), path), from a copy you "
                "trust"
            ) from None
        reason = _first_line(err) or type(err).__name__
        raise CheckpointError(_not_loadable(what, path, size, head, reason)) from None
    except Exception as err:  # noqa: BLE001 - torch.load raises many types (RuntimeError, OSError, EOFError, KeyError)
        reason = f"{type(err).__name__}: {_first_line(err)}" if _first_line(err) else type(err).__name__
        raise CheckpointError(_not_loadable(what, path, size, head, reason)) from None


def _not_loadable(what: str, path: Path, size: int, head: bytes, reason: str) -> str:
    if head.startswith((_ZIP_MAGIC, _PICKLE_MAGIC)):
        return (
            f"{what} {path} is truncated or damaged ({size} bytes; {reason}): a PyTorch file that does not load; "
            "copy or save it again"
        )
    return f"{what} {path} is not a PyTorch checkpoint ({size} bytes, starting {head!r}; {reason})"


def _tensors(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """``(dotted name, tensor)`` for every floating-point or complex tensor in nested mappings and sequences."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            yield prefix, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _tensors(value, f"{prefix}.{i}" if prefix else str(i))


def non_finite_tensors(obj: Any) -> list[tuple[str, int, int]]:
    """``(name, NaN count, Inf count)`` of every tensor nested in ``obj`` that holds a NaN or an infinite value."""
    found = []
    for name, tensor in _tensors(obj):
        if bool(torch.isfinite(tensor).all()):
            continue
        nan = int(torch.isnan(tensor).sum())
        found.append((name, nan, int(tensor.numel() - torch.isfinite(tensor).sum()) - nan))
    return found


def _counts(nan: int, inf: int) -> str:
    parts = [f"{nan} NaN" if nan else "", f"{inf} Inf" if inf else ""]
    return " and ".join(p for p in parts if p) + (" values" if nan + inf > 1 else " value")


def describe_non_finite(found: list[tuple[str, int, int]]) -> str:
    """``"tensor <name> holds 3 NaN values"`` for the first of ``found``, with how many more."""
    name, nan, inf = found[0]
    more = f" (and {len(found) - 1} more tensor(s) with NaN or Inf)" if len(found) > 1 else ""
    return f"tensor {name} holds {_counts(nan, inf)}{more}"
