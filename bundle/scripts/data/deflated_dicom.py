"""Deflated DICOM files read with a cap on what they inflate to.

Deflated Explicit VR Little Endian (PS3.5 A.5) compresses the whole dataset after the file meta; pydicom inflates
it with one zlib.decompress in dcmread, so a few MB can become many GB before any tag is looked at. These files
are inflated here in chunks instead, reading the image size on the way and stopping at the cap it implies.
"""

from __future__ import annotations

import os
import struct
import zlib

import pydicom
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import write_file_meta_info

from .read_errors import check_pixels, read_error

__all__ = ["DEFLATED_SYNTAX", "inflate_dicom", "meta_end_and_syntax"]

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
    """Walk top-level elements from ``pos`` collecting the image size tags into ``found``.

    Returns ``(status, pos)``: ``"pixels"`` with the offset of the pixel data element, ``"more"`` with the offset of
    the first element not yet complete in ``buf``, or ``"unparsable"``.
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
    """Offset where the dataset starts after the file meta group, and the transfer syntax; (0, None) without a meta
    group (a bare dataset)."""
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
