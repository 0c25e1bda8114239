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
background becomes 0, which the authors' crop (pixels > 0) needs. Compressed transfer syntaxes decode through
pydicom's plugins (pylibjpeg, pylibjpeg-libjpeg, pylibjpeg-openjpeg, pylibjpeg-rle).

Works with pydicom 2.4 and 3.x and numpy 1.26 and 2.x.
"""

from __future__ import annotations

import os
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

try:  # pydicom >= 3
    from pydicom.pixels import apply_modality_lut, apply_voi_lut
except ImportError:  # pydicom 2.x
    from pydicom.pixel_data_handlers.util import apply_modality_lut, apply_voi_lut

__all__ = [
    "MammogramReadError",
    "MammogramReader",
    "SUPPORTED_SUFFIXES",
    "dicom_laterality",
    "dicom_view",
    "read_dicom_header",
    "read_mammogram",
]

DICOM_SUFFIXES = (".dcm", ".dicom", ".dic")
PIL_SUFFIXES = (".png", ".tif", ".tiff", ".jpg", ".jpeg")
NIFTI_SUFFIXES = (".nii", ".nii.gz")
ITK_SUFFIXES = (".mha", ".mhd")
NRRD_SUFFIXES = (".nrrd",)
SUPPORTED_SUFFIXES = DICOM_SUFFIXES + PIL_SUFFIXES + NIFTI_SUFFIXES + ITK_SUFFIXES + NRRD_SUFFIXES

OUT_OF_SCOPE_3D = "tomosynthesis / multi-frame inputs are out of scope (expected one 2-D image)"
GRAYSCALE_PIL_MODES = frozenset({"1", "L", "I", "F", "I;16", "I;16L", "I;16B", "I;16N"})

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


def _valid_spacing(row: float, col: float) -> tuple[float, float] | None:
    """(row, col) mm when both are positive finite numbers; None (unknown) otherwise, e.g. the zeros some exporters
    write."""
    return (float(row), float(col)) if np.isfinite(row) and np.isfinite(col) and row > 0 and col > 0 else None


def _dicom_spacing(ds: pydicom.Dataset) -> tuple[float, float] | None:
    """(row, col) mm from PixelSpacing, else ImagerPixelSpacing; None when neither holds two positive numbers."""
    for keyword in ("PixelSpacing", "ImagerPixelSpacing"):
        value = ds.get(keyword)
        if value is not None and len(value) == 2:
            try:
                row, col = float(value[0]), float(value[1])
            except (TypeError, ValueError):
                continue
            if _valid_spacing(row, col) is not None:
                return row, col
    return None


def _dcmread(path: str | os.PathLike, stop_before_pixels: bool) -> pydicom.Dataset:
    if not Path(path).is_file():
        raise _fail(path, "file not found" if not Path(path).exists() else "not a regular file")
    try:
        return pydicom.dcmread(path, stop_before_pixels=stop_before_pixels)
    except InvalidDicomError:
        pass  # no preamble/'DICM': some writers omit it; accept only if the content parses as image tags
    except Exception as err:  # truncated or corrupt header
        raise _fail(path, f"not a readable DICOM file ({type(err).__name__}: {err})") from err
    try:
        ds = pydicom.dcmread(path, stop_before_pixels=stop_before_pixels, force=True)
        ok = "Rows" in ds and "Columns" in ds
    except Exception:
        ok = False
    if not ok:
        raise _fail(path, "not a DICOM file (no 'DICM' marker and no image tags)")
    return ds


def read_dicom_header(path: str | os.PathLike) -> dict[str, Any]:
    """Header fields for building datalists, without decoding pixels.

    Returns:
        dict with ``filename``, ``patient_id``, ``laterality`` ('L'/'R'/None, tags only), ``view``,
        ``study_uid``, ``series_uid``, ``sop_uid``, ``rows``, ``cols``, ``frames``, ``modality``,
        ``photometric``, ``spacing`` ((row, col) mm or None); missing tags are None.
    """
    ds = _dcmread(path, stop_before_pixels=True)

    def opt(keyword: str) -> str | None:
        return _text(ds.get(keyword)) or None

    def opt_int(keyword: str) -> int | None:
        value = ds.get(keyword)
        try:
            return None if value is None or value == "" else int(value)
        except (TypeError, ValueError):
            return None

    return {
        "filename": str(path),
        "patient_id": opt("PatientID"),
        "laterality": dicom_laterality(ds),
        "view": dicom_view(ds),
        "study_uid": opt("StudyInstanceUID"),
        "series_uid": opt("SeriesInstanceUID"),
        "sop_uid": opt("SOPInstanceUID"),
        "rows": opt_int("Rows"),
        "cols": opt_int("Columns"),
        "frames": opt_int("NumberOfFrames") or 1,
        "modality": opt("Modality"),
        "photometric": opt("PhotometricInterpretation"),
        "spacing": _dicom_spacing(ds),
    }


def _read_dicom(path: str | os.PathLike, apply_voi: bool, mask: bool) -> tuple[np.ndarray, dict[str, Any]]:
    ds = _dcmread(path, stop_before_pixels=False)
    if not any(k in ds for k in ("PixelData", "FloatPixelData", "DoubleFloatPixelData")):
        raise _fail(path, "DICOM file has no pixel data")
    frames = ds.get("NumberOfFrames")
    try:
        frames = int(frames) if frames not in (None, "") else 1
    except (TypeError, ValueError):
        frames = 1
    if frames > 1:
        raise _fail(path, f"{frames} frames; {OUT_OF_SCOPE_3D}")
    samples = int(ds.get("SamplesPerPixel", 1) or 1)
    photometric = _text(ds.get("PhotometricInterpretation")).upper()
    if samples != 1:
        raise _fail(path, f"{samples} samples per pixel ({photometric}); mammograms must be single-channel grayscale")
    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    try:
        raw = ds.pixel_array
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
        except Exception as err:
            raise _fail(path, f"invalid Modality/VOI LUT ({type(err).__name__}: {err})") from err
        arr = np.asarray(arr, dtype=np.float64)
        if photometric == "MONOCHROME1":
            arr = arr.max() - arr
        arr = arr.astype(np.float32)
    meta = {
        "format": "dicom",
        "laterality": dicom_laterality(ds),
        "laterality_source": None,
        "view": dicom_view(ds),
        "patient_id": _text(ds.get("PatientID")) or None,
        "spacing": _dicom_spacing(ds),
        "photometric": photometric or None,
        "study_uid": _text(ds.get("StudyInstanceUID")) or None,
        "series_uid": _text(ds.get("SeriesInstanceUID")) or None,
        "sop_uid": _text(ds.get("SOPInstanceUID")) or None,
        "transfer_syntax": str(syntax) if syntax else None,
    }
    if meta["laterality"]:
        meta["laterality_source"] = "dicom"
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


def _read_pil(path: str | os.PathLike) -> tuple[np.ndarray, dict[str, Any]]:
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
    }


def _read_nifti(path: str | os.PathLike) -> tuple[np.ndarray, dict[str, Any]]:
    reader = NibabelReader()
    try:
        arr, header = reader.get_data(reader.read(str(path)))
    except FileNotFoundError:
        raise _fail(path, "file not found") from None
    except Exception as err:
        raise _fail(path, f"not a readable NIfTI file ({type(err).__name__}: {err})") from err
    arr = _squeeze_to_2d(path, np.asarray(arr))
    affine = _swap_xy(header.get("affine"))
    return arr.T, {"format": "nifti", "affine": affine, "spacing": _spacing_from_affine(affine)}


def _read_itk(path: str | os.PathLike) -> tuple[np.ndarray, dict[str, Any]]:
    reader = ITKReader(reverse_indexing=True)
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
    return arr, {"format": "itk", "affine": affine, "spacing": _spacing_from_affine(affine)}


def _read_nrrd(path: str | os.PathLike) -> tuple[np.ndarray, dict[str, Any]]:
    # pynrrd directly: MONAI's NrrdReader requires a "space directions" field that plain NRRD files omit
    try:
        arr, header = nrrd.read(str(path), index_order="C")
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
    return arr, {"format": "nrrd", "spacing": spacing}


def _load(
    path: str | os.PathLike, *, mask: bool, apply_voi: bool, infer_laterality: bool, allow_empty: bool
) -> tuple[np.ndarray, dict[str, Any]]:
    """The (H, W) float32 array and the public metadata (None for unknown values)."""
    if not Path(path).exists():
        raise _fail(path, "file not found")
    if not Path(path).is_file():
        raise _fail(path, "not a regular file (DICOM series folders are not read: one 2-D image per file)")
    fmt = _format_of(path)
    if fmt == "dicom":
        arr, meta = _read_dicom(path, apply_voi=apply_voi, mask=mask)
    else:
        try:
            arr, meta = {"pil": _read_pil, "nifti": _read_nifti, "itk": _read_itk, "nrrd": _read_nrrd}[fmt](path)
        except (zlib.error, EOFError, SyntaxError) as err:  # PIL/nibabel decoding errors outside their wrappers
            raise _fail(path, f"truncated or corrupt file ({type(err).__name__}: {err})") from err
        meta.update(laterality=None, laterality_source=None, view=None, patient_id=None, photometric=None)
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
) -> tuple[np.ndarray, dict[str, Any]]:
    """Read one 2-D mammogram or mask in any supported format.

    Args:
        path: file to read (suffix decides the format; DICOM/PNG/TIFF/NRRD without a suffix are sniffed).
        mask: read a mask: raw stored values (no LUTs, no inversion), no laterality inference, all-zero allowed.
        apply_voi: apply a DICOM VOI LUT or window when present.
        infer_laterality: when no DICOM laterality tag exists, infer it from the side of the chest wall
            (``laterality_source`` says ``"image"``).
        allow_empty: accept an all-zero array (default: only for masks).

    Returns:
        ``(array, meta)``: array ``(H, W)`` float32; meta with ``filename``, ``format``, ``shape``, ``laterality``
        ('L'/'R'/None), ``laterality_source`` ('dicom'/'image'/None), ``view`` ('CC'/'MLO'/other/None),
        ``patient_id``, ``spacing`` ((row, col) mm or None; DICOM PixelSpacing / ImagerPixelSpacing, NIfTI / ITK
        affine, NRRD header, PNG pHYs), ``photometric`` (DICOM only, else None), and for DICOM the study/series/SOP
        UIDs and transfer syntax.

    Raises:
        MammogramReadError: missing, unreadable, truncated, non-grayscale, multi-frame/3-D or all-zero input.
    """
    return _load(
        path,
        mask=mask,
        apply_voi=apply_voi,
        infer_laterality=infer_laterality,
        allow_empty=mask if allow_empty is None else allow_empty,
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
    ``laterality_source`` ('dicom'/'image'/''), ``view`` ('' if unknown), ``patient_id``, ``photometric``,
    ``spacing`` ((row, col) mm, NaN if unknown), ``spatial_shape`` (H, W), ``affine``. Unknown strings are
    ``''`` rather than None so that batches collate.

    Args:
        mask: read masks (raw values, all-zero allowed, no laterality inference).
        apply_voi: apply a DICOM VOI LUT / window when present.
        infer_laterality: infer laterality from the image when the file has no tag.
        allow_empty: accept all-zero arrays (default: only for masks).
    """

    def __init__(
        self,
        mask: bool = False,
        apply_voi: bool = True,
        infer_laterality: bool = True,
        allow_empty: bool | None = None,
    ) -> None:
        super().__init__()
        self.mask = mask
        self.apply_voi = apply_voi
        self.infer_laterality = infer_laterality
        self.allow_empty = mask if allow_empty is None else allow_empty

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
            "patient_id": meta["patient_id"] or "",
            "photometric": meta["photometric"] or "",
            "spacing": np.asarray(spacing if spacing else (np.nan, np.nan), dtype=np.float64),
            "affine": np.asarray(affine, dtype=np.float64),
            "original_affine": np.asarray(affine, dtype=np.float64),
            "spatial_shape": np.asarray(arr.shape),
            "original_channel_dim": 0,
        }
        return arr[None], out
