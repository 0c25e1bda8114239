"""Atomic file writes: a reader sees the old file or the complete new one, never a torn file.

A write that finds no room (``ENOSPC``, ``EDQUOT``, ``EFBIG``) raises one ``OSError`` naming the final file;
:class:`FolderLock` keeps a second process out of a folder a run writes into.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

#: errno of a write that found no room -> (what happened, what to do)
NO_ROOM_ERRNOS = {
    errno.ENOSPC: ("no space left on device", "free space on that disk"),
    getattr(errno, "EDQUOT", errno.ENOSPC): ("disk quota exceeded", "free space in your quota, or raise it"),
    errno.EFBIG: ("file too large for the file size limit (ulimit -f)", "raise the limit: ulimit -f unlimited"),
}
#: atomic_write's ``.<name>.<mkstemp letters>.tmp`` and :func:`staged_path`'s ``.tmp<pid>-<name>``
_TEMPORARY = re.compile(r"^(\..+\.[a-z0-9_]{8}\.tmp|\.tmp\d+-.+)$")
#: descriptors this process holds an flock through; a forked child closes its copies
_LOCK_FDS: set[int] = set()


def _close_lock_copies_in_child() -> None:
    # an flock belongs to the open file, which fork shares: a data loader worker that outlives a killed parent for a
    # few seconds would keep the folder locked, and the rerun would be told another run holds it
    for fd in _LOCK_FDS:
        with contextlib.suppress(OSError):
            os.close(fd)
    _LOCK_FDS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_lock_copies_in_child)


def lock_exclusive(fd: int) -> None:
    """Take an exclusive ``flock`` on ``fd`` without waiting; forked children (data loader workers) do not share it.

    Args:
        fd: an open descriptor of the lock file or folder.

    Raises:
        OSError: ``EWOULDBLOCK`` when another process holds the lock, another errno where the file system has none.
    """
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _LOCK_FDS.add(fd)


def unlock(fd: int) -> None:
    """Close a descriptor :func:`lock_exclusive` locked, which releases the lock."""
    _LOCK_FDS.discard(fd)
    os.close(fd)


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Write ``path`` atomically: a synced temporary beside it, renamed over it on success, removed on error."""
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
        move_into_place(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        _raise_no_room(err, path)
        raise
    _fsync_dir(path.parent)


def _raise_no_room(err: BaseException, path: Path) -> None:
    """Raise one ``OSError`` naming ``path`` when ``err`` is a write that found no room."""
    full = disk_full(err)
    if full is not None:
        raise OSError(full.errno, os.strerror(full.errno), str(path)) from None


@contextmanager
def atomic_path(path: str | os.PathLike, staged_name: str | None = None, durable: bool = False) -> Iterator[Path]:
    """A temporary path beside ``path`` for writers that take a file name; moved over ``path`` on success.

    Args:
        path: the final file; its folder is created when missing.
        staged_name: the temporary name (default ``.tmp<pid>-<name>``, which keeps the extension); give a short one
            for long final names, or a fixed one for ``torch.save``, which records the name in the archive.
        durable: sync content and rename to disk; off for files that can be written again.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(staged_name) if staged_name else staged_path(path)
    try:
        yield tmp
        move_into_place(tmp, path, durable=durable)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        _raise_no_room(err, path)
        raise


def staged_path(path: str | os.PathLike) -> Path:
    """The temporary ``.tmp<pid>-<name>`` beside ``path`` that a writer fills before :func:`move_into_place`.

    It keeps ``path``'s extension (writers that pick the format by suffix) and :func:`is_temporary` knows it, so what
    a killed writer leaves is removed by :func:`remove_temporaries` and never taken for an output.
    """
    path = Path(path)
    return path.with_name(f".tmp{os.getpid()}-{path.name}")


def move_into_place(staged: str | os.PathLike, path: str | os.PathLike, durable: bool = False) -> None:
    """Rename the complete file or folder ``staged`` over ``path``; ``durable`` syncs before and after."""
    if durable and os.path.isfile(staged):
        with open(staged, "rb") as f:
            os.fsync(f.fileno())
    os.replace(staged, path)
    if durable:
        _fsync_dir(Path(path).parent)


def probe_writable(folder: str | os.PathLike) -> None:
    """Raise the ``OSError`` a new file in ``folder`` (or its nearest existing parent) would meet, before any work."""
    existing = Path(os.path.abspath(folder))
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{existing} is a file, not a folder")
    with tempfile.TemporaryFile(dir=existing):
        pass


def disk_full(err: BaseException | None) -> OSError | None:
    """The ``OSError`` of :data:`NO_ROOM_ERRNOS` in ``err``'s cause / context chain, or None."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in NO_ROOM_ERRNOS:
            return err
        err = err.__cause__ or err.__context__
    return None


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # platforms that cannot open folders
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def is_temporary(name: str) -> bool:
    """Whether ``name`` is a temporary name of :func:`atomic_write` or :func:`atomic_path`."""
    return bool(_TEMPORARY.match(name))


def remove_temporaries(folder: str | os.PathLike) -> list[str]:
    """Remove and log the temporaries killed writers left in ``folder`` (hold its :class:`FolderLock`); their names."""
    removed = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if is_temporary(entry.name) and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed.append(entry.name)
    if removed:
        logger.info("%s: removed %d temporary file(s) an interrupted write left: %s", folder, len(removed), removed)
    return sorted(removed)


class FolderLock:
    """An exclusive ``flock`` on a lock file in ``folder`` that records its holder (pid, host, start, what).

    The kernel releases the lock however the holder ends, so a record under a free lock is stale and taken over.

    Args:
        folder: the folder (created when missing).
        what: what the holder runs, recorded (e.g. ``"training"``).
        name: the lock file's name in ``folder``.

    Raises:
        BlockingIOError: from :meth:`acquire`, when a live process holds the lock (its record in ``holder``).
    """

    def __init__(self, folder: str | os.PathLike, what: str = "run", name: str = ".lock") -> None:
        self.path = Path(folder) / name
        self.what = what
        self._fd: int | None = None
        self.stale: dict[str, Any] | None = None
        self.made_folder = False

    @staticmethod
    def describe(record: dict[str, Any] | None) -> str:
        """``"training pid 123 on host h, started 2024-05-01 10:00:00"``."""
        record = record or {}
        return (
            f"{record.get('what', 'a run')} pid {record.get('pid', '?')} on host {record.get('host', '?')}, "
            f"started {record.get('started', '?')}"
        )

    def _read(self, fd: int) -> dict[str, Any] | None:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 4096).decode("utf-8", errors="replace").strip()
        try:
            record = json.loads(text) if text else None
        except ValueError:
            record = {"what": text[:80]}
        return record if isinstance(record, dict) or record is None else {"what": str(record)[:80]}

    def acquire(self) -> FolderLock:
        """Take the lock without waiting and write this process's record."""
        if self._fd is not None or fcntl is None:
            return self
        self.made_folder = not self.path.parent.is_dir()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            lock_exclusive(fd)
        except OSError as err:
            holder = self._read(fd)
            os.close(fd)
            if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):  # a file system without locks
                logger.warning("%s cannot be locked (%s): nothing keeps a second run out", self.path, err.strerror)
                return self
            busy = BlockingIOError(err.errno, f"{self.path} is held by {self.describe(holder)}", str(self.path))
            busy.holder = holder or {}  # type: ignore[attr-defined]
            raise busy from None
        self.stale = self._read(fd)
        if self.stale is not None:
            logger.warning(
                "%s: took over the lock of %s, which is no longer running", self.path, self.describe(self.stale)
            )
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        record = {"what": self.what, "pid": os.getpid(), "host": socket.gethostname(), "started": started}
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(record).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        """Empty the record and release the lock; the file stays, or two processes could lock two files of one name."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        unlock(self._fd)
        self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
