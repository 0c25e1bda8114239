"""Helpers of the DistributedDataParallel overlay (``configs/multi_gpu_train.yaml``) for runs under ``torchrun``.

One process per device: the process group is initialised once per process (in the bundle's ``initialize``, before
``training`` runs the stages in their fresh copies of the configuration) and destroyed once at the end
(``finalize``). Logging and TensorBoard handlers are disabled on ranks other than 0 *before* they are built, so that
only rank 0 opens event files; metrics, checkpoint loading and everything else run on every rank.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from ignite.engine import Engine, Events

__all__ = [
    "TORCHRUN_ENV",
    "RANK_ZERO_ONLY",
    "world_size",
    "rank",
    "local_device",
    "init_distributed",
    "destroy_distributed",
    "barrier",
    "rank_share",
    "rank_zero_first",
    "disable_on_other_ranks",
    "quiet_other_ranks",
    "RankBarrier",
    "SyncBuffers",
]

logger = logging.getLogger(__name__)

#: environment variables that ``torchrun`` sets for every process and ``init_process_group`` reads
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

#: handler classes that only log or draw: built on rank 0 only (MetricsSaver is not here: it gathers across ranks)
RANK_ZERO_ONLY = (
    "StatsHandler",
    "TensorBoardStatsHandler",
    "TensorBoardImageHandler",
    "ProgressBar",
    "SaliencyPanelWriter",
    "MLFlowHandler",
    "ClearMLStatsHandler",
    "ClearMLImageHandler",
)


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """Number of processes of the running group (1 without one)."""
    return dist.get_world_size() if _initialized() else 1


def rank() -> int:
    """Global rank of this process (0 without a process group)."""
    return dist.get_rank() if _initialized() else 0


def local_device() -> torch.device:
    """This process's device: ``cuda:<LOCAL_RANK>`` when CUDA is available, else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not 0 <= local_rank < torch.cuda.device_count():
        raise ValueError(
            f"LOCAL_RANK={local_rank} but this node has {torch.cuda.device_count()} CUDA device(s): "
            "start at most one process per GPU (torchrun --nproc_per_node)"
        )
    return torch.device("cuda", local_rank)


def init_distributed(backend: str | None = None, timeout_s: float = 1800.0) -> torch.device:
    """Join the process group described by ``torchrun``'s environment, once per process (idempotent).

    Args:
        backend: ``None`` picks ``nccl`` on CUDA and ``gloo`` on the CPU.
        timeout_s: how long a collective may wait for the other ranks.

    Returns:
        this process's device (see :func:`local_device`), made the current CUDA device on GPUs.

    Raises:
        ValueError: the process was not started by ``torchrun`` (its environment variables are missing).
    """
    device = local_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if _initialized():
        return device
    if not dist.is_available():
        raise ValueError("torch.distributed is not available in this PyTorch build")
    missing = [k for k in TORCHRUN_ENV if k not in os.environ]
    if missing:
        raise ValueError(
            f"multi_gpu_train.yaml must run under torchrun (missing environment variables {missing}): "
            "torchrun --nproc_per_node=N -m monai.bundle run training --config_file ..."
        )
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    logger.info("process group: backend %s, rank %d of %d, device %s", backend, rank(), world_size(), device)
    return device


def barrier() -> None:
    """Wait for every rank (no-op without a process group)."""
    if _initialized():
        dist.barrier()


def destroy_distributed() -> None:
    """Leave the process group after every rank got here (no-op without one)."""
    if _initialized():
        dist.barrier()
        dist.destroy_process_group()


def _first_phase(rank_: int, local_rank: int) -> int:
    """0 for global rank 0, 1 for the other nodes' first local process, 2 for everyone else."""
    if rank_ == 0:
        return 0
    return 1 if local_rank == 0 else 2


def rank_zero_first(parser: Any, ids: Sequence[str]) -> None:
    """Evaluate the config items ``ids`` of ``parser`` on rank 0 first, then on each node's first process, then on
    the other ranks, with a barrier between: for items that create files on first use (the quick start's
    synthetic dataset), which concurrent processes would otherwise race to create. Later references to the items
    reuse the parser's evaluated values."""
    phase = _first_phase(rank(), int(os.environ.get("LOCAL_RANK", "0")))
    for turn in range(3):
        if phase == turn:
            for id_ in ids:
                parser.get_parsed_content(id_)
        barrier()


