"""The process group every workflow joins under ``torchrun``, through ``ignite.distributed`` as MONAI does."""

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

logger = logging.getLogger(__name__)

#: set by ``torchrun`` for every process
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def is_rank_zero() -> bool:
    """Whether this process is rank 0 (or the only one): the one that logs, draws and shows progress."""
    return idist.get_rank() == 0


def local_device() -> torch.device:
    """``cuda:<LOCAL_RANK>`` when CUDA is available, else the CPU."""
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
        overlay, command: the config and ``monai.bundle run`` command the error names outside ``torchrun``.

    Returns:
        this process's device (:func:`local_device`), made the current CUDA device.

    Raises:
        ValueError: the process was not started by ``torchrun`` (its environment variables are missing).
    """
    stop_with_launcher()
    device = local_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if dist.is_available() and dist.is_initialized():
        idist.sync()  # a group made elsewhere: ignite caches its view of it
        return device
    if not dist.is_available():
        raise UsageError("torch.distributed is not available in this PyTorch build")
    # ignite would make a 1-process group without torchrun's environment
    missing = [k for k in TORCHRUN_ENV if k not in os.environ]
    if missing:
        raise UsageError(
            f"{overlay} must run under torchrun (missing environment variables {missing}): "
            f"torchrun --nproc_per_node=N -m monai.bundle run {command} --config_file ..."
        )
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    idist.initialize(backend, timeout=timedelta(seconds=timeout_s))
    logger.info(
        "process group: backend %s, rank %d of %d, device %s", backend, idist.get_rank(), idist.get_world_size(), device
    )
    return device


def barrier() -> None:
    """Wait for every rank (no-op without a process group)."""
    idist.barrier()


def destroy_distributed() -> None:
    """Leave the process group after a barrier (no-op without one)."""
    if dist.is_available() and dist.is_initialized():
        idist.barrier()
        idist.finalize()


def quiet_other_ranks(level: int | str = logging.WARNING) -> None:
    """Raise the root logger's level on ranks other than 0 (their INFO lines repeat rank 0's)."""
    if idist.get_rank() != 0:
        logging.getLogger().setLevel(level)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def stop_with_launcher(poll_s: float = 1.0) -> bool:
    """Under ``torchrun``, make this rank end when its launcher does (idempotent).

    torchrun starts ranks in sessions of their own, so a launcher killed outright would leave them running. On
    Linux ``PR_SET_PDEATHSIG`` has the kernel kill the rank; elsewhere a thread polls the parent every ``poll_s``.

    Returns:
        whether the watch was set (False outside ``torchrun``).
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
