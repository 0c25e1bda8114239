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
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nrrd
import numpy as np
from monai.data import ImageReader, ITKReader, NibabelReader, PILReader
from monai.data.utils import to_affine_nd
from monai.utils import ensure_tuple

from ..errors import UsageError
from .dicom_files import read_dicom as _read_dicom
from .dicom_files import read_dicom_header
from .errors import DEFAULT_MAX_PIXELS, OUT_OF_SCOPE_3D, MammogramReadError, check_pixels, read_error
from .geometry import chest_wall_side
from .header_facts import (
    MAMMOGRAPHY_SOP_CLASSES,
    dicom_laterality,
    dicom_view,
    laterality_and_source,
    mammography_problem,
    orientation_view_laterality,
    text_view_laterality,
    valid_spacing,
    view_and_source,
)
from .header_facts import file_suffix as _suffix

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "MAMMOGRAPHY_SOP_CLASSES",
    "MammogramReadError",
    "MammogramReader",
    "NotAMammogram",
    "SUPPORTED_SUFFIXES",
    "dicom_laterality",
    "dicom_view",
    "file_format",
    "mammography_problem",
    "not_a_mammogram",
    "pixel_kind_problem",
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

GRAYSCALE_PIL_MODES = frozenset({"1", "L", "I", "F", "I;16", "I;16L", "I;16B", "I;16N"})
#: the plausible pixel sizes of a mammogram, mm (a stated spacing outside them says nothing of the file's extent)
_PLAUSIBLE_SPACING_MM = (0.02, 1.0)
# an image whose long side times this is under the model window's is a thumbnail; likewise in mm, with this
_THUMBNAIL_FACTOR, _EXTENT_FRACTION = 5, 3


class NotAMammogram(MammogramReadError):
    """An input that is skipped because it is not a mammogram: no image at all, a binary image (a lesion mask), or
    one too small to hold a breast at the model's scale (a thumbnail). Inference lists it in errors.csv, not scored."""


def not_a_mammogram(path: str | os.PathLike, problem: str) -> NotAMammogram:
    """The :class:`NotAMammogram` of ``path``: ``"<path>: skipped, not a mammogram: <problem>"``."""
    return NotAMammogram(f"{path}: skipped, not a mammogram: {problem}", path=path, problem=problem)


def pixel_kind_problem(
    arr: np.ndarray,
    spacing: Sequence[float] | None = None,
    window: Sequence[int] | None = None,
    model_spacing: float | None = None,
) -> str | None:
    """Why the pixels ``arr`` (H, W) are not a mammogram, or None.

    An X-ray has hundreds to thousands of grey levels (8- to 16-bit): an image of at most two values is a mask or a
    drawing. A mammogram is 1000 px and more on its long side at 0.05-0.2 mm (18 x 24 cm detectors and larger), and
    a model's ``window`` (rows, cols) at its ``model_spacing`` (mm) holds a whole breast: an image whose long side is
    under a fifth of the window's (its breast would be enlarged more than 5 times), or, when the file states a
    plausible ``spacing`` (row, col mm) and the model has one, covers under a third of the window's long side in mm,
    is a thumbnail or a detail (None: not checked)."""
    lo, hi = float(arr.min()), float(arr.max())
    if not np.any((arr != lo) & (arr != hi)):
        values = f"{lo:g}" if lo == hi else f"{lo:g} and {hi:g}"
        return f"its pixels take {1 + (hi != lo)} value(s) only ({values}): a mask or a drawing, not an X-ray"
    if window is None:
        return None
    rows, cols = (int(v) for v in arr.shape[-2:])
    window_long = max(int(v) for v in window)
    if max(rows, cols) * _THUMBNAIL_FACTOR < window_long:
        return (
            f"{rows} x {cols} px: its long side is under a fifth of the model's {window_long} px window (the breast "
            f"would be enlarged more than {_THUMBNAIL_FACTOR} times): a thumbnail"
        )
    low, high = _PLAUSIBLE_SPACING_MM
    stated = spacing is not None and len(spacing) == 2 and all(low <= float(s) <= high for s in spacing)
    if model_spacing is not None and stated:
        long_mm = max(rows * float(spacing[0]), cols * float(spacing[1]))
        window_mm = window_long * float(model_spacing)
        if long_mm * _EXTENT_FRACTION < window_mm:
            return (
                f"{rows} x {cols} px at the stated {float(spacing[0]):g} x {float(spacing[1]):g} mm covers "
                f"{long_mm:.0f} mm on its long side, under a third of the model's {window_mm:.0f} mm window: a "
                "thumbnail or a detail"
            )
    return None


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
        raise read_error(
            path, f"unsupported file type {suffix or '(no suffix)'}; supported: {', '.join(SUPPORTED_SUFFIXES)}"
        )
    return sniffed


