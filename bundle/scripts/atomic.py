"""Atomic file writes: what a user produced is either the old file or the complete new one, never a torn file."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["atomic_write", "disk_full"]


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Open a temporary file beside ``path`` for writing; on success it is synced and renamed over ``path``
    (readable by all, like a normally created file), on any error it is removed and ``path`` is left untouched.

        with atomic_write("metrics.json", "w", encoding="utf-8") as f:
            f.write(text)
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        kwargs = {"encoding": encoding or "utf-8", "newline": ""} if mode == "w" else {}
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if disk_full(err) is not None:  # name the file (torch.save's own error names none)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from err
        raise
    _fsync_dir(path.parent)


def disk_full(err: BaseException | None) -> OSError | None:
    """The ``OSError`` in ``err``'s chain (``__cause__`` / ``__context__``) that says the disk or the quota is full
    (``ENOSPC``, ``EDQUOT``), or None. torch.save reports a full disk as a ``RuntimeError`` whose context is it."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            return err
        err = err.__cause__ or err.__context__
    return None


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable (a crash right after ``os.replace`` could otherwise lose the new name)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # platforms that cannot open folders: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
