"""Ingest DICOM mammograms into a MONAI Label studies folder as NRRD files.

    python label_app/ingest.py STUDIES_DIR [--bundle bundle]

MONAI Label's local datastore lists NIfTI, NRRD, PNG, JPEG and TIFF files, and writes 2-D results without
geometry: a DICOM is best served as a 2-D NRRD. Every DICOM file in STUDIES_DIR (``.dcm``/``.dicom``/``.dic``, or
any file with the DICM preamble) becomes ``<stem>.nrrd`` beside it: the pixels as the bundle reads them (Modality
and VOI LUTs applied, MONOCHROME1 inverted: what the model sees and a viewer should show), rows as displayed, and
the DICOM pixel spacing (Imager Pixel Spacing / Pixel Spacing) as the NRRD's space directions. A NRRD newer than
its DICOM is kept; a DICOM that cannot be read is reported (file and reason) and the others are still converted.
The DICOM files are left untouched. Exit code 0 unless no DICOM could be converted while some failed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

APP_DIR = Path(__file__).resolve().parent
DICOM_SUFFIXES = (".dcm", ".dicom", ".dic")


@dataclass
class IngestReport:
    converted: list[Path] = field(default_factory=list)
    up_to_date: list[Path] = field(default_factory=list)
    failed: list[tuple[Path, str]] = field(default_factory=list)


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


def ingest_dicoms(studies: str | Path) -> IngestReport:
    """Convert every DICOM in ``studies`` (top level, as MONAI Label's datastore lists it) to ``<stem>.nrrd``."""
    from nrrd_io import write_nrrd_2d

    from scripts.data.readers import read_mammogram

    studies = Path(studies)
    if not studies.is_dir():
        raise ValueError(f"studies {studies}: not a folder")
    report = IngestReport()
    for path in sorted(p for p in studies.iterdir() if p.is_file() and not p.name.startswith(".")):
        if not _is_dicom(path):
            continue
        target = path.with_suffix(".nrrd") if path.suffix else path.with_name(path.name + ".nrrd")
        if target.exists() and target.stat().st_mtime >= path.stat().st_mtime:
            report.up_to_date.append(target)
            continue
        try:
            array, meta = read_mammogram(path)
            write_nrrd_2d(target, _pixels(array), meta.get("spacing"))
        except Exception as e:  # noqa: BLE001 - one bad file must not stop the others
            report.failed.append((path, f"{type(e).__name__}: {e}"))
            continue
        report.converted.append(target)
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
    except ValueError as e:
        print(f"ingest: {e}", file=sys.stderr)
        return 2
    for target in report.converted:
        print(f"ingest: converted {target.name}")
    for path, reason in report.failed:
        print(f"ingest: FAILED {path}: {reason}", file=sys.stderr)
    print(
        f"ingest: {len(report.converted)} DICOM converted, {len(report.up_to_date)} up to date, "
        f"{len(report.failed)} failed ({args.studies})"
    )
    return 1 if report.failed and not (report.converted or report.up_to_date) else 0


if __name__ == "__main__":
    sys.exit(main())
