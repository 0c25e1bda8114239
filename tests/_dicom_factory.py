"""Build small synthetic mammography DICOM files for tests (pydicom 2.4 and 3.x)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

PYDICOM_MAJOR = int(pydicom.__version__.split(".")[0])
MG_FOR_PRESENTATION = "1.2.840.10008.5.1.4.1.1.1.2"


def _code_item(value: str, scheme: str, meaning: str) -> Dataset:
    item = Dataset()
    item.CodeValue = value
    item.CodingSchemeDesignator = scheme
    item.CodeMeaning = meaning
    return item


def make_dataset(
    pixels: np.ndarray | None,
    *,
    photometric: str = "MONOCHROME2",
    bits_stored: int = 12,
    laterality: str | None = "L",
    laterality_keyword: str = "ImageLaterality",
    view_position: str | None = "CC",
    view_code: tuple[str, str, str] | None = None,
    patient_id: str | None = "PAT-1",
    spacing: Sequence[float] | None = (0.07, 0.08),
    rescale: tuple[float, float] | None = None,
    window: tuple[float, float] | None = None,
    voi_lut: tuple[int, Sequence[int]] | None = None,
) -> Dataset:
    """An MG dataset holding ``pixels`` (``(H, W)`` or ``(frames, H, W)`` unsigned ints; None: no pixel data).

    ``voi_lut`` is ``(first_mapped_value, lut_values)`` for a 16-bit VOI LUT Sequence item.
    """
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = MG_FOR_PRESENTATION
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = MG_FOR_PRESENTATION
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID = generate_uid()
    ds.SeriesInstanceUID = generate_uid()
    ds.Modality = "MG"
    if patient_id is not None:
        ds.PatientID = patient_id
    if laterality is not None:
        setattr(ds, laterality_keyword, laterality)
    if view_position is not None:
        ds.ViewPosition = view_position
    if view_code is not None:
        ds.ViewCodeSequence = DicomSequence([_code_item(*view_code)])
    if spacing is not None:
        ds.ImagerPixelSpacing = [f"{s:g}" for s in spacing]
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated = 16
    ds.BitsStored = bits_stored
    ds.HighBit = bits_stored - 1
    ds.PixelRepresentation = 0
    if rescale is not None:
        ds.RescaleSlope = f"{rescale[0]:g}"
        ds.RescaleIntercept = f"{rescale[1]:g}"
    if window is not None:
        ds.WindowCenter = f"{window[0]:g}"
        ds.WindowWidth = f"{window[1]:g}"
    if voi_lut is not None:
        first, values = voi_lut
        item = Dataset()
        item.LUTDescriptor = [len(values), first, 16]
        item.add_new(0x00283006, "US", [int(v) for v in values])  # LUTData: "US or OW"; US takes a list
        ds.VOILUTSequence = DicomSequence([item])
    if pixels is not None:
        arr = np.ascontiguousarray(pixels, dtype=np.uint16)
        ds.Rows, ds.Columns = int(arr.shape[-2]), int(arr.shape[-1])
        if arr.ndim == 3:
            ds.NumberOfFrames = int(arr.shape[0])
        ds.PixelData = arr.tobytes()
    else:
        ds.Rows, ds.Columns = 4, 4
    return ds


def save(ds: Dataset, path: str | Path) -> Path:
    """Write a DICOM file (preamble, 'DICM', file meta) with pydicom 2.4 or 3.x."""
    path = Path(path)
    if PYDICOM_MAJOR >= 3:
        ds.save_as(path, enforce_file_format=True)
    else:  # pydicom 2.x needs the encoding on the dataset
        ds.is_little_endian = True
        ds.is_implicit_VR = False
        ds.save_as(path, write_like_original=False)
    return path


def make_dicom(path: str | Path, pixels: np.ndarray | None, **kwargs) -> Path:
    """:func:`make_dataset` written to ``path``."""
    return save(make_dataset(pixels, **kwargs), path)