def file_format(path: str | os.PathLike) -> str | None:
    """The reader a file goes to: ``"dicom"``, ``"pil"``, ``"nifti"``, ``"itk"`` or ``"nrrd"``, by its suffix, else by
    its first bytes; None for a file of neither (what the MONAI Label app checks headers by)."""
    try:
        return _format_of(path)
    except MammogramReadError:
        return None


# ------------------------------------------------------------------------------------------ other formats


def _squeeze_to_2d(path: str | os.PathLike, arr: np.ndarray, channel_axis: int | None = None) -> np.ndarray:
    if channel_axis is not None and arr.ndim == 3 and arr.shape[channel_axis] > 1:
        raise read_error(
            path, f"{arr.shape[channel_axis]} channels; mammograms and masks must be single-channel grayscale"
        )
    if arr.ndim > 2:
        arr = arr.reshape([s for s in arr.shape if s != 1] or [1])
    if arr.ndim != 2:
        raise read_error(path, f"array of shape {arr.shape}; {OUT_OF_SCOPE_3D}")
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
    return valid_spacing(np.linalg.norm(a[:rank, 0]), np.linalg.norm(a[:rank, 1]))


def _png_spacing(img: Any) -> tuple[float, float] | None:
    """(row, col) mm from a PNG's pHYs chunk in pixels per metre (PIL reports it as dpi, ``px * 0.0254``); None when
    absent, in unknown units, or 72 / 96 dpi: image editors write those by default, they say nothing of a detector."""
    dpi = img.info.get("dpi") if img.format == "PNG" else None
    ppm = [round(float(v) / 0.0254) for v in dpi] if dpi and len(dpi) == 2 else []
    if len(ppm) != 2 or min(ppm) < 1 or set(ppm) <= {2835, 3780}:
        return None
    return valid_spacing(1000.0 / ppm[1], 1000.0 / ppm[0])  # pHYs is x (columns) first


def _read_pil(path: str | os.PathLike, max_pixels: int | None) -> tuple[np.ndarray, dict[str, Any]]:
    reader = PILReader(reverse_indexing=False)
    try:
        img = reader.read(str(path))
    except FileNotFoundError:
        raise read_error(path, "file not found") from None
    except Exception as err:
        raise read_error(path, f"not a readable image ({type(err).__name__}: {err})") from err
    try:
        if getattr(img, "n_frames", 1) > 1:
            raise read_error(path, f"{img.n_frames} frames; {OUT_OF_SCOPE_3D}")
        check_pixels(path, (img.size[1], img.size[0]), max_pixels)  # PIL opens lazily: nothing decoded yet
        if img.mode not in GRAYSCALE_PIL_MODES:
            raise read_error(
                path, f"image mode {img.mode} ({len(img.getbands())} channels); it must be single-channel grayscale"
            )
        try:
            arr, _ = reader.get_data(img)
        except Exception as err:  # truncated or corrupt data surfaces only when decoding
            raise read_error(
                path, f"cannot decode image data, truncated or corrupt ({type(err).__name__}: {err})"
            ) from err
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
        check_pixels(path, img.shape, max_pixels)
        arr, header = reader.get_data(img)
    except FileNotFoundError:
        raise read_error(path, "file not found") from None
    except MammogramReadError:
        raise
    except Exception as err:
        raise read_error(path, f"not a readable NIfTI file ({type(err).__name__}: {err})") from err
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
        check_pixels(path, dims, max_pixels)
    try:
        img = reader.read(str(path))
        if img.GetNumberOfComponentsPerPixel() != 1:
            raise read_error(
                path, f"{img.GetNumberOfComponentsPerPixel()} channels; it must be single-channel grayscale"
            )
        arr, header = reader.get_data(img)
        arr = np.array(arr, copy=True)  # ITK hands out a view of its buffer, freed with `img`
    except MammogramReadError:
        raise
    except Exception as err:
        raise read_error(path, f"not a readable ITK image ({type(err).__name__}: {err})") from err
    arr = _squeeze_to_2d(path, np.asarray(arr))
    affine = _swap_xy(header.get("affine"))
    spacing = _spacing_from_affine(affine)
    return arr, {"format": "itk", "affine": affine, "spacing": spacing, "spacing_source": "affine" if spacing else None}


