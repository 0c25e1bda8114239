"""An inference input before it is read: the image size its header states, and the file it is read from."""

from __future__ import annotations

import os
from pathlib import Path

from glam_safety import Limits, check_image_shape


def stated_shape(path: str | os.PathLike, max_pixels: int | None = None) -> tuple[int, ...] | None:
    """The shape ``path``'s header states, rows first, or None when it cannot be read here (the reader decides).

    Raises:
        MammogramReadError: a DICOM whose header does not inflate within ``max_pixels``.
    """
    path = str(path)
    from scripts.data.readers import file_format

    kind = file_format(path)
    if kind == "dicom":
        from scripts.data.dicom_files import read_dicom_header
        from scripts.data.errors import MammogramReadError

        try:
            header = read_dicom_header(path, max_pixels=max_pixels)
        except MammogramReadError:
            raise
        except Exception:  # noqa: BLE001 - not DICOM after all: the reader says why
            return None
        frames = int(header.get("frames") or 1)
        rows, cols = int(header.get("rows") or 0), int(header.get("cols") or 0)
        return (rows, cols) if frames == 1 else (frames, rows, cols)
    try:
        if kind == "pil":
            from PIL import Image

            with Image.open(path) as img:  # lazy: the header only
                return (img.size[1], img.size[0]) + ((img.n_frames,) if getattr(img, "n_frames", 1) > 1 else ())
        if kind == "nifti":
            import nibabel as nib

            return tuple(int(d) for d in nib.load(path).header.get_data_shape())[::-1]
        if kind == "nrrd":
            import nrrd

            return tuple(int(d) for d in nrrd.read_header(path)["sizes"])[::-1]
    except Exception:  # noqa: BLE001 - an unreadable header is the reader's to report, with its reason
        return None
    return None


def check_input(path: str | os.PathLike, limits: Limits, what: str) -> None:
    """Refuse (``RequestRefused``) from its header an input beyond ``limits`` or of no mammogram's shape."""
    from glam_safety import RequestRefused

    from scripts.data.errors import MammogramReadError

    try:
        shape = stated_shape(path, limits.max_image_pixels)
    except MammogramReadError as e:
        raise RequestRefused(f"{what} cannot be read: {e.problem}") from None
    if shape is not None:
        check_image_shape(shape, limits, what)


def inference_input(root: str | os.PathLike, image_path: str) -> tuple[str, str | None]:
    """``(path to read, DICOM name or None)`` for datastore file ``image_path``: ingest's DICOM source, if current."""
    from ingest import ingested_source

    source = ingested_source(Path(root), Path(image_path))
    return (str(source), source.name) if source is not None else (image_path, None)
