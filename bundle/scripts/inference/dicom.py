"""DICOM outputs of a DICOM input: a Secondary Capture of the panel and a FRACTIONAL Segmentation of S_c.

highdicom is imported only here, only when asked for, so the rest of the bundle works with pydicom 2.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..enums import CLASS_NAMES
from ..errors import UsageError

#: ``dicom_outputs`` value -> the objects written
DICOM_OUTPUT_MODES = {"none": (), "sc": ("sc",), "map": ("map",), "both": ("sc", "map")}
MANUFACTURER = "GLAM-MONAI"
MODEL_NAME = "GLAM (Liu et al., MIDL 2021)"
SOFTWARE_VERSION = "glam-monai"
# series numbers of the derived series, far from the scanner's usual 1..99
SC_SERIES_NUMBER = 9901
MAP_SERIES_NUMBER = 9902
#: stored value of a fraction of 1 in the Segmentation (8 bits): read-back error <= 0.5 / FRACTIONAL_MAX
FRACTIONAL_MAX = 255
#: what the outputs state for a source SpecificCharacterSet highdicom refuses: Latin-1 keeps the bytes of a value
#: pydicom did not know either, UTF-8 the text of one it knew
FALLBACK_CHARSET_BYTES = "ISO_IR 100"
FALLBACK_CHARSET_TEXT = "ISO_IR 192"
# type 2 attributes (may be empty, must exist) that highdicom reads from the source; many files omit them
_TYPE2_SOURCE = (
    *("PatientName", "PatientID", "PatientBirthDate", "PatientSex", "SliceThickness"),
    *("StudyID", "StudyDate", "StudyTime", "AccessionNumber", "ReferringPhysicianName"),
)


def _usable_charset(ds: Any) -> str | None:
    """Make ``ds``'s SpecificCharacterSet one highdicom writes, in place; a note when it changed."""
    import highdicom as hd
    from pydicom.charset import python_encoding

    value = ds.get("SpecificCharacterSet")
    if value is None:
        return None
    values = [str(value)] if isinstance(value, str) else [str(v) for v in value]
    accepted = {member.value for member in hd.SpecificCharacterSetValues}
    if values and all(v in accepted for v in values):
        return None
    known = any(v.strip() for v in values) and all(v.strip() in python_encoding for v in values)
    ds.decode()  # every text value as the source's character set reads it, before the set is replaced
    fallback = FALLBACK_CHARSET_TEXT if known else FALLBACK_CHARSET_BYTES
    ds.SpecificCharacterSet = fallback
    what = "is not one highdicom writes" if known else "is not a DICOM character set"
    kept = "the text as pydicom read it" if known else "the text bytes copied as they are"
    return f"DICOM outputs: SpecificCharacterSet {'/'.join(values)!r} {what}; they state {fallback} ({kept})"


def _has_plane(ds: Any) -> bool:
    """Whether ``ds`` lies in a patient frame of reference, whose plane its Segmentation then carries."""
    return "FrameOfReferenceUID" in ds and "ImagePositionPatient" in ds


def _read_source(path: str | os.PathLike, notes: list[str] | None = None) -> Any:
    import pydicom

    # the header is enough: highdicom copies patient/study attributes and references the SOP instance
    ds = pydicom.dcmread(str(path), stop_before_pixels=True)
    missing = [k for k in ("StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID", "SOPClassUID") if k not in ds]
    if missing:
        raise UsageError(f"{path}: DICOM header lacks {', '.join(missing)}: cannot reference the source image")
    for keyword in _TYPE2_SOURCE:
        if keyword not in ds:
            setattr(ds, keyword, None)
    if _has_plane(ds) and "PixelSpacing" not in ds and "ImagerPixelSpacing" in ds:
        ds.PixelSpacing = ds.ImagerPixelSpacing  # the spacing the reader and the map files use
    note = _usable_charset(ds)
    if note is not None and notes is not None:
        notes.append(note)
    return ds


