"""2-D mammograms and lesion masks from DICOM, PNG/TIFF/JPEG, NIfTI, MHA/MHD and NRRD, as ``(H, W)`` arrays as shown.

DICOM pixels go through the Modality LUT, the VOI LUT and MONOCHROME1 inversion so that the background is 0, which the
breast crop (pixels > 0) needs.
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
from .errors import DEFAULT_MAX_PIXELS, OUT_OF_SCOPE_3D, MammogramReadError, check_pixels, read_error
from .geometry import chest_wall_side, spacing_in_range, usable_spacing
from .header_facts import file_suffix as _suffix
from .header_facts import (
    laterality_and_source,
    view_and_source,
)

DICOM_SUFFIXES = (".dcm", ".dicom", ".dic")
PIL_SUFFIXES = (".png", ".tif", ".tiff", ".jpg", ".jpeg")
NIFTI_SUFFIXES = (".nii", ".nii.gz")
ITK_SUFFIXES = (".mha", ".mhd")
NRRD_SUFFIXES = (".nrrd",)
SUPPORTED_SUFFIXES = DICOM_SUFFIXES + PIL_SUFFIXES + NIFTI_SUFFIXES + ITK_SUFFIXES + NRRD_SUFFIXES

GRAYSCALE_PIL_MODES = frozenset({"1", "L", "I", "F", "I;16", "I;16L", "I;16B", "I;16N"})
# an image whose long side times this is under the model window's is a thumbnail; likewise in mm, with this
_THUMBNAIL_FACTOR, _EXTENT_FRACTION = 5, 3


class NotAMammogram(MammogramReadError):
    """A skipped input that is not a mammogram: a binary image (a mask) or a thumbnail; inference lists it, unscored."""


def not_a_mammogram(path: str | os.PathLike, problem: str) -> NotAMammogram:
    """The :class:`NotAMammogram` of ``path``."""
    return NotAMammogram(f"{path}: skipped, not a mammogram: {problem}", path=path, problem=problem)


def pixel_kind_problem(
    arr: np.ndarray,
    spacing: Sequence[float] | None = None,
    window: Sequence[int] | None = None,
    model_spacing: float | None = None,
) -> str | None:
    """Why the pixels ``arr`` (H, W) are not a mammogram, or None.

    Args:
        arr: the image.
        spacing: the (row, col) mm the file states, or None.
        window: the model's window (rows, cols); None skips the thumbnail rules.
        model_spacing: the model's pixel spacing in mm, or None.

    Returns:
        None, or the reason: at most two grey levels (a mask or a drawing), a long side under a fifth of the window's,
        or, with a plausible stated spacing, under a third of the window's extent in mm (a thumbnail or a detail).
    """
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
    stated = spacing is not None and len(spacing) == 2 and spacing_in_range(spacing)
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
    formats = {"dicom": DICOM_SUFFIXES, "pil": PIL_SUFFIXES, "nifti": NIFTI_SUFFIXES, "itk": ITK_SUFFIXES}
    for fmt, suffixes in {**formats, "nrrd": NRRD_SUFFIXES}.items():
        if suffix in suffixes:
            return fmt
    sniffed = _sniff_format(path)
    if sniffed is None:
        raise read_error(
            path, f"unsupported file type {suffix or '(no suffix)'}; supported: {', '.join(SUPPORTED_SUFFIXES)}"
        )
    return sniffed


def file_format(path: str | os.PathLike) -> str | None:
    """The reader a file goes to (``dicom``, ``pil``, ``nifti``, ``itk``, ``nrrd``) by suffix or first bytes."""
    try:
        return _format_of(path)
    except MammogramReadError:
        return None


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


def _affine_meta(fmt: str, affine: np.ndarray | None) -> dict[str, Any]:
    """Format, 4x4 affine and (row, col) spacing of an x-first 2-D image whose array was transposed."""
    spacing = None
    if affine is not None:
        affine = np.array(to_affine_nd(3, np.asarray(affine, dtype=np.float64)), dtype=np.float64, copy=True)
        affine[:, [0, 1]] = affine[:, [1, 0]]  # the first two voxel axes swap
        spacing = usable_spacing((np.linalg.norm(affine[:3, 0]), np.linalg.norm(affine[:3, 1])))
    return {"format": fmt, "affine": affine, "spacing": spacing, "spacing_source": "affine" if spacing else None}


def _png_spacing(img: Any) -> tuple[float, float] | None:
    """(row, col) mm from a PNG's pHYs chunk; None when absent or 72 / 96 dpi, the defaults of image editors."""
    dpi = img.info.get("dpi") if img.format == "PNG" else None
    ppm = [round(float(v) / 0.0254) for v in dpi] if dpi and len(dpi) == 2 else []
    if len(ppm) != 2 or min(ppm) < 1 or set(ppm) <= {2835, 3780}:
        return None
    return usable_spacing((1000.0 / ppm[1], 1000.0 / ppm[0]))  # pHYs is x (columns) first


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
    return _squeeze_to_2d(path, np.asarray(arr)).T, _affine_meta("nifti", header.get("affine"))


