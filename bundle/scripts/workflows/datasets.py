"""The training dataset, optionally with the deterministic part of the preprocessing computed once.

Loading a mammogram, mirroring it and cropping the breast (the erosion and connected components of the authors'
crop) cost more than a training step of a CPU-sized model: on 2 CPU cores the preprocessing, not the network, set
the epoch time (docs/performance.md). MONAI's ``CacheDataset`` keeps the output of the transforms before the first
random one (the random window shift) in memory, so the window, standardisation and augmentations still run every
epoch, exactly as without the cache.

(A disk cache, MONAI's ``PersistentDataset``, would also share the work between processes, but its files hold the
images' metadata as pickled numpy arrays, which a ``weights_only`` load refuses: the bundle does not unpickle
arbitrary files.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from monai.data import CacheDataset, Dataset
from monai.utils import str2bool

__all__ = ["training_dataset"]


def training_dataset(
    data: Sequence[Any], transform: Callable, cache: bool | str = False, num_workers: int = 0
) -> Dataset:
    """The training dataset: a ``CacheDataset`` of the deterministic preprocessing when ``cache`` is on (about
    1.4 MB an image and 0.35 MB a mask at 736x480, all held in memory), else a plain ``Dataset``.

    Args:
        data: datalist items.
        transform: the preprocessing (a ``Compose`` whose random transforms come after the deterministic ones).
        cache: keep the deterministic part in memory (a command-line ``'true'`` / ``'false'`` is accepted).
        num_workers: threads that fill the cache.
    """
    if str2bool(cache):
        return CacheDataset(data=data, transform=transform, cache_rate=1.0, num_workers=int(num_workers) or None)
    return Dataset(data=data, transform=transform)