def secondary_capture(source: Any, panel: np.ndarray) -> Any:
    """True Colour Secondary Capture of ``panel`` ((H, W, 3) uint8 RGB) in ``source``'s study, referencing it.

    Raises:
        ValueError: when ``panel`` is not (H, W, 3) uint8.
    """
    import highdicom as hd
    from pydicom.dataset import Dataset

    panel = np.asarray(panel)
    if panel.ndim != 3 or panel.shape[2] != 3 or panel.dtype != np.uint8:
        raise UsageError(f"panel must be (H, W, 3) uint8, got shape {panel.shape} dtype {panel.dtype}")
    # highdicom accepts single-letter orientations only: the source's (the panel keeps its directions) replaces a
    # placeholder afterwards
    orientation = [str(v) for v in (getattr(source, "PatientOrientation", None) or [])]
    sc = hd.sc.SCImage.from_ref_dataset(
        ref_dataset=source,
        pixel_array=panel,
        photometric_interpretation=hd.PhotometricInterpretationValues.RGB,
        bits_allocated=8,
        coordinate_system="PATIENT",
        patient_orientation=("A", "F"),
        laterality=getattr(source, "ImageLaterality", None) or getattr(source, "Laterality", None) or None,
        series_instance_uid=hd.UID(),
        sop_instance_uid=hd.UID(),
        series_number=SC_SERIES_NUMBER,
        instance_number=1,
        manufacturer=MANUFACTURER,
        series_description="GLAM saliency overlay (research use, not for clinical decisions)",
    )
    sc.PatientOrientation = orientation if len(orientation) == 2 else None
    ref = Dataset()
    ref.ReferencedSOPClassUID = source.SOPClassUID
    ref.ReferencedSOPInstanceUID = source.SOPInstanceUID
    purpose = Dataset()  # the panel is derived from the source image
    purpose.CodeValue = "121322"
    purpose.CodingSchemeDesignator = "DCM"
    purpose.CodeMeaning = "Source image for image processing operation"
    ref.PurposeOfReferenceCodeSequence = [purpose]
    sc.SourceImageSequence = [ref]
    sc.ImageType = ["DERIVED", "SECONDARY"]
    sc.BurnedInAnnotation = "YES"  # the title strip names the file
    return sc


def saliency_segmentation(source: Any, s_c: np.ndarray) -> Any:
    """FRACTIONAL Segmentation of S_c (benign, malignant; 8 bits) referencing ``source``.

    Args:
        source: the source's header.
        s_c: (2, Rows, Columns) float in [0, 1].

    Raises:
        ValueError: when ``s_c`` is not the source's size.
    """
    import highdicom as hd
    from pydicom.sr.codedict import codes

    s_c = np.asarray(s_c, dtype=np.float32)
    rows, cols = int(source.Rows), int(source.Columns)
    if s_c.ndim != 3 or s_c.shape[0] != 2 or s_c.shape[1:] != (rows, cols):
        raise UsageError(f"S_c must have shape (2, {rows}, {cols}) (the source image), got {s_c.shape}")
    algorithm = hd.AlgorithmIdentificationSequence(
        name=MODEL_NAME, version=SOFTWARE_VERSION, family=codes.cid7162.ArtificialIntelligence
    )
    segments = [
        hd.seg.SegmentDescription(
            segment_number=i + 1,
            segment_label=cls,
            segmented_property_category=codes.SCT.MorphologicallyAbnormalStructure,
            segmented_property_type=codes.SCT.Neoplasm,
            algorithm_type=hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC,
            algorithm_identification=algorithm,
        )
        for i, cls in enumerate(CLASS_NAMES)
    ]
    return hd.seg.Segmentation(
        source_images=[source],
        pixel_array=np.moveaxis(np.clip(s_c, 0.0, 1.0), 0, -1)[None],  # (1, H, W, 2): one frame, two segments
        segmentation_type=hd.seg.SegmentationTypeValues.FRACTIONAL,
        segment_descriptions=segments,
        series_instance_uid=hd.UID(),
        series_number=MAP_SERIES_NUMBER,
        sop_instance_uid=hd.UID(),
        instance_number=1,
        manufacturer=MANUFACTURER,
        manufacturer_model_name=MODEL_NAME,
        software_versions=SOFTWARE_VERSION,
        device_serial_number="0",
        fractional_type=hd.seg.SegmentationFractionalTypeValues.PROBABILITY,
        max_fractional_value=FRACTIONAL_MAX,
        content_description="GLAM S_c saliency (benign, malignant)",
        content_label="GLAM_S_C",
        series_description="GLAM saliency S_c (research use, not for clinical decisions)",
    )


def save_dicom(ds: Any, path: str | os.PathLike) -> None:
    """Write a DICOM object with its file meta information."""
    ds.save_as(str(path), enforce_file_format=True)


def dicom_objects(
    source_path: str | os.PathLike,
    kinds: Sequence[str],
    panel: np.ndarray | None = None,
    s_c: np.ndarray | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """``kind -> DICOM object`` (``sc``, ``map``) for the DICOM file ``source_path``; header fixes to ``notes``.

    Raises:
        ValueError: naming the file when its header cannot be referenced or an input is missing.
    """
    source = _read_source(source_path, notes)
    objects = {}
    for kind in kinds:
        if kind == "sc":
            if panel is None:
                raise UsageError(f"{source_path}: a Secondary Capture needs the overlay panel")
            objects[kind] = secondary_capture(source, panel)
        elif kind == "map":
            if s_c is None:
                raise UsageError(f"{source_path}: a Segmentation needs S_c")
            objects[kind] = saliency_segmentation(source, s_c)
        else:
            raise UsageError(f"unknown DICOM output kind {kind!r} (sc, map)")
    return objects
