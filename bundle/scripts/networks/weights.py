"""Checkpoint files of the bundle's networks: written atomically and never with NaN or Inf weights, loaded strictly
with weights only, each problem said in one line naming the file."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..atomic import atomic_write
from ..errors import UsageError
from .checkpoint_file import CheckpointError, NonFiniteError, describe_non_finite, non_finite_tensors, read_checkpoint
from .settings import SETTINGS_KEY, check_settings

logger = logging.getLogger(__name__)


def save_atomic(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` to a temporary file in the target folder, then rename it over ``path`` (never a torn file).

    Raises:
        NonFiniteError: a floating-point tensor of ``obj`` holds NaN or Inf (named); nothing is written, and the
            file already at ``path`` stays as it was.
    """
    found = non_finite_tensors(obj)
    if found:
        raise NonFiniteError(
            f"{path} not written: {describe_non_finite(found)}; the file keeps its earlier content (if any)"
        )
    with atomic_write(path, "wb") as f:
        torch.save(obj, f)
    return Path(path)


WEIGHTS_HELP = (
    "train GLAM (docs/training.md; the quick start writes runs/quickstart/models/joint/model.pt), convert the "
    "authors' checkpoint (tools/convert_nyukat_checkpoint.py), or pass --ckpt_path PATH"
)


def check_finite(obj: Any, source: str | os.PathLike) -> Any:
    """``obj`` (a state dict or a training checkpoint) when every floating-point tensor in it is finite.

    Raises:
        NonFiniteError: naming ``source`` and the first tensor.
    """
    found = non_finite_tensors(obj)
    if found:
        raise NonFiniteError(
            f"{source}: {describe_non_finite(found)}; the checkpoint is not usable (weights that diverged in "
            "training, or a damaged copy; see docs/training.md, 'Non-finite losses and weights')"
        )
    return obj


def load_checkpoint_file(path: str | os.PathLike, what: str = "checkpoint") -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU, its tensors checked finite.

    Raises:
        FileNotFoundError: no file at ``path``.
        CheckpointError: unreadable, naming the file.
        NonFiniteError: a tensor holds NaN or Inf.
    """
    return check_finite(read_checkpoint(path, what), path)


def weights_of(state: Any, path: str | os.PathLike) -> Mapping[str, Any]:
    """The network's state dict in a loaded ``model.pt`` or a stage's ``last.pt``.

    Raises:
        CheckpointError: neither, naming ``path``.
    """
    if isinstance(state, Mapping) and isinstance(state.get("network"), Mapping) and "trainer" in state:
        state = state["network"]
    if not isinstance(state, Mapping) or not all(isinstance(k, str) for k in state):
        raise CheckpointError(
            f"model weights {path}: not a state dict (a mapping of tensor names to tensors; got {type(state).__name__})"
        )
    return state


def _listed(items: list[str], separator: str = ", ") -> str:
    return separator.join(items[:3]) + (f"{separator}..." if len(items) > 3 else "")


def state_dict_problems(
    network: torch.nn.Module, state: Mapping[str, Any], source: str = "the checkpoint"
) -> list[str]:
    """One line per kind of problem that keeps ``state`` from loading strictly into ``network``.

    Raises:
        ValueError: the settings record differs from the network's (naming ``source``).
    """
    saved_settings = state.get(SETTINGS_KEY)
    if isinstance(saved_settings, torch.Tensor) and isinstance(getattr(network, "settings", None), Mapping):
        check_settings(saved_settings, network.settings, source)  # before shapes: names the cause
    expected = {k: v for k, v in network.state_dict().items() if k != SETTINGS_KEY}
    weights = {k: v for k, v in state.items() if k != SETTINGS_KEY}
    problems = []
    for what, keys in (
        ("missing", [k for k in expected if k not in weights]),
        ("unexpected", [k for k in weights if k not in expected]),
        ("non-tensor", [k for k in expected if k in weights and not isinstance(weights[k], torch.Tensor)]),
    ):
        if keys:
            problems.append(f"{len(keys)} {what} key(s) ({_listed(keys)})")
    shapes = [
        f"{k} {tuple(weights[k].shape)} vs {tuple(v.shape)}"
        for k, v in expected.items()
        if k in weights and isinstance(weights[k], torch.Tensor) and weights[k].shape != v.shape
    ]
    if shapes:
        problems.append(f"{len(shapes)} shape mismatch(es) ({_listed(shapes, '; ')})")
    return problems


def load_weights(network: torch.nn.Module, path: str | os.PathLike) -> torch.nn.Module:
    """Load a ``model.pt`` or a stage's ``last.pt`` into ``network`` (unwrapped from data parallelism), strictly.

    Returns:
        ``network``.

    Raises:
        ValueError: an unreadable file, non-finite tensors, or settings, keys or shapes that differ; naming the file.
    """
    state = weights_of(load_checkpoint_file(Path(path), "checkpoint"), path)
    wrapped = isinstance(network, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel))
    module = network.module if wrapped else network
    problems = state_dict_problems(module, state, f"the checkpoint {path}")
    if problems:
        raise UsageError(
            f"model weights {path} do not match the network: {', '.join(problems)}; were they trained with other "
            "model settings (a preset), or is it another model's file?"
        )
    module.load_state_dict(state, strict=True)
    logger.info("weights %s loaded strictly (%d tensors)", path, len(state))
    return network


def plain_state_dict(network: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The network's state dict on the CPU, unwrapped from data parallelism: the model zoo's format."""
    module = getattr(network, "module", network)
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}
