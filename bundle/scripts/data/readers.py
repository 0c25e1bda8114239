"""Loading of 2-D mammograms and lesion masks from DICOM, PNG/TIFF, NIfTI, MHA/MHD and NRRD.

Array convention of the whole project: an image is ``(H, W)`` as displayed — rows top-to-bottom, columns
left-to-right — and ``(1, H, W)`` (channel first) once loaded through MONAI. Every format lands there:

- DICOM: ``Rows x Columns`` as stored (pydicom's ``pixel_array``);
- PNG/TIFF/JPEG: the picture's rows (MONAI's ``PILReader`` with ``reverse_indexing=False``);
- MHA/MHD (ITK) and NRRD: ITK index ``[x, y]`` is ``[column, row]``, as ITK, 3D Slicer and MONAI's writers store
  a picture (``ITKReader(reverse_indexing=True)``; NRRD through pynrrd with ``index_order="C"``);
- NIfTI: voxel axis ``i`` is the column and ``j`` the row, the same x-first layout (what ITK, SimpleITK and
  MONAI's ``SaveImage`` write from a displayed picture), so the data array is transposed. No reorientation by
  the affine is done: mammograms carry no patient-space frame that the model relies on.

DICOM pixels go through the Modality LUT (or rescale slope/intercept), then the VOI LUT or window when present
(``apply_voi``), then MONOCHROME1 is inverted as ``max - x`` so dense tissue is bright and the (saturated)
background becomes 0, which the authors' crop (pixels > 0) needs; PixelPaddingValue pixels become 0 too. Compressed
transfer syntaxes decode through pydicom's plugins (pylibjpeg, pylibjpeg-libjpeg, pylibjpeg-openjpeg, pylibjpeg-rle).

Every image states where its view, laterality and spacing came from (``view_source``, ``laterality_source``,
``spacing_source``: the tags, PatientOrientation, archive naming patterns, the pixels), and its ``modality`` and
``body_part``. DICOMs that are not mammograms are refused unless ``accept_non_mammography``; every format's header
size is checked against ``max_pixels`` before pixels are decoded, and deflated DICOMs are inflated with a cap
(docs/preprocessing.md, "Readers and formats").

Works with pydicom 2.4 and 3.x and numpy 1.26 and 2.x.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nrrd
import numpy as np
import pydicom
from monai.data import ImageReader, ITKReader, NibabelReader, PILReader
from monai.data.utils import to_affine_nd
from monai.utils import ensure_tuple
from pydicom.errors import InvalidDicomError
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import write_file_meta_info

try:  # pydicom >= 3
    from pydicom.pixels import apply_modality_lut, apply_voi_lut
except ImportError:  # pydicom 2.x
    from pydicom.pixel_data_handlers.util import apply_modality_lut, apply_voi_lut

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "MAMMOGRAPHY_SOP_CLASSES",
    "MammogramReadError",
    "MammogramReader",
    "SUPPORTED_SUFFIXES",
    "dicom_laterality",
    "dicom_view",
    "mammography_problem",
    "orientation_view_laterality",
    "read_dicom_header",
    "read_mammogram",
    "text_view_laterality",
]

DICOM_SUFFIXES = (".dcm", ".dicom", ".dic")
PIL_SUFFIXES = (".png", ".tif", ".tiff", ".jpg", ".jpeg")
NIFTI_SUFFIXES = (".nii", ".nii.gz")
ITK_SUFFIXES = (".mha", ".mhd")
NRRD_SUFFIXES = (".nrrd",)
SUPPORTED_SUFFIXES = DICOM_SUFFIXES + PIL_SUFFIXES + NIFTI_SUFFIXES + ITK_SUFFIXES + NRRD_SUFFIXES

OUT_OF_SCOPE_3D = "tomosynthesis / multi-frame inputs are out of scope (expected one 2-D image)"
GRAYSCALE_PIL_MODES = frozenset({"1", "L", "I", "F", "I;16", "I;16L", "I;16B", "I;16N"})

# Decoded-size cap: PIL refuses a decompression bomb at 2 x Image.MAX_IMAGE_PIXELS (2 x 89,478,485) pixels; the same
# figure for every format. The largest full-field mammograms (about 4000 x 5000 / 4096 x 5625 px) are 20-23 million
# pixels, 8x below it.
DEFAULT_MAX_PIXELS = 178_956_970
# Digital Mammography X-Ray Image Storage, For Presentation / For Processing
MAMMOGRAPHY_SOP_CLASSES = frozenset({"1.2.840.10008.5.1.4.1.1.1.2", "1.2.840.10008.5.1.4.1.1.1.2.1"})
DEFLATED_SYNTAX = "1.2.840.10008.1.2.1.99"
_MIB = 1 << 20

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


class MammogramReadError(ValueError):
    """A file that cannot be used as a 2-D mammogram or mask; the message names the file and the problem."""

    def __init__(self, message: str, *, path: str | os.PathLike | None = None, problem: str | None = None):
        super().__init__(message)
        self.path = None if path is None else str(path)
        self.problem = problem if problem is not None else message


def _fail(path: str | os.PathLike, problem: str) -> MammogramReadError:
    return MammogramReadError(f"{path}: {problem}", path=path, problem=problem)


def _check_pixels(path: str | os.PathLike, shape: Sequence[int], max_pixels: int | None) -> None:
    """Refuse, before any pixel buffer exists, an image whose header states more than ``max_pixels`` pixels; the
    message names the file, the decoded size, the cap and the option that raises it."""
    dims = [max(int(s), 0) for s in shape]
    pixels = int(np.prod(dims, dtype=object)) if dims else 0
    if max_pixels is not None and pixels > max_pixels:
        raise _fail(
            path,
            f"image of {' x '.join(str(d) for d in dims)} = {pixels:,} pixels (about {pixels * 4 / 1e9:.1f} GB as the "
            f"reader's float32 array) exceeds the decoded-size cap of {max_pixels:,} pixels; if the file is trusted, "
            "raise the reader's max_pixels option",
        )


def _suffix(path: str | os.PathLike) -> str:
    name = str(path).lower()
    return ".nii.gz" if name.endswith(".nii.gz") else Path(name).suffix


def _sniff_format(path: str | os.PathLike) -> str | None:
    """Format from the first bytes, for files without a known suffix."""
    try:
        with open(path, "rb") as f:
            head = f.read(132)
    except OSError:
        return None
    if head[128:132] == b"DICM":
        return "dicom"
    if head.startswith(b"\x89PNG\r\n\x1a\n") or head[:4] in (b"II*\x00", b"MM\x00*") or head[:3] == b"\xff\xd8\xff":
        return "pil"
    if head.startswith(b"NRRD"):
        return "nrrd"
    return None


def _format_of(path: str | os.PathLike) -> str:
    suffix = _suffix(path)
    for fmt, suffixes in (
        ("dicom", DICOM_SUFFIXES),
        ("pil", PIL_SUFFIXES),
        ("nifti", NIFTI_SUFFIXES),
        ("itk", ITK_SUFFIXES),
        ("nrrd", NRRD_SUFFIXES),
    ):
        if suffix in suffixes:
            return fmt
    sniffed = _sniff_format(path)
    if sniffed is None:
        raise _fail(
            path, f"unsupported file type {suffix or '(no suffix)'}; supported: {', '.join(SUPPORTED_SUFFIXES)}"
        )
    return sniffed


# ----------------------------------------------------------------------------------------------- DICOM tags


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def dicom_laterality(ds: pydicom.Dataset) -> str | None:
    """``'L'``/``'R'`` from ImageLaterality, Laterality or an enhanced image's FrameLaterality, else None."""
    for keyword in ("ImageLaterality", "Laterality"):
        value = _text(ds.get(keyword)).upper()
        if value in ("L", "R"):
            return value
    for group in ds.get("SharedFunctionalGroupsSequence", []) or []:
        for anatomy in group.get("FrameAnatomySequence", []) or []:
            value = _text(anatomy.get("FrameLaterality")).upper()
            if value in ("L", "R"):
                return value
    return None


