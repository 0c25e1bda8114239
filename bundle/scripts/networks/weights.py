"""Checkpoint files of the bundle's networks: written atomically, loaded strictly with weights only, and the
one-line help when the weights are missing."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from monai.utils import str2bool

from ..atomic import atomic_write
from .settings import SETTINGS_KEY, check_settings

__all__ = [
    "save_atomic",
    "WEIGHTS_HELP",
    "require_weights",
    "load_checkpoint_file",
    "load_weights",
    "as_flag",
    "plain_state_dict",
]

logger = logging.getLogger(__name__)


def save_atomic(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` to a temporary file in the target folder, then rename it over ``path`` (never a torn file)."""
    with atomic_write(path, "wb") as f:
        torch.save(obj, f)
    return Path(path)


WEIGHTS_HELP = (
    "train GLAM (docs/training.md; the quick start writes runs/quickstart/models/joint/model.pt), convert the "
    "authors' checkpoint (scripts/convert_nyukat_checkpoint.py), or pass --ckpt_path PATH"
)


def require_weights(path: str | os.PathLike) -> str:
    """``path`` when it is a file; otherwise stop the workflow with one line that names the missing file and how to
    get weights (``SystemExit``: the bundle runner's expression handling lets it through, so no traceback)."""
    if not Path(path).is_file():
        raise SystemExit(f"error: model weights not found: {path}: {WEIGHTS_HELP}")
    return str(path)


def load_checkpoint_file(path: Path, what: str) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU; an unreadable file is a ``ValueError`` naming it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:
        raise ValueError(f"cannot read {what} {path}: {type(err).__name__}: {err}") from err


def load_weights(network: torch.nn.Module, path: str | os.PathLike) -> torch.nn.Module:
    """Load a plain state dict (``weights_only``) into ``network``, strictly; returns ``network``.

    A file that is not a state dict, or whose keys or shapes differ from the network's, is a ``ValueError`` that
    names the file (and the keys).
    """
    state = load_checkpoint_file(Path(path), "model weights")
    if not isinstance(state, Mapping):
        raise ValueError(f"model weights {path}: not a state dict (a mapping of tensor names to tensors)")
    saved_settings = state.get(SETTINGS_KEY)
    if isinstance(saved_settings, torch.Tensor) and isinstance(getattr(network, "settings", None), Mapping):
        check_settings(saved_settings, network.settings, f"the checkpoint {path}")  # before shapes: names the cause
    # the weights alone: the settings record is checked above, and older checkpoints have none
    expected = {k: v for k, v in network.state_dict().items() if k != SETTINGS_KEY}
    weights = {k: v for k, v in state.items() if k != SETTINGS_KEY}
    problems = []
    for what, keys in (
        ("missing", [k for k in expected if k not in weights]),
        ("unexpected", [k for k in weights if k not in expected]),
    ):
        if keys:
            problems.append(f"{len(keys)} {what} key(s) ({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''})")
    shapes = [
        f"{k} {tuple(weights[k].shape)} vs {tuple(v.shape)}"
        for k, v in expected.items()
        if k in weights and isinstance(weights[k], torch.Tensor) and weights[k].shape != v.shape
    ]
    if shapes:
        problems.append(
            f"{len(shapes)} shape mismatch(es) ({'; '.join(shapes[:3])}{'; ...' if len(shapes) > 3 else ''})"
        )
    if problems:
        raise ValueError(
            f"model weights {path} do not match the network: {', '.join(problems)}; were they trained with other "
            "model settings (a preset)?"
        )
    network.load_state_dict(state, strict=True)
    logger.info("weights %s loaded strictly (%d tensors)", path, len(state))
    return network


def as_flag(value: Any, name: str) -> bool:
    """A yes/no option that may come from the command line as text (fire passes ``--resume false`` as 'false')."""
    try:
        return str2bool(str(value).strip())  # str(): also bools and the integers 0/1
    except ValueError:
        raise ValueError(f"{name} must be true or false, got {value!r}") from None


def plain_state_dict(network: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The network's state dict on the CPU, unwrapped from (Distributed)DataParallel: the model-zoo format."""
    module = getattr(network, "module", network)
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}
