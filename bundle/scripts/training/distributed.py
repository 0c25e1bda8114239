"""DistributedDataParallel pieces of the training (``configs/multi_gpu_train.yaml``); the process group itself is
:mod:`scripts.distributed`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import ignite.distributed as idist
import torch
import torch.distributed as dist
from ignite.engine import Engine, Events
from monai.data import partition_dataset

from ..errors import UsageError

#: handler classes that only log or draw: built on rank 0 only (MetricsSaver is not here: it gathers across ranks)
RANK_ZERO_ONLY = tuple(
    "StatsHandler TensorBoardStatsHandler TensorBoardImageHandler ProgressBar SaliencyPanelWriter MLFlowHandler "
    "ClearMLStatsHandler ClearMLImageHandler".split()
)


def rank_zero_first(parser: Any, ids: Sequence[str]) -> None:
    """Evaluate the config items ``ids`` on rank 0, then on each node's first process, then on the others."""
    with idist.one_rank_first(rank=0, local=False), idist.one_rank_first(rank=0, local=True):
        for id_ in ids:
            parser.get_parsed_content(id_)


def rank_share(items: Sequence[Any], num_replicas: int | None = None, rank_: int | None = None) -> list[Any]:
    """This rank's share ``items[rank::num_replicas]``, unpadded, so that each rank caches only its own images.

    Raises:
        ValueError: fewer items than ranks (the metric gathering would wait forever).
    """
    n = idist.get_world_size() if num_replicas is None else int(num_replicas)
    r = idist.get_rank() if rank_ is None else int(rank_)
    if not 0 <= r < n:
        raise UsageError(f"rank must be in [0, {n}), got {r}")
    if len(items) < n:
        raise UsageError(f"{len(items)} item(s) cannot be shared by {n} processes: every rank needs at least one")
    return list(partition_dataset(list(items), num_partitions=n, shuffle=False, even_divisible=False)[r])


def _target_name(component: Any) -> str | None:
    if not isinstance(component, dict):
        return None
    target = component.get("_target_")
    return target.rsplit(".", 1)[-1] if isinstance(target, str) else None


def disable_on_other_ranks(config: Any, targets: Iterable[str] = RANK_ZERO_ONLY, rank_: int | None = None) -> list[str]:
    """On ranks other than 0, mark every list entry whose ``_target_`` class is in ``targets`` as ``_disabled_``.

    Args:
        config: a raw bundle configuration (nested dicts and lists), modified in place.
        targets: class names of the components to disable.
        rank_: this process's rank (default: from the process group).

    Returns:
        the config ids of the disabled entries.
    """
    if (idist.get_rank() if rank_ is None else int(rank_)) == 0:
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


class RankBarrier:
    """Make every rank wait for the others when the engine completes: the next stage loads rank 0's ``model.pt``."""

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.COMPLETED, self)

    def __call__(self, engine: Engine) -> None:
        idist.barrier()


class SyncBuffers:
    """Copy rank 0's buffers (batch-norm statistics) to every rank when the engine starts.

    After an epoch each rank's running statistics differ; this makes every rank validate the model rank 0 saves.

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
        if idist.get_world_size() <= 1:
            return
        module = getattr(self.network, "module", self.network)
        for buffer in module.buffers():
            dist.broadcast(buffer.data, src=self.src)
