"""The process group every workflow joins under ``torchrun``: training (``configs/multi_gpu_train.yaml``), evaluation
(``multi_gpu_evaluate.yaml``) and inference (``multi_gpu_inference.yaml``) take their rank, world size and device
here. The training's own DDP pieces (the rank-0-only handlers, each rank's share of the validation list, the
barriers attached to its engines) are in :mod:`scripts.training.distributed`.

One process per device. The rank logic is PyTorch-Ignite's (``ignite.distributed``, the same view MONAI's metric
gathering uses): the process group is joined through ``idist.initialize`` once per process and left through
``idist.finalize`` once at the end.

A rank ends with its launcher: ``torchrun`` starts each worker in a session of its own, so a signal to the
launcher's process group never reaches them, and a launcher killed outright (SIGKILL, out of memory, a scheduler's
cancel) could not stop them itself; :func:`stop_with_launcher` makes the kernel kill a rank whose ``torchrun`` is
gone (Ctrl-C and SIGTERM on ``torchrun`` already stop every rank: it forwards them).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import ignite.distributed as idist
import torch
import torch.distributed as dist

from .errors import UsageError

__all__ = [
    "TORCHRUN_ENV",
    "world_size",
    "rank",
    "is_rank_zero",
    "local_device",
    "init_distributed",
    "barrier",
    "destroy_distributed",
    "quiet_other_ranks",
    "stop_with_launcher",
]

logger = logging.getLogger(__name__)

#: environment variables that ``torchrun`` sets for every process and ``init_process_group`` reads
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def world_size() -> int:
    """Number of processes of the running group (1 without one)."""
    return idist.get_world_size()


def rank() -> int:
    """Global rank of this process (0 without a process group)."""
    return idist.get_rank()


def is_rank_zero() -> bool:
    """Whether this process is rank 0 (or the only process): the one that logs, draws and shows progress."""
    return rank() == 0


def local_device() -> torch.device:
    """This process's device: ``cuda:<LOCAL_RANK>`` when CUDA is available, else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not 0 <= local_rank < torch.cuda.device_count():
        raise UsageError(
            f"LOCAL_RANK={local_rank} but this node has {torch.cuda.device_count()} CUDA device(s): "
            "start at most one process per GPU (torchrun --nproc_per_node)"
        )
    return torch.device("cuda", local_rank)


def init_distributed(
    backend: str | None = None,
    timeout_s: float = 1800.0,
    overlay: str = "multi_gpu_train.yaml",
    command: str = "training",
) -> torch.device:
    """Join the process group described by ``torchrun``'s environment, once per process (idempotent).

    Args:
        backend: ``None`` picks ``nccl`` on CUDA and ``gloo`` on the CPU.
        timeout_s: how long a collective may wait for the other ranks.
        overlay, command: the configuration and the ``monai.bundle run`` command the error names when the process
            was not started by ``torchrun``.

    Returns:
        this process's device (see :func:`local_device`), made the current CUDA device on GPUs.

    Raises:
        ValueError: the process was not started by ``torchrun`` (its environment variables are missing).
    """
    stop_with_launcher()
    device = local_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if dist.is_available() and dist.is_initialized():
        idist.sync()  # a group made elsewhere: ignite keeps its view of it instead of re-reading it at every call
        return device
    if not dist.is_available():
        raise UsageError("torch.distributed is not available in this PyTorch build")
    # ignite would fill in a 1-process group for a missing environment: a run started without torchrun must fail
    missing = [k for k in TORCHRUN_ENV if k not in os.environ]
    if missing:
        raise UsageError(
            f"{overlay} must run under torchrun (missing environment variables {missing}): "
            f"torchrun --nproc_per_node=N -m monai.bundle run {command} --config_file ..."
        )
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    idist.initialize(backend, timeout=timedelta(seconds=timeout_s))
    logger.info("process group: backend %s, rank %d of %d, device %s", backend, rank(), world_size(), device)
    return device


def barrier() -> None:
    """Wait for every rank (no-op without a process group)."""
    idist.barrier()


def destroy_distributed() -> None:
    """Leave the process group after every rank got here (no-op without one)."""
    if dist.is_available() and dist.is_initialized():
        idist.barrier()
        idist.finalize()


def quiet_other_ranks(level: int | str = logging.WARNING) -> None:
    """Raise the root logger's level on ranks other than 0 (their INFO lines repeat rank 0's)."""
    if rank() != 0:
        logging.getLogger().setLevel(level)


#: prctl's option that sends a signal to this process when its parent ends (linux/prctl.h)
_PR_SET_PDEATHSIG = 1


def stop_with_launcher(poll_s: float = 1.0) -> bool:
    """Make this process end when its launcher does, under ``torchrun`` (``TORCHELASTIC_RUN_ID`` set); idempotent.

    On Linux the kernel sends SIGKILL to the process when its parent, ``torchrun``, ends (``prctl`` with
    ``PR_SET_PDEATHSIG``); elsewhere a daemon thread checks the parent every ``poll_s`` seconds. A parent that is gone
    already (the process was handed to init) ends the process at once. A rank's DataLoader workers follow it.

    Returns:
        whether the watch was set (False outside ``torchrun``: a process started otherwise keeps running).
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ or os.name != "posix":
        return False
    if getattr(stop_with_launcher, "parent", None) is not None:
        return True
    parent = os.getppid()
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform.startswith("linux") else None
    if libc is None or libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(poll_s)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, name="stop-with-launcher", daemon=True).start()
    if parent == 1:  # handed to init: the launcher ended before the watch was set
        os.kill(os.getpid(), signal.SIGKILL)
    stop_with_launcher.parent = parent  # type: ignore[attr-defined]
    return True