def _metaimage_dims(path: str | os.PathLike) -> list[int] | None:
    """DimSize of a MetaImage text header, None when absent or unreadable (ITK then decides)."""
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
    return _squeeze_to_2d(path, np.asarray(arr)), _affine_meta("itk", header.get("affine"))


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
            spacing = usable_spacing((np.linalg.norm(vectors[1]), np.linalg.norm(vectors[0])))
    elif header.get("spacings") is not None and len(header["spacings"]) >= 2:
        sx, sy = (float(v) for v in header["spacings"][:2])
        spacing = usable_spacing((sy, sx))
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
    """The (H, W) float32 array and the metadata of :func:`read_mammogram`."""
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
            meta.update(laterality=laterality, laterality_source=laterality_source, view=view, view_source=view_source)
            meta.update(dict.fromkeys(("patient_id", "photometric", "modality", "body_part")))
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
        path: file to read; the suffix decides the format, DICOM/PNG/TIFF/NRRD without one are sniffed.
        mask: read a mask: raw stored values (no LUTs, no inversion), no laterality inference, all-zero allowed.
        apply_voi: apply a DICOM VOI LUT or window when present.
        infer_laterality: when the file states no laterality, take it from the chest wall's side (``laterality_source``
            ``"image"``).
        allow_empty: accept an all-zero array (default: only for masks).
        accept_non_mammography: read DICOMs that are not mammograms (:func:`mammography_problem`).
        max_pixels: decoded-size cap, checked from the header before any pixel buffer exists; None: no cap.

    Returns:
        ``(array, meta)``: the ``(H, W)`` float32 array; meta with ``filename``, ``format``, ``shape``, ``laterality``,
        ``view``, ``spacing`` ((row, col) mm) each with its ``*_source``, ``patient_id``, ``modality``, ``body_part``,
        ``photometric`` (None when unknown), and for DICOM the study/series/SOP UIDs and transfer syntax.

    Raises:
        MammogramReadError: missing, unreadable, truncated, not grayscale, multi-frame/3-D, all-zero, not a mammogram or
            larger than ``max_pixels``.
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
    """A file for ``get_data`` to decode: MONAI's LoadImage tries other readers when ``read`` fails."""

    def __init__(self, path: str):
        self.path = path


class MammogramReader(ImageReader):
    """MONAI ``ImageReader`` of 2-D mammograms and masks as ``(1, H, W)``, with :func:`read_mammogram`'s metadata.

    Args:
        mask, apply_voi, infer_laterality, allow_empty, accept_non_mammography, max_pixels: :func:`read_mammogram`'s.
        kind_checks: refuse images whose pixels are not a mammogram's (:func:`pixel_kind_problem`) with
            :class:`NotAMammogram`.
        window, model_spacing: the model's window (rows, cols) and pixel spacing (mm), for the thumbnail rule.
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
        """Known suffixes and suffix-less files (DICOM exports) are accepted."""
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
        texts = ("filename", "format", "laterality", "laterality_source", "view", "view_source", "patient_id")
        out = {k: meta[k] or "" for k in (*texts, "photometric")}
        out["spacing"] = np.asarray(spacing if spacing else (np.nan, np.nan), dtype=np.float64)
        out.update({k: meta[k] or "" for k in ("spacing_source", "modality", "body_part")})
        out.update(affine=np.asarray(affine, dtype=np.float64), original_affine=np.asarray(affine, dtype=np.float64))
        out.update(spatial_shape=np.asarray(arr.shape), original_channel_dim=0)
        return arr[None], out
