"""``predictions.csv``, ``errors.csv`` and ``breasts.csv`` of an inference run, appended one row per image completed.

Text cells are escaped losslessly and a cell a spreadsheet would run as a formula gets a leading ``'``
(:func:`unescape_text` reverses both).
"""

from __future__ import annotations

import csv
import io
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..atomic import atomic_write
from ..data.header_facts import file_suffix, text_view_laterality
from ..data.readers import SUPPORTED_SUFFIXES
from ..enums import CLASS_NAMES
from ..errors import UsageError
from ..metrics.breasts import breast_key, group_breasts

logger = logging.getLogger(__name__)

#: key of the error message in an item that failed (and the second column of errors.csv)
ERROR_KEY = "error"
#: third column of errors.csv: what an image that was processed (its error cell empty) should be read with
NOTE_KEY = "note"
#: the predictions.csv column listing an image's files (relative to the output folder, separated by ";")
FILES_KEY = "files"
ERROR_COLUMNS = ["image", ERROR_KEY, NOTE_KEY]
PREDICTION_COLUMNS = ["image", "output_stem", *(f"prob_{c}" for c in CLASS_NAMES), *(f"label_{c}" for c in CLASS_NAMES)]
PREDICTION_COLUMNS += ["height", "width", "patch_boxes", FILES_KEY]
#: how the image was read and where the model looked (:func:`~.facts.image_facts`, the window on the file)
FACT_COLUMNS = ["laterality", "laterality_source", "view", "view_source", "spacing_row_mm", "spacing_col_mm"]
FACT_COLUMNS += ["spacing_source", "window_y0", "window_x0", "window_y1", "window_x1"]
#: the input's size and modification time (ns) when it was read: a row counts as done only while they still hold
FINGERPRINT_COLUMNS = ["input_bytes", "input_mtime_ns"]
#: the share of the breast inside the model's window and the patient, last
BREAST_COLUMNS = ["breast_in_window", "patient_id"]
PREDICTION_COLUMNS += [*FACT_COLUMNS, *FINGERPRINT_COLUMNS, *BREAST_COLUMNS]
# the columns whose cells are free text (escaped and neutralised); the others are numbers this module formats
_TEXT_COLUMNS = frozenset(
    {"image", "output_stem", ERROR_KEY, NOTE_KEY, FILES_KEY, "laterality", "laterality_source", "view", "view_source"}
    | {"spacing_source", "patient_id", "views", "inputs", "grouped_by"}
)
#: breasts.csv: one row per breast (:func:`breast_rows`)
BREAST_TABLE_COLUMNS = ["patient_id", "laterality", "views", "images", *(f"prob_{c}" for c in CLASS_NAMES)]
BREAST_TABLE_COLUMNS += ["inputs", "grouped_by", NOTE_KEY]
#: the laterality sources that do not state one (predictions.csv's laterality_source): read from the pixels, or none
_UNSTATED_LATERALITY = ("", "image", "unknown")
#: the views a screening exam takes of each breast: a breast without one of them is noted
SCREENING_VIEWS = ("CC", "MLO")
# first characters that make a spreadsheet evaluate a cell (OWASP "CSV injection"), and the quote that marks them
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "'")


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if ch == "\\":
        return "\\\\"
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, as Python's surrogateescape keeps it in a str
        return f"\\x{code - 0xDC00:02x}"
    if 0xD800 <= code <= 0xDFFF:
        return f"\\u{code:04x}"
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    return ch


def escape_text(text: str) -> str:
    """``text`` as printable UTF-8 on one line, losslessly; plain text is unchanged."""
    if text.isprintable() and "\\" not in text:
        try:
            text.encode("utf-8")
            return text
        except UnicodeEncodeError:
            pass
    return "".join(_escape_char(ch) for ch in text)


