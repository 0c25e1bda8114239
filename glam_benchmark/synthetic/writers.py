"""File writers of the synthetic data set: 16-bit PNG images, 0/255 PNG masks, 2-D NIfTI and MG DICOM (Digital
Mammography X-Ray Image For Presentation). Every writer is atomic (:func:`~scripts.atomic.atomic_path`): it writes to a
temporary name beside the target, then renames it, so an interrupted run never leaves a half-written file under the
final name."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from scripts.atomic import atomic_path

from .config import MAX_VALUE_12BIT

__all__ = ["write_png16", "write_mask_png", "write_nifti", "write_mammogram_dicom", "deterministic_uid"]


def _png_options(spacing_mm: float | None) -> dict[str, Any]:
    """PIL's save options that write the pixel spacing as the PNG pHYs chunk (pixels per metre, rounded to whole
    ones; PIL takes it as dpi), which the readers take as the image's spacing; none without a spacing."""
    return {} if spacing_mm is None else {"dpi": (25.4 / float(spacing_mm),) * 2}


def write_png16(path: str | os.PathLike, image: np.ndarray, spacing_mm: float | None = None) -> None:
    """(H, W) uint16 -> 16-bit grayscale PNG; ``spacing_mm`` (isotropic) goes into its pHYs chunk."""
    from PIL import Image

    arr = np.ascontiguousarray(image, dtype=np.uint16)
    with atomic_path(path) as tmp:
        Image.fromarray(arr).save(tmp, format="PNG", **_png_options(spacing_mm))


def write_mask_png(path: str | os.PathLike, mask: np.ndarray, spacing_mm: float | None = None) -> None:
    """(H, W) binary mask -> 8-bit PNG with values 0 and 255 (the authors' mask format); ``spacing_mm`` as in
    :func:`write_png16`."""
    from PIL import Image

    mask_u8 = np.where(np.asarray(mask) > 0, 255, 0).astype(np.uint8)
    with atomic_path(path) as tmp:
        Image.fromarray(mask_u8).save(tmp, format="PNG", **_png_options(spacing_mm))


def write_nifti(path: str | os.PathLike, array: np.ndarray, spacing_mm: float) -> None:
    """(H, W) array -> 2-D NIfTI whose first axis is x (columns) and second y (rows), as ITK, MONAI's
    PILReader (reverse_indexing) and NibabelReader lay out 2-D images: the stored data is ``array.T``."""
    import nibabel as nib

    affine = np.diag([spacing_mm, spacing_mm, 1.0, 1.0])
    img = nib.Nifti1Image(np.ascontiguousarray(np.asarray(array).T), affine)
    img.header.set_xyzt_units("mm")
    with atomic_path(path) as tmp:  # the staged name keeps the extension: nibabel picks the compression from it
        nib.save(img, str(tmp))


# SNOMED CT view codes (DICOM CID 4014)
_VIEW_CODES = {"CC": ("399162004", "cranio-caudal"), "MLO": ("399368009", "medio-lateral oblique")}
# Patient Orientation (0020,0020): row direction \ column direction, for the breast facing right (chest wall at
# column 0) and for the detector-native right breast facing left.
_ORIENTATION = {
    ("L", "CC", "right"): ["A", "R"],
    ("L", "MLO", "right"): ["A", "FR"],
    ("R", "CC", "right"): ["A", "L"],
    ("R", "MLO", "right"): ["A", "FL"],
    ("R", "CC", "left"): ["P", "L"],
    ("R", "MLO", "left"): ["P", "FL"],
    ("L", "CC", "left"): ["P", "R"],
    ("L", "MLO", "left"): ["P", "FR"],
}


def deterministic_uid(*parts: Any) -> str:
    """A DICOM UID derived from ``parts`` (same parts -> same UID) under pydicom's root."""
    from pydicom.uid import generate_uid

    return str(generate_uid(entropy_srcs=[str(p) for p in parts]))


