"""The evaluation on several processes (``configs/multi_gpu_evaluate.yaml``, under ``torchrun``): which images each
rank evaluates, and the split's data check shared by the ranks.

Each rank takes one contiguous block of the split (:func:`rank_block`: rank 0 the first images, rank 1 the next,
..., the first ``n % N`` ranks one image more), not the interleaved share of training's validation. The report's
metric handlers gather their per-image values rank by rank, so with blocks the gathered rows are in the split's
order, the order one process evaluates them in: ``metrics.csv`` has the same rows, and every mean, standard
deviation and AUC of ``metrics.json`` adds the same per-image values in the same order (the pooled PxAP histograms
and the FROC's counts are integers, summed exactly in any order). The per-image values themselves are each
process's forward pass of the network, which may round an image differently from another process's.

:func:`check_data_on_ranks` is evaluate.yaml's data check with the work shared: each rank reads the files of its
block only, the ranks gather their findings, and every rank then raises the same error, naming every problem with
its index in the whole split, or goes on: the same report as one process's check of the whole split.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import ignite.distributed as idist
from monai.utils import str2bool

from ..distributed import rank, world_size
from ..errors import UsageError

__all__ = ["block_bounds", "rank_block", "check_data_on_ranks"]


def block_bounds(n_items: int, num_replicas: int | None = None, rank_: int | None = None) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank_``'s block of ``n_items`` (``numpy.array_split``'s sizes: the first
    ``n_items % num_replicas`` blocks hold one item more).

    Raises:
        ValueError: fewer items than ranks (a rank would evaluate nothing while the others wait for it to gather).
    """
    n = world_size() if num_replicas is None else int(num_replicas)
    r = rank() if rank_ is None else int(rank_)
    if not 0 <= r < n:
        raise UsageError(f"rank must be in [0, {n}), got {r}")
    if n_items < n:
        raise UsageError(
            f"{n_items} image(s) to evaluate cannot be shared by {n} processes: every rank needs at least one "
            f"(start torchrun with --nproc_per_node and --nnodes giving at most {n_items} processes)"
        )
    size, extra = divmod(n_items, n)
    start = r * size + min(r, extra)
    return start, start + size + (r < extra)


def rank_block(items: Sequence[Any], num_replicas: int | None = None, rank_: int | None = None) -> list[Any]:
    """This rank's contiguous block of ``items`` (:func:`block_bounds`); all of them without a process group."""
    start, stop = block_bounds(len(items), num_replicas, rank_)
    return list(items[start:stop])


def check_data_on_ranks(
    datalist: Sequence[Any], split: str, pixel_spacing: Any = None, enabled: bool | str = True
) -> Any:
    """The files, labels, masks and boxes of the split checked as evaluate.yaml's ``check_data`` does
    (:func:`scripts.data.checks.check_data` on ``{split: datalist}``), each rank reading the files of its own
    block (:func:`rank_block`) only. Collective: every rank calls it, and every rank gets the same outcome.

    The ranks gather their block's reports; each problem keeps its item's index in the whole split; the whole
    split's items are also checked without reading files for what spans blocks (an image listed twice). Only rank 0
    warns about images without a pixel spacing. Returns the report, or None when ``enabled`` is no.

    Raises:
        scripts.data.checks.DataCheckError: on every rank, naming every problem of every block.
    """
    if not str2bool(str(enabled)):
        return None
    from ..data.checks import DataCheckReport, assert_report_ok, run_data_checks
    from ..data.geometry import as_pixel_spacing

    as_pixel_spacing(pixel_spacing)  # a bad value fails here, before the files are read
    items = list(datalist)
    start, stop = block_bounds(len(items))
    mine = run_data_checks({split: items[start:stop]})
    mine.problems = [dataclasses.replace(p, index=p.index + start) if p.index is not None else p for p in mine.problems]
    mine.ok_items = [(s, i + start, image) for s, i, image in mine.ok_items]
    blocks = idist.all_gather(mine) if world_size() > 1 else [mine]
    # across blocks (an image listed twice, the split's size): cheap, and the same on every rank
    whole = run_data_checks({split: items}, read_files=False)
    report = DataCheckReport(source=whole.source, n_items=len(items))
    for block in blocks:  # in rank order: the split's order
        report.problems += [p for p in block.problems if p.index is not None]
        report.ok_items += block.ok_items
        report.spacings.update(block.spacings)
        report.stated_by_datalist |= set(block.stated_by_datalist)
    report.problems += [p for p in whole.problems if p.index is None]
    return assert_report_ok(report, pixel_spacing if rank() == 0 else None)
