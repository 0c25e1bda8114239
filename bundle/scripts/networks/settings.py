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

The inference config and the MONAI Label app read a checkpoint's record back
(:func:`~scripts.networks.glam.checkpoint_setting`, which falls back on GLAM's defaults), so a network trained with a
preset is rebuilt with that preset's settings without the preset. This module knows nothing of GLAM: the network
imports it, not the other way round.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from .checkpoint_file import CheckpointError, read_checkpoint

__all__ = [
    "SETTINGS_KEY",
    "INFERENCE_CHOICES",
    "encode_settings",
    "decode_settings",
    "settings_differences",
    "check_settings",
    "read_checkpoint_settings",
]

#: the buffer's name in a module's state dict
SETTINGS_KEY = "model_settings"
#: recorded, but a network may be built with other values than its checkpoint's (they change no weight; see the
#: module's docstring for why the others are compared)
INFERENCE_CHOICES = (
    "num_patches_eval",
    "num_patches_train",
    "gamma_c",
    "t_global",
    "t_local",
    "global_pool_after_upsampling",
)
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


def decode_settings(tensor: torch.Tensor) -> dict[str, Any]:
    """The settings recorded by :func:`encode_settings`."""
    try:
        return json.loads(bytes(tensor.detach().cpu().to(torch.uint8).tolist()).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"the checkpoint's {SETTINGS_KEY} entry is not a settings record ({err})") from err


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
    ``saved`` (a :data:`SETTINGS_KEY` entry) and a network's ``current`` settings."""
    differences = settings_differences(decode_settings(saved), current)
    if differences:
        raise ValueError(
            f"{source} was trained with other model settings than this network's: {'; '.join(differences)} "
            "(build the network with the settings it was trained with, e.g. its preset)"
        )


@lru_cache(maxsize=8)
def _cached_record(path: str, mtime_ns: int, size: int) -> dict[str, Any] | None:
    state = read_checkpoint(path)
    record = state.get(SETTINGS_KEY) if isinstance(state, Mapping) else None
    return decode_settings(record) if isinstance(record, torch.Tensor) else None


def read_checkpoint_settings(path: str | os.PathLike) -> dict[str, Any] | None:
    """The settings record of the checkpoint at ``path``; None when the file does not exist or has no record (an
    older checkpoint). A file that cannot be read is a ``ValueError`` naming it. Read once per file version."""
    path = Path(path)
    if not path.is_file():
        return None
    stat = path.stat()
    try:
        record = _cached_record(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    except CheckpointError:
        raise  # names the file already, in one line
    except ValueError as err:
        raise ValueError(f"the checkpoint {path}: {err}") from err
    except Exception as err:  # noqa: BLE001 - torch.load raises many types; the message names the file
        raise ValueError(f"cannot read the checkpoint {path}: {type(err).__name__}: {err}") from err
    # a copy: the cached record is shared by every caller, and config values get mutated downstream
    return copy.deepcopy(record)
