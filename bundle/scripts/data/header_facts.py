"""What a mammogram's header and name say: view, laterality, pixel spacing, and whether it is a mammogram."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydicom

from .geometry import usable_spacing

# Digital Mammography X-Ray Image Storage, For Presentation / For Processing
MAMMOGRAPHY_SOP_CLASSES = frozenset({"1.2.840.10008.5.1.4.1.1.1.2", "1.2.840.10008.5.1.4.1.1.1.2.1"})

# ViewCodeSequence meanings (CID 4014) and codes (SNOMED-RT / SNOMED CT) for the views GLAM distinguishes
_VIEW_MEANINGS = {
    "cranio caudal": "CC",
    "medio lateral oblique": "MLO",
    "medio lateral": "ML",
    "latero medial": "LM",
    "latero medial oblique": "LMO",
    "cranio caudal exaggerated laterally": "XCCL",
    "cranio caudal exaggerated medially": "XCCM",
    "caudo cranial (from below)": "FB",
    "superolateral to inferomedial oblique": "SIO",
    "axillary tail": "AT",
}
_VIEW_CODES = {
    "R-10242": "CC",
    "399162004": "CC",
    "R-10226": "MLO",
    "399368009": "MLO",
    "R-10224": "ML",
    "399260004": "ML",
    "R-10228": "LM",
    "399352003": "LM",
}


def tag_text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def dicom_laterality(ds: pydicom.Dataset) -> str | None:
    """``'L'``/``'R'`` from ImageLaterality, Laterality or an enhanced image's FrameLaterality, else None."""
    for keyword in ("ImageLaterality", "Laterality"):
        value = tag_text(ds.get(keyword)).upper()
        if value in ("L", "R"):
            return value
    for group in ds.get("SharedFunctionalGroupsSequence", []) or []:
        for anatomy in group.get("FrameAnatomySequence", []) or []:
            value = tag_text(anatomy.get("FrameLaterality")).upper()
            if value in ("L", "R"):
                return value
    return None


def dicom_view(ds: pydicom.Dataset) -> str | None:
    """View code (``'CC'``, ``'MLO'``, ...) from ViewPosition or ViewCodeSequence, else None."""
    position = tag_text(ds.get("ViewPosition")).upper()
    if position:
        return position
    for item in ds.get("ViewCodeSequence", []) or []:
        code = tag_text(item.get("CodeValue")).upper()
        if code in _VIEW_CODES:
            return _VIEW_CODES[code]
        meaning = tag_text(item.get("CodeMeaning"))
        key = " ".join(meaning.lower().replace("-", " ").replace("_", " ").split())
        if key in _VIEW_MEANINGS:
            return _VIEW_MEANINGS[key]
        if meaning:
            return meaning
    return None


def _multi(value: Any) -> list[str]:
    """A DICOM value as the list of its values' texts."""
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        value = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        return [v.strip() for v in value.split("\\")]
    if isinstance(value, Sequence):
        return [tag_text(v) for v in value]
    return [tag_text(value)]


def orientation_view_laterality(patient_orientation: Any) -> tuple[str | None, str | None]:
    """View and laterality implied by PatientOrientation (0020,0020), None for what it does not imply.

    One axis of a mammogram runs anterior-posterior; the other is purely R/L for a CC, R/L with F/H for an MLO and
    purely F/H for a lateral view (``"ML"``; ML and LM are not told apart), PS3.3 C.8.11.7. For an oblique, F+R or H+L
    is a left breast whatever the mirroring; a CC is left for ``A\\R``, right for ``P\\L``, and ambiguous otherwise.

    Args:
        patient_orientation: the tag's value (two values of the letters A/P, R/L, H/F).

    Returns:
        ``(view, laterality)``, each None when not implied.
    """
    values = [v.upper() for v in _multi(patient_orientation)]
    if len(values) != 2 or any(not v or set(v) - set("APRLHF") for v in values):
        return None, None
    row, col = values
    if row in ("A", "P"):
        other = col
    elif col in ("A", "P"):
        other = row
    else:
        return None, None
    letters = set(other)
    vertical, lateral = letters & {"F", "H"}, letters & {"L", "R"}
    if letters & {"A", "P"} or len(vertical) > 1 or len(lateral) > 1 or len(other) != len(letters):
        return None, None
    view = "MLO" if vertical and lateral else "ML" if vertical else "CC" if lateral else None
    laterality = None
    if row in ("A", "P"):  # A/P along the rows, as mammograms are stored
        if vertical and lateral:
            laterality = "L" if ("F" in letters) == ("R" in letters) else "R"
        elif lateral:
            laterality = {("A", "R"): "L", ("P", "L"): "R"}.get((row, col))
    return view, laterality