def rank_share(items: Sequence[Any], num_replicas: int | None = None, rank_: int | None = None) -> list[Any]:
    """This rank's share of ``items``: ``items[rank::num_replicas]``, without padding or shuffling.

    The same split as ``monai.data.DistributedSampler(even_divisible=False, shuffle=False)``, applied to a datalist
    before a ``CacheDataset`` is built, so that each rank caches only its own images and every image is evaluated
    exactly once (metrics gathered over the ranks are those of one process on the whole list).

    Raises:
        ValueError: fewer items than ranks (a rank would have nothing to evaluate).
    """
    n = world_size() if num_replicas is None else int(num_replicas)
    r = rank() if rank_ is None else int(rank_)
    if not 0 <= r < n:
        raise ValueError(f"rank must be in [0, {n}), got {r}")
    if len(items) < n:
        raise ValueError(f"{len(items)} item(s) cannot be shared by {n} processes: every rank needs at least one")
    return list(items[r::n])


def _target_name(component: Any) -> str | None:
    if not isinstance(component, dict):
        return None
    target = component.get("_target_")
    return target.rsplit(".", 1)[-1] if isinstance(target, str) else None


def disable_on_other_ranks(config: Any, targets: Iterable[str] = RANK_ZERO_ONLY, rank_: int | None = None) -> list[str]:
    """On ranks other than 0, mark every list entry of ``config`` whose ``_target_`` class is in ``targets`` as
    ``_disabled_`` (MONAI then leaves it out of its list without building it). No-op on rank 0.

    Called in ``training`` on the running bundle's raw configuration, before the stages copy it; matching by class
    name (``"StatsHandler"`` matches ``_target_: monai.handlers.StatsHandler``) rather than by list index keeps
    working when ``train.yaml``'s handler lists change.

    Args:
        config: a raw bundle configuration (nested dicts and lists), modified in place.
        targets: class names of the components to disable.
        rank_: this process's rank (default: from the process group).

    Returns:
        the config ids of the disabled entries.
    """
    if (rank() if rank_ is None else int(rank_)) == 0:
        return []
    return _disable(config, frozenset(targets), "")


def _disable(config: Any, names: frozenset[str], id_: str) -> list[str]:
    disabled: list[str] = []
    if isinstance(config, dict):
        for key, value in config.items():
            disabled += _disable(value, names, f"{id_}#{key}" if id_ else str(key))
    elif isinstance(config, list):
        for i, value in enumerate(config):
            sub_id = f"{id_}#{i}"
            if _target_name(value) in names:
                value["_disabled_"] = True
                disabled.append(sub_id)
            else:
                disabled += _disable(value, names, sub_id)
    return disabled


def quiet_other_ranks(level: int | str = logging.WARNING) -> None:
    """Raise the root logger's level on ranks other than 0 (their INFO lines repeat rank 0's)."""
    if rank() != 0:
        logging.getLogger().setLevel(level)


class RankBarrier:
    """Make every rank wait for the others when the engine completes (or is terminated).

    Attached to each stage's trainer: rank 0 writes the stage's checkpoints during its last epoch, and the next
    stage loads ``<previous stage>/model.pt`` on every rank, so no rank may start it before rank 0 is done.
    """

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.COMPLETED, self)

    def __call__(self, engine: Engine) -> None:
        barrier()


class SyncBuffers:
    """Copy rank 0's buffers (batch-norm running statistics) to every rank when the engine starts.

    DDP broadcasts rank 0's buffers at the start of every *training* forward, but each rank's last forward then
    updates its own running statistics from its own images, so after an epoch the ranks' batch norms differ.
    Attached to the evaluator, this makes every rank validate the model that rank 0 checkpoints.

    Args:
        network: the (DDP-wrapped or plain) network whose buffers to synchronise.
        src: the rank whose buffers everyone takes.
    """

    def __init__(self, network: torch.nn.Module, src: int = 0) -> None:
        self.network = network
        self.src = int(src)

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.STARTED, self)

    def __call__(self, engine: Engine | None = None) -> None:
        if world_size() <= 1:
            return
        module = getattr(self.network, "module", self.network)
        for buffer in module.buffers():
            dist.broadcast(buffer.data, src=self.src)
