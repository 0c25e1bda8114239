"""Atomic file writes: what a user produced is either the old file or the complete new one, never a torn file.

The one owner of the project's temporary-file-and-rename: :func:`atomic_write` (a file object, synced),
:func:`atomic_path` (a temporary path for writers that take a file name) and :func:`move_into_place` (the rename
itself, for files staged elsewhere, e.g. an inference run's files committed together). No other module renames a
file (tests/test_owners.py checks it)."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["atomic_write", "atomic_path", "move_into_place", "disk_full"]


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
        if disk_full(err) is not None:  # name the file (torch.save's own error names none)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from err
        raise
    _fsync_dir(path.parent)


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
    except BaseException:
        tmp.unlink(missing_ok=True)
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
