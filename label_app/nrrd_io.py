"""2-D NRRD files that ITK, 3D Slicer and the bundle's reader all place the same way."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence

import nrrd
import numpy as np

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
    """Write ``array`` ``(H, W)`` (rows as displayed) atomically with the geometry of ``affine``, else ``spacing``.

    A picture off the z = 0 plane is written as a ``(W, H, 1)`` LPS volume (ITK refuses a 2-D NRRD in 3-D space).

    Args:
        path: the NRRD file.
        array: the ``(H, W)`` picture.
        spacing: ``(row, col)`` mm along the LPS axes; None with no ``affine``: no geometry (none is invented).
        key_values: ``key:=value`` pairs for the header.
        affine: 4x4 RAS of voxel ``(column, row)``, as ``scripts.inference.maps.file_affine`` gives it.
    """
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
    # a short staged name: the final one may be 255 bytes
    with atomic_path(path, staged_name=f".glam-{uuid.uuid4().hex[:12]}.tmp.nrrd") as tmp:
        nrrd.write(str(tmp), np.ascontiguousarray(array), header, index_order="C")
