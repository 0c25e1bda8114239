"""The training and validation datasets: the deterministic preprocessing of each image computed once and cached.

Loading a mammogram, resampling, mirroring it, cropping the breast and placing the best-centre window cost
hundreds of milliseconds per full-size image on a CPU core, many times a GPU's training step, and they give the
same result every epoch. The workflows therefore split the preprocessing (docs/performance.md): this dataset runs
the deterministic half (``train#preprocessing``: up to the window's region, the image as uint16, the masks as
bytes), and the random per-step half runs batched on the model's device (``train#batch_transforms``, applied by
:class:`~scripts.workflows.batch.GLAMPrepareBatch`). The cache holds the deterministic half:

- ``"memory"``: MONAI's ``CacheDataset`` (about 12 MB per full-size training image, 0.7 MB at 736x480);
- ``"disk"``: MONAI's ``PersistentDataset`` in ``cache_dir``, one ``.pt`` file per image, written on first use
  (atomically: a temporary file renamed into place) and read back with ``torch.load(weights_only=True)``: for
  datasets larger than memory (the operating system's page cache keeps what fits), shared by every process and
  every later run. Its file names hash the datalist item, the size and modification time of the files it names,
  and the settings of every cached transform, so a changed file or setting is never served stale;
- ``"none"``: the deterministic half runs again every epoch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.data import CacheDataset, Dataset, PersistentDataset
from monai.data.utils import worker_init_fn
from monai.utils import str2bool

__all__ = [
    "CACHE_MODES",
    "cache_mode",
    "cached_item_hash",
    "single_thread_worker",
    "training_dataset",
    "transforms_hash",
]

#: values of the configs' ``train_cache`` / ``val_cache``
CACHE_MODES = ("none", "memory", "disk")
#: part of every disk-cache hash: bump when what a cache entry holds changes meaning
CACHE_FORMAT = 1
logger = logging.getLogger(__name__)


def cache_mode(cache: bool | str | None) -> str:
    """One of :data:`CACHE_MODES` from a config value: ``"none"`` / ``"memory"`` / ``"disk"``, or a yes/no (the
    ``train_cache: true`` of earlier presets, a command-line ``'false'``): yes is ``"memory"``, no ``"none"``."""
    if cache is None:
        return "none"
    text = str(cache).strip().lower()
    if text in CACHE_MODES:
        return text
    try:
        return "memory" if str2bool(text) else "none"
    except ValueError:
        raise ValueError(f"cache must be one of {CACHE_MODES} (or true / false), got {cache!r}") from None


def _describe(obj: Any, depth: int = 0) -> Any:
    """A JSON-able picture of a transform's settings: its class and public attributes, recursively (random states
    and private run-time state left out, arrays as lists, functions and classes by name)."""
    if depth > 8:
        return "..."
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        return [_describe(x, depth + 1) for x in items]
    if isinstance(obj, Mapping):
        return {str(k): _describe(v, depth + 1) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (np.ndarray, torch.Tensor)):
        return [str(obj.dtype), np.asarray(obj.detach().cpu() if isinstance(obj, torch.Tensor) else obj).tolist()]
    if isinstance(obj, (type, torch.dtype, np.dtype, np.generic)):
        return repr(obj)
    if isinstance(obj, (types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.BuiltinMethodType)):
        return f"{getattr(obj, '__module__', '')}.{obj.__qualname__}"
    if hasattr(obj, "__dict__"):
        attrs = {k: v for k, v in vars(obj).items() if not k.startswith("_") and k != "R"}
        return [type(obj).__module__ + "." + type(obj).__qualname__, _describe(attrs, depth + 1)]
    return repr(obj)


def transforms_hash(transforms: Sequence[Any]) -> bytes:
    """MD5 (hex, bytes) of the settings of ``transforms`` (``PersistentDataset``'s ``hash_transform``): any changed
    argument of a cached transform gives other cache files."""
    text = json.dumps([CACHE_FORMAT, [_describe(t) for t in transforms]], sort_keys=True, default=repr)
    return hashlib.md5(text.encode("utf-8")).hexdigest().encode("utf-8")


def cached_item_hash(item: Any) -> bytes:
    """MD5 (hex, bytes) of a datalist item together with the size and modification time of every file it names
    (``PersistentDataset``'s ``hash_func``): a file replaced in place gives another cache file."""
    values = item.values() if isinstance(item, Mapping) else [item]
    stats = []
    for value in values:
        if isinstance(value, (str, os.PathLike)) and str(value) and os.path.isfile(value):
            st = os.stat(value)
            stats.append([os.fspath(value), st.st_size, st.st_mtime_ns])
    text = json.dumps([item, stats], sort_keys=True, default=str)
    return hashlib.md5(text.encode("utf-8")).hexdigest().encode("utf-8")


def training_dataset(
    data: Sequence[Any],
    transform: Callable,
    cache: bool | str = "none",
    cache_dir: str | os.PathLike | None = None,
    num_workers: int = 0,
    progress: bool = True,
) -> Dataset:
    """The dataset of the deterministic preprocessing, cached as ``cache`` says (see the module docstring).

    Args:
        data: datalist items.
        transform: the deterministic preprocessing (``train#preprocessing`` / ``validate#preprocessing``).
        cache: ``"none"``, ``"memory"`` or ``"disk"`` (a yes/no is accepted: yes = memory).
        cache_dir: the folder of the disk cache (made if missing); needed for ``"disk"``.
        num_workers: threads that fill a memory cache.
        progress: show the memory cache's progress bar.
    """
    mode = cache_mode(cache)
    if mode == "memory":
        return CacheDataset(
            data=data, transform=transform, cache_rate=1.0, num_workers=int(num_workers) or None, progress=progress
        )
    if mode == "disk":
        if not cache_dir:
            raise ValueError("cache 'disk' needs a cache_dir (the folder that holds the cached images)")
        os.makedirs(cache_dir, exist_ok=True)
        logger.info("preprocessing cache on disk: %s (%d images; the first epoch fills it)", cache_dir, len(data))
        return PersistentDataset(
            data=data,
            transform=transform,
            cache_dir=cache_dir,
            hash_func=cached_item_hash,
            hash_transform=transforms_hash,
            weights_only=True,
        )
    return Dataset(data=data, transform=transform)


def single_thread_worker(worker_id: int) -> None:
    """``worker_init_fn`` of the loaders: MONAI's (seeds the worker's transforms), then one intra-op thread per worker
    (each worker handles one image at a time; several threads each would only compete for the same cores)."""
    worker_init_fn(worker_id)
    torch.set_num_threads(1)
