"""2-D NRRD files that ITK, 3D Slicer and the bundle's reader all place the same way."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import nrrd
import numpy as np


def write_nrrd_2d(path: str | os.PathLike, array: np.ndarray, spacing: Sequence[float] | None = None) -> None:
    """Write ``array`` ``(H, W)`` (rows as displayed) with pixel ``spacing`` ``(row, col)`` in mm (None: 1 x 1).

    Stored x (column) first with ``space directions`` and ``space origin``, the layout ITK and 3D Slicer read as a
    picture; written to a temporary file in the same folder and moved into place, so a reader never sees half a
    file."""
    array = np.asarray(array)
    if array.ndim != 2:
        raise ValueError(f"{path}: expected a 2-D array, got shape {array.shape}")
    sr, sc = (float(v) for v in (spacing or (1.0, 1.0)))
    if not (np.isfinite([sr, sc]).all() and sr > 0 and sc > 0):
        raise ValueError(f"{path}: pixel spacing must be positive and finite, got {(sr, sc)}")
    header = {
        "space dimension": 2,
        "space directions": np.array([[sc, 0.0], [0.0, sr]]),
        "space origin": np.zeros(2),
        "encoding": "gzip",
    }
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.nrrd")
    try:
        nrrd.write(str(tmp), np.ascontiguousarray(array), header, index_order="C")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
