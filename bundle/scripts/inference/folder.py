"""The output folder of an inference run, opened before the first image: locked, checked and planned.

Rerunning a command resumes it; nothing a run wrote is replaced by another run's outputs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import atomic_write, is_temporary, lock_exclusive, probe_writable, remove_temporaries, unlock
from .files import OUTPUT_FOLDERS, OutputSelection, files_are_complete, input_names
from .tables import (
    FILES_KEY,
    FINGERPRINT_COLUMNS,
    InferenceTables,
    input_fingerprint,
    rank_tables,
    unescape_text,
)

try:  # POSIX; elsewhere the folder is not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

#: the run's record in the output folder
RUN_RECORD = "run.json"
#: the item key of an input's size and modification time when the run was planned (its row records them)
FINGERPRINT_KEY = "input_fingerprint"
# what a folder holds once a run has written into it
_RUN_OUTPUTS = ("predictions.csv", "errors.csv", *OUTPUT_FOLDERS)
_STEM_UNSAFE = {";": "_", "/": "_", "\\": "_"}  # ";" separates the files column's entries


class OutputFolderRefused(SystemExit):
    """The run cannot write into its output folder; the message says why and what to do (status 1)."""


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file (the checkpoint's identity in the run record)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


#: what an output's file name adds to its stem at most: ``.tmp<pid>-`` and ``_S_c_malignant.png``, or atomic_write's
#: ``.<name>.<random>.tmp`` around ``_map.dcm``, and the ``_<n>`` that keeps stems apart, with room to spare
STEM_OVERHEAD_BYTES = 55


def stem_limit(folder: str | os.PathLike | None = None) -> int:
    """The most bytes of a stem whose every output file name fits the ``NAME_MAX`` of ``folder``'s file system."""
    name_max = 255
    with contextlib.suppress(OSError, ValueError, AttributeError):
        name_max = int(os.pathconf(folder, "PC_NAME_MAX")) if folder is not None else name_max
    return max(name_max - STEM_OVERHEAD_BYTES, 32)


