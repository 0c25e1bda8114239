"""Model settings that travel inside a network's state dict, so that a checkpoint says how it was built.

A network records its settings as JSON in a persistent ``uint8`` buffer (``model_settings``): every state dict and
so every checkpoint the workflows write carries them, while the file stays a plain state dict that MONAI's
``CheckpointLoader`` and the model zoo's tools load as before. Loading a state dict whose recorded settings differ
from the network's raises a ``ValueError`` that names each setting that differs; a state dict without the record
(an older checkpoint, the authors' converted weights) loads as before.

Some settings are choices made at inference (``INFERENCE_CHOICES``: M patches, gamma_c, K in training): they are
recorded but may differ.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

__all__ = [
    "SETTINGS_KEY",
    "INFERENCE_CHOICES",
    "encode_settings",
    "decode_settings",
    "settings_differences",
    "check_settings",
]

#: the buffer's name in a module's state dict
SETTINGS_KEY = "model_settings"
#: recorded, but a network may be built with other values than its checkpoint's
INFERENCE_CHOICES = ("num_patches_eval", "num_patches_train", "gamma_c")


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
    """``"name: checkpoint X, network Y"`` for every setting outside :data:`INFERENCE_CHOICES` that differs (a setting
    only one side records counts as differing)."""
    saved, current = _plain(saved), _plain(current)
    names = sorted((set(saved) | set(current)) - set(INFERENCE_CHOICES))
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
