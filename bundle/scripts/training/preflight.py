"""The training's own checks, before a dataset or a network is built (:func:`preflight_training`)."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ignite.distributed as idist
from monai.bundle import ConfigParser
from monai.utils import str2bool

from ..atomic import FolderLock, probe_writable, remove_temporaries
from ..errors import UsageError
from .checkpoints import read_record

#: the lock file of a training run in its ``ckpt_root``
RUN_LOCK = ".training.lock"

#: the options that hold one value per stage ({global: ..., local: ..., joint: ...}) or one number for all
PER_STAGE_OPTIONS = ("epochs", "learning_rate", "batch_size", "lambda_sparsity", "t_local")
#: the per-stage options that are real numbers, 0 allowed (a stage that only validates, a loss without L1 term)
_REAL_OPTIONS = ("learning_rate", "lambda_sparsity")
#: the per-stage options that are shares of a whole, in (0, 1] (the local pooling's top-t share)
_FRACTION_OPTIONS = ("t_local",)
#: the local stage's patches for lesion-free images: random in-breast ones, or Algorithm 1's on the global maps
LOCAL_NEGATIVES = ("random", "salient")


# -- per-stage values ----------------------------------------------------------------------------------------------
def per_stage(value: Any, stage: str, name: str = "value", scale: float | None = None) -> Any:
    """The value of a per-stage option for ``stage``: ``value[stage]`` of a dict, or ``value`` itself when it is one
    number for every stage (``--epochs 1``), times ``scale`` when given. A dict without ``stage`` is a
    :class:`UsageError` naming it."""
    if scale is not None:
        return per_stage(value, stage, name) * scale
    if isinstance(value, Mapping):
        if stage not in value:
            raise UsageError(
                f"{name} has no value for the {stage} stage ({dict(value)}): give one number for every stage "
                f"(--{name} 2) or a value per stage (--{name}#{stage} 2)"
            )
        return value[stage]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(
            f"{name} must be a number or a dict per stage {{global: .., local: .., joint: ..}}, got {value!r}"
        )
    return value


def _check_per_stage(parser: ConfigParser, stages: Sequence[str]) -> None:
    for name in PER_STAGE_OPTIONS:
        if name not in parser:
            continue
        value = parser.get_parsed_content(name)
        for stage in stages:
            per_stage(value, stage, name)
        values = value.values() if isinstance(value, Mapping) else [value]
        for v in values:
            not_number = isinstance(v, bool) or not isinstance(v, (int, float))
            if name in _FRACTION_OPTIONS:
                if not_number or not 0 < v <= 1:
                    raise UsageError(f"{name} must be fractions in (0, 1], got {value!r}")
                continue
            if not_number or v < 0 or (v == 0 and name not in _REAL_OPTIONS):
                raise UsageError(f"{name} must be positive numbers, got {value!r}")
            if not math.isfinite(v):  # --learning_rate 1e400 parses to inf: the first step would make every weight NaN
                raise UsageError(
                    f"--{name} must be a finite number, got {value!r} (a value beyond {sys.float_info.max:.3g} "
                    "overflows to inf)"
                )
            if name not in _REAL_OPTIONS and int(v) != v:
                raise UsageError(f"{name} must be whole numbers, got {value!r}")


def _finished_by_state(last: Path) -> bool:
    """Whether the trainer state saved in ``last.pt`` reached its ``max_epochs`` (False when unreadable)."""
    import torch

    try:
        state = torch.load(last, map_location="cpu", weights_only=True)["trainer"]
        epoch = state["epoch"] if "epoch" in state else int(state["iteration"]) // int(state["epoch_length"])
        return int(epoch) >= int(state["max_epochs"])
    except Exception:  # noqa: BLE001 - any unreadable or foreign file: not known to be finished
        return False


def check_unfinished_run(ckpt_root: str | os.PathLike, stages: Sequence[str], resume: Any, overwrite: Any) -> None:
    """Refuse to start afresh, without ``resume`` or ``overwrite``, over a stage's unfinished ``last.pt``."""
    if str2bool(str(resume)) or str2bool(str(overwrite)):
        return
    for stage in stages:
        folder = Path(ckpt_root) / stage
        if not (folder / "last.pt").is_file():
            continue
        record = read_record(folder)
        if record is not None and record.get("finished"):
            continue
        if record is None and _finished_by_state(folder / "last.pt"):
            continue  # a folder written before the selection record existed: the trainer state says it finished
        epochs = f" (epoch {record['epochs_run']})" if record and record.get("epochs_run") else ""
        raise UsageError(
            f"{os.path.abspath(folder)} holds the checkpoints of an unfinished {stage} run{epochs}: continue it with "
            "--resume true, or start afresh with --overwrite true (or another --ckpt_root)"
        )