def unescape_text(cell: str) -> str:
    """The text :func:`csv_cell` wrote ``cell`` for (bytes 0x80-0xFF as surrogateescape characters)."""
    if len(cell) >= 2 and cell[0] == "'" and cell[1] in _FORMULA_STARTS:
        cell = cell[1:]
    out, i = [], 0
    while i < len(cell):
        ch = cell[i]
        if ch == "\\" and i + 1 < len(cell):
            kind = cell[i + 1]
            if kind == "\\":
                out.append("\\")
                i += 2
                continue
            width = {"x": 2, "u": 4}.get(kind)
            if width is not None:
                code = int(cell[i + 2 : i + 2 + width], 16)
                out.append(chr(0xDC00 + code) if kind == "x" and code >= 0x80 else chr(code))
                i += 2 + width
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def csv_cell(value: Any) -> Any:
    """A text cell as written: escaped (:func:`escape_text`), with ``'`` before a formula; other values unchanged."""
    if not isinstance(value, str):
        return value
    text = escape_text(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


def error_record(path: str | os.PathLike, exc: BaseException | str) -> dict[str, str]:
    """An errors.csv row: the input and ``"<ExceptionType>: <message>"`` (or the message given)."""
    message = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return {"image": os.fspath(path), ERROR_KEY: message}


def note_record(path: str | os.PathLike, note: str) -> dict[str, str]:
    """An errors.csv row of an image that was processed: the input, an empty error and the note."""
    return {"image": os.fspath(path), ERROR_KEY: "", NOTE_KEY: note}


def prediction_row(
    path: str,
    stem: str,
    scores: Sequence[float],
    labels: Sequence[int | str],
    size: tuple[int, int],
    boxes: Iterable[Sequence[int]],
    files: Sequence[str] = (),
    facts: Mapping[str, Any] | None = None,
    window: Sequence[int] | None = None,
    fingerprint: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A predictions.csv row of one image."""
    window_cells = dict(zip(FACT_COLUMNS[-4:], window if window is not None else ("",) * 4))
    return {
        **dict(facts or {}),
        **window_cells,
        **dict(fingerprint or {}),
        "image": path,
        "output_stem": stem,
        **{f"prob_{c}": f"{scores[i]:.6f}" for i, c in enumerate(CLASS_NAMES)},
        **{f"label_{c}": labels[i] for i, c in enumerate(CLASS_NAMES)},
        "height": size[0],
        "width": size[1],
        "patch_boxes": ";".join(" ".join(str(v) for v in b) for b in boxes),
        FILES_KEY: ";".join(files),
    }


def stated_exam(path: str) -> tuple[str, str] | None:
    """The exam a file's name states (``SYN00012_R_MLO`` -> ``SYN00012``) and its source; None."""
    name = os.path.basename(path)
    suffix = file_suffix(name)
    stem = name[: -len(suffix)] if suffix in SUPPORTED_SUFFIXES and name.lower().endswith(suffix) else name
    tokens = re.split(r"[^A-Za-z0-9]+", stem)
    naming = [
        text_view_laterality(token) != (None, None)
        or (token.upper() in ("L", "R") and any(text_view_laterality(t)[0] for t in tokens[max(i - 1, 0) : i + 2]))
        for i, token in enumerate(tokens)
    ]
    if not any(naming):
        return None
    kept = [token for token, names in zip(tokens, naming) if not names and token]
    folder = os.path.dirname(path)
    if not kept:
        return folder, "folder"
    return os.path.join(folder, "_".join(kept)), "file name"


def _breast_of(row: Mapping[str, str]) -> tuple[tuple | None, str]:
    """A predictions.csv row's breast key and what grouped it."""
    if row["patient_id"]:
        key = breast_key({"patient_id": row["patient_id"], "laterality": row["laterality"]})
        return key, "patient_id" if key else ""
    stated = row.get("laterality_source", "") not in _UNSTATED_LATERALITY
    exam = stated_exam(unescape_text(row["image"])) if stated else None
    if not exam or not row["laterality"]:
        return None, ""
    return breast_key({"patient_id": escape_text(exam[0]), "laterality": row["laterality"], "study": exam[1]}), exam[1]


def breast_rows(predictions: Sequence[Mapping[str, str]]) -> list[dict[str, Any]]:
    """breasts.csv's rows from predictions.csv's: one per exam and laterality, scored by its images' mean."""
    keyed = [_breast_of(r) for r in predictions]
    keys = [key for key, _ in keyed]
    groups, _ = group_breasts(keys)
    rows = []
    for group in groups:
        images = [predictions[i] for i in group]
        key = keys[group[0]]
        views = sorted({r["view"] for r in images if r["view"]})
        notes = []
        if key is None:
            notes.append("no patient ID or no laterality: the image is a breast of its own")
        else:
            missing = [v for v in SCREENING_VIEWS if v not in views]
            if missing:
                notes.append(f"no {' or '.join(missing)} view")
        unknown = sum(1 for r in images if not r["view"])
        if unknown:
            notes.append(f"the view of {unknown} image(s) is unknown")
        rows.append(
            {
                "patient_id": key[0] if key else "",
                "laterality": key[1] if key else "",
                "views": ";".join(views),
                "images": len(images),
                **{f"prob_{c}": f"{sum(float(r[f'prob_{c}']) for r in images) / len(images):.6f}" for c in CLASS_NAMES},
                "inputs": ";".join(r["image"] for r in images),
                "grouped_by": keyed[group[0]][1],
                NOTE_KEY: "; ".join(notes),
            }
        )
    return sorted(rows, key=lambda r: (r["patient_id"] == "", r["patient_id"], r["laterality"], r["inputs"]))


def input_fingerprint(path: str | os.PathLike) -> dict[str, str]:
    """``{"input_bytes", "input_mtime_ns"}`` of a file: what ties a row to its input's content."""
    try:
        st = os.stat(path)
    except OSError:
        return {"input_bytes": "", "input_mtime_ns": ""}
    return {"input_bytes": str(st.st_size), "input_mtime_ns": str(st.st_mtime_ns)}


def _line(columns: Sequence[str], row: Mapping[str, Any], escape: bool) -> bytes:
    buffer = io.StringIO()
    values = [row.get(c, "") for c in columns]
    csv.writer(buffer).writerow([csv_cell(v) if escape and c in _TEXT_COLUMNS else v for c, v in zip(columns, values)])
    # the cells are valid text once escaped; a value this module did not escape must not stop the row either
    return buffer.getvalue().encode("utf-8", errors="backslashreplace")


class AppendOnlyCsv:
    """A CSV file with a fixed header, appended one row per ``write`` (thread-safe).

    Args:
        path: the file.
        columns: its header.
    """

    def __init__(self, path: str | os.PathLike, columns: Sequence[str]) -> None:
        self.path = Path(path)
        self.columns = list(columns)
        self._fd: int | None = None
        self._lock = threading.Lock()

    def open(self) -> list[dict[str, str]]:
        """Create the file with its header or take it up (a torn last line dropped); returns its rows as stored.

        Raises:
            ValueError: naming the file when its header differs.
        """
        if not self.path.exists():
            self._write_all([])
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            logger.warning(
                "%s: dropped a torn last line (%d bytes) left by an interrupted run", self.path, len(data) - keep
            )
            with open(self.path, "r+b") as f:
                f.truncate(keep)
            data = data[:keep]
        if not data:
            self._write_all([])
            data = self.path.read_bytes()
        rows = self._parse(data)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_BINARY", 0))
        return rows

    def read_rows(self) -> list[dict[str, str]]:
        """The rows as stored, read without changing the file (a torn last line left out; no file, no rows)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        data = data[: data.rfind(b"\n") + 1]
        return self._parse(data) if data else []

    def _parse(self, data: bytes) -> list[dict[str, str]]:
        reader = csv.reader(io.StringIO(data.decode("utf-8", errors="replace"), newline=""))
        header = next(reader, [])
        if header != self.columns and header == self.columns[: len(header)]:
            raise UsageError(
                f"{self.path}: written by an earlier version of this workflow (it lacks the columns "
                f"{self.columns[len(header) :]}); choose another --output_dir, or move that table away to start over"
            )
        if header != self.columns:
            raise UsageError(
                f"{self.path}: its columns {header} are not those this version writes {self.columns} (a table of "
                "another version or program)"
            )
        return [dict(zip(self.columns, r)) for r in reader if r]

    def append(self, row: Mapping[str, Any]) -> None:
        """Write one row (text cells escaped) with a single ``write``."""
        line = _line(self.columns, row, escape=True)
        with self._lock:
            if self._fd is None:
                raise RuntimeError(f"{self.path} is not open")
            written = 0
            while written < len(line):  # a regular file takes it whole; a short write (disk full) is completed or fails
                written += os.write(self._fd, line[written:])

    def replace_rows(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Atomically replace the file by its header and ``rows`` (cells as stored: not escaped again)."""
        with self._lock:
            self._close_fd()
            self._write_all(rows)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_BINARY", 0))

    def _write_all(self, rows: Iterable[Mapping[str, Any]]) -> None:
        with atomic_write(self.path, "wb") as f:
            f.write(_line(self.columns, dict(zip(self.columns, self.columns)), escape=False))
            for row in rows:
                f.write(_line(self.columns, row, escape=False))

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        with self._lock:
            self._close_fd()


PREDICTIONS_TABLE = "predictions"
ERRORS_TABLE = "errors"
# a rank's own tables under multi_gpu_inference.yaml: predictions.rank<r>.csv, errors.rank<r>.csv
_RANK_TABLE = re.compile(rf"^({PREDICTIONS_TABLE}|{ERRORS_TABLE})\.rank(\d+)\.csv$")


def table_name(table: str, rank: int | None = None) -> str:
    """The file name of a table: ``predictions.csv``, or a rank's ``predictions.rank<r>.csv``."""
    return f"{table}.csv" if rank is None else f"{table}.rank{int(rank)}.csv"


def rank_tables(output_dir: str | os.PathLike) -> dict[int, dict[str, Path]]:
    """The ranks' tables in a folder: rank -> {``"predictions"`` / ``"errors"``: path} (those that exist)."""
    found: dict[int, dict[str, Path]] = {}
    try:
        names = sorted(os.listdir(output_dir))
    except OSError:
        return found
    for name in names:
        match = _RANK_TABLE.match(name)
        if match:
            found.setdefault(int(match.group(2)), {})[match.group(1)] = Path(output_dir) / name
    return dict(sorted(found.items()))


class InferenceTables:
    """A run's ``predictions.csv`` and ``errors.csv`` (failures, assumptions), appended as images complete.

    Args:
        output_dir: the output folder.
        rank: a rank's own tables under multi_gpu_inference.yaml (``predictions.rank<r>.csv``); None: the folder's.
    """

    def __init__(self, output_dir: str | os.PathLike, rank: int | None = None) -> None:
        self.output_dir = Path(output_dir)
        self.rank = rank
        self.predictions = AppendOnlyCsv(self.output_dir / table_name(PREDICTIONS_TABLE, rank), PREDICTION_COLUMNS)
        self.errors = AppendOnlyCsv(self.output_dir / table_name(ERRORS_TABLE, rank), ERROR_COLUMNS)
        self.failed = 0
        self.written = 0
        self._count_lock = threading.Lock()

    def open(self) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        """Create or take up both tables; returns the rows already there (predictions, errors), cells as stored."""
        self.failed = self.written = 0
        return self.predictions.open(), self.errors.open()

    def add_prediction(self, row: Mapping[str, Any]) -> None:
        self.predictions.append(row)
        with self._count_lock:
            self.written += 1

    def add_error(self, record: Mapping[str, Any]) -> None:
        self.errors.append(record)
        with self._count_lock:
            self.failed += 1

    def add_note(self, record: Mapping[str, Any]) -> None:
        self.errors.append(record)

    def absorb(self) -> dict[int, tuple[list[dict[str, str]], list[dict[str, str]]]]:
        """Move the rows of the ranks' tables (:func:`rank_tables`) into these tables, a rank's prediction row winning.

        Returns:
            rank -> (prediction rows, error rows) taken, cells as stored.
        """
        found = rank_tables(self.output_dir)
        if not found:
            return {}
        predictions, errors = self.predictions.read_rows(), self.errors.read_rows()
        taken = {}
        for rank, paths in found.items():
            rows = (
                AppendOnlyCsv(paths[PREDICTIONS_TABLE], PREDICTION_COLUMNS).read_rows()
                if PREDICTIONS_TABLE in paths
                else [],
                AppendOnlyCsv(paths[ERRORS_TABLE], ERROR_COLUMNS).read_rows() if ERRORS_TABLE in paths else [],
            )
            taken[rank] = rows
            predictions += rows[0]
            errors += rows[1]
        self.predictions.replace_rows({row["image"]: row for row in predictions}.values())
        self.errors.replace_rows(errors)
        for paths in found.values():
            for path in paths.values():
                path.unlink(missing_ok=True)
        return taken

    def compact(self) -> None:
        """Rewrite both tables sorted by input and write ``breasts.csv`` from predictions.csv."""
        self.predictions.close()
        rows = self.predictions.open()
        # one row per input, its last (a redone input's row replaces the one it had)
        predictions = sorted({r["image"]: r for r in rows}.values(), key=lambda r: r["image"])
        if predictions != rows:  # a file already in order is left as it is
            self.predictions.replace_rows(predictions)
        header = dict(zip(BREAST_TABLE_COLUMNS, BREAST_TABLE_COLUMNS))
        # the cells as stored in predictions.csv: escaped once
        table = b"".join(_line(BREAST_TABLE_COLUMNS, r, escape=False) for r in [header, *breast_rows(predictions)])
        breasts = self.output_dir / "breasts.csv"
        if not breasts.is_file() or breasts.read_bytes() != table:  # a rerun that changed nothing leaves it alone
            with atomic_write(breasts, "wb") as f:
                f.write(table)
        done = {row["image"] for row in predictions}
        self.errors.close()
        rows = self.errors.open()
        last_error = {row["image"]: row for row in rows if row[ERROR_KEY] and row["image"] not in done}
        notes = {(row["image"], row[NOTE_KEY]): row for row in rows if not row[ERROR_KEY]}
        compacted = [*(last_error[k] for k in sorted(last_error)), *(notes[k] for k in sorted(notes))]
        if compacted != rows:
            self.errors.replace_rows(compacted)

    def close(self) -> None:
        self.predictions.close()
        self.errors.close()
