"""The datasets of the deterministic preprocessing, cached in memory, on disk or not at all."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import types
from collections.abc import Callable, Mapping, Sequence
from copy import deepcopy
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.data import CacheDataset, Dataset, PersistentDataset
from monai.utils import convert_to_tensor

from ..errors import UsageError

#: values of the configs' ``train_cache`` / ``val_cache``
CACHE_MODES = ("none", "memory", "disk")
#: part of every disk-cache hash: bump it when what a cache entry holds changes meaning
CACHE_FORMAT = 4
logger = logging.getLogger(__name__)


def read_datalist(datalist: str | os.PathLike, splits: Sequence[str] = ()) -> dict[str, list[dict[str, Any]]]:
    """The datalist file's splits with every relative path (image, masks) joined to the file's folder.

    Args:
        datalist: the datalist file.
        splits: the splits the workflow reads (train.yaml: ``training`` and ``validation``); an empty one is allowed.

    Raises:
        KeyError: a split of ``splits`` is missing (naming the splits the file has).
    """
    from ..data import load_datalist
    from ..data.datalist import resolve_paths

    content = resolve_paths(load_datalist(datalist), os.path.dirname(os.path.abspath(datalist)))
    for split in splits:
        if split not in content:
            raise KeyError(f"{datalist} has no {split!r} split (it has {sorted(content)})")
    return content


def cache_mode(cache: str | None) -> str:
    """One of :data:`CACHE_MODES` (None: ``"none"``), case-insensitive.

    Raises:
        ValueError: any other value, naming the valid ones.
    """
    text = "none" if cache is None else str(cache).strip().lower()
    if text not in CACHE_MODES:
        raise UsageError(f"cache must be one of {CACHE_MODES}, got {cache!r}")
    return text


def _describe(obj: Any, depth: int = 0) -> Any:
    """A JSON-able picture of a transform's settings: its class and public attributes, recursively."""
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
    """MD5 (hex, bytes) of the settings of ``transforms``: ``PersistentDataset``'s ``hash_transform``."""
    text = json.dumps([CACHE_FORMAT, [_describe(t) for t in transforms]], sort_keys=True, default=repr)
    return hashlib.md5(text.encode("utf-8")).hexdigest().encode("utf-8")


def cached_item_hash(item: Any) -> bytes:
    """MD5 (hex, bytes) of a datalist item and the size and mtime of the files it names: ``hash_func``."""
    values = item.values() if isinstance(item, Mapping) else [item]
    stats = []
    for value in values:
        if isinstance(value, (str, os.PathLike)) and str(value) and os.path.isfile(value):
            st = os.stat(value)
            stats.append([os.fspath(value), st.st_size, st.st_mtime_ns])
    text = json.dumps([item, stats], sort_keys=True, default=str)
    return hashlib.md5(text.encode("utf-8")).hexdigest().encode("utf-8")


def _feed(digest: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        digest.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        digest.update(f"A{a.dtype}{a.shape}".encode())
        digest.update(a.tobytes())
    elif isinstance(value, Mapping):
        digest.update(b"{")
        for k in sorted(value, key=str):
            digest.update(repr(k).encode())
            _feed(digest, value[k])
        digest.update(b"}")
    elif isinstance(value, (list, tuple)):
        digest.update(b"[")
        for v in value:
            _feed(digest, v)
        digest.update(b"]")
    else:
        digest.update(repr(value).encode())


def content_checksum(data: Any) -> str:
    """SHA-256 (hex) of a cached item: each tensor's dtype, shape and bytes, each other value's repr."""
    digest = hashlib.sha256()
    _feed(digest, data)
    return digest.hexdigest()


class ChecksummedPersistentDataset(PersistentDataset):
    """MONAI's ``PersistentDataset`` whose cache entries carry a checksum; a bad entry is recomputed with a warning."""

    def _read_entry(self, hashfile: Path) -> Any:
        """The data of a sound cache file.

        Raises:
            ValueError: what is wrong with the file.
        """
        try:
            entry = torch.load(hashfile, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - torch.load raises many types on a damaged file
            raise UsageError(f"cannot be read ({type(err).__name__}: {err})") from None
        if not isinstance(entry, Mapping) or "checksum" not in entry or "data" not in entry:
            raise UsageError("is not a checksummed cache entry")
        if content_checksum(entry["data"]) != entry["checksum"]:
            raise UsageError("does not match its checksum (its content changed on disk)")
        return entry["data"]

    def _cachecheck(self, item_transformed: Any) -> Any:
        if self.cache_dir is None:
            return super()._cachecheck(item_transformed)
        hashfile = Path(self.cache_dir) / f"{self.hash_func(item_transformed).decode('utf-8')}{self.transform_hash}.pt"
        if hashfile.is_file():
            try:
                return self._read_entry(hashfile)
            except ValueError as problem:
                image = item_transformed.get("image") if isinstance(item_transformed, Mapping) else None
                logger.warning("disk cache entry %s (of %s) %s: recomputing it", hashfile, image, problem)
        data = self._pre_transform(deepcopy(item_transformed))
        # numpy arrays as tensors, so that a weights_only load reads them back
        stored = convert_to_tensor(data, convert_numeric=False, track_meta=self.track_meta)
        entry = {"checksum": content_checksum(stored), "data": stored}
        try:
            from ..atomic import atomic_write

            with atomic_write(hashfile, "wb") as f:
                torch.save(entry, f)
        except OSError as err:  # a read-only cache still trains
            logger.warning("cannot write the disk cache entry %s (%s): it is recomputed every time", hashfile, err)
        return data


def training_dataset(
    data: Sequence[Any],
    transform: Callable,
    cache: str = "none",
    cache_dir: str | os.PathLike | None = None,
    num_workers: int = 0,
    progress: bool = True,
) -> Dataset:
    """The dataset of the deterministic preprocessing, cached as ``cache`` says.

    Args:
        data: datalist items.
        transform: the deterministic preprocessing (``train#preprocessing`` / ``validate#preprocessing``).
        cache: ``"none"``, ``"memory"`` or ``"disk"``.
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
            raise UsageError("cache 'disk' needs a cache_dir (the folder that holds the cached images)")
        os.makedirs(cache_dir, exist_ok=True)
        logger.info("preprocessing cache on disk: %s (%d images; the first epoch fills it)", cache_dir, len(data))
        return ChecksummedPersistentDataset(
            data=data,
            transform=transform,
            cache_dir=cache_dir,
            hash_func=cached_item_hash,
            hash_transform=transforms_hash,
            weights_only=True,
        )
    return Dataset(data=data, transform=transform)