def dicom_view(ds: pydicom.Dataset) -> str | None:
    """View code (``'CC'``, ``'MLO'``, ``'ML'``, ...) from ViewPosition or ViewCodeSequence, else None.

    An unrecognised ViewCodeSequence meaning is returned as written.
    """
    position = _text(ds.get("ViewPosition")).upper()
    if position:
        return position
    for item in ds.get("ViewCodeSequence", []) or []:
        code = _text(item.get("CodeValue")).upper()
        if code in _VIEW_CODES:
            return _VIEW_CODES[code]
        meaning = _text(item.get("CodeMeaning"))
        key = " ".join(meaning.lower().replace("-", " ").replace("_", " ").split())
        if key in _VIEW_MEANINGS:
            return _VIEW_MEANINGS[key]
        if meaning:
            return meaning
    return None


def _multi(value: Any) -> list[str]:
    """A DICOM multi-valued string as a list (pydicom gives a MultiValue, or a plain str for one value)."""
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        value = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        return [v.strip() for v in value.split("\\")]
    return [_text(v) for v in value]


def orientation_view_laterality(patient_orientation: Any) -> tuple[str | None, str | None]:
    """View and laterality implied by PatientOrientation (0020,0020), ``(None, None)`` where it implies nothing.

    The two values are the directions of the rows (first pixel to last of a row) and of the columns, in the letters
    A/P, R/L, H/F (PS3.3 C.7.6.1.1.1). In a mammogram one axis runs along the anterior-posterior line (chest wall to
    nipple) and the other tells the projection (PS3.3 C.8.11.7, the mammography orientation conventions):

    - the other axis purely R/L: cranio-caudal (``"CC"``): ``A\\R`` L-CC, ``P\\L`` R-CC;
    - R/L combined with F/H (the oblique foot component): ``"MLO"``: ``A\\FR`` L-MLO, ``P\\FL`` R-MLO;
    - purely F/H: a 90-degree lateral view, returned as ``"ML"`` (ML and LM are not told apart; both take the MLO
      window rule).

    Laterality: for an oblique the column direction's R/L component is set by the anatomy (down the image is
    inferior-medial, i.e. towards the patient's right for a left breast), so F+R or H+L is a left breast, F+L or
    H+R a right one, however the image was mirrored. For CC only the two conventions together decide (lateral side at
    the top, and a left breast's chest wall on the left as the detector stores it): ``A\\R`` left, ``P\\L`` right;
    ``A\\L`` and ``P\\R`` (a mirrored or upside-down CC) are ambiguous and give no laterality; nor do lateral views.
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
    """View and laterality stated by a free-text name, ``(None, None)`` when it states none or contradicts itself.

    The text is split at every character that is not a letter or digit and only whole tokens count: a view code
    (``CC``, ``MLO``, ``ML``, ``LM``, ``XCCL``, ``XCCM``), ``LEFT`` / ``RIGHT`` anywhere, ``L`` / ``R`` only next
    to a view code (``"L CC"``, ``"R_MLO"``, ``"MLO-R"``), or both in one token (``LCC``, ``RMLO``). So CBIS-DDSM's
    ``Mass-Test_P_00173_LEFT_MLO`` and INbreast's ``..._MG_R_CC_ANON`` are read; ``CCTV`` or ``LEFTOVER`` are not.
    Case is ignored.
    """
    tokens = [t for t in re.split(r"[^A-Z0-9]+", _text(text).upper()) if t]
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


def _file_stem(path: str | os.PathLike) -> str:
    name = Path(path).name
    return name[: -len(_suffix(path))] if _suffix(path) and name.lower().endswith(_suffix(path)) else name


def _text_sources(ds: pydicom.Dataset | None, path: str | os.PathLike) -> list[tuple[str, Any]]:
    """Free-text places that may name the view / side, in order of trust."""
    sources = [] if ds is None else [(k, ds.get(k)) for k in ("SeriesDescription", "ProtocolName", "PatientID")]
    return [*sources, ("filename", _file_stem(path))]


def view_and_source(ds: pydicom.Dataset | None, path: str | os.PathLike) -> tuple[str | None, str | None]:
    """``(view, view_source)``: ViewPosition, ViewCodeSequence, PatientOrientation, then the SeriesDescription,
    ProtocolName, PatientID and file name patterns of :func:`text_view_laterality`; ``(None, None)`` if none."""
    if ds is not None:
        if _text(ds.get("ViewPosition")):
            return dicom_view(ds), "ViewPosition"
        view = dicom_view(ds)
        if view:
            return view, "ViewCodeSequence"
        view = orientation_view_laterality(ds.get("PatientOrientation"))[0]
        if view:
            return view, "PatientOrientation"
    for source, text in _text_sources(ds, path):
        view = text_view_laterality(text)[0]
        if view:
            return view, source
    return None, None


def laterality_and_source(ds: pydicom.Dataset | None, path: str | os.PathLike) -> tuple[str | None, str | None]:
    """``(laterality, laterality_source)`` from the file alone: ImageLaterality / Laterality / FrameLaterality
    (``"dicom"``), PatientOrientation, then the SeriesDescription, ProtocolName, PatientID and file name patterns;
    ``(None, None)`` if none (the image-based guess is :func:`read_mammogram`'s)."""
    if ds is not None:
        laterality = dicom_laterality(ds)
        if laterality:
            return laterality, "dicom"
        laterality = orientation_view_laterality(ds.get("PatientOrientation"))[1]
        if laterality:
            return laterality, "PatientOrientation"
    for source, text in _text_sources(ds, path):
        laterality = text_view_laterality(text)[1]
        if laterality:
            return laterality, source
    return None, None


def _valid_spacing(row: float, col: float) -> tuple[float, float] | None:
    """(row, col) mm when both are positive finite numbers; None (unknown) otherwise, e.g. the zeros some exporters
    write."""
    return (float(row), float(col)) if np.isfinite(row) and np.isfinite(col) and row > 0 and col > 0 else None


def _dicom_spacing_and_source(ds: pydicom.Dataset) -> tuple[tuple[float, float] | None, str | None]:
    """((row, col) mm, tag) from PixelSpacing, else ImagerPixelSpacing; (None, None) when neither holds two positive
    numbers.

    PS3.3 (10.7.1.3, C.8.11.7): in projection radiography ImagerPixelSpacing is measured at the detector's front
    plane, and PixelSpacing, when present, is calibrated to the patient (for mammography, ImagerPixelSpacing divided
    by EstimatedRadiographicMagnificationFactor, or a calibration): the standard's precedence is PixelSpacing. When
    only ImagerPixelSpacing is present it is used as it is, not divided by the magnification factor (about 1.1 in
    contact mammography): the archives the models learn from state detector-plane spacing.
    """
    for keyword in ("PixelSpacing", "ImagerPixelSpacing"):
        value = ds.get(keyword)
        if value is not None and len(_multi(value)) == 2:
            try:
                row, col = (float(v) for v in _multi(value))
            except (TypeError, ValueError):
                continue
            spacing = _valid_spacing(row, col)
            if spacing is not None:
                return spacing, keyword
    return None, None


def _dicom_spacing(ds: pydicom.Dataset) -> tuple[float, float] | None:
    return _dicom_spacing_and_source(ds)[0]


def mammography_problem(modality: Any, body_part: Any, sop_class: Any = None) -> str | None:
    """Why a DICOM is not a mammogram, or None when it is one (or cannot be told).

    Accepted: Modality MG; any Modality with BodyPartExamined BREAST (CR mammography systems write Modality CR) or a
    Digital Mammography SOP class; files that state neither a Modality nor a BodyPartExamined (many anonymising
    exports drop both). Refused: everything else, e.g. a CR chest radiograph, a CT slice, or a file without Modality
    whose BodyPartExamined is CHEST.
    """
    modality, body_part, sop_class = _text(modality).upper(), _text(body_part).upper(), _text(sop_class)
    if modality == "MG" or sop_class in MAMMOGRAPHY_SOP_CLASSES:
        return None
    if "BREAST" in body_part or "MAMM" in body_part or (not modality and not body_part):
        return None
    return (
        f"not a mammogram (Modality {modality or '(none)'}, BodyPartExamined {body_part or '(none)'}; accepted: "
        "Modality MG, BodyPartExamined BREAST or a Digital Mammography SOP class); to read it anyway set the "
        "reader's accept_non_mammography option"
    )


# ------------------------------------------------------------------------------------- bounded DICOM reading
# Deflated Explicit VR Little Endian (PS3.5 A.5) compresses the whole dataset after the file meta; pydicom inflates
# it with one zlib.decompress in dcmread, so a few MB can become many GB before any tag is looked at. These files
# are inflated here in chunks instead, reading the image size on the way and stopping at the cap it implies.

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


def _meta_end_and_syntax(path: str | os.PathLike) -> tuple[int, str | None]:
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


def _inflate_dicom(path: str | os.PathLike, header_only: bool, max_pixels: int | None) -> pydicom.Dataset:
    """Read a deflated DICOM, inflating in chunks and refusing past the size its header implies."""
    meta_end, _ = _meta_end_and_syntax(path)
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
                            _check_pixels(path, (rows, cols) if frames == 1 else (frames, rows, cols), max_pixels)
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
                    raise _fail(
                        path,
                        f"deflated DICOM inflates past {cap:,} bytes, more than {size} needs; refused before "
                        "inflating further (a corrupt or hostile file; if it is trusted, raise the reader's "
                        "max_pixels option)",
                    )
                if inflater.eof:
                    break
    except zlib.error as err:
        raise _fail(path, f"corrupt deflated DICOM data (zlib: {err})") from err
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


def _dcmread(
    path: str | os.PathLike, stop_before_pixels: bool, max_pixels: int | None = DEFAULT_MAX_PIXELS
) -> pydicom.Dataset:
    """pydicom's dcmread with its size traps closed: deflated files are inflated with a cap, and the pixel data of
    other files is read only when accessed (``defer_size``), after the caller has checked Rows x Columns."""
    if not Path(path).is_file():
        raise _fail(path, "file not found" if not Path(path).exists() else "not a regular file")
    try:
        _, syntax = _meta_end_and_syntax(path)
    except OSError as err:
        raise _fail(path, f"cannot be read ({type(err).__name__}: {err})") from err
    if syntax == DEFLATED_SYNTAX:
        try:
            return _inflate_dicom(path, stop_before_pixels, max_pixels)
        except MammogramReadError:
            raise
        except MemoryError as err:
            raise _fail(
                path, "out of memory inflating the deflated DICOM (lower the input size or free memory)"
            ) from err
        except Exception as err:
            raise _fail(path, f"not a readable deflated DICOM file ({type(err).__name__}: {err})") from err
    # values over 1 MiB (the pixel data, large private blobs) stay on disk until accessed
    kwargs: dict[str, Any] = {"stop_before_pixels": stop_before_pixels, "defer_size": _MIB}
    try:
        return pydicom.dcmread(path, **kwargs)
    except InvalidDicomError:
        pass  # no preamble/'DICM': some writers omit it; accept only if the content parses as image tags
    except Exception as err:  # truncated or corrupt header
        raise _fail(path, f"not a readable DICOM file ({type(err).__name__}: {err})") from err
    try:
        ds = pydicom.dcmread(path, force=True, **kwargs)
        ok = "Rows" in ds and "Columns" in ds
    except Exception:
        ok = False
    if not ok:
        raise _fail(path, "not a DICOM file (no 'DICM' marker and no image tags)")
    return ds


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


def read_dicom_header(path: str | os.PathLike, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> dict[str, Any]:
    """Header fields for building datalists, without decoding pixels.

    Returns:
        dict with ``filename``, ``patient_id``, ``laterality`` ('L'/'R'/None; tags, PatientOrientation or the text
        patterns, never the pixels) and ``laterality_source``, ``view`` and ``view_source`` (as
        :func:`read_mammogram`), ``study_uid``, ``series_uid``, ``sop_uid``, ``rows``, ``cols``, ``frames``,
        ``modality``, ``body_part`` (BodyPartExamined), ``sop_class``, ``mammography_problem`` (None, or why the
        reader would refuse it as not a mammogram), ``photometric``, ``spacing`` ((row, col) mm or None) and
        ``spacing_source`` ('PixelSpacing' / 'ImagerPixelSpacing'); missing tags are None.
    """
    ds = _dcmread(path, stop_before_pixels=True, max_pixels=max_pixels)

    def opt(keyword: str) -> str | None:
        return _text(ds.get(keyword)) or None

    laterality, laterality_source = laterality_and_source(ds, path)
    view, view_source = view_and_source(ds, path)
    spacing, spacing_source = _dicom_spacing_and_source(ds)
    return {
        "filename": str(path),
        "patient_id": opt("PatientID"),
        "laterality": laterality,
        "laterality_source": laterality_source,
        "view": view,
        "view_source": view_source,
        "study_uid": opt("StudyInstanceUID"),
        "series_uid": opt("SeriesInstanceUID"),
        "sop_uid": opt("SOPInstanceUID"),
        "rows": _int_tag(ds, "Rows"),
        "cols": _int_tag(ds, "Columns"),
        "frames": _int_tag(ds, "NumberOfFrames") or 1,
        "modality": (opt("Modality") or "").upper() or None,
        "body_part": (opt("BodyPartExamined") or "").upper() or None,
        "sop_class": opt("SOPClassUID"),
        "mammography_problem": mammography_problem(
            ds.get("Modality"), ds.get("BodyPartExamined"), ds.get("SOPClassUID")
        ),
        "photometric": opt("PhotometricInterpretation"),
        "spacing": spacing,
        "spacing_source": spacing_source,
    }


def _padding_mask(ds: pydicom.Dataset, raw: np.ndarray) -> np.ndarray | None:
    """Stored pixels that PixelPaddingValue (up to PixelPaddingRangeLimit) marks as outside the image: CR systems
    pad the unexposed border with it, and a MONOCHROME1 padding of 0 would otherwise invert to a white frame."""
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


def _read_dicom(
    path: str | os.PathLike, apply_voi: bool, mask: bool, accept_non_mammography: bool, max_pixels: int | None
) -> tuple[np.ndarray, dict[str, Any]]:
    ds = _dcmread(path, stop_before_pixels=False, max_pixels=max_pixels)
    if not any(k in ds for k in ("PixelData", "FloatPixelData", "DoubleFloatPixelData")):
        raise _fail(path, "DICOM file has no pixel data")
    frames = _int_tag(ds, "NumberOfFrames", 1) or 1
    rows, cols = _int_tag(ds, "Rows", 0) or 0, _int_tag(ds, "Columns", 0) or 0
    # before pydicom allocates the decoded array (its pixel data is deferred, or bounded by the inflation cap)
    _check_pixels(path, (rows, cols) if frames == 1 else (frames, rows, cols), max_pixels)
    if not mask and not accept_non_mammography:
        problem = mammography_problem(ds.get("Modality"), ds.get("BodyPartExamined"), ds.get("SOPClassUID"))
        if problem:
            raise _fail(path, problem)
    if frames > 1:
        raise _fail(path, f"{frames} frames; {OUT_OF_SCOPE_3D}")
    samples = int(ds.get("SamplesPerPixel", 1) or 1)
    photometric = _text(ds.get("PhotometricInterpretation")).upper()
    if samples != 1:
        raise _fail(path, f"{samples} samples per pixel ({photometric}); mammograms must be single-channel grayscale")
    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    try:
        raw = ds.pixel_array
    except MemoryError as err:
        raise _fail(path, f"out of memory decoding {rows} x {cols} pixels (free memory or read it elsewhere)") from err
    except Exception as err:
        name = getattr(syntax, "name", syntax)
        hint = ""
        if getattr(syntax, "is_compressed", False):
            hint = "; compressed DICOM needs pylibjpeg, pylibjpeg-libjpeg, pylibjpeg-openjpeg and pylibjpeg-rle"
        raise _fail(
            path, f"cannot decode pixel data (transfer syntax {name}: {type(err).__name__}: {err}){hint}"
        ) from err
    if raw.ndim != 2:
        raise _fail(path, f"pixel data of shape {raw.shape}; {OUT_OF_SCOPE_3D}")
    if mask:
        arr = raw.astype(np.float32)
    else:
        try:
            arr = apply_modality_lut(raw, ds)
            if apply_voi and ("VOILUTSequence" in ds or "WindowCenter" in ds):
                arr = apply_voi_lut(arr, ds, index=0)
            arr = np.asarray(arr, dtype=np.float64)
        except MemoryError as err:
            raise _fail(path, f"out of memory applying the intensity LUTs to {rows} x {cols} pixels") from err
        except Exception as err:
            raise _fail(path, f"invalid Modality/VOI LUT ({type(err).__name__}: {err})") from err
        padding = _padding_mask(ds, raw)
        kept = arr if padding is None or padding.all() else arr[~padding]
        if photometric == "MONOCHROME1":
            # after the VOI: the window's output is inverted, so the saturated (highest) background becomes 0
            arr = kept.max() - arr
        if padding is not None:
            arr[padding] = 0  # outside the exposed field: background, whatever value the padding had
        arr = arr.astype(np.float32)
    laterality, laterality_source = laterality_and_source(ds, path)
    view, view_source = view_and_source(ds, path)
    spacing, spacing_source = _dicom_spacing_and_source(ds)
    meta = {
        "format": "dicom",
        "laterality": laterality,
        "laterality_source": laterality_source,
        "view": view,
        "view_source": view_source,
        "patient_id": _text(ds.get("PatientID")) or None,
        "spacing": spacing,
        "spacing_source": spacing_source,
        "modality": _text(ds.get("Modality")).upper() or None,
        "body_part": _text(ds.get("BodyPartExamined")).upper() or None,
        "photometric": photometric or None,
        "study_uid": _text(ds.get("StudyInstanceUID")) or None,
        "series_uid": _text(ds.get("SeriesInstanceUID")) or None,
        "sop_uid": _text(ds.get("SOPInstanceUID")) or None,
        "transfer_syntax": _transfer_syntax(ds),
    }
    return arr, meta


# ------------------------------------------------------------------------------------------ other formats


def _squeeze_to_2d(path: str | os.PathLike, arr: np.ndarray, channel_axis: int | None = None) -> np.ndarray:
    if channel_axis is not None and arr.ndim == 3 and arr.shape[channel_axis] > 1:
        raise _fail(path, f"{arr.shape[channel_axis]} channels; mammograms and masks must be single-channel grayscale")
    if arr.ndim > 2:
        arr = arr.reshape([s for s in arr.shape if s != 1] or [1])
    if arr.ndim != 2:
        raise _fail(path, f"array of shape {arr.shape}; {OUT_OF_SCOPE_3D}")
    return arr


def _affine_4x4(affine: np.ndarray | None) -> np.ndarray | None:
    """2-D readers give 3x3 (ITK, NRRD) or 4x4 (NIfTI) affines; MONAI's 2-D convention is 4x4."""
    return None if affine is None else to_affine_nd(3, np.asarray(affine, dtype=np.float64))


def _swap_xy(affine: np.ndarray | None) -> np.ndarray | None:
    """Affine of a transposed 2-D array: the first two voxel axes swap."""
    if affine is None:
        return None
    out = np.array(_affine_4x4(affine), dtype=np.float64, copy=True)
    out[:, [0, 1]] = out[:, [1, 0]]
    return out


def _spacing_from_affine(affine: np.ndarray | None) -> tuple[float, float] | None:
    if affine is None:
        return None
    a = np.asarray(affine, dtype=np.float64)
    rank = a.shape[0] - 1
    return _valid_spacing(np.linalg.norm(a[:rank, 0]), np.linalg.norm(a[:rank, 1]))


def _png_spacing(img: Any) -> tuple[float, float] | None:
    """(row, col) mm from a PNG's pHYs chunk in pixels per metre (PIL reports it as dpi, ``px * 0.0254``); None when
    absent, in unknown units, or 72 / 96 dpi: image editors write those by default, they say nothing of a detector."""
    dpi = img.info.get("dpi") if img.format == "PNG" else None
    ppm = [round(float(v) / 0.0254) for v in dpi] if dpi and len(dpi) == 2 else []
    if len(ppm) != 2 or min(ppm) < 1 or set(ppm) <= {2835, 3780}:
        return None
    return _valid_spacing(1000.0 / ppm[1], 1000.0 / ppm[0])  # pHYs is x (columns) first


def _read_pil(path: str | os.PathLike, max_pixels: int | None) -> tuple[np.ndarray, dict[str, Any]]:
    reader = PILReader(reverse_indexing=False)
    try:
        img = reader.read(str(path))
    except FileNotFoundError:
        raise _fail(path, "file not found") from None
    except Exception as err:
        raise _fail(path, f"not a readable image ({type(err).__name__}: {err})") from err
    try:
        if getattr(img, "n_frames", 1) > 1:
            raise _fail(path, f"{img.n_frames} frames; {OUT_OF_SCOPE_3D}")
        _check_pixels(path, (img.size[1], img.size[0]), max_pixels)  # PIL opens lazily: nothing decoded yet
        if img.mode not in GRAYSCALE_PIL_MODES:
            raise _fail(
                path, f"image mode {img.mode} ({len(img.getbands())} channels); it must be single-channel grayscale"
            )
        try:
            arr, _ = reader.get_data(img)
        except Exception as err:  # truncated or corrupt data surfaces only when decoding
            raise _fail(path, f"cannot decode image data, truncated or corrupt ({type(err).__name__}: {err})") from err
        spacing = _png_spacing(img)
    finally:
        img.close()
    return _squeeze_to_2d(path, np.asarray(arr)), {
        "format": "png" if _suffix(path) == ".png" else "pil",
        "spacing": spacing,
        "spacing_source": "pHYs" if spacing else None,
    }


def _read_nifti(path: str | os.PathLike, max_pixels: int | None) -> tuple[np.ndarray, dict[str, Any]]:
    reader = NibabelReader()
    try:
        img = reader.read(str(path))  # nibabel reads the header only; the data stays on disk until get_data
        _check_pixels(path, img.shape, max_pixels)
        arr, header = reader.get_data(img)
    except FileNotFoundError:
        raise _fail(path, "file not found") from None
    except MammogramReadError:
        raise
    except Exception as err:
        raise _fail(path, f"not a readable NIfTI file ({type(err).__name__}: {err})") from err
    arr = _squeeze_to_2d(path, np.asarray(arr))
    affine = _swap_xy(header.get("affine"))
    spacing = _spacing_from_affine(affine)
    return arr.T, {
        "format": "nifti",
        "affine": affine,
        "spacing": spacing,
        "spacing_source": "affine" if spacing else None,
    }


def _metaimage_dims(path: str | os.PathLike) -> list[int] | None:
    """DimSize of a MetaImage (.mha/.mhd) from its text header, None when absent or unreadable (ITK then decides)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64 * 1024)
    except OSError:
        return None
    for line in head.split(b"\n"):
        key, _, value = line.partition(b"=")
        if key.strip() == b"DimSize":
            try:
                return [int(v) for v in value.split()]
            except ValueError:
                return None
        if key.strip() == b"ElementDataFile":
            break
    return None


def _read_itk(path: str | os.PathLike, max_pixels: int | None) -> tuple[np.ndarray, dict[str, Any]]:
    reader = ITKReader(reverse_indexing=True)
    dims = _metaimage_dims(path)
    if dims:  # ITK allocates the whole image in read()
        _check_pixels(path, dims, max_pixels)
    try:
        img = reader.read(str(path))
        if img.GetNumberOfComponentsPerPixel() != 1:
            raise _fail(path, f"{img.GetNumberOfComponentsPerPixel()} channels; it must be single-channel grayscale")
        arr, header = reader.get_data(img)
        arr = np.array(arr, copy=True)  # ITK hands out a view of its buffer, freed with `img`
    except MammogramReadError:
        raise
    except Exception as err:
        raise _fail(path, f"not a readable ITK image ({type(err).__name__}: {err})") from err
    arr = _squeeze_to_2d(path, np.asarray(arr))
    affine = _swap_xy(header.get("affine"))
    spacing = _spacing_from_affine(affine)
    return arr, {"format": "itk", "affine": affine, "spacing": spacing, "spacing_source": "affine" if spacing else None}


def _read_nrrd(path: str | os.PathLike, max_pixels: int | None) -> tuple[np.ndarray, dict[str, Any]]:
    # pynrrd directly: MONAI's NrrdReader requires a "space directions" field that plain NRRD files omit
    try:
        sizes = nrrd.read_header(str(path)).get("sizes")
        if sizes is not None:
            _check_pixels(path, [int(v) for v in sizes], max_pixels)
        arr, header = nrrd.read(str(path), index_order="C")
    except MammogramReadError:
        raise
    except Exception as err:
        raise _fail(path, f"not a readable NRRD file ({type(err).__name__}: {err})") from err
    arr = _squeeze_to_2d(path, np.asarray(arr))
    spacing = None
    directions = header.get("space directions")
    if directions is not None:
        vectors = [np.asarray(v, dtype=np.float64) for v in directions if v is not None and np.all(np.isfinite(v))]
        if len(vectors) >= 2:  # header order is x (column) first
            spacing = _valid_spacing(np.linalg.norm(vectors[1]), np.linalg.norm(vectors[0]))
    elif header.get("spacings") is not None and len(header["spacings"]) >= 2:
        sx, sy = (float(v) for v in header["spacings"][:2])
        spacing = _valid_spacing(sy, sx)
    return arr, {"format": "nrrd", "spacing": spacing, "spacing_source": "nrrd" if spacing else None}


def _load(
    path: str | os.PathLike,
    *,
    mask: bool,
    apply_voi: bool,
    infer_laterality: bool,
    allow_empty: bool,
    accept_non_mammography: bool = False,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> tuple[np.ndarray, dict[str, Any]]:
    """The (H, W) float32 array and the public metadata (None for unknown values)."""
    if not Path(path).exists():
        raise _fail(path, "file not found")
    if not Path(path).is_file():
        raise _fail(path, "not a regular file (DICOM series folders are not read: one 2-D image per file)")
    fmt = _format_of(path)
    try:
        if fmt == "dicom":
            arr, meta = _read_dicom(path, apply_voi, mask, accept_non_mammography, max_pixels)
        else:
            try:
                read = {"pil": _read_pil, "nifti": _read_nifti, "itk": _read_itk, "nrrd": _read_nrrd}[fmt]
                arr, meta = read(path, max_pixels)
            except (zlib.error, EOFError, SyntaxError) as err:  # PIL/nibabel decoding errors outside their wrappers
                raise _fail(path, f"truncated or corrupt file ({type(err).__name__}: {err})") from err
            laterality, laterality_source = laterality_and_source(None, path)
            view, view_source = view_and_source(None, path)
            meta.update(
                laterality=laterality,
                laterality_source=laterality_source,
                view=view,
                view_source=view_source,
                patient_id=None,
                photometric=None,
                modality=None,
                body_part=None,
            )
    except MemoryError as err:
        raise _fail(path, f"out of memory reading the image (its decoded-size cap is max_pixels={max_pixels})") from err
    arr = np.asarray(arr, dtype=np.float32)
    if min(arr.shape) < 2:
        raise _fail(path, f"image of shape {arr.shape} is not a 2-D picture")
    if not np.isfinite(arr).all():
        raise _fail(path, "image contains NaN or infinite values")
    if not allow_empty and not arr.any():
        raise _fail(path, "all pixels are zero (blank image)")
    if not mask and meta["laterality"] is None and infer_laterality and arr.any():
        # imported here: the transforms package imports this module for its pipeline
        from scripts.transforms.mammo.breast import chest_wall_side

        # unflipped display convention (the authors' horizontal_flip="NO"): a left breast's chest wall is on the left
        meta["laterality"] = "L" if chest_wall_side(arr) == "left" else "R"
        meta["laterality_source"] = "image"
    meta["filename"] = str(path)
    meta["shape"] = tuple(int(s) for s in arr.shape)
    return np.ascontiguousarray(arr), meta


def read_mammogram(
    path: str | os.PathLike,
    *,
    mask: bool = False,
    apply_voi: bool = True,
    infer_laterality: bool = True,
    allow_empty: bool | None = None,
    accept_non_mammography: bool = False,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Read one 2-D mammogram or mask in any supported format.

    Args:
        path: file to read (suffix decides the format; DICOM/PNG/TIFF/NRRD without a suffix are sniffed).
        mask: read a mask: raw stored values (no LUTs, no inversion), no laterality inference, all-zero allowed.
        apply_voi: apply a DICOM VOI LUT or window when present.
        infer_laterality: when neither the tags, PatientOrientation nor the text patterns state the laterality,
            infer it from the side of the chest wall (``laterality_source`` says ``"image"``).
        allow_empty: accept an all-zero array (default: only for masks).
        accept_non_mammography: read DICOMs that are not mammograms (see :func:`mammography_problem`); masks are
            never refused for their modality.
        max_pixels: decoded-size cap, checked from the header before any pixel buffer exists (DICOM Rows x Columns x
            frames, NIfTI / MetaImage / NRRD dimensions, PIL's size); default :data:`DEFAULT_MAX_PIXELS`, PIL's
            decompression-bomb limit; None: no cap.

    Returns:
        ``(array, meta)``: array ``(H, W)`` float32; meta with ``filename``, ``format``, ``shape``, ``laterality``
        ('L'/'R'/None) and ``laterality_source`` ('dicom', 'PatientOrientation', 'SeriesDescription',
        'ProtocolName', 'PatientID', 'filename', 'image' or None), ``view`` ('CC'/'MLO'/other/None) and
        ``view_source`` ('ViewPosition', 'ViewCodeSequence', 'PatientOrientation', 'SeriesDescription',
        'ProtocolName', 'PatientID', 'filename' or None), ``patient_id``, ``spacing`` ((row, col) mm or None) and
        ``spacing_source`` ('PixelSpacing', 'ImagerPixelSpacing', 'affine' (NIfTI / ITK), 'nrrd', 'pHYs' or None),
        ``modality`` and ``body_part`` (DICOM Modality / BodyPartExamined, upper case; None when absent or not
        DICOM), ``photometric`` (DICOM only, else None), and for DICOM the study/series/SOP UIDs and transfer syntax.

    Raises:
        MammogramReadError: missing, unreadable, truncated, non-grayscale, multi-frame/3-D, all-zero, not a mammogram
        or larger than ``max_pixels``.
    """
    return _load(
        path,
        mask=mask,
        apply_voi=apply_voi,
        infer_laterality=infer_laterality,
        allow_empty=mask if allow_empty is None else allow_empty,
        accept_non_mammography=accept_non_mammography,
        max_pixels=max_pixels,
    )


class _Pending:
    """What :meth:`MammogramReader.read` hands to ``get_data``: decoding is deferred so that errors surface
    from ``get_data``, which MONAI's LoadImage does not swallow (it retries other readers after ``read``)."""

    def __init__(self, path: str):
        self.path = path


class MammogramReader(ImageReader):
    """MONAI ``ImageReader`` for 2-D mammograms and masks in every supported format, in the ``(1, H, W)``
    convention.

    Use it with ``LoadImaged(keys, reader=MammogramReader())`` (in a bundle config
    ``"reader": {"_target_": "scripts.data.readers.MammogramReader"}``). The data comes back channel-first,
    ``(1, H, W)``, with ``original_channel_dim = 0`` so ``ensure_channel_first`` is a no-op either way.
    Metadata (``MetaTensor.meta``): ``filename``, ``format``, ``laterality`` ('L'/'R'/''),
    ``laterality_source``, ``view`` ('' if unknown), ``view_source``, ``patient_id``, ``photometric``,
    ``spacing`` ((row, col) mm, NaN if unknown), ``spacing_source``, ``modality``, ``body_part``, ``spatial_shape``
    (H, W), ``affine``; the values are :func:`read_mammogram`'s, with ``''`` instead of None so that batches collate.

    Args:
        mask: read masks (raw values, all-zero allowed, no laterality inference, no modality check).
        apply_voi: apply a DICOM VOI LUT / window when present.
        infer_laterality: infer laterality from the image when the file states none.
        allow_empty: accept all-zero arrays (default: only for masks).
        accept_non_mammography: read DICOMs that are not mammograms (default: refused with the reason).
        max_pixels: decoded-size cap in pixels (default :data:`DEFAULT_MAX_PIXELS`; None: no cap).
    """

    def __init__(
        self,
        mask: bool = False,
        apply_voi: bool = True,
        infer_laterality: bool = True,
        allow_empty: bool | None = None,
        accept_non_mammography: bool = False,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
    ) -> None:
        super().__init__()
        self.mask = mask
        self.apply_voi = apply_voi
        self.infer_laterality = infer_laterality
        self.allow_empty = mask if allow_empty is None else allow_empty
        self.accept_non_mammography = accept_non_mammography
        self.max_pixels = max_pixels

    def verify_suffix(self, filename: Sequence[str | os.PathLike] | str | os.PathLike) -> bool:
        """Known suffixes, and suffix-less files (DICOM folders export those), are accepted."""
        return all(_suffix(f) in SUPPORTED_SUFFIXES or _suffix(f) == "" for f in ensure_tuple(filename))

    def read(self, data: Sequence[str | os.PathLike] | str | os.PathLike, **kwargs: Any) -> _Pending:
        names = ensure_tuple(data)
        if len(names) != 1:
            raise ValueError(f"MammogramReader reads one 2-D image at a time, got {len(names)} files: {names}")
        return _Pending(str(names[0]))

    def get_data(self, img: _Pending) -> tuple[np.ndarray, dict]:
        arr, meta = _load(
            img.path,
            mask=self.mask,
            apply_voi=self.apply_voi,
            infer_laterality=self.infer_laterality,
            allow_empty=self.allow_empty,
            accept_non_mammography=self.accept_non_mammography,
            max_pixels=self.max_pixels,
        )
        spacing = meta.get("spacing")
        affine = meta.get("affine")
        if affine is None:
            sr, sc = spacing if spacing else (1.0, 1.0)
            affine = np.diag([sr, sc, 1.0, 1.0])
        out = {
            "filename": meta["filename"],
            "format": meta["format"],
            "laterality": meta["laterality"] or "",
            "laterality_source": meta["laterality_source"] or "",
            "view": meta["view"] or "",
            "view_source": meta["view_source"] or "",
            "patient_id": meta["patient_id"] or "",
            "photometric": meta["photometric"] or "",
            "spacing": np.asarray(spacing if spacing else (np.nan, np.nan), dtype=np.float64),
            "spacing_source": meta["spacing_source"] or "",
            "modality": meta["modality"] or "",
            "body_part": meta["body_part"] or "",
            "affine": np.asarray(affine, dtype=np.float64),
            "original_affine": np.asarray(affine, dtype=np.float64),
            "spatial_shape": np.asarray(arr.shape),
            "original_channel_dim": 0,
        }
        return arr[None], out
