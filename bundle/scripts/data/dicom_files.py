"""DICOM files read with their size traps closed: the image size checked against the cap before any pixel is decoded.

pydicom inflates a Deflated Explicit VR Little Endian file (PS3.5 A.5) in one ``zlib.decompress``, so a few MB can
become many GB before a tag is read; these files are inflated here in chunks, stopping at the size the header implies.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
from pydicom.errors import InvalidDicomError
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import write_file_meta_info

from .errors import DEFAULT_MAX_PIXELS, OUT_OF_SCOPE_3D, MammogramReadError, check_pixels, read_error
from .header_facts import (
    dicom_spacing_and_source,
    header_value_problem,
    laterality_and_source,
    mammography_problem,
    tag_text,
    view_and_source,
)

try:  # pydicom >= 3
    from pydicom.pixels import apply_modality_lut, apply_voi_lut
except ImportError:  # pydicom 2.x
    from pydicom.pixel_data_handlers.util import apply_modality_lut, apply_voi_lut

DEFLATED_SYNTAX = "1.2.840.10008.1.2.1.99"
_MIB = 1 << 20

_LONG_VRS = frozenset({b"OB", b"OD", b"OF", b"OL", b"OV", b"OW", b"SQ", b"SV", b"UC", b"UN", b"UR", b"UT", b"UV"})
_SIZE_TAGS = {0x00280002: "samples", 0x00280008: "frames", 0x00280010: "rows", 0x00280011: "cols", 0x00280100: "bits"}
_UNDEFINED = 0xFFFFFFFF
_INFLATE_CHUNK = 4 * _MIB
_HEADER_LIMIT = 64 * _MIB  # inflated bytes before the pixel data: more is no image header
_TRAILER_SLACK = 16 * _MIB  # elements after the pixel data (padding, signatures)


class _NeedMore(Exception):
    """The buffer ends inside an element."""


class _Unparsable(Exception):
    """Not explicit VR little endian as this scanner reads it."""


def _element_at(buf: bytes | bytearray, pos: int) -> tuple[int, bytes, int, int]:
    """(tag, VR, value offset, value length) of the explicit-VR little-endian element at ``pos``."""
    if pos + 8 > len(buf):
        raise _NeedMore
    group, elem = struct.unpack_from("<HH", buf, pos)
    tag = (group << 16) | elem
    if group == 0xFFFE:  # items and delimiters carry no VR
        return tag, b"", pos + 8, struct.unpack_from("<I", buf, pos + 4)[0]
    vr = bytes(buf[pos + 4 : pos + 6])
    if vr in _LONG_VRS:
        if pos + 12 > len(buf):
            raise _NeedMore
        return tag, vr, pos + 12, struct.unpack_from("<I", buf, pos + 8)[0]
    if not (vr.isalpha() and vr.isupper()):
        raise _Unparsable
    return tag, vr, pos + 8, struct.unpack_from("<H", buf, pos + 6)[0]


def _skip_value(buf: bytes | bytearray, vr: bytes, start: int, length: int) -> int:
    """Position after an element's value; undefined-length sequences are walked item by item."""
    if length != _UNDEFINED:
        return start + length
    if vr != b"SQ":
        raise _Unparsable  # undefined-length UN (implicit VR inside) or encapsulated data before the pixels
    pos = start
    while True:
        tag, _, item_start, item_length = _element_at(buf, pos)
        if tag == 0xFFFEE0DD:  # sequence delimiter
            return item_start
        if tag != 0xFFFEE000:
            raise _Unparsable
        if item_length != _UNDEFINED:
            pos = item_start + item_length
            continue
        pos = item_start
        while True:
            tag, vr_, value_start, value_length = _element_at(buf, pos)
            if tag == 0xFFFEE00D:  # item delimiter
                pos = value_start
                break
            pos = _skip_value(buf, vr_, value_start, value_length)


def _scan_image_header(buf: bytes | bytearray, pos: int, found: dict[str, int]) -> tuple[str, int]:
    """Walk top-level elements from ``pos``, collecting the image size tags into ``found``.

    Returns:
        ``("pixels", offset of the pixel data)``, ``("more", offset of the first incomplete element)`` or
        ``("unparsable", pos)``.
    """
    try:
        while True:
            tag, vr, start, length = _element_at(buf, pos)
            if tag in (0x7FE00008, 0x7FE00009, 0x7FE00010):
                return "pixels", pos
            if tag in _SIZE_TAGS and length != _UNDEFINED:
                if start + length > len(buf):
                    raise _NeedMore
                raw = bytes(buf[start : start + length])
                if vr == b"US" and length >= 2:
                    found[_SIZE_TAGS[tag]] = struct.unpack_from("<H", raw)[0]
                elif vr == b"IS":
                    text = raw.decode("ascii", "replace").strip("\x00 ").split("\\")[0].strip()
                    found[_SIZE_TAGS[tag]] = int(text) if text else 1
            end = _skip_value(buf, vr, start, length)
            if end > len(buf):
                raise _NeedMore
            pos = end
    except _NeedMore:
        return "more", pos
    except (_Unparsable, ValueError, struct.error):
        return "unparsable", pos


