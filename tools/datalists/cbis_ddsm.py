"""CBIS-DDSM as TCIA delivers it: the description CSVs' paths resolved to the files of the downloaded tree.

The CSVs name ``<case>/<StudyUID>/<SeriesUID>/000000.dcm``; the NBIA Data Retriever writes
``[CBIS-DDSM/]<case>/<date>-DDSM-<n>/<n>.000000-<series description>-<n>/1-1.dcm``, and each abnormality's ROI mask and
cropped image under ``<case>_<k>/``. The CSV swaps the ROI-mask and cropped-image paths on some rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from scripts.data.errors import CsvRowError

__all__ = [
    "CBIS_PIXEL_SPACING_MM",
    "DicomCandidate",
    "find_case_folder",
    "resolve_cbis_image",
    "resolve_cbis_roi",
]

# DDSM's films were digitised at 42 (DBA), 43.5 (Howtek) or 50 µm (Lumisys); CBIS-DDSM's DICOMs state none and its
# CSVs do not name the scanner, so one value for all: the coarsest, within 16 % of every scanner (docs/own_data.md)
CBIS_PIXEL_SPACING_MM = 0.05

# "1.000000-full mammogram images-24515" -> "full mammogram images"
_SERIES_FOLDER = re.compile(r"^\d+(?:\.\d+)?-(?P<description>.*?)-\d+$")


@dataclass(frozen=True)
class DicomCandidate:
    """A DICOM file under a case folder, with the header fields the resolution needs."""

    path: Path
    patient_id: str | None
    study_uid: str | None
    series_uid: str | None
    rows: int | None
    cols: int | None
    description: str  # SeriesDescription and the series folder's description, lower case

    def describe(self) -> str:
        size = f"{self.rows}x{self.cols}" if self.rows and self.cols else "no size"
        return f"{self.path.name} in '{self.path.parent.name}' ({size})"


def _series_description(path: Path) -> str:
    """SeriesDescription from the header only; '' when absent or unreadable."""
    import pydicom

    try:
        ds = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=["SeriesDescription"], force=True)
    except Exception:
        return ""
    return str(ds.get("SeriesDescription", "") or "").strip()


def _candidates(folder: Path) -> list[DicomCandidate]:
    """Every readable DICOM file under ``folder`` (recursive), sorted by path."""
    from scripts.data.dicom_files import read_dicom_header

    out = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        try:
            header = read_dicom_header(path)
        except Exception:
            continue
        folder_match = _SERIES_FOLDER.match(path.parent.name)
        words = [_series_description(path)]
        words.append(folder_match["description"] if folder_match else path.parent.name)
        out.append(
            DicomCandidate(
                path,
                header.get("patient_id"),
                header.get("study_uid"),
                header.get("series_uid"),
                header.get("rows"),
                header.get("cols"),
                " | ".join(w for w in words if w).lower(),
            )
        )
    return out


def find_case_folder(root: Path, name: str) -> Path | None:
    """The case folder ``name`` under ``root`` or ``root/CBIS-DDSM`` (the retriever's top folder), else None."""
    for base in (root, root / "CBIS-DDSM"):
        if (base / name).is_dir():
            return base / name
    return None


def _uid_parts(csv_path: str) -> tuple[str, str | None, str | None]:
    """(case folder, study UID, series UID) of a CSV path ``case/study/series/000000.dcm`` (backslashes too)."""
    parts = PurePosixPath(csv_path.replace("\\", "/")).parts
    return parts[0], (parts[1] if len(parts) > 2 else None), (parts[2] if len(parts) > 3 else None)


def _one(found: list[DicomCandidate]) -> DicomCandidate | None:
    return found[0] if len(found) == 1 else None


def resolve_cbis_image(root: Path, csv_path: str, where: str) -> DicomCandidate | Path:
    """The full mammogram a row's ``image file path`` names: the path when it exists under ``root``, else the case
    folder's DICOM chosen by series UID, study UID, a "full mammogram" series description, or as its only file.

    Raises:
        CsvRowError: naming what was found.
    """
    if not csv_path:
        raise CsvRowError(f"{where}: empty image file path")
    literal = root / csv_path
    if literal.is_file():
        return literal
    case, study, series = _uid_parts(csv_path)
    folder = find_case_folder(root, case)
    if folder is None:
        raise CsvRowError(f"{where}: image {csv_path!r}: neither the file nor a folder {case!r} exists under {root}")
    every = _candidates(folder)
    # TCIA's PatientID is the case folder's name; a re-exported tree may have lost it, so it narrows, never empties
    found = [c for c in every if c.patient_id in (None, case)] or every
    if not found:
        raise CsvRowError(f"{where}: image {csv_path!r}: no readable DICOM file under {folder}")
    choice = (
        _one([c for c in found if series and c.series_uid == series])
        or _one([c for c in found if study and c.study_uid == study])
        or _one([c for c in found if "full mammogram" in c.description])
        or _one(found)
    )
    if choice is None:
        listed = ", ".join(c.describe() for c in found[:6])
        raise CsvRowError(
            f"{where}: image {csv_path!r}: {len(found)} DICOM files under {folder} and none matches the CSV's "
            f"series/study UID or is the only 'full mammogram images' series: {listed}"
        )
    return choice


def _is_binary(path: Path) -> bool:
    from scripts.data.readers import read_mammogram

    try:
        arr, _ = read_mammogram(path, mask=True)
    except Exception:
        return False
    arr = np.asarray(arr)
    # two values at most, one of them 0 (a linear pass: np.unique sorts 15 million pixels per CBIS-DDSM mask)
    return arr.size > 0 and bool(np.all((arr == 0) | (arr == arr.max())))


def resolve_cbis_roi(
    root: Path, roi_path: str, cropped_path: str, image_shape: tuple[int, int], where: str
) -> tuple[Path, bool]:
    """The ROI mask of a row: among the files the two mask paths name (and their case folders' DICOMs), the one of
    the image's size with binary pixels; several are told apart by series description, then by the CSV's series
    UID.

    Returns:
        ``(path, swapped)``, ``swapped`` when the CSV had put it under the cropped-image column.

    Raises:
        CsvRowError: when none or several remain.
    """
    candidates: dict[Path, DicomCandidate | None] = {}
    roi_series = _uid_parts(roi_path)[2] if roi_path else None
    crop_series = _uid_parts(cropped_path)[2] if cropped_path else None
    for column_path in (roi_path, cropped_path):
        if not column_path:
            continue
        if (root / column_path).is_file():
            candidates.setdefault(root / column_path, None)
            continue
        folder = find_case_folder(root, _uid_parts(column_path)[0])
        if folder is not None:
            for c in _candidates(folder):
                candidates[c.path] = c
    if not candidates:
        raise CsvRowError(
            f"{where}: ROI mask {roi_path!r}: neither the file nor its case folder exists under {root} "
            f"(cropped image path: {cropped_path!r})"
        )

    def shape_of(path: Path, cand: DicomCandidate | None) -> tuple[int | None, int | None]:
        if cand is not None:
            return cand.rows, cand.cols
        from scripts.data.readers import read_mammogram

        try:
            arr, _ = read_mammogram(path, mask=True)
        except Exception:
            return None, None
        return tuple(np.asarray(arr).shape)

    sized = [(p, c) for p, c in candidates.items() if shape_of(p, c) == tuple(image_shape)]
    masks = [(p, c) for p, c in sized if _is_binary(p)]
    if len(masks) > 1:  # two binary files of the image's size: the series description, then the CSV's UID decide
        masks = [m for m in masks if m[1] is None or "roi mask" in m[1].description] or masks
    if len(masks) > 1 and roi_series:
        masks = [m for m in masks if m[1] is not None and m[1].series_uid == roi_series] or masks
    if len(masks) != 1:
        listed = ", ".join(
            (c.describe() if c is not None else f"{p.name} {shape_of(p, None)}") for p, c in candidates.items()
        )
        what = "no binary file" if not masks else f"{len(masks)} binary files"
        raise CsvRowError(
            f"{where}: ROI mask {roi_path!r}: {what} of the image's size {image_shape[0]}x{image_shape[1]} "
            f"among {listed}"
        )
    path, cand = masks[0]
    if cand is None:
        swapped = bool(cropped_path) and path == root / cropped_path
    else:
        swapped = crop_series is not None and cand.series_uid == crop_series and crop_series != roi_series
    return path, swapped