def _fitted(name: str, limit: int) -> str:
    """``name`` cut to ``limit`` bytes, ending with ``~`` and 8 hex digits of its hash when cut."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) <= limit:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:8]
    head, size = [], 0
    for ch in name:
        width = len(ch.encode("utf-8", "surrogateescape"))
        if size + width > limit - len(digest) - 1:
            break
        head.append(ch)
        size += width
    return f"{''.join(head)}~{digest}"


def _identity(path: str) -> str:
    """What an input path names, however it is spelled: the file it resolves to."""
    return os.path.realpath(path)


def assign_stems(paths: Sequence[str], taken: Mapping[str, str], limit: int | None = None) -> dict[str, str]:
    """``path -> stem`` for every input: the folder's, else its name cut to ``limit`` bytes and made unique.

    Args:
        paths: the inputs.
        taken: path -> stem of the inputs the folder has.
        limit: the most bytes of a stem.
    """
    limit = stem_limit() if limit is None else int(limit)
    used = {stem.casefold() for stem in taken.values()}
    stems, names = {}, input_names(paths)
    for path in paths:
        if path in taken:
            stems[path] = taken[path]
            continue
        name = "".join(_STEM_UNSAFE.get(ch, ch) for ch in names[path]) or "image"
        name = "".join(ch if ch.isprintable() or 0xDC80 <= ord(ch) <= 0xDCFF else "_" for ch in name)
        name = _fitted(name, limit)
        stem, n = name, 2
        while stem.casefold() in used:
            stem, n = f"{name}_{n}", n + 1
        used.add(stem.casefold())
        stems[path] = stem
    return stems


def _normalised(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _differences(recorded: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(recorded) | set(current)):
        a, b = recorded.get(key), current.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {json.dumps(a)} there, {json.dumps(b)} now")
    return out


@dataclass
class InferencePlan(Sequence):
    """What a run does: its ``items`` (with ``output_stem``) out of ``total`` inputs, ``skipped`` done before."""

    items: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0
    skipped: int = 0
    redone: int = 0

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: Any) -> Any:
        return self.items[index]


class InferenceOutputFolder:
    """The output folder of one run.

    Args:
        output_dir: the folder.
        settings: what makes two runs the same run (JSON-able: checkpoint hash, model settings, preprocessing and
            output settings); written to ``run.json`` and compared on a rerun.
        outputs: the files to write (:class:`~.files.OutputSelection`).
    """

    def __init__(self, output_dir: str | os.PathLike, settings: Mapping[str, Any], outputs: OutputSelection) -> None:
        self.path = Path(output_dir)
        self.outputs = outputs
        self.settings = _normalised({**settings, "outputs": outputs.names()})
        self.tables = InferenceTables(self.path)
        self.plan: InferencePlan | None = None
        self._lock_fd: int | None = None

    def open(self, items: Sequence[Mapping[str, Any]]) -> InferencePlan:
        """Open the folder for a run over ``items`` (once) and return the plan.

        Raises:
            OutputFolderRefused: with the reason when the run cannot write here.
        """
        if self.plan is not None:
            return self.plan
        self._lock()
        try:
            self._take_over()
            try:
                predictions, _ = self.tables.open()
                if self.tables.absorb():  # the rows of a killed multi_gpu_inference.yaml job's ranks
                    predictions = self.tables.predictions.read_rows()
            except (OSError, ValueError) as err:
                raise self._refused(f"its tables cannot be continued: {type(err).__name__}: {err}") from err
            self.plan = self._make_plan(items, predictions)
        except BaseException:
            self.close()
            raise
        return self.plan

    def _take_over(self) -> None:
        """Refuse the folder or record this run in it, check it for writing and clear an interrupted run's leftovers."""
        write_record = self._check_record()  # refuses before anything in the folder is changed
        self._check_writable()
        self._remove_temporaries()
        if write_record:
            with atomic_write(self.path / RUN_RECORD, "w") as f:
                json.dump({"settings": self.settings}, f, indent=2, sort_keys=True)

    def _refused(self, reason: str) -> OutputFolderRefused:
        return OutputFolderRefused(f"error: output_dir {self.path}: {reason}")

    def _lock(self) -> None:
        # the folder itself is locked, not a file in it: a read-only folder is refused by the writing check, and a
        # rerun that has nothing to do leaves the folder as it was
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise self._refused(f"cannot be created ({type(err).__name__}: {err.strerror or err})") from err
        if fcntl is None:
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            lock_exclusive(fd)
        except OSError as err:
            os.close(fd)
            raise self._refused(
                "another inference run is writing into it; wait for it or choose another folder"
            ) from err
        self._lock_fd = fd

    def _check_writable(self) -> None:
        for folder in [self.path, *(self.path / name for name in self.outputs.folders())]:
            try:
                folder.mkdir(exist_ok=True)
                probe_writable(folder)
            except OSError as err:
                raise self._refused(
                    f"not writable ({folder}: {type(err).__name__}: {err.strerror or err}); nothing was run"
                ) from err

    def _remove_temporaries(self) -> None:
        for folder in [self.path, *(self.path / name for name in OUTPUT_FOLDERS)]:
            if folder.is_dir():
                remove_temporaries(folder)

    def _check_record(self) -> bool:
        """Refuse a folder of another run or of unknown provenance; returns whether to write this run's record."""
        record_path = self.path / RUN_RECORD
        if not record_path.exists():
            found = [name for name in _RUN_OUTPUTS if (self.path / name).exists() and self._has_content(name)]
            if found:
                raise self._refused(
                    f"holds {', '.join(found)} but no {RUN_RECORD} (outputs of an earlier version or another "
                    "program): choose another --output_dir; nothing there was changed"
                )
            return True
        try:
            recorded = json.loads(record_path.read_text(encoding="utf-8"))["settings"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise self._refused(f"its {RUN_RECORD} cannot be read ({type(err).__name__}: {err})") from err
        differences = _differences(recorded, self.settings)
        if not differences:
            return False
        if not self._holds_outputs():
            # a run that stopped before its first image: nothing to protect
            logger.info("%s: replacing the record of a run that wrote no image (%s)", self.path, "; ".join(differences))
            return True
        raise self._refused(
            f"holds the outputs of another run ({RUN_RECORD}), which this run would mix with its own: "
            + "; ".join(differences)
            + ". Choose another --output_dir, or run with that run's settings to resume it; nothing there was "
            "changed"
        )

    def _holds_outputs(self) -> bool:
        """Whether a table (a rank's included) has a row or a sub-folder holds a file."""
        ranks = [path.name for paths in rank_tables(self.path).values() for path in paths.values()]
        for name in [*_RUN_OUTPUTS, *ranks]:
            path = self.path / name
            if path.is_file():
                with open(path, "rb") as f:
                    if len([line for line in f.read().splitlines() if line.strip()]) > 1:
                        return True
            elif path.is_dir() and any(path.iterdir()):
                return True
        return False

    def _has_content(self, name: str) -> bool:
        # temporaries are this program's (a run stopped while checking the folder for writing leaves its probe)
        path = self.path / name
        if path.is_dir():
            return any(not is_temporary(entry.name) for entry in path.iterdir())
        return path.stat().st_size > 0

    def _row_is_complete(self, row: Mapping[str, str]) -> bool:
        """Whether the files a row lists are those its image's manifest records."""
        files = [unescape_text(f) for f in row.get(FILES_KEY, "").split(";") if f]
        return files_are_complete(self.path, unescape_text(row.get("output_stem", "")), files)

    @staticmethod
    def _row_is_current(row: Mapping[str, str], fingerprints: Mapping[str, Mapping[str, str]]) -> bool:
        """Whether a row still describes its input (same size and modification time); other runs' inputs are left
        alone."""
        current = fingerprints.get(_identity(unescape_text(row["image"])))
        if current is None:
            return True
        return all(row.get(k, "") == current[k] != "" for k in FINGERPRINT_COLUMNS)

    def _my_inputs(self, paths: list[str]) -> list[str]:
        return paths

    def _rows_to_check(
        self, predictions: list[dict[str, str]], paths: list[str], mine: list[str]
    ) -> list[dict[str, str]]:
        return predictions

    def _drop_rows(self, predictions: list[dict[str, str]], stale: list[dict[str, str]]) -> None:
        """Remove the ``stale`` rows from predictions.csv: their images run again."""
        stale_ids = {id(row) for row in stale}
        self.tables.predictions.replace_rows([row for row in predictions if id(row) not in stale_ids])

    def _make_plan(self, items: Sequence[Mapping[str, Any]], predictions: list[dict[str, str]]) -> InferencePlan:
        # an input is the file its path resolves to, however the path is spelled (relative, absolute, through a
        # linked folder): a rerun spelled otherwise finds its rows, and one file listed twice is run once
        unique: dict[str, Mapping[str, Any]] = {}
        seen: set[str] = set()
        for item in items:
            path = os.fspath(item["image"])
            if _identity(path) in seen:
                logger.warning("%s is listed twice: it is run once", path)
                continue
            seen.add(_identity(path))
            unique[path] = item
        paths = list(unique)
        mine = self._my_inputs(paths)
        # what each input is now: a row counts as done only for the content it was computed from
        fingerprints = {_identity(path): input_fingerprint(path) for path in mine}
        checked = self._rows_to_check(predictions, paths, mine)
        complete = [row for row in checked if self._row_is_complete(row)]
        damaged = len(checked) - len(complete)
        current = {id(row) for row in complete if self._row_is_current(row, fingerprints)}
        changed = len(complete) - len(current)
        stale = [row for row in checked if id(row) not in current]
        if stale:
            self._drop_rows(predictions, stale)
        if damaged:
            logger.warning(
                "%s: %d images in predictions.csv have missing or damaged files: they are run again", self.path, damaged
            )
        if changed:
            logger.warning(
                "%s: %d inputs changed since their predictions.csv row was written (another size or modification "
                "time): they are run again and their rows replaced",
                self.path,
                changed,
            )
        stale_ids = {id(row) for row in stale}
        done = {_identity(unescape_text(row["image"])) for row in predictions if id(row) not in stale_ids}
        taken = {unescape_text(row["image"]): unescape_text(row["output_stem"]) for row in predictions}
        by_identity = {_identity(path): stem for path, stem in taken.items()}
        taken.update({path: by_identity[_identity(path)] for path in paths if _identity(path) in by_identity})
        stems = assign_stems(paths, taken, stem_limit(self.path))
        plan = InferencePlan(total=len(mine), redone=damaged + changed)
        for path in mine:
            if _identity(path) in done:
                plan.skipped += 1
            else:
                fingerprint = fingerprints[_identity(path)]
                plan.items.append({**unique[path], "output_stem": stems[path], FINGERPRINT_KEY: fingerprint})
        if plan.skipped:
            logger.info(
                "%s: resuming: %d of %d inputs are done already (skipped), %d to run",
                self.path,
                plan.skipped,
                plan.total,
                len(plan.items),
            )
        return plan

    def finish(self) -> None:
        """Compact the tables, then :meth:`close`."""
        if self.plan is not None:
            with contextlib.suppress(OSError):  # a folder that became unwritable keeps its appended tables
                self.tables.compact()
        self.close()

    def close(self) -> None:
        """Close the tables and release the folder."""
        self.tables.close()
        if self._lock_fd is not None:
            unlock(self._lock_fd)
            self._lock_fd = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