def meta_end_and_syntax(path: str | os.PathLike) -> tuple[int, str | None]:
    """Offset where the dataset starts after the file meta group, and the transfer syntax; ``(0, None)`` without one."""
    with open(path, "rb") as f:
        head = f.read(132 + 64 * 1024)  # the file meta group is a few hundred bytes
    pos = 132 if head[128:132] == b"DICM" else 0
    syntax = None
    try:
        while True:
            tag, vr, start, length = _element_at(head, pos)
            if tag >> 16 != 0x0002:
                break
            if tag == 0x00020010:
                syntax = head[start : start + length].decode("ascii", "replace").strip("\x00 ")
            pos = _skip_value(head, vr, start, length)
    except (_NeedMore, _Unparsable, struct.error):
        return pos, syntax
    return pos, syntax


def inflate_dicom(path: str | os.PathLike, header_only: bool, max_pixels: int | None) -> pydicom.Dataset:
    """Read a deflated DICOM, inflating in chunks and refusing past the size its header implies."""
    meta_end, _ = meta_end_and_syntax(path)
    meta = pydicom.filereader.read_file_meta_info(path)
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    data = bytearray()
    found: dict[str, int] = {}
    status, scan_pos, cap, pixel_pos = "more", 0, None, None
    fallback_cap = (2 * max_pixels if max_pixels is not None else 1 << 62) + _HEADER_LIMIT
    try:
        with open(path, "rb") as f:
            f.seek(meta_end)
            pending = b""
            while True:
                if not pending:
                    pending = f.read(_INFLATE_CHUNK)
                    if not pending:
                        break
                data += inflater.decompress(pending, _INFLATE_CHUNK)
                pending = inflater.unconsumed_tail
                if status == "more":
                    status, scan_pos = _scan_image_header(data, scan_pos, found)
                    if status == "pixels":
                        pixel_pos = scan_pos
                        rows, cols, frames = found.get("rows", 0), found.get("cols", 0), found.get("frames", 1) or 1
                        bits = found.get("bits", 16) or 16
                        if rows and cols:
                            check_pixels(path, (rows, cols) if frames == 1 else (frames, rows, cols), max_pixels)
                            cap = pixel_pos + rows * cols * frames * (found.get("samples", 1) or 1) * -(-bits // 8)
                            cap += _TRAILER_SLACK
                        else:
                            cap = fallback_cap
                        if header_only:
                            break
                    elif status == "unparsable" or len(data) > _HEADER_LIMIT:
                        status, cap = "unparsable", fallback_cap
                if cap is not None and len(data) > cap:
                    size = (
                        f"its header's {found['rows']} x {found['cols']} image"
                        if found.get("rows") and found.get("cols") and pixel_pos is not None
                        else f"2 bytes per pixel of the decoded-size cap of {max_pixels:,} pixels (max_pixels)"
                    )
                    raise read_error(
                        path,
                        f"deflated DICOM inflates past {cap:,} bytes, more than {size} needs; refused before "
                        "inflating further (a corrupt or hostile file; if it is trusted, raise the reader's "
                        "max_pixels option)",
                    )
                if inflater.eof:
                    break
    except zlib.error as err:
        raise read_error(path, f"corrupt deflated DICOM data (zlib: {err})") from err
    if header_only and pixel_pos is not None:
        del data[pixel_pos:]
    meta = pydicom.dataset.FileMetaDataset(meta)
    meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    fp = DicomBytesIO()
    fp.write(b"\x00" * 128 + b"DICM")
    write_file_meta_info(fp, meta, enforce_standard=True)
    fp.write(bytes(data))
    del data
    fp.seek(0)
    ds = pydicom.dcmread(fp, stop_before_pixels=header_only)
    ds.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian  # what the inflated dataset now is
    ds._original_syntax = DEFLATED_SYNTAX  # reported as the file's transfer syntax
    return ds


def dcmread_capped(
    path: str | os.PathLike, stop_before_pixels: bool, max_pixels: int | None = DEFAULT_MAX_PIXELS
) -> pydicom.Dataset:
    """pydicom's ``dcmread`` with deflated files inflated under a cap and the pixel data left on disk."""
    if not Path(path).is_file():
        raise read_error(path, "file not found" if not Path(path).exists() else "not a regular file")
    try:
        _, syntax = meta_end_and_syntax(path)
    except OSError as err:
        raise read_error(path, f"cannot be read ({type(err).__name__}: {err})") from err
    if syntax == DEFLATED_SYNTAX:
        try:
            return inflate_dicom(path, stop_before_pixels, max_pixels)
        except MammogramReadError:
            raise
        except MemoryError as err:
            raise read_error(
                path, "out of memory inflating the deflated DICOM (lower the input size or free memory)"
            ) from err
        except Exception as err:
            raise read_error(path, f"not a readable deflated DICOM file ({type(err).__name__}: {err})") from err
    # values over 1 MiB (the pixel data, large private blobs) stay on disk until accessed
    kwargs: dict[str, Any] = {"stop_before_pixels": stop_before_pixels, "defer_size": _MIB}
    try:
        return pydicom.dcmread(path, **kwargs)
    except InvalidDicomError:
        pass  # no preamble/'DICM': some writers omit it; accept only if the content parses as image tags
    except Exception as err:  # truncated or corrupt header
        raise read_error(path, f"not a readable DICOM file ({type(err).__name__}: {err})") from err
    try:
        ds = pydicom.dcmread(path, force=True, **kwargs)
        ok = "Rows" in ds and "Columns" in ds
    except Exception:
        ok = False
    if not ok:
        raise read_error(path, "not a DICOM file (no 'DICM' marker and no image tags)")
    return ds


def _check_header_values(ds: pydicom.Dataset, path: str | os.PathLike) -> None:
    """Refuse a header value the reader would misread (:func:`header_value_problem`)."""
    problem = header_value_problem(ds)
    if problem:
        raise read_error(path, problem)


def _int_tag(ds: pydicom.Dataset, keyword: str, default: int | None = None) -> int | None:
    value = ds.get(keyword)
    try:
        return default if value is None or value == "" else int(value)
    except (TypeError, ValueError):
        return default


def _transfer_syntax(ds: pydicom.Dataset) -> str | None:
    original = getattr(ds, "_original_syntax", None)
    if original:
        return original
    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    return str(syntax) if syntax else None


def _header_facts(ds: pydicom.Dataset, path: str | os.PathLike) -> dict[str, Any]:
    """What the header (and the file name) say of the image, None where they say nothing."""
    laterality, laterality_source = laterality_and_source(ds, path)
    view, view_source = view_and_source(ds, path)
    spacing, spacing_source = dicom_spacing_and_source(ds)
    return {
        "laterality": laterality,
        "laterality_source": laterality_source,
        "view": view,
        "view_source": view_source,
        "patient_id": tag_text(ds.get("PatientID")) or None,
        "spacing": spacing,
        "spacing_source": spacing_source,
        "modality": tag_text(ds.get("Modality")).upper() or None,
        "body_part": tag_text(ds.get("BodyPartExamined")).upper() or None,
        "photometric": tag_text(ds.get("PhotometricInterpretation")).upper() or None,
        "study_uid": tag_text(ds.get("StudyInstanceUID")) or None,
        "series_uid": tag_text(ds.get("SeriesInstanceUID")) or None,
        "sop_uid": tag_text(ds.get("SOPInstanceUID")) or None,
    }


def read_dicom_header(path: str | os.PathLike, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> dict[str, Any]:
    """Header fields for building datalists, without decoding pixels.

    Returns:
        ``filename``, ``patient_id``, ``laterality`` / ``view`` with their ``*_source`` (never from the pixels),
        ``study_uid``, ``series_uid``, ``sop_uid``, ``rows``, ``cols``, ``frames``, ``modality``, ``body_part``,
        ``sop_class``, ``mammography_problem`` (None, or why the reader would refuse it), ``photometric``, ``spacing``
        and ``spacing_source``; missing tags are None.
    """
    ds = dcmread_capped(path, stop_before_pixels=True, max_pixels=max_pixels)
    _check_header_values(ds, path)
    return {
        "filename": str(path),
        **_header_facts(ds, path),
        "photometric": tag_text(ds.get("PhotometricInterpretation")) or None,
        "rows": _int_tag(ds, "Rows"),
        "cols": _int_tag(ds, "Columns"),
        "frames": _int_tag(ds, "NumberOfFrames") or 1,
        "sop_class": tag_text(ds.get("SOPClassUID")) or None,
        "mammography_problem": mammography_problem(
            ds.get("Modality"), ds.get("BodyPartExamined"), ds.get("SOPClassUID")
        ),
    }


def _padding_mask(ds: pydicom.Dataset, raw: np.ndarray) -> np.ndarray | None:
    """Stored pixels PixelPaddingValue (to PixelPaddingRangeLimit) marks as outside the image, or None.

    A MONOCHROME1 padding of 0 would otherwise invert to a white frame.
    """
    try:
        value = int(ds.PixelPaddingValue) if "PixelPaddingValue" in ds else None
        limit = int(ds.PixelPaddingRangeLimit) if "PixelPaddingRangeLimit" in ds else None
    except (TypeError, ValueError):
        return None
    if value is None:
        return None
    low, high = (value, value) if limit is None else (min(value, limit), max(value, limit))
    padding = (raw >= low) & (raw <= high)
    return padding if padding.any() else None


def read_dicom(
    path: str | os.PathLike, apply_voi: bool, mask: bool, accept_non_mammography: bool, max_pixels: int | None
) -> tuple[np.ndarray, dict[str, Any]]:
    ds = dcmread_capped(path, stop_before_pixels=False, max_pixels=max_pixels)
    _check_header_values(ds, path)
    if not any(k in ds for k in ("PixelData", "FloatPixelData", "DoubleFloatPixelData")):
        raise read_error(path, "DICOM file has no pixel data")
    frames = _int_tag(ds, "NumberOfFrames", 1) or 1
    rows, cols = _int_tag(ds, "Rows", 0) or 0, _int_tag(ds, "Columns", 0) or 0
    # before pydicom allocates the decoded array (its pixel data is deferred, or bounded by the inflation cap)
    check_pixels(path, (rows, cols) if frames == 1 else (frames, rows, cols), max_pixels)
    if not mask and not accept_non_mammography:
        problem = mammography_problem(ds.get("Modality"), ds.get("BodyPartExamined"), ds.get("SOPClassUID"))
        if problem:
            raise read_error(path, problem)
    if frames > 1:
        raise read_error(path, f"{frames} frames; {OUT_OF_SCOPE_3D}")
    samples = int(ds.get("SamplesPerPixel", 1) or 1)
    photometric = tag_text(ds.get("PhotometricInterpretation")).upper()
    if samples != 1:
        raise read_error(
            path, f"{samples} samples per pixel ({photometric}); mammograms must be single-channel grayscale"
        )
    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    try:
        raw = ds.pixel_array
    except MemoryError as err:
        raise read_error(
            path, f"out of memory decoding {rows} x {cols} pixels (free memory or read it elsewhere)"
        ) from err
    except Exception as err:
        name = getattr(syntax, "name", syntax)
        hint = ""
        if getattr(syntax, "is_compressed", False):
            hint = "; compressed DICOM needs pylibjpeg, pylibjpeg-libjpeg, pylibjpeg-openjpeg and pylibjpeg-rle"
        raise read_error(
            path, f"cannot decode pixel data (transfer syntax {name}: {type(err).__name__}: {err}){hint}"
        ) from err
    if raw.ndim != 2:
        raise read_error(path, f"pixel data of shape {raw.shape}; {OUT_OF_SCOPE_3D}")
    if mask:
        arr = raw.astype(np.float32)
    else:
        try:
            arr = apply_modality_lut(raw, ds)
            if apply_voi and ("VOILUTSequence" in ds or "WindowCenter" in ds):
                arr = apply_voi_lut(arr, ds, index=0)
            arr = np.asarray(arr, dtype=np.float64)
        except MemoryError as err:
            raise read_error(path, f"out of memory applying the intensity LUTs to {rows} x {cols} pixels") from err
        except Exception as err:
            raise read_error(path, f"invalid Modality/VOI LUT ({type(err).__name__}: {err})") from err
        padding = _padding_mask(ds, raw)
        kept = arr if padding is None or padding.all() else arr[~padding]
        if photometric == "MONOCHROME1":
            # after the VOI: the window's output is inverted, so the saturated (highest) background becomes 0
            arr = kept.max() - arr
        if padding is not None:
            arr[padding] = 0  # outside the exposed field: background, whatever value the padding had
        arr = arr.astype(np.float32)
    return arr, {"format": "dicom", **_header_facts(ds, path), "transfer_syntax": _transfer_syntax(ds)}
