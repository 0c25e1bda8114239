"""One image's maps on its input file: brought back from the model's window through the preprocessing's inverse,
placed with the file's own geometry, and written as NIfTI (and PNG) files."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.data import MetaTensor
from monai.transforms import Compose, Invertd

from ..data.geometry import usable_spacing
from ..enums import CLASS_NAMES, MAP_NAMES, OutputKey
from ..errors import UsageError
from ..patches import render_saliency
from ..transforms.mammo.coverage import original_size, window_on_original
from .files import OutputSelection, StagedFiles

#: pixel size (mm) the map files state when the input's is unknown (PNG inputs; DICOMs without a valid spacing)
FALLBACK_SPACING_MM = 1.0
#: NIfTI's RAS patient space from the LPS one of DICOM, ITK and NRRD (and back): x and y change sign
LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])
#: x, y of a NRRD space (as ITK reads it) -> x, y of RAS; any other space is read as LPS, as ITK does
_NRRD_SPACES = {"right-anterior-superior": (1, 1), "ras": (1, 1), "left-anterior-superior": (-1, 1), "las": (-1, 1)}
#: maps are stored as round(map x MAP_SCALE) in 16 bits (NIfTI with scl_slope 1 / MAP_SCALE, PNG)
MAP_SCALE = 65535
# zlib level of the PNGs (maps and panels): level 1 takes about half the time of PIL's default 6 for files about 10 %
# larger
PNG_LEVEL = 1


def _numbers(value: Any, count: int) -> np.ndarray | None:
    """``count`` finite numbers from a header value (a DICOM multi-value, a NRRD vector), else None."""
    try:
        flat = np.asarray([float(v) for v in (value if value is not None else ())], dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return flat if flat.size == count and np.isfinite(flat).all() else None


def _affine_from(columns: Sequence[np.ndarray], origin: np.ndarray | None) -> np.ndarray:
    """4x4 affine from the column and row index directions and the origin (third column: the unit normal)."""
    affine = np.eye(4)
    affine[:3, 0], affine[:3, 1] = columns
    normal = np.cross(*columns)
    if np.linalg.norm(normal) > 0:
        affine[:3, 2] = normal / np.linalg.norm(normal)
    if origin is not None:
        affine[:3, 3] = origin
    return affine


def _dicom_affine(path: str, spacing: tuple[float, float], notes: list[str] | None) -> np.ndarray:
    """RAS affine of a DICOM from ImageOrientationPatient / ImagePositionPatient (defaults noted)."""
    import pydicom

    keywords = ("ImageOrientationPatient", "ImagePositionPatient")
    ds = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=list(keywords))
    found = {k: ds.get(k) for k in keywords}
    iop, ipp = _numbers(found["ImageOrientationPatient"], 6), _numbers(found["ImagePositionPatient"], 3)
    if iop is not None:
        row, col = iop[:3], iop[3:]
        if not (np.allclose([row @ row, col @ col], 1.0, atol=1e-3) and abs(row @ col) < 1e-3):
            iop = None
    for keyword, value in zip(found, (iop, ipp)):
        if value is None and found[keyword] is not None and notes is not None:
            notes.append(f"{keyword} {found[keyword]} is not usable: the map files take DICOM's default")
    iop = iop if iop is not None else np.array([1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    # voxel i (the column index) moves along the row direction by the column spacing, j along the column direction
    return LPS_TO_RAS @ _affine_from((iop[:3] * spacing[1], iop[3:] * spacing[0]), ipp)


def _nrrd_affine(path: str, spacing: tuple[float, float]) -> np.ndarray:
    """RAS affine of a NRRD from its space directions and origin, read as ITK reads them."""
    import nrrd

    header = nrrd.read_header(path)
    sizes = [int(v) for v in header.get("sizes", ())]
    vectors = [np.asarray(v, dtype=np.float64).reshape(-1) for v in header.get("space directions", [])]
    axes = [k for k, v in enumerate(vectors) if np.isfinite(v).all() and v.size in (2, 3)]
    axes = sorted(axes, key=lambda k: k < len(sizes) and sizes[k] == 1)[:2]  # the picture's axes first
    sign = np.array([*_NRRD_SPACES.get(str(header.get("space", "")).strip().lower(), (-1, -1)), 1.0])
    if len(axes) < 2:
        return LPS_TO_RAS @ np.diag([spacing[1], spacing[0], 1.0, 1.0])
    columns = [np.pad(vectors[k], (0, 3 - vectors[k].size)) * sign for k in axes]
    origin = _numbers(header.get("space origin"), len(vectors[axes[0]]))
    return _affine_from(columns, None if origin is None else np.pad(origin, (0, 3 - origin.size)) * sign)


def file_affine(meta: Mapping[str, Any], notes: list[str] | None = None) -> np.ndarray:
    """The RAS affine (mm) of voxel ``(i, j)`` = (column, row) of the input file, so maps overlay it in ITK viewers.

    Args:
        meta: the image's metadata from :class:`~scripts.data.readers.MammogramReader`.
        notes: a DICOM orientation or position that cannot be used is noted here.

    Returns:
        The 4x4 affine; a file without a usable pixel spacing gets :data:`FALLBACK_SPACING_MM` pixels.
    """
    spacing = usable_spacing(meta.get("spacing")) or (FALLBACK_SPACING_MM,) * 2
    path = str(meta.get("filename_or_obj") or meta.get("filename") or "")
    fmt = meta.get("format")
    own = meta.get("original_affine", meta.get("affine"))
    if fmt in ("nifti", "itk") and own is not None and usable_spacing(meta.get("spacing")) is not None:
        affine = np.array(torch.as_tensor(own).cpu().numpy(), dtype=np.float64)
        affine[:, [0, 1]] = affine[:, [1, 0]]
        if abs(np.linalg.det(affine[:3, :3])) > 0:
            return affine
        # a 2-D file stating no third axis (a zero column): the plane's normal, which nibabel can write
        return _affine_from((affine[:3, 0], affine[:3, 1]), affine[:3, 3])
    if fmt == "dicom":
        return _dicom_affine(path, spacing, notes)
    if fmt == "nrrd":
        return _nrrd_affine(path, spacing)
    return LPS_TO_RAS @ np.diag([spacing[1], spacing[0], 1.0, 1.0])


@dataclass(frozen=True)
class OnOriginal:
    """One image's outputs on its file's grid: ``maps``, the patch ``boxes`` and the model's ``window``."""

    maps: dict[str, np.ndarray]
    boxes: list[tuple[int, int, int, int]]
    window: tuple[int, int, int, int] | None


