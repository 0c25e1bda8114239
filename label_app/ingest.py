"""Ingest DICOM mammograms into a MONAI Label studies folder: a NRRD copy for the viewers, the DICOM for the model.

    python label_app/ingest.py STUDIES_DIR [--bundle bundle]

Each DICOM ``x.dcm`` gets ``x.dcm.nrrd`` (datastore id ``x.dcm``): the pixels as the bundle reads them with the
DICOM's geometry, or no geometry when it states no pixel spacing. ``.glam_ingest.json`` records each copy, so that
the server reads the DICOM itself while the copy is still ingest's (:func:`ingested_source`). Unreadable files are
reported one line each and the others converted; exit code 1 only when none could be.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

APP_DIR = Path(__file__).resolve().parent
DICOM_SUFFIXES = (".dcm", ".dicom", ".dic")
#: the record of the copies ingest made, in the studies folder (hidden: never listed, never an upload's name)
MANIFEST = ".glam_ingest.json"
MANIFEST_VERSION = 1
#: the longest file name the file systems take, in bytes
MAX_FILE_NAME_BYTES = 255


@dataclass
class IngestReport:
    converted: list[Path] = field(default_factory=list)
    up_to_date: list[Path] = field(default_factory=list)
    failed: list[tuple[Path, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _is_dicom(path: Path) -> bool:
    if path.suffix.lower() in DICOM_SUFFIXES:
        return True
    if path.suffix:  # PNG, NRRD, ... are not DICOM
        return False
    try:
        with open(path, "rb") as f:
            return f.read(132)[128:132] == b"DICM"
    except OSError:
        return False


def _pixels(array: np.ndarray) -> np.ndarray:
    """Integral values that fit keep an integer type (smaller files); others stay float32."""
    if np.all(array == np.round(array)) and array.min() >= 0 and array.max() <= 65535:
        return array.astype(np.uint16)
    return array.astype(np.float32)


def copy_name(dicom_name: str) -> str:
    """The viewers' copy of DICOM ``dicom_name``: ``<dicom_name>.nrrd`` (its datastore id is ``dicom_name``)."""
    return dicom_name + ".nrrd"


