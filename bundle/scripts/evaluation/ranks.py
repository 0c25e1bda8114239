"""Which images each rank evaluates under ``torchrun``: contiguous blocks, so gathered rows keep the split's order."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import ignite.distributed as idist
from monai.utils import str2bool

from ..errors import UsageError


def block_bounds(n_items: int, num_replicas: int | None = None, rank_: int | None = None) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank_``'s block of ``n_items`` (``numpy.array_split``'s sizes).

    Raises:
        ValueError: fewer items than ranks (the others would wait for it to gather).
    """
    n = idist.get_world_size() if num_replicas is None else int(num_replicas)
    r = idist.get_rank() if rank_ is None else int(rank_)
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


def check_data_on_ranks(
    datalist: Sequence[Any], split: str, pixel_spacing: Any = None, enabled: bool | str = True
) -> Any:
    """The split checked as ``check_data`` does, each rank reading its own block; collective.

    Returns:
        the report of the whole split (indices in the whole split), or None when ``enabled`` is no.

    Raises:
        scripts.data.checks.DataCheckError: on every rank, naming every problem of every block.
    """
    if not str2bool(str(enabled)):
        return None
    from ..data.checks import DataCheckReport, assert_report_ok, run_data_checks
    from ..data.geometry import as_pixel_spacing

    as_pixel_spacing(pixel_spacing)  # fail before the files are read
    items = list(datalist)
    start, stop = block_bounds(len(items))
    mine = run_data_checks({split: items[start:stop]})
    mine.problems = [dataclasses.replace(p, index=p.index + start) if p.index is not None else p for p in mine.problems]
    mine.ok_items = [(s, i + start, image) for s, i, image in mine.ok_items]
    blocks = idist.all_gather(mine) if idist.get_world_size() > 1 else [mine]
    # what spans blocks (an image listed twice), without reading files
    whole = run_data_checks({split: items}, read_files=False)
    report = DataCheckReport(source=whole.source, n_items=len(items))
    for block in blocks:
        report.problems += [p for p in block.problems if p.index is not None]
        report.ok_items += block.ok_items
        report.spacings.update(block.spacings)
        report.stated_by_datalist |= set(block.stated_by_datalist)
    report.problems += [p for p in whole.problems if p.index is None]
    return assert_report_ok(report, pixel_spacing if idist.get_rank() == 0 else None)