def invert_maps(item: Mapping[str, Any], maps: Mapping[str, torch.Tensor], transform: Compose) -> dict[str, np.ndarray]:
    """Window maps ``name -> (C, h, w)`` -> ``(C, H, W)`` on the file's grid, through ``Invertd(transform)``."""
    d: dict[str, Any] = {"image": item["image"]}
    for k, v in maps.items():
        d[k] = MetaTensor(v.float())
    inv = Invertd(list(maps), transform=transform, orig_keys="image", nearest_interp=False)(d)
    return {k: np.asarray(torch.as_tensor(inv[k]).cpu().numpy(), dtype=np.float32) for k in maps}


# key of the patch indicators inverted along with the maps (not a map name)
_BOXES = "boxes"


def _patch_indicators(boxes: torch.Tensor, window: tuple[int, ...]) -> torch.Tensor:
    """(K, h, w): 1 inside patch k's box ``(row, col, height, width)``, 0 elsewhere."""
    indicator = torch.zeros((boxes.shape[0], *window))
    for k, (r, c, h, w) in enumerate(boxes.tolist()):
        indicator[k, max(0, r) : r + h, max(0, c) : c + w] = 1.0
    return indicator


def _bounding_boxes(indicators: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(K, H, W) inverted indicators -> ``(top, left, bottom, right)`` (end-exclusive) of each non-empty one."""
    boxes = []
    for k in range(indicators.shape[0]):
        inside = indicators[k] > 0.5
        rows, cols = np.flatnonzero(inside.any(axis=1)), np.flatnonzero(inside.any(axis=0))
        if rows.size:  # a patch entirely in padding has no pixel of the file
            boxes.append((int(rows[0]), int(cols[0]), int(rows[-1]) + 1, int(cols[-1]) + 1))
    return boxes


# channels per inverted tensor: PyTorch's CPU bilinear resize takes a slow path for 3 channels (143 ms against 30 ms
# for 2 at 2944x1920), so the patch indicators go back in pairs
_CHANNELS_PER_PASS = 2


def maps_on_original(
    item: Mapping[str, Any],
    pred: Mapping[str, torch.Tensor],
    transform: Compose,
    gamma_c: float = 0.5,
    names: Sequence[str] = MAP_NAMES,
) -> OnOriginal:
    """One image's GLAM outputs on the original file's grid (pixels the model never saw are 0).

    Args:
        item: the preprocessed item (``item["image"]``: ``(1, h, w)`` ``MetaTensor`` with its applied operations).
        pred: that image's network outputs (``saliency_global``, ``patch_maps``, ``patch_boxes``).
        transform: the preprocessing ``Compose`` the item went through.
        gamma_c: weight of S_g in S_c.
        names: the maps to bring back.

    Returns:
        :class:`OnOriginal`: the maps, the patch boxes and the model's window on the file.

    Raises:
        ValueError: when an inverted map is not the file's size.
    """
    window = tuple(item["image"].shape[-2:])
    boxes = pred[OutputKey.PATCH_BOXES]
    maps = render_saliency(
        pred[OutputKey.SALIENCY_GLOBAL][None], pred[OutputKey.PATCH_MAPS][None], boxes[None], window, 1, gamma_c
    )
    names = [n for n in MAP_NAMES if n in names]
    indicators = torch.split(_patch_indicators(boxes, window), _CHANNELS_PER_PASS)
    to_invert = {name: maps[name][0] for name in names}
    to_invert.update({f"{_BOXES}{i}": chunk for i, chunk in enumerate(indicators)})
    back = invert_maps(item, to_invert, transform)
    out = {name: np.clip(back[name], 0.0, 1.0, out=back[name]) for name in names}
    patches = _bounding_boxes(np.concatenate([back[f"{_BOXES}{i}"] for i in range(len(indicators))]))
    meta = item["image"].meta
    size = original_size(meta)
    for name, m in out.items():
        if m.shape[-2:] != size:
            path = meta.get("filename_or_obj", "")
            raise UsageError(f"{path}: inverted {name} has shape {m.shape[-2:]}, the file {size}")
    return OnOriginal(out, patches, window_on_original(meta, size))


def quantize(maps: np.ndarray) -> np.ndarray:
    """Maps in [0, 1] -> ``round(map x 65535)`` as uint16 (values outside [0, 1] are clipped)."""
    scaled = np.multiply(maps, np.float32(MAP_SCALE), dtype=np.float32)
    scaled += np.float32(0.5)
    np.clip(scaled, 0.0, MAP_SCALE + 0.5, out=scaled)
    return scaled.astype(np.uint16)


def save_png(path: Path, array: np.ndarray) -> None:
    """Write an 8-bit RGB or 16-bit grey array as a PNG (PIL: a third faster than MONAI's ``PILWriter``)."""
    from PIL import Image

    Image.fromarray(array).save(path, format="PNG", compress_level=PNG_LEVEL)


def save_nifti(path: Path, quantized: np.ndarray, affine: np.ndarray) -> None:
    """Write (C, H, W) uint16 maps as a gzip NIfTI whose ``scl_slope`` gives readers the maps in [0, 1].

    Args:
        path: the file to write.
        quantized: the maps, (C, H, W) uint16.
        affine: the input file's (:func:`file_affine`).

    Raises:
        ValueError: when ``quantized`` is not (C, H, W) uint16.
    """
    import nibabel as nib

    if quantized.dtype != np.uint16 or quantized.ndim != 3:
        raise UsageError(f"save_nifti takes (C, H, W) uint16 maps, got {quantized.dtype} {quantized.shape}")
    img = nib.Nifti1Image(np.transpose(quantized, (2, 1, 0))[:, :, None, None, :], np.asarray(affine, np.float64))
    img.header.set_slope_inter(1.0 / MAP_SCALE, 0.0)
    img.header.set_intent("vector", (), name=",".join(CLASS_NAMES))
    img.header.set_xyzt_units("mm")
    nib.save(img, str(path))


def map_spacing(meta: Mapping[str, Any]) -> tuple[float, float] | None:
    """The (row, col) mm the map files state: the file's own spacing, None when it states none."""
    return usable_spacing(meta.get("spacing"))


def used_spacing(meta: Mapping[str, Any]) -> tuple[float, float] | None:
    """The (row, col) mm the preprocessing used (``spacing_used``), else the file's; None when neither is known."""
    for key in ("spacing_used", "spacing"):
        spacing = usable_spacing(meta.get(key))
        if spacing is not None:
            return spacing
    return None


def write_map_files(
    staged: StagedFiles,
    files: Mapping[str, str],
    maps: Mapping[str, np.ndarray],
    outputs: OutputSelection,
    meta: Mapping[str, Any],
    notes: list[str] | None = None,
) -> None:
    """Stage the map files ``outputs`` asks for: a NIfTI per map and, with ``png``, a 16-bit PNG per class."""
    affine = file_affine(meta, notes) if outputs.maps else None
    for name in outputs.maps:
        quantized = quantize(maps[name])
        save_nifti(staged.path(files[name]), quantized, affine)
        for c, cls in enumerate(CLASS_NAMES if outputs.png else ()):
            save_png(staged.path(files[f"{name}_{cls}"]), quantized[c])


# formats that seldom state a pixel spacing: their maps state 1 mm per pixel without a note
_FORMATS_WITHOUT_SPACING = ("png", "pil")
_NO_SPACING = "no valid pixel spacing in the file (missing, zero or negative) nor stated, and the model has none"


def map_spacing_note(meta: Mapping[str, Any], outputs: OutputSelection) -> tuple[str, bool] | None:
    """The note of NIfTI maps that state a pixel size the file does not: ``(note, first)``; None otherwise."""
    if not outputs.maps or map_spacing(meta) is not None or meta.get("format") in _FORMATS_WITHOUT_SPACING:
        return None
    if used_spacing(meta) is None:
        return f"{_NO_SPACING}: the NIfTI maps state {FALLBACK_SPACING_MM:g} mm per pixel", True
    return f"the NIfTI maps keep the file's grid at {FALLBACK_SPACING_MM:g} mm per pixel", False
