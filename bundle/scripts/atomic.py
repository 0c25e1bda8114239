"""Atomic file writes: what a user produced is either the old file or the complete new one, never a torn file.

The one owner of the project's temporary-file-and-rename: :func:`atomic_write` (a file object, synced),
:func:`atomic_path` (a temporary path for writers that take a file name) and :func:`move_into_place` (the rename
itself, for files staged elsewhere, e.g. an inference run's files committed together). No other module renames a
file (tests/test_owners.py checks it).

A write that fails for lack of room (a full disk ``ENOSPC``, a full quota ``EDQUOT``, the file size limit ``EFBIG``,
``ulimit -f``) raises one ``OSError`` with that errno and the final file's name (:func:`disk_full` finds it);
:func:`remove_temporaries` clears the temporaries a killed writer left, and :class:`FolderLock` keeps a second
process out of a folder a run writes into."""

from __future__ import annotations

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

try:  # POSIX; elsewhere a folder is not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "atomic_write",
    "atomic_path",
    "move_into_place",
    "disk_full",
    "NO_ROOM_ERRNOS",
    "is_temporary",
    "remove_temporaries",
    "FolderLock",
]

logger = logging.getLogger(__name__)

#: the errnos of a write that found no room (the disk, the user's quota, the process's file size limit): what
#: happened and what to do, in words
NO_ROOM_ERRNOS = {
    errno.ENOSPC: ("no space left on device", "free space on that disk"),
    getattr(errno, "EDQUOT", errno.ENOSPC): ("disk quota exceeded", "free space in your quota, or raise it"),
    errno.EFBIG: ("file too large for the file size limit (ulimit -f)", "raise the limit: ulimit -f unlimited"),
}
#: the temporary names of this module's writers: atomic_write's ``.<name>.<8 of mkstemp's letters>.tmp`` and
#: atomic_path's default ``.tmp<pid>-<name>``
_TEMPORARY = re.compile(r"^(\..+\.[a-z0-9_]{8}\.tmp|\.tmp\d+-.+)$")


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
        move_into_place(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        _raise_no_room(err, path)
        raise
    _fsync_dir(path.parent)


def _raise_no_room(err: BaseException, path: Path) -> None:
    """Raise one ``OSError`` naming ``path`` when ``err`` is (or was caused by) a write that found no room; its chain
    is cut (torch.save wraps the ``OSError`` in a ``RuntimeError`` that names no file: one line says it all)."""
    full = disk_full(err)
    if full is not None:
        raise OSError(full.errno, os.strerror(full.errno), str(path)) from None


@contextmanager
def atomic_path(path: str | os.PathLike, staged_name: str | None = None, durable: bool = False) -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that takes a file name (nibabel, which picks the compression
    from the extension, pydicom, pynrrd, PIL, ``torch.save``); when the block ends without error the file is moved
    over ``path`` (:func:`move_into_place`), on any error it is removed and ``path`` is left untouched.

        with atomic_path("maps/x.nii.gz") as tmp:
            nib.save(image, str(tmp))

    Args:
        path: the final file; its folder is created when missing.
        staged_name: the temporary file's name in ``path``'s folder. Default ``.tmp<pid>-<name>``: hidden, and
            ending with the final name so that its extension stays. Give one where the name matters: a short one
            when the final name may be 255 bytes long; the name of a file ``torch.save`` writes, which records it
            (less its last suffix) in the archive, so that the bytes stay those the file had before.
        durable: sync the content and the rename to disk (as :func:`atomic_write` always does); off by default for
            files that can be written again (a synthetic data set, a converted checkpoint, a run that resumes).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(staged_name or f".tmp{os.getpid()}-{path.name}")
    try:
        yield tmp
        move_into_place(tmp, path, durable=durable)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        _raise_no_room(err, path)
        raise


def move_into_place(staged: str | os.PathLike, path: str | os.PathLike, durable: bool = False) -> None:
    """Rename the complete file (or folder) ``staged`` over ``path`` in one step (``os.replace``: on the same file
    system, a reader sees the old file or the new one, never a part). ``durable``: the file's content is synced
    before the rename and its folder after it, so that a crash cannot leave the new name over lost content."""
    if durable and os.path.isfile(staged):
        with open(staged, "rb") as f:
            os.fsync(f.fileno())
    os.replace(staged, path)
    if durable:
        _fsync_dir(Path(path).parent)


def probe_writable(folder: str | os.PathLike) -> None:
    """Raise the ``OSError`` a new file in ``folder`` would meet, before any work is spent on it: a folder that does
    not exist yet is probed at its nearest existing parent (where it would be made), which must be a folder. The
    probe is an anonymous temporary file: nothing is left behind."""
    existing = Path(os.path.abspath(folder))
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{existing} is a file, not a folder")
    with tempfile.TemporaryFile(dir=existing):
        pass


def disk_full(err: BaseException | None) -> OSError | None:
    """The ``OSError`` in ``err``'s chain (``__cause__`` / ``__context__``) that says a write found no room
    (:data:`NO_ROOM_ERRNOS`: the disk, the quota or the file size limit), or None. torch.save reports it as a
    ``RuntimeError`` whose context is it."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in NO_ROOM_ERRNOS:
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


def is_temporary(name: str) -> bool:
    """Whether ``name`` is a temporary file name of :func:`atomic_write` or :func:`atomic_path` (its default)."""
    return bool(_TEMPORARY.match(name))


def remove_temporaries(folder: str | os.PathLike) -> list[str]:
    """Remove the temporary files (:func:`is_temporary`) that writers killed mid-write left in ``folder`` (not in
    its sub-folders), with a log line naming them; returns their names. Call it only while no other process writes
    there (:class:`FolderLock`): a live writer's temporary has the same name."""
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
    """An exclusive lock on a folder for one process: ``flock`` on a lock file in it, which records the holder (pid,
    host, start time, what it runs) so that a refused process can name it. The kernel releases the lock when the
    holder ends in any way (a kill, a lost node on NFS), so a record whose lock is free is stale and is taken over.

    Args:
        folder: the folder (created when missing).
        what: what the holder runs, recorded (e.g. ``"training"``).
        name: the lock file's name in ``folder``.

    Raises (:meth:`acquire`):
        BlockingIOError: another live process holds the lock; its ``holder`` attribute is that process's record.
    """

    def __init__(self, folder: str | os.PathLike, what: str = "run", name: str = ".lock") -> None:
        self.path = Path(folder) / name
        self.what = what
        self._fd: int | None = None
        #: the record of a process that ended holding the lock (taken over by :meth:`acquire`), else None
        self.stale: dict[str, Any] | None = None
        #: whether :meth:`acquire` created the folder
        self.made_folder = False

    @staticmethod
    def describe(record: dict[str, Any] | None) -> str:
        """``"training pid 123 on host h, started 2024-05-01 10:00:00"`` from a holder's record."""
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
        """Take the lock (without waiting), write this process's record; a stale record is logged as taken over."""
        if self._fd is not None or fcntl is None:
            return self
        self.made_folder = not self.path.parent.is_dir()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
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
        record = {
            "what": self.what,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(record).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        """Empty the record (a free lock), release the lock. The file stays: removing it would let two processes
        lock two different files under one name."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
