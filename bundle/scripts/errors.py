"""The bundle's error type for a problem the user can fix, and the one line the command line prints for it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .atomic import NO_ROOM_ERRNOS, disk_full


class UsageError(ValueError):
    """A problem the user can fix, printed by the command line as one ``error: <message>`` line.

    It subclasses ``ValueError`` so that callers catching ``ValueError`` keep working.
    """


def user_error(err: BaseException) -> BaseException | None:
    """The user's error in ``err``'s cause chain (a :class:`UsageError` or a full disk); None for a bug."""
    full = disk_full(err)
    if full is not None:
        return full
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, UsageError):
            return current
        current = current.__cause__ or current.__context__
    return None


def error_line(err: BaseException) -> str:
    """``error: <message>`` on one line, led by the type's name for a subclass."""
    if disk_full(err) is err:
        return f"error: {disk_full_message(err)}"  # type: ignore[arg-type]
    kind = "" if type(err) is UsageError else f"{type(err).__name__}: "
    return f"error: {kind}{' '.join(str(err).split())}"


def disk_full_message(err: OSError) -> str:
    """One line for a write that found no room: the file being written and what is still there."""
    what, fix = NO_ROOM_ERRNOS.get(err.errno, NO_ROOM_ERRNOS[errno.ENOSPC])
    if not err.filename:
        return f"{what} ({fix.replace('that disk', 'the output disk')}, then run again)"
    target = Path(os.path.abspath(err.filename))
    head = f"{what} writing {target}"
    if target.suffix != ".pt":
        kept = "its previous version is unchanged" if target.is_file() else "nothing was written to it"
        return f"{head}; {kept} ({fix}, then run again)"
    others = sorted(
        (p for p in target.parent.glob("*.pt") if p.is_file()), key=lambda p: p.stat().st_mtime, reverse=True
    )
    good = next((p for p in [target.parent / "last.pt", target, *others] if p.is_file()), None)
    kept = f"the last good checkpoint is {good}" if good else f"no checkpoint was written in {target.parent} yet"
    return f"{head}; {kept} ({fix}, then continue with --resume true)"