# Whole-token view codes accepted in free text (series descriptions, patient ids, file names); short words that
# could mean something else ("AT", "FB") are left out
_TEXT_VIEWS = frozenset({"CC", "MLO", "ML", "LM", "XCCL", "XCCM"})
_TEXT_SIDES = {"LEFT": "L", "RIGHT": "R"}
_TEXT_COMPACT = re.compile(r"^([LR])(CC|MLO|ML|LM|XCCL|XCCM)$")


def text_view_laterality(text: Any) -> tuple[str | None, str | None]:
    """View and laterality a free-text name states, None for what it does not state or contradicts.

    Only whole tokens (split at non-alphanumerics, any case) count: a view code, ``LEFT`` / ``RIGHT``, ``L`` / ``R``
    next to a view code, or both in one token (``RMLO``), so ``Mass-Test_P_00173_LEFT_MLO`` is read and ``CCTV`` is not.

    Returns:
        ``(view, laterality)``.
    """
    tokens = [t for t in re.split(r"[^A-Z0-9]+", tag_text(text).upper()) if t]
    views: set[str] = set()
    sides: set[str] = set()
    for i, token in enumerate(tokens):
        compact = _TEXT_COMPACT.match(token)
        if token in _TEXT_VIEWS:
            views.add(token)
        elif token in _TEXT_SIDES:
            sides.add(_TEXT_SIDES[token])
        elif compact:
            sides.add(compact.group(1))
            views.add(compact.group(2))
        elif token in ("L", "R") and any(t in _TEXT_VIEWS for t in tokens[max(i - 1, 0) : i] + tokens[i + 1 : i + 2]):
            sides.add(token)
    return (views.pop() if len(views) == 1 else None), (sides.pop() if len(sides) == 1 else None)


