"""The data's errors, in a module every data module imports: unusable files, datalists and CSV rows, and the
decoded-size cap."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from ..errors import UsageError

OUT_OF_SCOPE_3D = "tomosynthesis / multi-frame inputs are out of scope (expected one 2-D image)"

# PIL's decompression-bomb limit (2 x Image.MAX_IMAGE_PIXELS), for every format: 8x the largest full-field mammogram
DEFAULT_MAX_PIXELS = 178_956_970


class MammogramReadError(UsageError):
    """A file that cannot be used as a 2-D mammogram or mask; the message names the file and the problem."""

    def __init__(self, message: str, *, path: str | os.PathLike | None = None, problem: str | None = None):
        super().__init__(message)
        self.path = None if path is None else str(path)
        self.problem = problem if problem is not None else message


def read_error(path: str | os.PathLike, problem: str) -> MammogramReadError:
    return MammogramReadError(f"{path}: {problem}", path=path, problem=problem)


def _over_cap(size: Sequence[int], max_pixels: int | None) -> tuple[str, int] | None:
    """``("H x W", pixels)`` of ``size`` when it holds more than ``max_pixels`` pixels, else None."""
    dims = [max(int(s), 0) for s in size]
    pixels = int(np.prod(dims, dtype=object)) if dims else 0
    if max_pixels is None or pixels <= max_pixels:
        return None
    return " x ".join(str(d) for d in dims), pixels


def check_pixels(path: str | os.PathLike, shape: Sequence[int], max_pixels: int | None) -> None:
    """Refuse, before any pixel buffer exists, an image whose header states more than ``max_pixels`` pixels.

    Raises:
        MammogramReadError: naming the file, the size, the cap and the option that raises it.
    """
    over = _over_cap(shape, max_pixels)
    if over is not None:
        dims, pixels = over
        raise read_error(
            path,
            f"image of {dims} = {pixels:,} pixels (about {pixels * 4 / 1e9:.1f} GB as the "
            f"reader's float32 array) exceeds the decoded-size cap of {max_pixels:,} pixels; if the file is trusted, "
            "raise the cap: --max_image_pixels N on the inference command line (the reader's max_pixels in Python)",
        )


def check_resampled_pixels(
    path: str | os.PathLike,
    shape: Sequence[int],
    size: Sequence[int],
    why: str,
    max_pixels: int | None,
) -> None:
    """Refuse resampling an image of ``shape`` to ``size`` when that has more than ``max_pixels`` pixels."""
    over = _over_cap(size, max_pixels)
    if over is not None:
        dims, pixels = over
        raise read_error(
            path,
            f"resampling the {' x '.join(str(int(s)) for s in shape)} image {why} would make it "
            f"{dims} = {pixels:,} pixels (about {pixels * 4 / 1e9:.1f} GB as float32), "
            f"above the cap of {max_pixels:,} pixels; if the spacing is right, raise max_image_pixels",
        )


class DatalistError(UsageError):
    """A datalist file or structure that cannot be used; the message names the file/split and the problem."""


class CsvRowError(UsageError):
    """A row that cannot become an item; ``items_from_csv`` lists its message among its problems."""
