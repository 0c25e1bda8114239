"""An inference input before it is read: the image size its header states, and the file it is read from."""

from __future__ import annotations

import os
from pathlib import Path

from glam_safety import Limits, check_image_shape


def stated_shape(path: str | os.PathLike, max_pixels: int | None = None) -> tuple[int, ...] | None:
    """The array shape ``path``'s header states, rows first as the bundle reads a picture (NIfTI and NRRD store
    columns first: their axes are reversed), or None when the
    header cannot be read here (the bundle's reader then decides). A DICOM whose header cannot be read within
    ``max_pixels`` (a deflated file inflating past it) raises the bundle's ``MammogramReadError``."""
    path = str(path)
    from scripts.data.readers import file_format

    kind = file_format(path)  # the bundle reader's own choice: by suffix, else by the first bytes
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
    """Refuse (:class:`glam_safety.RequestRefused`) an input whose header states an image beyond ``limits`` or no
    mammogram-shaped picture, before it is decoded; ``what`` names it as the client knows it."""
    from glam_safety import RequestRefused

    from scripts.data.errors import MammogramReadError

    try:
        shape = stated_shape(path, limits.max_image_pixels)
    except MammogramReadError as e:
        raise RequestRefused(f"{what} cannot be read: {e.problem}") from None
    if shape is not None:
        check_image_shape(shape, limits, what)


def inference_input(root: str | os.PathLike, image_path: str) -> tuple[str, str | None]:
    """``(path to read, name of the DICOM it stands for or None)`` for the datastore file ``image_path`` of the
    studies folder ``root``: the DICOM ``ingest.py`` converted into it while the NRRD is still the one it wrote
    (:func:`ingest.ingested_source`), else the file itself."""
    from ingest import ingested_source

    source = ingested_source(Path(root), Path(image_path))
    return (str(source), source.name) if source is not None else (image_path, None)