# Mass-Training_P_00001_LEFT_CC, Calc-Test_P_00038_RIGHT_MLO_2 (the _2: abnormality 2's ROI folder)
_CASE = re.compile(
    r"^(?P<collection>(?:mass|calc)-(?:training|test))_(?P<patient>p_\d+)_(?P<side>left|right)_(?P<view>cc|mlo)"
    r"(?:_(?P<abnormality>\d+))?$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class CbisCase:
    """What a CBIS-DDSM case folder name says."""

    collection: str  # "Mass-Training", "Calc-Test", ...
    patient: str  # "P_00173"
    laterality: str  # "L" / "R"
    view: str  # "CC" / "MLO"
    abnormality: int | None  # the ROI folders' suffix

    @property
    def official_split(self) -> str:
        return "test" if self.collection.lower().endswith("test") else "training"


def parse_case_folder(name: str) -> CbisCase | None:
    """The fields of a case folder name (``Mass-Test_P_00173_LEFT_CC[_1]``), None for any other name."""
    m = _CASE.match(str(name).strip())
    if m is None:
        return None
    collection = "-".join(part.capitalize() for part in m["collection"].split("-"))
    abnormality = int(m["abnormality"]) if m["abnormality"] else None
    return CbisCase(collection, m["patient"].upper(), m["side"][0].upper(), m["view"].upper(), abnormality)


def cbis_patient_id(patient_id: str | None) -> str | None:
    """``P_00173`` for a CBIS-DDSM per-view PatientID, None for other ids, so that a woman's views share one split."""
    case = parse_case_folder(patient_id or "")
    return None if case is None else case.patient


def file_suffix(path: str | os.PathLike) -> str:
    """The lower-case suffix that decides a file's format, ``.nii.gz`` counted as one."""
    name = str(path).lower()
    return ".nii.gz" if name.endswith(".nii.gz") else Path(name).suffix


def _file_stem(path: str | os.PathLike) -> str:
    name = Path(path).name
    return name[: -len(file_suffix(path))] if file_suffix(path) and name.lower().endswith(file_suffix(path)) else name


def _from_text(ds: pydicom.Dataset | None, path: str | os.PathLike, index: int) -> tuple[str | None, str | None]:
    """Item ``index`` of :func:`text_view_laterality` from the first descriptive tag or file name stating it."""
    texts = [] if ds is None else [(k, ds.get(k)) for k in ("SeriesDescription", "ProtocolName", "PatientID")]
    for source, text in [*texts, ("filename", _file_stem(path))]:
        value = text_view_laterality(text)[index]
        if value:
            return value, source
    return None, None


def view_and_source(ds: pydicom.Dataset | None, path: str | os.PathLike) -> tuple[str | None, str | None]:
    """``(view, view_source)``: ViewPosition, ViewCodeSequence, PatientOrientation, then the text patterns."""
    if ds is not None:
        if tag_text(ds.get("ViewPosition")):
            return dicom_view(ds), "ViewPosition"
        view = dicom_view(ds)
        if view:
            return view, "ViewCodeSequence"
        view = orientation_view_laterality(ds.get("PatientOrientation"))[0]
        if view:
            return view, "PatientOrientation"
    return _from_text(ds, path, 0)


def laterality_and_source(ds: pydicom.Dataset | None, path: str | os.PathLike) -> tuple[str | None, str | None]:
    """``(laterality, laterality_source)`` from the tags, PatientOrientation or text; ``(None, None)``."""
    if ds is not None:
        laterality = dicom_laterality(ds)
        if laterality:
            return laterality, "dicom"
        laterality = orientation_view_laterality(ds.get("PatientOrientation"))[1]
        if laterality:
            return laterality, "PatientOrientation"
    return _from_text(ds, path, 1)


def dicom_spacing_and_source(ds: pydicom.Dataset) -> tuple[tuple[float, float] | None, str | None]:
    """``((row, col) mm, tag)`` from PixelSpacing, else ImagerPixelSpacing; ``(None, None)`` when neither is usable.

    ImagerPixelSpacing is used as it is, not divided by the magnification factor: the archives the models learn from
    state detector-plane spacing.
    """
    for keyword in ("PixelSpacing", "ImagerPixelSpacing"):
        value = ds.get(keyword)
        if value is not None and len(_multi(value)) == 2:
            try:
                row, col = (float(v) for v in _multi(value))
            except (TypeError, ValueError):
                continue
            spacing = usable_spacing((row, col))
            if spacing is not None:
                return spacing, keyword
    return None, None


def _is_number(text: str, whole: bool = False) -> bool:
    try:
        number = float(text)
    except ValueError:
        return False
    return math.isfinite(number) and (number.is_integer() or not whole)


# keyword -> (how many values, "number" / "whole" / "text", what the message says the tag must be); the tags the
# readers take a value of, with the multiplicity the standard gives them (0: one or more)
_SPACING = (2, "number", "two numbers (row\\column spacing in mm)")
_WHOLE = (1, "whole", "one whole number")
_TEXT = (1, "text", "one value")
_HEADER_VALUES = {
    **dict.fromkeys(("PixelSpacing", "ImagerPixelSpacing"), _SPACING),
    **dict.fromkeys(("Rows", "Columns", "NumberOfFrames", "SamplesPerPixel", "BitsAllocated", "BitsStored"), _WHOLE),
    **dict.fromkeys(("HighBit", "PixelRepresentation", "PixelPaddingValue", "PixelPaddingRangeLimit"), _WHOLE),
    **dict.fromkeys(("RescaleSlope", "RescaleIntercept"), (1, "number", "one number")),
    **dict.fromkeys(("WindowCenter", "WindowWidth"), (0, "number", "numbers")),
    **dict.fromkeys(("PhotometricInterpretation", "Modality", "BodyPartExamined", "ViewPosition"), _TEXT),
    **dict.fromkeys(("ImageLaterality", "Laterality", "PatientID"), _TEXT),
}


def header_value_problem(ds: pydicom.Dataset) -> str | None:
    """Why a header value the readers take does not have the form the standard gives it, or None.

    Absent or empty tags state nothing; a wrong number of values or text where a number belongs is named with the
    keyword, tag and value, since reading it otherwise would be a guess.
    """
    for keyword, (count, kind, expected) in _HEADER_VALUES.items():
        if keyword not in ds:
            continue
        element = ds.data_element(keyword)
        tag = f"({element.tag.group:04X},{element.tag.element:04X})"
        try:
            values = _multi(element.value)
        except Exception as err:  # noqa: BLE001 - pydicom could not convert the bytes: the tag is unreadable
            return f"{keyword} {tag} cannot be read ({type(err).__name__}: {err})"
        if not any(values):
            continue
        fits = (count == 0 or len(values) == count) and (
            kind == "text" or all(_is_number(v, whole=kind == "whole") for v in values)
        )
        if not fits:
            written = "\\".join(values)
            return f"{keyword} {tag} must be {expected}, got '{written}'"
    return None


def mammography_problem(modality: Any, body_part: Any, sop_class: Any = None) -> str | None:
    """Why a DICOM is not a mammogram, or None when it is one or cannot be told.

    Accepted: Modality MG, BodyPartExamined BREAST (CR systems write Modality CR), a Digital Mammography SOP class, or
    neither Modality nor BodyPartExamined (anonymised exports drop both).
    """
    modality, body_part, sop_class = tag_text(modality).upper(), tag_text(body_part).upper(), tag_text(sop_class)
    if modality == "MG" or sop_class in MAMMOGRAPHY_SOP_CLASSES:
        return None
    if "BREAST" in body_part or "MAMM" in body_part or (not modality and not body_part):
        return None
    return (
        f"not a mammogram (Modality {modality or '(none)'}, BodyPartExamined {body_part or '(none)'}; accepted: "
        "Modality MG, BodyPartExamined BREAST or a Digital Mammography SOP class); to read it anyway, pass "
        "--accept_non_mammography true to inference (MammogramReader(accept_non_mammography=True) in Python)"
    )
