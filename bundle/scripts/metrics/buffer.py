"""MONAI's ``Cumulative`` buffers in one growing tensor each, and MONAI's ROC AUC over them.

Why: MONAI keeps one small tensor per image. On the CPU glibc puts these long-lived allocations into the holes that
each image's freed maps leave, the next image's maps no longer fit there, and the heap grows by megabytes per image
that are never given back. A buffer doubled when full makes a handful of allocations per evaluation instead.
"""

from __future__ import annotations

from typing import Any

import torch
from monai.metrics import ROCAUCMetric
from monai.utils import convert_data_type, evenly_divisible_all_gather

#: rows of a buffer's first allocation
_FIRST_CAPACITY = 64


def _rows_of(data: Any) -> torch.Tensor:
    """A batch-first tensor of ``data``: a tensor or array as it is, a sequence of channel-first tensors stacked."""
    if isinstance(data, (list, tuple)) and data and all(isinstance(d, torch.Tensor) for d in data):
        return torch.stack(list(data))
    return convert_data_type(data, output_type=torch.Tensor, wrap_sequence=True)[0]


class CompactCumulative:
    """Mixin for a :class:`monai.metrics.Cumulative` whose buffers are growing tensors (same interface).

    Put it before the MONAI class: ``class M(CompactCumulative, CumulativeIterationMetric)``. ``extend``, ``append``,
    ``get_buffer``, ``reset`` and ``len`` behave as MONAI's: each buffer takes batch-first rows of one shape, on one
    device, in the promoted dtype of everything added; ``get_buffer`` gathers every rank's rows (collective).
    """

    def reset(self) -> None:
        super().reset()  # type: ignore[misc]
        self._buffer_rows: list[torch.Tensor] | None = None
        self._buffer_counts: list[int] = []

    def extend(self, *data: Any) -> None:
        """Add a batch to each buffer: a batch-first tensor or a list of channel-first tensors per buffer.

        Raises:
            TypeError: a different number of buffers than before, or rows whose shape or device differ from the
                buffer's.
        """
        batches = [_rows_of(d) for d in data]
        batches = [b.detach().reshape(1) if b.ndim == 0 else b.detach() for b in batches]
        if self._buffer_rows is None:
            self._buffer_rows = [b.new_empty((_FIRST_CAPACITY, *b.shape[1:])) for b in batches]
            self._buffer_counts = [0] * len(batches)
        if len(batches) != len(self._buffer_rows):
            raise TypeError(f"{type(self).__name__}: {len(batches)} buffers given, {len(self._buffer_rows)} before.")
        for i, batch in enumerate(batches):
            self._buffer_rows[i] = self._room(self._buffer_rows[i], self._buffer_counts[i], batch)
            self._buffer_rows[i][self._buffer_counts[i] : self._buffer_counts[i] + len(batch)] = batch
            self._buffer_counts[i] += len(batch)

    def append(self, *data: Any) -> None:
        """Add one sample to each buffer (stacked along a new first dimension by ``get_buffer``)."""
        self.extend(*(_rows_of(d)[None] for d in data))

    def _room(self, rows: torch.Tensor, count: int, batch: torch.Tensor) -> torch.Tensor:
        """``rows``, or a larger copy, with room for ``batch`` after its first ``count`` rows, in a common dtype."""
        if batch.shape[1:] != rows.shape[1:] or batch.device != rows.device:
            raise TypeError(
                f"{type(self).__name__}: rows of shape {tuple(batch.shape[1:])} on {batch.device} cannot join a "
                f"buffer of rows of shape {tuple(rows.shape[1:])} on {rows.device}."
            )
        dtype = torch.promote_types(rows.dtype, batch.dtype)
        if count + len(batch) <= len(rows) and dtype == rows.dtype:
            return rows
        grown = rows.new_empty((max(2 * len(rows), count + len(batch)), *rows.shape[1:]), dtype=dtype)
        grown[:count] = rows[:count]
        return grown

    def get_buffer(self) -> torch.Tensor | list[torch.Tensor] | None:
        """Every rank's rows of each buffer (a copy), one tensor when there is one buffer; None before any data."""
        if self._buffer_rows is None:
            return None
        buffers = [
            evenly_divisible_all_gather(rows[:count], concat=True).clone()
            for rows, count in zip(self._buffer_rows, self._buffer_counts)
        ]
        return buffers[0] if len(buffers) == 1 else buffers

    def __len__(self) -> int:
        buffers = self.get_buffer()
        if buffers is None:
            return 0
        return max(len(b) for b in ([buffers] if isinstance(buffers, torch.Tensor) else buffers))


class CompactROCAUCMetric(CompactCumulative, ROCAUCMetric):
    """MONAI's :class:`~monai.metrics.ROCAUCMetric` (same arguments and results) over growing buffers."""