def _read_nrrd(path: str | os.PathLike, max_pixels: int | None) -> tuple[np.ndarray, dict[str, Any]]:
    # pynrrd directly: MONAI's NrrdReader requires a "space directions" field that plain NRRD files omit
    try:
        sizes = nrrd.read_header(str(path)).get("sizes")
        if sizes is not None:
            check_pixels(path, [int(v) for v in sizes], max_pixels)
        arr, header = nrrd.read(str(path), index_order="C")
    except MammogramReadError:
        raise
    except Exception as err:
        raise read_error(path, f"not a readable NRRD file ({type(err).__name__}: {err})") from err
    arr = _squeeze_to_2d(path, np.asarray(arr))
    spacing = None
    directions = header.get("space directions")
    if directions is not None:
        vectors = [np.asarray(v, dtype=np.float64) for v in directions if v is not None and np.all(np.isfinite(v))]
        if len(vectors) >= 2:  # header order is x (column) first
            spacing = valid_spacing(np.linalg.norm(vectors[1]), np.linalg.norm(vectors[0]))
    elif header.get("spacings") is not None and len(header["spacings"]) >= 2:
        sx, sy = (float(v) for v in header["spacings"][:2])
        spacing = valid_spacing(sy, sx)
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
        raise read_error(path, "file not found")
    if not Path(path).is_file():
        raise read_error(path, "not a regular file (DICOM series folders are not read: one 2-D image per file)")
    fmt = _format_of(path)
    try:
        if fmt == "dicom":
            arr, meta = _read_dicom(path, apply_voi, mask, accept_non_mammography, max_pixels)
        else:
            try:
                read = {"pil": _read_pil, "nifti": _read_nifti, "itk": _read_itk, "nrrd": _read_nrrd}[fmt]
                arr, meta = read(path, max_pixels)
            except (zlib.error, EOFError, SyntaxError) as err:  # PIL/nibabel decoding errors outside their wrappers
                raise read_error(path, f"truncated or corrupt file ({type(err).__name__}: {err})") from err
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
        raise read_error(
            path, f"out of memory reading the image (its decoded-size cap is max_pixels={max_pixels})"
        ) from err
    arr = np.asarray(arr, dtype=np.float32)
    if min(arr.shape) < 2:
        raise read_error(path, f"image of shape {arr.shape} is not a 2-D picture")
    if not np.isfinite(arr).all():
        raise read_error(path, "image contains NaN or infinite values")
    if not allow_empty and not arr.any():
        raise read_error(path, "all pixels are zero (blank image)")
    if not mask and meta["laterality"] is None and infer_laterality and arr.any():
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
        kind_checks: refuse images whose pixels are not a mammogram's (:func:`pixel_kind_problem`: a binary image;
            with ``window``, a thumbnail) with :class:`NotAMammogram`; inference's reader does, where a folder may
            hold masks and previews beside the films.
        window, model_spacing: the model's window (rows, cols) and pixel spacing (mm; None: unknown) that the
            thumbnail rule of ``kind_checks`` measures an image against.
    """

    def __init__(
        self,
        mask: bool = False,
        apply_voi: bool = True,
        infer_laterality: bool = True,
        allow_empty: bool | None = None,
        accept_non_mammography: bool = False,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        kind_checks: bool = False,
        window: Sequence[int] | None = None,
        model_spacing: float | Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self.mask = mask
        self.apply_voi = apply_voi
        self.infer_laterality = infer_laterality
        self.allow_empty = mask if allow_empty is None else allow_empty
        self.accept_non_mammography = accept_non_mammography
        self.max_pixels = max_pixels
        self.kind_checks = kind_checks
        self.window = None if window is None else tuple(int(v) for v in ensure_tuple(window))
        self.model_spacing = None if model_spacing is None else float(np.mean(ensure_tuple(model_spacing)))

    def verify_suffix(self, filename: Sequence[str | os.PathLike] | str | os.PathLike) -> bool:
        """Known suffixes, and suffix-less files (DICOM folders export those), are accepted."""
        return all(_suffix(f) in SUPPORTED_SUFFIXES or _suffix(f) == "" for f in ensure_tuple(filename))

    def read(self, data: Sequence[str | os.PathLike] | str | os.PathLike, **kwargs: Any) -> _Pending:
        names = ensure_tuple(data)
        if len(names) != 1:
            raise UsageError(f"MammogramReader reads one 2-D image at a time, got {len(names)} files: {names}")
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
        if self.kind_checks and not self.mask:
            problem = pixel_kind_problem(arr, meta.get("spacing"), self.window, self.model_spacing)
            if problem:
                raise not_a_mammogram(img.path, problem)
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
