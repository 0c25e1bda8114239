"""Model settings that travel inside a network's state dict, so that a checkpoint says how it was built.

A network records its settings as JSON in a persistent ``uint8`` buffer (``model_settings``): every state dict and
so every checkpoint the workflows write carries them, while the file stays a plain state dict that MONAI's
``CheckpointLoader`` and the model zoo's tools load as before. Loading a state dict whose recorded settings differ
from the network's raises a ``ValueError`` that names each setting that differs; a state dict without the record
(an older checkpoint, the authors' converted weights) loads as before.

Some settings are choices made at inference (``INFERENCE_CHOICES``): they change no weight, so a network may be
built with other values than its checkpoint's; they are recorded but may differ. They are M patches, K in
training, gamma_c (S_c's mix of S_g and S_l) and how the maps are pooled into the image-level scores (``t_global``,
``t_local``, ``global_pool_after_upsampling``: they change y_global, y_scales and y_local, no map). Every other
setting is compared: it shapes the weights (sizes, depths, backbone, the joint modules), decides which weights run
(``aggregation``: the gated attention and the fusion head learn on the aggregation a checkpoint trained with, and a
network built with concatenation holds attention weights that never trained), changes the maps the local module
learned from and the patches Algorithm 1 picks in them (``gammas``, ``pool_in_breast``, ``patch_size``), or the
input scale the convolutions learned (``image_size``, ``pixel_spacing``). The bundle version that wrote a
checkpoint is recorded for information and never compared (``INFORMATIONAL``). A setting the checkpoint does not
record (it predates the setting) is not compared either.

A record is checked when it is read (:func:`validate_settings`, through :func:`decode_settings`), before anything is
built from it: a mapping (not a list), every number finite, each known setting of its type and within its range, the
window's and the patches' sides at most :data:`MAX_WINDOW_SIDE` pixels; a record that fails is one ``ValueError``
line naming the checkpoint file and the setting.

The inference config and the MONAI Label app read a checkpoint's record back (:func:`checkpoint_setting`, which
falls back on GLAM's defaults), so a network trained with a preset is rebuilt with that preset's settings without the
preset. Which settings are recorded, their checks and which are compared are read from GLAM's settings record
(:class:`~scripts.networks.glam_settings.GLAMSettings`); this module holds the record's format, a network that
carries one (:class:`RecordsSettings`) and its reading.
"""

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
from .glam_settings import GLAM_DEFAULTS, MAX_WINDOW_SIDE, setting_specs

__all__ = [
    "SETTINGS_KEY",
    "INFERENCE_CHOICES",
    "encode_settings",
    "decode_settings",
    "validate_settings",
    "MAX_WINDOW_SIDE",
    "settings_differences",
    "check_settings",
    "read_checkpoint_settings",
    "RecordsSettings",
    "checkpoint_setting",
]

#: the buffer's name in a module's state dict
SETTINGS_KEY = "model_settings"
#: recorded, but a network may be built with other values than its checkpoint's (they change no weight; see the
#: module's docstring for why the others are compared): the record's settings with ``compared=False``
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


# each recorded setting: (the check of its JSON value, what it must be), from the record (GLAMSettings)
_CHECKS: dict[str, tuple[Any, str]] = {
    **{name: (spec.check, spec.expected) for name, spec in setting_specs().items() if spec.record},
    "bundle_version": (lambda v: isinstance(v, str), "a version string"),
}


def validate_settings(record: Any) -> dict[str, Any]:
    """``record`` (a decoded settings record) when it can be built from, else a one-line ``ValueError`` saying what
    is wrong: not a mapping (a list, a number), a NaN or infinite number anywhere, a known setting of the wrong type
    or outside its range (the window's and patches' sides at most :data:`MAX_WINDOW_SIDE` px, at most 256 patches,
    the pooling fractions in (0, 1]). Settings this version does not know are kept (a later version's record)."""
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
    """``"name: checkpoint X, network Y"`` for every setting outside :data:`INFERENCE_CHOICES` and
    :data:`INFORMATIONAL` that differs. A setting only the checkpoint records counts as differing (the network
    cannot honour it); one only the network has is skipped (the checkpoint predates it, its value is unknown)."""
    saved, current = _plain(saved), _plain(current)
    names = sorted(set(saved) - set(INFERENCE_CHOICES) - set(INFORMATIONAL))
    missing = "(not recorded)"
    return [
        f"{name}: checkpoint {json.dumps(saved.get(name, missing))}, network {json.dumps(current.get(name, missing))}"
        for name in names
        if saved.get(name, missing) != current.get(name, missing)
    ]


def check_settings(saved: torch.Tensor, current: Mapping[str, Any], source: str = "the checkpoint") -> None:
    """``ValueError`` naming every setting that differs (see :func:`settings_differences`) between the record
    ``saved`` (a :data:`SETTINGS_KEY` entry) and a network's ``current`` settings; a record that is not valid
    (:func:`validate_settings`) is a ``ValueError`` naming ``source``."""
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
    """The settings record of the checkpoint at ``path``, validated (:func:`validate_settings`); None when the file does
    not exist or has no record (an older checkpoint). A file that cannot be read, or whose record is not valid, is a
    one-line ``ValueError`` naming it. Read once per file version."""
    path = Path(path)
    if not path.is_file():
        return None
    stat = path.stat()
    try:
        record = _cached_record(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    except CheckpointError:
        raise  # names the file already, in one line
    except ValueError as err:
        raise UsageError(f"the checkpoint {path}: {err}") from err
    except Exception as err:  # noqa: BLE001 - torch.load raises many types; the message names the file
        raise UsageError(f"cannot read the checkpoint {path}: {type(err).__name__}: {err}") from err
    # a copy: the cached record is shared by every caller, and config values get mutated downstream
    return copy.deepcopy(record)


def checkpoint_setting(path: str | os.PathLike, name: str, default: Any = inspect.Parameter.empty) -> Any:
    """The value of setting ``name`` recorded in the checkpoint at ``path``; when the file is missing or does not
    record it, ``default``, or else GLAM's own default for it (:data:`~scripts.networks.glam_settings.GLAM_DEFAULTS`,
    the paper's value)."""
    record = read_checkpoint_settings(path)
    if record is not None and name in record:
        return record[name]
    if default is not inspect.Parameter.empty:
        return default
    if name not in GLAM_DEFAULTS:
        raise KeyError(f"{name!r} is not a GLAM setting with a default")
    return GLAM_DEFAULTS[name]


class RecordsSettings(nn.Module):
    """A module that carries its settings record in its state dict (:meth:`record_settings`) and checks a loaded
    state dict's record against it: one that differs is a ``ValueError`` naming the settings (:func:`check_settings`);
    after the check the module keeps its own record (inference choices may differ, older checkpoints have none)."""

    def record_settings(self, record: Mapping[str, Any]) -> None:
        """Record ``record`` (JSON values) as :attr:`settings` and as the persistent :data:`SETTINGS_KEY` buffer."""
        self.settings: dict[str, Any] = dict(record)
        self.register_buffer(SETTINGS_KEY, encode_settings(self.settings), persistent=True)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors):
        key = prefix + SETTINGS_KEY
        if key in state_dict:
            check_settings(state_dict[key], self.settings)
        state_dict[key] = getattr(self, SETTINGS_KEY)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors)
