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


def write_nrrd_2d(
    path: str | os.PathLike,
    array: np.ndarray,
    spacing: Sequence[float] | None = None,
    key_values: Mapping[str, str] | None = None,
) -> None:
    """Write ``array`` ``(H, W)`` (rows as displayed) with pixel ``spacing`` ``(row, col)`` in mm.

    With a spacing the file has ``space directions`` and ``space origin``, stored x (column) first, the layout ITK
    and 3D Slicer read as a picture. Without one (None: the source states none) it has **no geometry**: no spacing is
    invented, the bundle's reader finds none (its spacing policy applies) and viewers show it at their default.
    ``key_values``: NRRD key/value pairs (``key:=value``) recorded in the header. Written to a temporary file of a
    short name in the same folder and moved into place, so a reader never sees half a file."""
    array = np.asarray(array)
    if array.ndim != 2:
        raise ValueError(f"{path}: expected a 2-D array, got shape {array.shape}")
    header: dict = {"encoding": "gzip"}
    if spacing is not None:
        sr, sc = (float(v) for v in spacing)
        if usable_spacing((sr, sc)) is None:
            raise ValueError(f"{path}: pixel spacing must be positive and finite, got {(sr, sc)}")
        header.update(
            {
                "space dimension": 2,
                "space directions": np.array([[sc, 0.0], [0.0, sr]]),
                "space origin": np.zeros(2),
            }
        )
    header.update({str(k): str(v) for k, v in (key_values or {}).items()})
    # a short staged name: the final name may be 255 bytes
    with atomic_path(path, staged_name=f".glam-{uuid.uuid4().hex[:12]}.tmp.nrrd") as tmp:
        nrrd.write(str(tmp), np.ascontiguousarray(array), header, index_order="C")
