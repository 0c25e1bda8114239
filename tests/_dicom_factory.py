"""Build small synthetic mammography DICOM files for tests (pydicom 2.4 and 3.x)."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import write_dataset, write_file_meta_info
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

PYDICOM_MAJOR = int(pydicom.__version__.split(".")[0])
MG_FOR_PRESENTATION = "1.2.840.10008.5.1.4.1.1.1.2"
CR_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.1"
DEFLATED = "1.2.840.10008.1.2.1.99"


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
    modality: str | None = "MG",
    sop_class: str = MG_FOR_PRESENTATION,
    body_part: str | None = None,
    patient_orientation: Sequence[str] | None = None,
    series_description: str | None = None,
    protocol_name: str | None = None,
    pixel_spacing: Sequence[float] | None = None,
    magnification: float | None = None,
    rows_cols: tuple[int, int] | None = None,
    padding: tuple[int, int | None] | None = None,
) -> Dataset:
    """An MG dataset holding ``pixels`` (``(H, W)`` or ``(frames, H, W)`` unsigned ints; None: no pixel data).

    ``voi_lut`` is ``(first_mapped_value, lut_values)`` for a 16-bit VOI LUT Sequence item. ``spacing`` is written
    as ImagerPixelSpacing, ``pixel_spacing`` as PixelSpacing, ``magnification`` as
    EstimatedRadiographicMagnificationFactor. ``modality`` None leaves the tag out; ``sop_class`` is written to the
    file meta and the dataset (a CR image: ``CR_IMAGE_STORAGE``). ``rows_cols`` overrides Rows / Columns (a header
    claiming another size than the pixel data, or no pixel data). ``padding`` is ``(PixelPaddingValue,
    PixelPaddingRangeLimit or None)``.
    """
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID = generate_uid()
    ds.SeriesInstanceUID = generate_uid()
    if modality is not None:
        ds.Modality = modality
    if body_part is not None:
        ds.BodyPartExamined = body_part
    if patient_orientation is not None:
        ds.PatientOrientation = list(patient_orientation)
    if series_description is not None:
        ds.SeriesDescription = series_description
    if protocol_name is not None:
        ds.ProtocolName = protocol_name
    if pixel_spacing is not None:
        ds.PixelSpacing = [f"{s:g}" for s in pixel_spacing]
    if magnification is not None:
        ds.EstimatedRadiographicMagnificationFactor = f"{magnification:g}"
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
    if rows_cols is not None:
        ds.Rows, ds.Columns = (int(v) for v in rows_cols)
    if padding is not None:
        ds.add_new(0x00280120, "US", int(padding[0]))  # PixelPaddingValue
        if padding[1] is not None:
            ds.add_new(0x00280121, "US", int(padding[1]))  # PixelPaddingRangeLimit
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


def _dataset_bytes(ds: Dataset) -> bytes:
    """The dataset (no file meta) encoded as explicit VR little endian."""
    fp = DicomBytesIO()
    fp.is_little_endian = True
    fp.is_implicit_VR = False
    write_dataset(fp, ds)
    return fp.getvalue()


def save_deflated_bomb(ds: Dataset, path: str | Path, zero_pixel_bytes: int) -> Path:
    """A Deflated Explicit VR Little Endian file (PS3.5 A.5) whose dataset is ``ds`` (without pixel data) followed by
    a PixelData element of ``zero_pixel_bytes`` zeros: a few KB per GB on disk, the full size once inflated.

    The zeros are one 1 MiB deflate segment ended by a full flush (which resets the compressor's history, so the
    segment decodes the same anywhere) repeated, so the file is written in milliseconds whatever it inflates to.
    """
    mib = 1 << 20
    assert zero_pixel_bytes % mib == 0 and zero_pixel_bytes < 1 << 32
    body = Dataset()
    for elem in ds:
        if elem.tag != 0x7FE00010:
            body.add(elem)
    header = _dataset_bytes(body) + struct.pack("<HH2sHI", 0x7FE0, 0x0010, b"OW", 0, zero_pixel_bytes)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    segment_compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    segment = segment_compressor.compress(bytes(mib)) + segment_compressor.flush(zlib.Z_FULL_FLUSH)
    meta = FileMetaDataset(ds.file_meta)
    meta.TransferSyntaxUID = DEFLATED
    fp = DicomBytesIO()
    fp.write(b"\x00" * 128 + b"DICM")
    write_file_meta_info(fp, meta, enforce_standard=True)
    path = Path(path)
    with open(path, "wb") as f:
        f.write(fp.getvalue())
        f.write(compressor.compress(header) + compressor.flush(zlib.Z_FULL_FLUSH))
        for _ in range(zero_pixel_bytes // mib):
            f.write(segment)
        f.write(compressor.flush())
    return path


def linear_window(x: np.ndarray, center: float, width: float, bits: int) -> np.ndarray:
    """DICOM PS3.3 C.11.2.1.2.1 LINEAR windowing onto [0, 2**bits - 1], written out for the tests."""
    ymax = 2.0**bits - 1
    x = x.astype(np.float64)
    y = ((x - (center - 0.5)) / (width - 1) + 0.5) * ymax
    y[x <= center - 0.5 - (width - 1) / 2] = 0
    y[x > center - 0.5 + (width - 1) / 2] = ymax
    return y


def set_raw_value(path: str | Path, tag: int, raw: bytes) -> Path:
    """Rewrite the value of the top-level element ``tag`` of an explicit-VR little-endian file written by
    :func:`save` to the bytes ``raw`` as they are (padded with a space to an even length), whatever its VR allows:
    the text a scanner wrote that pydicom will not write, e.g. ``b"abc"`` in a DS or one value where two belong."""
    path = Path(path)
    data = path.read_bytes()
    key = struct.pack("<HH", tag >> 16, tag & 0xFFFF)
    pos = data.index(key, 132)
    length = struct.unpack_from("<H", data, pos + 6)[0]  # short-VR elements only (DS, IS, CS, US, LO, ...)
    raw = raw + b" " if len(raw) % 2 else raw
    path.write_bytes(data[: pos + 6] + struct.pack("<H", len(raw)) + raw + data[pos + 8 + length :])
    return path