def lock_run(ckpt_root: str | os.PathLike) -> FolderLock | None:
    """Rank 0 locks ``ckpt_root`` for this run and removes the temporaries a killed save left.

    Returns:
        the lock, held until its ``release`` (or the process's end); None on the other ranks (their rank 0 holds it).

    Raises:
        UsageError: another live training holds the folder (resumed or not): the line names its pid, host and start.
    """
    if idist.get_rank() != 0:
        return None
    lock = FolderLock(ckpt_root, "training", name=RUN_LOCK)
    try:
        lock.acquire()
    except BlockingIOError as err:
        raise UsageError(
            f"--ckpt_root {os.path.abspath(ckpt_root)} is in use by another training "
            f"({FolderLock.describe(err.holder)}): wait for it to end, stop it, or pass another --ckpt_root"
        ) from None
    root = Path(ckpt_root)
    for folder in [root, *sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())]:
        remove_temporaries(folder)
    return lock


def unlock_run(lock: FolderLock | None, started: bool) -> None:
    """Release the run's lock; remove a ``ckpt_root`` the run made when only the lock is in it."""
    if lock is None:
        return
    lock.release()
    folder = lock.path.parent
    if not started and lock.made_folder and [p.name for p in folder.iterdir()] == [RUN_LOCK]:
        lock.path.unlink(missing_ok=True)
        folder.rmdir()


def check_writable(**folders: str | os.PathLike) -> None:
    """Each folder accepts a new file (a folder that does not exist yet: its nearest existing parent).

    Raises:
        UsageError: naming the option and the folder.
    """
    for name, folder in folders.items():
        try:
            probe_writable(folder)
        except OSError as err:
            raise UsageError(
                f"{name} {os.path.abspath(folder)} cannot be written ({err.strerror or err}): choose a writable "
                f"folder (--{name} DIR)"
            ) from None


def preflight_training(parser: ConfigParser) -> FolderLock | None:
    """The training's checks on ``parser``, before any work; returns the run's lock on ``ckpt_root``."""
    from .stage import stages_to_run

    try:
        stages = stages_to_run(str(parser.get_parsed_content("stage")))
    except ValueError as err:
        raise UsageError(str(err)) from None
    _check_per_stage(parser, stages)
    negatives = parser.get_parsed_content("local_negatives") if "local_negatives" in parser else "random"
    if negatives not in LOCAL_NEGATIVES:
        raise UsageError(f"local_negatives must be one of {list(LOCAL_NEGATIVES)}, got {negatives!r}")
    check_writable(
        ckpt_root=parser.get_parsed_content("ckpt_root"), output_root=parser.get_parsed_content("output_root")
    )
    lock = lock_run(parser.get_parsed_content("ckpt_root"))
    try:
        check_unfinished_run(
            parser.get_parsed_content("ckpt_root"),
            stages,
            parser.get_parsed_content("resume"),
            parser.get_parsed_content("overwrite") if "overwrite" in parser else False,
        )
    except BaseException:
        unlock_run(lock, started=False)
        raise
    return lock
