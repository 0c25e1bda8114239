"""INbreast: its published CSV, its DICOM file names and its XML (OsiriX plist) ROI annotations.

- ``INbreast.csv`` is ';'-separated: ``Patient ID;Patient age;Laterality;View;Acquisition date;File Name;ACR;Bi-Rads``.
- Images are ``AllDICOMs/<File Name>_<hash>_MG_<L|R>_<CC|ML|MLO>_ANON.dcm``; the hash is the same for every image of
  a woman, which makes it the patient id (the CSV's "Patient ID" column reads "removed").
- Annotations are ``AllXML/<File Name>.xml``: a plist whose ``Images[0].ROIs`` hold each finding's ``Point_px``
  polygon ("(x, y)" strings, x the column, y the row). Images without findings have no XML.
"""

from __future__ import annotations

import plistlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UsageError

__all__ = ["INBREAST_BIRADS", "PolygonMask", "find_inbreast_dicom", "inbreast_patient_id", "read_inbreast_rois"]

# BI-RADS category (first digit of "4a", "4b", ...) -> [benign, malignant]: 1 negative (no lesion), 2-3 benign
# (3: probably benign), 4-6 malignant (4-5 suspicious, 6 biopsy-proven); a proxy, INbreast has no pathology for most
INBREAST_BIRADS = {1: [0, 0], 2: [1, 0], 3: [1, 0], 4: [0, 1], 5: [0, 1], 6: [0, 1]}

_NAME = re.compile(r"^(?P<file>\d+)_(?P<hash>[0-9a-fA-F]+)_MG_(?P<side>[LR])_(?P<view>[A-Z]+)", re.IGNORECASE)
_POINT = re.compile(r"\(\s*([-+0-9.eE]+)\s*,\s*([-+0-9.eE]+)\s*(?:,\s*[-+0-9.eE]+\s*)?\)")


@dataclass(frozen=True)
class PolygonMask:
    """Lesion outlines to rasterise at an image's size: polygons of (x = column, y = row) pixel coordinates."""

    source: Path
    shape: tuple[int, int]  # (H, W) of the image
    polygons: tuple[tuple[tuple[float, float], ...], ...]

    def rasterise(self) -> np.ndarray:
        """(H, W) bool: every polygon filled, its outline included; one point marks its pixel, two a line."""
        from PIL import Image, ImageDraw

        canvas = Image.new("L", (self.shape[1], self.shape[0]), 0)
        draw = ImageDraw.Draw(canvas)
        for poly in self.polygons:
            pts = [(float(x), float(y)) for x, y in poly]
            if len(pts) >= 3:
                draw.polygon(pts, fill=1, outline=1)
            elif len(pts) == 2:
                draw.line(pts, fill=1, width=1)
            elif pts:
                draw.point(pts, fill=1)
        return np.asarray(canvas, dtype=np.uint8) > 0


def find_inbreast_dicom(root: Path, file_name: str) -> Path | None:
    """``<root>/AllDICOMs/<file_name>_*.dcm`` (else anywhere under ``root``); None when there is none."""
    folder = root / "AllDICOMs"
    for base, pattern in ((folder, f"{file_name}_*.dcm"), (root, f"**/{file_name}_*.dcm")):
        if base.is_dir():
            found = sorted(base.glob(pattern))
            if found:
                return found[0]
    return None


def inbreast_patient_id(path: Path) -> str | None:
    """The woman's hash from an INbreast file name (``22678622_61b13c59bcba149e_MG_R_CC_ANON.dcm``), else None."""
    m = _NAME.match(path.name)
    return None if m is None else m["hash"].lower()


def find_inbreast_xml(root: Path, file_name: str) -> Path | None:
    """``<root>/AllXML/<file_name>.xml`` (else anywhere under ``root``); None when the image has no annotation."""
    direct = root / "AllXML" / f"{file_name}.xml"
    if direct.is_file():
        return direct
    found = sorted(root.glob(f"**/{file_name}.xml")) if root.is_dir() else []
    return found[0] if found else None


def read_inbreast_rois(xml_path: Path) -> list[tuple[str, tuple[tuple[float, float], ...]]]:
    """``[(roi name, ((x, y), ...)), ...]`` from an INbreast XML; ValueError naming the file when it is not one."""
    try:
        with open(xml_path, "rb") as fh:
            plist = plistlib.load(fh)
    except Exception as err:  # not a plist, truncated, ...
        raise UsageError(f"{xml_path}: not an INbreast XML annotation ({type(err).__name__}: {err})") from None
    images = plist.get("Images") if isinstance(plist, dict) else None
    if not isinstance(images, list):
        raise UsageError(f"{xml_path}: no 'Images' array (expected an OsiriX ROI plist)")
    rois = []
    for image in images:
        for roi in image.get("ROIs", []) or []:
            points = []
            for text in roi.get("Point_px", []) or []:
                m = _POINT.fullmatch(str(text).strip())
                if m is None:
                    raise UsageError(f"{xml_path}: ROI {roi.get('Name')!r}: unreadable point {text!r}")
                points.append((float(m[1]), float(m[2])))
            if points:
                rois.append((str(roi.get("Name", "")), tuple(points)))
    return rois