def _stat(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def read_manifest(studies: Path) -> dict[str, dict[str, Any]]:
    """The copies ingest recorded in ``studies`` (NRRD name -> record); empty when there is no valid record."""
    try:
        data = json.loads((studies / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if (
        not isinstance(data, dict)
        or data.get("version") != MANIFEST_VERSION
        or not isinstance(data.get("copies"), dict)
    ):
        return {}
    return {k: v for k, v in data["copies"].items() if isinstance(k, str) and isinstance(v, dict)}


def _write_manifest(studies: Path, copies: dict[str, dict[str, Any]]) -> None:
    from scripts.atomic import atomic_write

    with atomic_write(studies / MANIFEST, "w", encoding="utf-8") as f:
        json.dump({"version": MANIFEST_VERSION, "copies": copies}, f, indent=1, sort_keys=True)


def _is_ours(studies: Path, name: str, record: dict[str, Any]) -> bool:
    """Whether copy ``name`` is still the file ingest wrote (``record``'s size, modification time and inode)."""
    try:
        return _stat(studies / name) == record.get("copy_stat")
    except OSError:
        return False


def _current(studies: Path, name: str, record: dict[str, Any]) -> bool:
    """Whether ``record`` of copy ``name`` still holds: the copy is the file ingest wrote, the DICOM the one it read."""
    source = record.get("source")
    if not isinstance(source, str) or os.sep in source or "/" in source or source.startswith("."):
        return False
    try:
        return _is_ours(studies, name, record) and _stat(studies / source)[:2] == record.get("source_stat")
    except OSError:
        return False


def ingested_source(studies: Path, copy: Path) -> Path | None:
    """The DICOM of the studies folder that ``copy`` (a file of it) is ingest's current copy of, else None."""
    from glam_safety import RequestRefused, readable_path

    record = read_manifest(studies).get(copy.name)
    if copy.parent.resolve() != studies.resolve() or record is None or not _current(studies, copy.name, record):
        return None
    try:
        return Path(readable_path(studies, record["source"], f"the DICOM of {copy.name!r}"))
    except RequestRefused:
        return None


def _name_problem(name: str) -> str | None:
    """Why DICOM ``name`` cannot be served under its id, or None."""
    from glam_safety import MAX_NAME_LENGTH, RequestRefused, check_name

    size = len(os.fsencode(copy_name(name)))
    if size > MAX_FILE_NAME_BYTES or len(name) > MAX_NAME_LENGTH:
        return (
            f"the file name is {len(os.fsencode(name))} bytes: its copy {copy_name(name)[:40]!r}... would be "
            f"{size} bytes (file systems take {MAX_FILE_NAME_BYTES}) and its id longer than {MAX_NAME_LENGTH} "
            "characters; rename the file"
        )
    try:
        check_name(name, "the file name", new=True)
    except RequestRefused as e:
        return f"{e}; rename the file"
    return None


def ingest_dicoms(studies: str | Path) -> IngestReport:
    """Copy every DICOM in ``studies`` (top level, as MONAI Label's datastore lists it) to ``<name>.nrrd`` for the
    viewers and record it (module docstring)."""
    from nrrd_io import write_nrrd_2d

    from scripts.data.readers import read_mammogram
    from scripts.inference.maps import file_affine

    studies = Path(studies)
    if not studies.is_dir():
        raise ValueError(f"studies {studies}: not a folder")
    report = IngestReport()
    old = read_manifest(studies)
    copies = {k: v for k, v in old.items() if _current(studies, k, v)}
    for path in sorted(p for p in studies.iterdir() if not p.name.startswith(".")):
        try:
            if not path.is_file() or not _is_dicom(path):
                continue
            problem = _name_problem(path.name)
            if problem:
                report.failed.append((path, problem))
                continue
            name = copy_name(path.name)
            target = studies / name
            if name in copies and copies[name]["source"] == path.name:
                report.up_to_date.append(target)
                continue
            ours = name in old and old[name].get("source") == path.name and _is_ours(studies, name, old[name])
            if (target.exists() or target.is_symlink()) and not ours:
                report.failed.append(
                    (
                        path,
                        f"{name} exists and is not ingest's current copy of it: left as it is (remove it to convert)",
                    )
                )
                continue
            legacy = path.with_suffix(".nrrd")
            if path.suffix and legacy.exists() and legacy.name not in copies:
                report.notes.append(
                    f"{legacy.name} beside {path.name} is served as its own image {legacy.stem!r}: ingest now writes "
                    f"{name}; if {legacy.name} is an earlier ingest's copy (at an invented 1 mm), remove it"
                )
            array, meta = read_mammogram(path)
            spacing = meta.get("spacing")
            affine = file_affine(meta) if spacing else None  # the DICOM's plane, as the served maps state it
            write_nrrd_2d(target, _pixels(array), spacing, {"glam_source": path.name}, affine)
            copies[name] = {
                "source": path.name,
                "source_stat": _stat(path)[:2],
                "copy_stat": _stat(target),
                "spacing": list(spacing) if spacing else None,
                "spacing_source": meta.get("spacing_source"),
            }
        except Exception as e:  # noqa: BLE001 - one bad file must not stop the others
            report.failed.append((path, f"{type(e).__name__}: {e}"))
            continue
        report.converted.append(target)
    if copies != old:
        _write_manifest(studies, copies)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("studies", type=Path, help="the MONAI Label studies folder")
    ap.add_argument("--bundle", type=Path, default=APP_DIR.parent / "bundle", help="the GLAM bundle folder")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(args.bundle.resolve()))
    sys.path.insert(0, str(APP_DIR))
    try:
        report = ingest_dicoms(args.studies)
    except (ValueError, OSError) as e:
        print(f"ingest: {e}", file=sys.stderr)
        return 2
    for target in report.converted:
        print(f"ingest: converted {target.name}")
    for note in report.notes:
        print(f"ingest: note: {note}")
    for path, reason in report.failed:  # a name that is not UTF-8 is shown with its bytes escaped
        print(f"ingest: FAILED {os.fsencode(path).decode('utf-8', 'backslashreplace')}: {reason}", file=sys.stderr)
    print(
        f"ingest: {len(report.converted)} DICOM converted, {len(report.up_to_date)} up to date, "
        f"{len(report.failed)} failed ({args.studies})"
    )
    return 1 if report.failed and not (report.converted or report.up_to_date) else 0


if __name__ == "__main__":
    sys.exit(main())
