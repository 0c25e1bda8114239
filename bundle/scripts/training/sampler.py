"""The paper's per-epoch balancing: every image with a lesion plus as many randomly drawn lesion-free images."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import ignite.distributed as idist
import numpy as np
from torch.utils.data import Sampler

from ..errors import UsageError


def positive_flags(items: Sequence[dict], label_key: str = "label") -> list[bool]:
    """Whether each datalist item has any lesion label (benign or malignant); a missing label counts as negative.

    Raises:
        ValueError: naming the item (index and image) whose label is not a list of 0/1 values.
    """
    flags = []
    for i, item in enumerate(items):
        label = item.get(label_key)
        if label is None:
            flags.append(False)
            continue
        try:
            values = np.asarray(label, dtype=float).ravel()
        except (TypeError, ValueError):  # strings, ragged lists: the same clear error as other bad values
            values = np.asarray([np.nan])
        if values.size == 0 or not np.isin(values, (0.0, 1.0)).all():
            raise UsageError(f"item {i} ({item.get('image', '?')}): {label_key} must be 0/1 values, got {label!r}")
        flags.append(bool(values.any()))
    return flags


class BalancedEpochSampler(Sampler[int]):
    """Indices of one epoch: all positives plus as many negatives drawn without replacement, shuffled.

    The draw depends only on ``seed`` and the epoch, so a resumed run sees the same epochs (``WeightedRandomSampler``
    balances only in expectation).

    Args:
        positives: one flag per dataset item, True for images with a lesion (see :func:`positive_flags`).
        seed: base seed.
        negatives_per_positive: negatives drawn per positive (1 in the paper); all negatives when there are fewer.
        num_replicas, rank: data-parallel split (default: the running process group's, ``ignite.distributed``).
    """

    def __init__(
        self,
        positives: Sequence[bool],
        seed: int = 0,
        negatives_per_positive: float = 1.0,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        flags = np.asarray(list(positives), dtype=bool)
        if flags.size == 0:
            raise UsageError("BalancedEpochSampler needs a non-empty dataset")
        if negatives_per_positive < 0:
            raise UsageError(f"negatives_per_positive must be >= 0, got {negatives_per_positive}")
        num_replicas = idist.get_world_size() if num_replicas is None else num_replicas
        rank = idist.get_rank() if rank is None else rank
        if not 0 <= rank < num_replicas:
            raise UsageError(f"rank must be in [0, {num_replicas}), got {rank}")
        self.pos = np.flatnonzero(flags)
        self.neg = np.flatnonzero(~flags)
        self.seed = int(seed)
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        n_pos = len(self.pos)
        self.num_negatives = (
            len(self.neg) if n_pos == 0 else min(len(self.neg), int(round(n_pos * negatives_per_positive)))
        )
        self.epoch_size = n_pos + self.num_negatives
        self.num_samples = -(-self.epoch_size // self.num_replicas)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def epoch_indices(self, epoch: int | None = None) -> list[int]:
        """All indices of an epoch (every rank's share, before the split)."""
        rng = np.random.default_rng([self.seed, self.epoch if epoch is None else int(epoch)])
        negatives = rng.choice(self.neg, size=self.num_negatives, replace=False) if self.num_negatives else []
        indices = np.concatenate([self.pos, np.asarray(negatives, dtype=int)])
        return [int(i) for i in rng.permutation(indices)]

    def __iter__(self) -> Iterator[int]:
        indices = self.epoch_indices()
        total = self.num_samples * self.num_replicas
        indices = (indices * (total // len(indices) + 1))[:total]
        return iter(indices[self.rank : total : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
