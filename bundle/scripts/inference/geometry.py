"""The way back from the model's window onto each input file's geometry: the maps and the patch boxes go through the
inverse of the preprocessing (``Invertd``), the window is computed from the metadata the preprocessing recorded.

The first step of an image's outputs (:meth:`~.writer.GLAMInferenceWriter.write_item`): everything after it (the
map files, the panel, the DICOM objects, the table row) works on the file's own pixel grid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from monai.data import MetaTensor
from monai.transforms import Compose, Invertd

from ..data.geometry import usable_spacing
from ..enums import MAP_NAMES, OutputKey
from ..errors import UsageError
from ..patches import render_saliency
from ..transforms.mammo.coverage import original_size, window_box_to_original, window_on_original

__all__ = [
    "FALLBACK_SPACING_MM",
    "LPS_TO_RAS",
    "file_affine",
    "OnOriginal",
    "window_box_to_original",
    "window_on_original",
    "invert_maps",
    "maps_on_original",
    "original_size",
]


#: pixel size (mm) the map files state when the input's is unknown (PNG inputs; DICOMs without a valid spacing)
FALLBACK_SPACING_MM = 1.0
#: NIfTI's RAS patient space from the LPS one of DICOM, ITK and NRRD (and back): x and y change sign
LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])
#: x, y of a NRRD space (as ITK reads it) -> x, y of RAS; any other space is read as LPS, as ITK does
_NRRD_SPACES = {"right-anterior-superior": (1, 1), "ras": (1, 1), "left-anterior-superior": (-1, 1), "las": (-1, 1)}


def _numbers(value: Any, count: int) -> np.ndarray | None:
    """``count`` finite numbers from a header value (a DICOM multi-value, a NRRD vector), else None."""
    try:
        flat = np.asarray([float(v) for v in (value if value is not None else ())], dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return flat if flat.size == count and np.isfinite(flat).all() else None


def _affine_from(columns: Sequence[np.ndarray], origin: np.ndarray | None) -> np.ndarray:
    """4x4 affine from the directions of the column and the row index (3-vectors, scaled by the pixel size) and the
    origin; the third column is the plane's unit normal."""
    affine = np.eye(4)
    affine[:3, 0], affine[:3, 1] = columns
    normal = np.cross(*columns)
    if np.linalg.norm(normal) > 0:
        affine[:3, 2] = normal / np.linalg.norm(normal)
    if origin is not None:
        affine[:3, 3] = origin
    return affine


def _dicom_affine(path: str, spacing: tuple[float, float], notes: list[str] | None) -> np.ndarray:
    """RAS affine of a DICOM from ImageOrientationPatient / ImagePositionPatient (DICOM's defaults, rows along x and
    columns along y from position 0, for a tag the file lacks or holds badly; a bad one gets a note)."""
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
    """RAS affine of a NRRD from its space directions and origin, read as ITK reads them: the picture's two axes
    (of more than one pixel) x (column) first; an unnamed or LPS space is LPS. Without directions: the spacing along
    LPS axes."""
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
    """The input file's geometry as the map files state it: the 4x4 affine (RAS, mm) of voxel ``(i, j)`` = (column,
    row) of the file's pixel grid, the layout of a 2-D NIfTI, so that a map written with it lies on its image in
    ITK-based viewers (3D Slicer, ITK-SNAP), wherever the file places, mirrors or rotates its picture.

    - NIfTI, MHA/MHD: the file's own affine (the reader's ``original_affine``, which is for the (row, column) array:
      its first two columns swap back);
    - DICOM: ImageOrientationPatient, ImagePositionPatient and the pixel spacing the reader used, composed as MONAI's
      ``PydicomReader`` composes them (LPS to RAS; the third column the plane's unit normal); a file without them
      takes DICOM's defaults (rows along the patient's x, columns along y, from position 0), as ITK reads it;
    - NRRD: its space directions and origin (:func:`_nrrd_affine`);
    - PNG, TIFF, JPEG: the pixel spacing along LPS axes from position 0, as ITK reads a picture.

    Args:
        meta: the image's metadata from :class:`~scripts.data.readers.MammogramReader` or ``read_mammogram``
            (``format``, ``filename_or_obj`` or ``filename``, ``spacing`` (row, col) mm, ``original_affine``).
        notes: what the file holds that could not be used (a DICOM orientation that is not two orthogonal unit
            directions) is appended here.

    Returns:
        The affine; a file stating no usable pixel spacing gets :data:`FALLBACK_SPACING_MM` pixels.
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
    """One image's outputs on its file's pixel grid: ``maps`` name -> (2, H, W) float32 in [0, 1], the patch
    ``boxes`` and the model's ``window`` as (top, left, bottom, right), end-exclusive (``window`` None when the
    model saw none of the file)."""

    maps: dict[str, np.ndarray]
    boxes: list[tuple[int, int, int, int]]
    window: tuple[int, int, int, int] | None


def invert_maps(item: Mapping[str, Any], maps: Mapping[str, torch.Tensor], transform: Compose) -> dict[str, np.ndarray]:
    """Window-coordinate maps ``name -> (C, h, w)`` -> arrays ``(C, H, W)`` on the original file's pixel grid,
    through ``Invertd(transform)`` with ``item["image"]`` (the preprocessed ``MetaTensor``) as the reference."""
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


# channels per inverted tensor: PyTorch's CPU bilinear resize of a (1, 3, H, W) tensor takes a slow path (measured
# at 2944x1920: 143 ms for 3 channels, 15 ms for 1 and 30 ms for 2), so the patch indicators go back in pairs (each
# map has two channels, benign and malignant)
_CHANNELS_PER_PASS = 2


def maps_on_original(
    item: Mapping[str, Any],
    pred: Mapping[str, torch.Tensor],
    transform: Compose,
    gamma_c: float = 0.5,
    names: Sequence[str] = MAP_NAMES,
) -> OnOriginal:
    """One image's GLAM outputs on the original file's geometry.

    Args:
        item: the preprocessed item (``item["image"]``: ``(1, h, w)`` ``MetaTensor`` with its applied operations).
        pred: that image's network outputs (``saliency_global`` ``(2, h/4/.., w/..)``, ``patch_maps``
            ``(K, 2, p/4, p/4)``, ``patch_boxes`` ``(K, 4)`` row, col, height, width in the window).
        transform: the preprocessing ``Compose`` the item went through.
        gamma_c: weight of S_g in S_c.
        names: the maps to bring back (the others are not computed on the file's grid).

    Returns:
        :class:`OnOriginal`: ``maps`` ``{name: (2, H, W) float32 in [0, 1]}`` for the maps named, rendered at full
        window resolution and taken back through the inverse of the preprocessing (pixels the model never saw are
        0); the patch ``boxes`` on the file (patches entirely in padding are dropped), the maps and the patch
        indicators going through one ``Invertd``, two channels per tensor; the model's ``window`` on the file (the
        part of it the model saw; None when it saw none of it), computed from the metadata
        (:func:`window_on_original`). A map whose inverse is not the file's size is a ``ValueError``.
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