def write_mammogram_dicom(
    path: str | os.PathLike,
    image: np.ndarray,
    *,
    patient_id: str,
    laterality: str,
    view: str,
    facing: str,
    spacing_mm: float,
    study_uid: str,
    series_uid: str,
    sop_uid: str,
    instance_number: int = 1,
    photometric: str = "MONOCHROME2",
) -> None:
    """Write a Digital Mammography X-Ray Image - For Presentation (12 bits stored in 16) as explicit VR
    little endian. ``image``: (H, W) uint16 in 0..4095 with dense tissue bright; for MONOCHROME1 the stored
    values are inverted (4095 - x) as a MONOCHROME1 detector writes them. Works with pydicom 2.4 and 3.x."""
    import pydicom
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import DigitalMammographyXRayImageStorageForPresentation, ExplicitVRLittleEndian

    if photometric not in ("MONOCHROME1", "MONOCHROME2"):
        raise ValueError(f"photometric must be MONOCHROME1 or MONOCHROME2, got {photometric!r}")
    arr = np.asarray(image)
    if arr.ndim != 2:
        raise ValueError(f"{path}: image must be 2-D (H, W), got shape {arr.shape}")
    pixels = arr.astype(np.uint16)
    if photometric == "MONOCHROME1":
        pixels = (MAX_VALUE_12BIT - pixels.astype(np.int32)).clip(0, MAX_VALUE_12BIT).astype(np.uint16)

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = DigitalMammographyXRayImageStorageForPresentation
    meta.MediaStorageSOPInstanceUID = sop_uid
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    meta.ImplementationClassUID = deterministic_uid("glam-monai-synthetic-implementation")

    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = DigitalMammographyXRayImageStorageForPresentation
    ds.SOPInstanceUID = sop_uid
    ds.StudyInstanceUID = study_uid
    ds.SeriesInstanceUID = series_uid
    ds.Modality = "MG"
    ds.PresentationIntentType = "FOR PRESENTATION"
    ds.ImageType = ["DERIVED", "PRIMARY"]
    ds.Manufacturer = "GLAM-MONAI synthetic"
    ds.PatientID = patient_id
    ds.PatientName = f"Synthetic^{patient_id}"
    ds.PatientSex = "F"
    ds.StudyDate = "20240101"
    ds.StudyTime = "120000"
    ds.AccessionNumber = patient_id
    ds.StudyID = "1"
    ds.SeriesNumber = 1
    ds.InstanceNumber = int(instance_number)
    ds.BodyPartExamined = "BREAST"
    ds.ImageLaterality = laterality
    ds.ViewPosition = view
    code_value, meaning = _VIEW_CODES[view]
    code = Dataset()
    code.CodeValue = code_value
    code.CodingSchemeDesignator = "SCT"
    code.CodeMeaning = meaning
    ds.ViewCodeSequence = [code]
    ds.PatientOrientation = _ORIENTATION[(laterality, view, facing)]
    ds.BurnedInAnnotation = "NO"
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = photometric
    ds.Rows, ds.Columns = int(pixels.shape[0]), int(pixels.shape[1])
    ds.BitsAllocated = 16
    ds.BitsStored = 12
    ds.HighBit = 11
    ds.PixelRepresentation = 0
    ds.PixelSpacing = [f"{spacing_mm:.6g}", f"{spacing_mm:.6g}"]
    ds.ImagerPixelSpacing = [f"{spacing_mm:.6g}", f"{spacing_mm:.6g}"]
    ds.PixelIntensityRelationship = "LOG"
    # -1: higher stored values = less X-ray reaching the detector (dense tissue bright), i.e. MONOCHROME2 here
    ds.PixelIntensityRelationshipSign = 1 if photometric == "MONOCHROME1" else -1
    ds.WindowCenter = "2048"
    ds.WindowWidth = "4096"
    ds.PixelData = pixels.astype("<u2").tobytes()

    with atomic_path(path) as tmp:
        if int(pydicom.__version__.split(".")[0]) >= 3:
            pydicom.dcmwrite(tmp, ds, enforce_file_format=True)
        else:  # pydicom 2.x: encoding from the dataset flags, file meta written by write_like_original=False
            ds.is_little_endian = True
            ds.is_implicit_VR = False
            pydicom.dcmwrite(str(tmp), ds, write_like_original=False)
