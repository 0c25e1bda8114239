"""Model settings recorded as JSON in a network's state dict (a ``model_settings`` buffer)."""

from __future__ import annotations

import copy
import inspect
import json
import math
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import UsageError
from .checkpoint_file import CheckpointError, read_checkpoint
from .glam_settings import GLAM_DEFAULTS, setting_specs

#: the buffer's name in a module's state dict
SETTINGS_KEY = "model_settings"
#: recorded, but a network may be built with other values than its checkpoint's: they change no weight
INFERENCE_CHOICES = tuple(name for name, spec in setting_specs().items() if spec.record and not spec.compared)
#: recorded for information, never compared
INFORMATIONAL = ("bundle_version",)


def _plain(value: Any) -> Any:
    """JSON's view of a setting: tuples as lists, mappings with sorted keys."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def encode_settings(settings: Mapping[str, Any]) -> torch.Tensor:
    """Settings -> a 1-D ``uint8`` tensor of their JSON (sorted keys, so equal settings give equal tensors)."""
    text = json.dumps(_plain(settings), sort_keys=True)
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.uint8)


def _non_finite(value: Any, path: str) -> str | None:
    """The path of the first NaN or infinite number in a JSON value, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        where = (f"{path}.{key}" if path else str(key)) if isinstance(value, dict) else f"{path}[{key}]"
        found = _non_finite(item, where)
        if found:
            return found
    return None


# each recorded setting: (the check of its JSON value, what it must be)
_CHECKS: dict[str, tuple[Any, str]] = {
    **{name: (spec.check, spec.expected) for name, spec in setting_specs().items() if spec.record},
    "bundle_version": (lambda v: isinstance(v, str), "a version string"),
}


def validate_settings(record: Any) -> dict[str, Any]:
    """``record`` (a decoded settings record) when a network can be built from it; unknown settings are kept.

    Raises:
        ValueError: not a mapping, a non-finite number, or a known setting of the wrong type or range.
    """
    if not isinstance(record, dict):
        raise UsageError(f"the settings record is a {type(record).__name__}, not a mapping of settings")
    found = _non_finite(record, "")
    if found:
        raise UsageError(f"the settings record's {found} is not a finite number (NaN or infinite)")
    for name, (check, expected) in _CHECKS.items():
        if name in record and not check(record[name]):
            shown = json.dumps(record[name])
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise UsageError(f"the settings record's {name} is {shown}; it must be {expected}")
    return record


def decode_settings(tensor: torch.Tensor) -> dict[str, Any]:
    """The settings recorded by :func:`encode_settings`, validated (:func:`validate_settings`)."""
    try:
        record = json.loads(bytes(tensor.detach().cpu().to(torch.uint8).tolist()).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise UsageError(f"the checkpoint's {SETTINGS_KEY} entry is not a settings record ({err})") from err
    return validate_settings(record)


def settings_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``"name: checkpoint X, network Y"`` for every compared setting that differs."""
    saved, current = _plain(saved), _plain(current)
    names = sorted(set(saved) - set(INFERENCE_CHOICES) - set(INFORMATIONAL))
    missing = "(not recorded)"
    return [
        f"{name}: checkpoint {json.dumps(saved.get(name, missing))}, network {json.dumps(current.get(name, missing))}"
        for name in names
        if saved.get(name, missing) != current.get(name, missing)
    ]


def check_settings(saved: torch.Tensor, current: Mapping[str, Any], source: str = "the checkpoint") -> None:
    """Check the record ``saved`` against a network's ``current`` settings.

    Raises:
        ValueError: an invalid record (naming ``source``), or every setting that differs.
    """
    try:
        record = decode_settings(saved)
    except ValueError as err:
        raise UsageError(f"{source}: {err}") from None
    differences = settings_differences(record, current)
    if differences:
        raise UsageError(
            f"{source} was trained with other model settings than this network's: {'; '.join(differences)} "
            "(build the network with the settings it was trained with, e.g. its preset)"
        )


@lru_cache(maxsize=8)
def _cached_record(path: str, mtime_ns: int, size: int) -> dict[str, Any] | None:
    state = read_checkpoint(path)
    record = state.get(SETTINGS_KEY) if isinstance(state, Mapping) else None
    if record is not None and not isinstance(record, torch.Tensor):
        raise UsageError(f"its {SETTINGS_KEY} entry is a {type(record).__name__}, not a settings record")
    return decode_settings(record) if isinstance(record, torch.Tensor) else None


def read_checkpoint_settings(path: str | os.PathLike) -> dict[str, Any] | None:
    """The validated settings record of the checkpoint at ``path``; None when there is none.

    Raises:
        ValueError: an unreadable file or an invalid record, naming the file.
    """
    path = Path(path)
    if not path.is_file():
        return None
    stat = path.stat()
    try:
        record = _cached_record(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    except CheckpointError:
        raise
    except ValueError as err:
        raise UsageError(f"the checkpoint {path}: {err}") from err
    except Exception as err:  # noqa: BLE001 - torch.load raises many types; the message names the file
        raise UsageError(f"cannot read the checkpoint {path}: {type(err).__name__}: {err}") from err
    # the cached record is shared by every caller
    return copy.deepcopy(record)


def checkpoint_setting(path: str | os.PathLike, name: str, default: Any = inspect.Parameter.empty) -> Any:
    """Setting ``name`` recorded in the checkpoint at ``path``; else ``default``, or else GLAM's default."""
    record = read_checkpoint_settings(path)
    if record is not None and name in record:
        return record[name]
    if default is not inspect.Parameter.empty:
        return default
    if name not in GLAM_DEFAULTS:
        raise KeyError(f"{name!r} is not a GLAM setting with a default")
    return GLAM_DEFAULTS[name]


class RecordsSettings(nn.Module):
    """A module carrying its settings record in its state dict, checked against a loaded state dict's record."""

    def record_settings(self, record: Mapping[str, Any]) -> None:
        """Record ``record`` (JSON values) as :attr:`settings` and as the :data:`SETTINGS_KEY` buffer."""
        self.settings: dict[str, Any] = dict(record)
        self.register_buffer(SETTINGS_KEY, encode_settings(self.settings), persistent=True)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors):
        key = prefix + SETTINGS_KEY
        if key in state_dict:
            check_settings(state_dict[key], self.settings)
        state_dict[key] = getattr(self, SETTINGS_KEY)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors)
