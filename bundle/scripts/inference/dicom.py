"""DICOM outputs for PACS when the input was DICOM: a Secondary Capture of the overlay panel and a FRACTIONAL
Segmentation of S_c (segments benign, malignant) on the source image's pixel grid and plane, both in the source study
and referencing the source image (highdicom).

Used by :class:`scripts.inference.writer.GLAMInferenceWriter` when ``dicom_outputs`` is ``"sc"``, ``"map"`` or
``"both"``.
highdicom (>= 0.23 needs pydicom >= 3) is imported only here, only when DICOM outputs are asked for, so the rest
of the bundle keeps working with pydicom 2.4.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write
from ..enums import CLASS_NAMES
from ..errors import UsageError

__all__ = [
    "DICOM_OUTPUT_MODES",
    "dicom_output_kinds",
    "secondary_capture",
    "saliency_segmentation",
    "dicom_objects",
    "save_dicom",
    "write_dicom_outputs",
]

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
#: what the outputs state for a source SpecificCharacterSet highdicom refuses (see _usable_charset): Latin-1 keeps the
#: bytes of a value pydicom did not know either (it decoded with its Latin-1 default), UTF-8 the text of one it knew
FALLBACK_CHARSET_BYTES = "ISO_IR 100"
FALLBACK_CHARSET_TEXT = "ISO_IR 192"
_TYPE2_SOURCE = (
    "PatientName",
    "PatientID",
    "PatientBirthDate",
    "PatientSex",
    "SliceThickness",  # of the Image Plane module: read when the source has a frame of reference
    "StudyID",
    "StudyDate",
    "StudyTime",
    "AccessionNumber",
    "ReferringPhysicianName",
)


def dicom_output_kinds(mode: str | None) -> tuple[str, ...]:
    """``"none" | "sc" | "map" | "both"`` (None = "none") -> the kinds to write; ValueError names a bad value."""
    key = "none" if mode is None else str(mode).strip().lower()
    if key not in DICOM_OUTPUT_MODES:
        raise UsageError(f"dicom_outputs must be one of {sorted(DICOM_OUTPUT_MODES)}, got {mode!r}")
    return DICOM_OUTPUT_MODES[key]


def _usable_charset(ds: Any) -> str | None:
    """Make ``ds``'s SpecificCharacterSet one highdicom writes, in place; returns a note when it had to change it.

    highdicom copies the source's SpecificCharacterSet into its objects and refuses a value it does not know
    (``'ISO_IR 999'``, a typo, an empty first value). Every text value is decoded first with the source's own
    character set; then the outputs state ``ISO_IR 100`` (Latin-1) when pydicom did not know the value either (it
    decoded the text with its Latin-1 default, so the bytes are written back as they were), else ``ISO_IR 192``
    (UTF-8: any text pydicom decoded is written as it reads)."""
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
    """Whether the Segmentation of ``ds`` carries its plane: a source in a patient frame of reference
    (FrameOfReferenceUID and ImagePositionPatient) gives its position, orientation and pixel spacing to the
    Segmentation's frame; without a frame of reference the Segmentation IOD has no place for them."""
    return "FrameOfReferenceUID" in ds and "ImagePositionPatient" in ds


def _read_source(path: str | os.PathLike, notes: list[str] | None = None) -> Any:
    import pydicom

    # the header is enough: highdicom copies patient/study attributes and references the SOP instance
    ds = pydicom.dcmread(str(path), stop_before_pixels=True)
    missing = [k for k in ("StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID", "SOPClassUID") if k not in ds]
    if missing:
        raise UsageError(f"{path}: DICOM header lacks {', '.join(missing)}: cannot reference the source image")
    # type 2 attributes (may be empty, must exist) that highdicom reads from the source; many files omit them
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
    """Multi-frame True Colour Secondary Capture of ``panel`` ((H, W, 3) uint8 RGB) in ``source``'s study
    (patient and study copied, new series and SOP UIDs) with ``SourceImageSequence`` -> ``source``'s SOP instance."""
    import highdicom as hd
    from pydicom.dataset import Dataset

    panel = np.asarray(panel)
    if panel.ndim != 3 or panel.shape[2] != 3 or panel.dtype != np.uint8:
        raise UsageError(f"panel must be (H, W, 3) uint8, got shape {panel.shape} dtype {panel.dtype}")
    # highdicom wants a patient orientation for a PATIENT coordinate system and accepts single letters only; the
    # panel's tiles keep the source's row/column directions, so the source's value (e.g. "FR" in a mammogram) is
    # copied over the placeholder afterwards, or left empty (type 2) when the source has none.
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
    """FRACTIONAL Segmentation of S_c ((2, H, W) float in [0, 1], channels benign/malignant, H x W = the source's
    Rows x Columns): two segments "benign" and "malignant" (Neoplasm, automatic, algorithm GLAM), one frame each,
    stored as round(value x 255) in 8 bits (read back within 0.5/255), referencing ``source`` (ReferencedSeries
    and the frames' SourceImageSequence). A source in a patient frame of reference gives the frames its
    FrameOfReferenceUID, ImagePositionPatient, ImageOrientationPatient and pixel spacing (:func:`_has_plane`).

    A Segmentation rather than a Parametric Map: highdicom 0.28's ParametricMap fails on projection images without
    a frame of reference (mammograms), its Segmentation handles them.
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
    """Write a DICOM object as a file at ``path`` (with its file meta information)."""
    ds.save_as(str(path), enforce_file_format=True)


def dicom_objects(
    source_path: str | os.PathLike,
    kinds: Sequence[str],
    panel: np.ndarray | None = None,
    s_c: np.ndarray | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """``kind -> DICOM object`` for the kinds asked: ``"sc"`` (the Secondary Capture of ``panel``, (H', W', 3)
    uint8) and / or ``"map"`` (the Segmentation of ``s_c``, (2, H, W) float on the source grid), both referencing
    the DICOM file ``source_path`` (its header is read). What had to change in the source's header to write them (a
    character set highdicom refuses) is appended to ``notes``."""
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


def write_dicom_outputs(
    source_path: str | os.PathLike,
    output_dir: str | os.PathLike,
    stem: str,
    kinds: Sequence[str],
    panel: np.ndarray | None = None,
    s_c: np.ndarray | None = None,
    notes: list[str] | None = None,
) -> list[Path]:
    """Write ``output_dir/dicom/<stem>_sc.dcm`` and / or ``<stem>_map.dcm`` (:func:`dicom_objects`) atomically.
    Returns the paths written."""
    written = []
    for kind, ds in dicom_objects(source_path, kinds, panel, s_c, notes).items():
        path = Path(output_dir) / "dicom" / f"{stem}_{kind}.dcm"
        with atomic_write(path, "wb") as f:
            ds.save_as(f, enforce_file_format=True)
        written.append(path)
    return written
