"""2-D NRRD files that ITK, 3D Slicer and the bundle's reader all place the same way."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence

import nrrd
import numpy as np

# the bundle folder is on sys.path before this module is imported (main.GLAMApp, ingest.main put it there)
from scripts.atomic import atomic_path
from scripts.data.geometry import usable_spacing
from scripts.inference.maps import LPS_TO_RAS


def write_nrrd_2d(
    path: str | os.PathLike,
    array: np.ndarray,
    spacing: Sequence[float] | None = None,
    key_values: Mapping[str, str] | None = None,
    affine: np.ndarray | None = None,
) -> None:
    """Write ``array`` ``(H, W)`` (rows as displayed) with the geometry of ``affine``, else of pixel ``spacing``.

    ``affine``: 4x4, RAS mm, of voxel ``(i, j)`` = (column, row), as a 2-D NIfTI states it
    (``scripts.inference.maps.file_affine``); ``spacing``: ``(row, col)`` mm along the LPS axes from 0 (what ITK
    gives a picture). The file states it as ITK reads a NRRD (LPS): ``space directions`` x (column) first and
    ``space origin``, in a 2-D space when the picture lies in the plane z = 0 with its axes in it, else as a
    ``(W, H, 1)`` volume in ``left-posterior-superior`` space (ITK refuses a 2-D NRRD in a 3-D space). Without
    either (None: the source states none) the file has **no geometry**: no spacing is invented, the bundle's reader
    finds none (its spacing policy applies) and viewers show it at their default. ``key_values``: NRRD key/value
    pairs (``key:=value``) recorded in the header. Written to a temporary file of a short name in the same folder and
    moved into place, so a reader never sees half a file."""
    array = np.asarray(array)
    if array.ndim != 2:
        raise ValueError(f"{path}: expected a 2-D array, got shape {array.shape}")
    header: dict = {"encoding": "gzip"}
    if affine is None and spacing is not None:
        sr, sc = (float(v) for v in spacing)
        if usable_spacing((sr, sc)) is None:
            raise ValueError(f"{path}: pixel spacing must be positive and finite, got {(sr, sc)}")
        affine = LPS_TO_RAS @ np.diag([sc, sr, 1.0, 1.0])
    if affine is not None:
        lps = LPS_TO_RAS @ np.asarray(affine, dtype=np.float64) + 0.0  # no -0 in the header
        if not np.isfinite(lps).all():
            raise ValueError(f"{path}: the affine must be finite, got {lps.tolist()}")
        if np.allclose(lps[2, [0, 1, 3]], 0.0) and np.allclose(lps[:2, 2], 0.0):
            header.update({"space dimension": 2, "space directions": lps[:2, :2].T, "space origin": lps[:2, 3]})
        else:
            header.update({"space": "left-posterior-superior", "space directions": lps[:3, :3].T})
            header["space origin"] = lps[:3, 3]
            array = array[None]
    header.update({str(k): str(v) for k, v in (key_values or {}).items()})
    # a short staged name: the final name may be 255 bytes
    with atomic_path(path, staged_name=f".glam-{uuid.uuid4().hex[:12]}.tmp.nrrd") as tmp:
        nrrd.write(str(tmp), np.ascontiguousarray(array), header, index_order="C")
