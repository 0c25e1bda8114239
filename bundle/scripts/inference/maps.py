"""The map files of one image (the second step of its outputs, after :mod:`.geometry`): each map on the file's grid
as a gzip NIfTI of 16-bit integers with ``scl_slope`` 1/65535 (readers get floats within 0.5/65535 of the map) and
the file's own geometry (:func:`~.geometry.file_affine`), and with ``png`` also a 16-bit grey PNG per class; the note
an image gets when its maps state a pixel size the file does not.

Why not MONAI's ``SaveImage`` / ``NibabelWriter`` / ``PILWriter`` (measured, see :func:`save_nifti` and
:func:`save_png`): the NIfTI files would lose their ``scl_slope`` and vector intent, and ``PILWriter``'s identical
PNGs cost a third more time. Either would write to the temporary names of :class:`~.files.StagedFiles` as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..data.geometry import usable_spacing
from ..enums import CLASS_NAMES
from ..errors import UsageError
from .files import OutputSelection, StagedFiles
from .geometry import FALLBACK_SPACING_MM, file_affine

__all__ = [
    "FALLBACK_SPACING_MM",
    "MAP_SCALE",
    "PNG_LEVEL",
    "quantize",
    "save_png",
    "save_nifti",
    "map_spacing",
    "used_spacing",
    "write_map_files",
    "map_spacing_note",
]

#: maps are stored as round(map x MAP_SCALE) in 16 bits (NIfTI with scl_slope 1 / MAP_SCALE, PNG)
MAP_SCALE = 65535
# zlib level of the PNGs (maps and panels): measured on 2944x1920 maps and their panels, level 1 took about half the
# time of PIL's default 6 for files about 10 % larger (docs/inference.md, "Formats")
PNG_LEVEL = 1


def quantize(maps: np.ndarray) -> np.ndarray:
    """Maps in [0, 1] -> ``round(map x 65535)`` as uint16 (values outside [0, 1] are clipped)."""
    scaled = np.multiply(maps, np.float32(MAP_SCALE), dtype=np.float32)
    scaled += np.float32(0.5)
    np.clip(scaled, 0.0, MAP_SCALE + 0.5, out=scaled)
    return scaled.astype(np.uint16)


def save_png(path: Path, array: np.ndarray) -> None:
    """An 8-bit RGB or 16-bit grey array as a PNG file at ``path`` (written as it is: stage it for atomicity).

    Why PIL itself rather than MONAI's ``PILWriter``: fed MONAI's x-first layout (``(C, W, H)``, ``output_dtype`` the
    array's, ``scale=None``, the same zlib level) ``PILWriter`` writes these files byte for byte, but took 2.75 s
    against PIL's 2.0 s for the reference run's 28 PNGs (16-bit maps and panels; its copies and transposes before
    the same encoder), time every image's writer thread would pay.
    """
    from PIL import Image

    Image.fromarray(array).save(path, format="PNG", compress_level=PNG_LEVEL)


def save_nifti(path: Path, quantized: np.ndarray, affine: np.ndarray) -> None:
    """(C, H, W) uint16 (:func:`quantize`) -> gzip NIfTI (W, H, 1, 1, C), intent 'vector', ``scl_slope`` 1/65535 (a
    reader's floats are the map within 0.5/65535): x = column, y = row as the readers expect.

    ``affine``: the input file's (:func:`~.geometry.file_affine`: RAS, voxel ``(i, j)`` = (column, row)), so that
    voxel ``(i, j)`` of the map is voxel ``(i, j)`` of a NIfTI input and lies where the input's pixel lies. The
    transposed view is handed to nibabel as it is: NIfTI stores x fastest, which is the (C, H, W) array's own memory
    order.

    Why not MONAI's ``NibabelWriter`` / ``SaveImage``: given the same uint16 array (x first) and affine, they store
    the same integers but as a 4-D (W, H, 1, C) image without an intent and without ``scl_slope``, so a reader gets
    0..65535 instead of the map in [0, 1] (and channels in NIfTI's time axis), and took 0.20 s against 0.10 s on a
    2730 x 981 map; ``SaveImage``'s ``FolderLayout`` would also name the files from the input's file name, where
    :func:`~.folder.assign_stems` keeps two inputs of the same name apart.
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
    """The (row, col) mm the map files state: the file's own spacing (``meta["spacing"]``), so that a map lies on its
    image in the viewers; None when the file states none (the maps then state :data:`FALLBACK_SPACING_MM`, as viewers
    show such a file). A spacing from the datalist, ``input_spacing`` or the estimate is what the model saw the image
    at, stated in predictions.csv, not the file's geometry."""
    return usable_spacing(meta.get("spacing"))


def used_spacing(meta: Mapping[str, Any]) -> tuple[float, float] | None:
    """The (row, col) mm the maps on the file's grid state: the input's spacing the preprocessing used
    (``meta["spacing_used"]``: the file's, the datalist's, ``input_spacing`` or the estimate; predictions.csv states
    which), else the file's (``meta["spacing"]``); None (the maps state :data:`FALLBACK_SPACING_MM`) when neither is
    known, which predictions.csv states as ``spacing_source`` ``unknown``."""
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
    """Stage the map files ``outputs`` asks for: per map, ``files[name]`` (NIfTI with the input file's geometry,
    :func:`~.geometry.file_affine`, whose notes go to ``notes``) and with ``png`` ``files[f"{name}_{class}"]``
    (16-bit PNG per class)."""
    affine = file_affine(meta, notes) if outputs.maps else None
    for name in outputs.maps:
        quantized = quantize(maps[name])
        save_nifti(staged.path(files[name]), quantized, affine)
        for c, cls in enumerate(CLASS_NAMES if outputs.png else ()):
            save_png(staged.path(files[f"{name}_{cls}"]), quantized[c])


# formats that seldom state a pixel spacing (a PNG may, in its pHYs chunk): maps of unknown spacing state 1 mm per pixel
# without a note
_FORMATS_WITHOUT_SPACING = ("png", "pil")
_NO_SPACING = "no valid pixel spacing in the file (missing, zero or negative) nor stated, and the model has none"


def map_spacing_note(meta: Mapping[str, Any], outputs: OutputSelection) -> tuple[str, bool] | None:
    """What an image's NIfTI maps state that the file does not: ``(note, first)`` (``first``: the note leads the
    image's notes, the pixel size is unknown altogether), or None (no maps, the file states its spacing, or a PNG,
    whose 1 mm is what every viewer shows)."""
    if not outputs.maps or map_spacing(meta) is not None or meta.get("format") in _FORMATS_WITHOUT_SPACING:
        return None
    if used_spacing(meta) is None:
        return f"{_NO_SPACING}: the NIfTI maps state {FALLBACK_SPACING_MM:g} mm per pixel", True
    # the model saw it at a stated or estimated spacing; the maps keep the file's own grid
    return f"the NIfTI maps keep the file's grid at {FALLBACK_SPACING_MM:g} mm per pixel", False
