"""The files of a GLAM inference run, one writer per kind (composed by
:class:`~scripts.workflows.inference.GLAMInferenceWriter`, see docs/inference.md for the layout):

- :class:`OutputStems`: the file-name stem of each input, unique within the run;
- :class:`MapFiles`: ``maps/<stem>_<S>.nii.gz`` and ``maps/<stem>_<S>_<class>.png`` for S in S_g, S_l, S_c;
- :func:`overlay_panel` and :class:`PanelFiles`: the titled overlay panel and ``panels/<stem>_panel.png``;
- :class:`InferenceTables`: ``predictions.csv`` (one row per written image) and ``errors.csv`` (one row per input
  that failed: a batch job reports every bad item and still finishes the good ones; plus one note row per image
  that was processed under an assumption, e.g. the model's pixel spacing for a file that states none).

Every file is written beside its final name and renamed over it, so a reader never sees a torn file.
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write
from ..data.readers import SUPPORTED_SUFFIXES, read_mammogram
from ..enums import CLASS_NAMES, MAP_NAMES
from ..visualize import saliency_panel

__all__ = [
    "ERROR_KEY",
    "NOTE_KEY",
    "ERROR_COLUMNS",
    "PREDICTION_COLUMNS",
    "FALLBACK_SPACING_MM",
    "write_replacing",
    "save_png",
    "save_nifti",
    "OutputStems",
    "MapFiles",
    "ground_truth_masks",
    "panel_title_lines",
    "add_title",
    "overlay_panel",
    "PanelFiles",
    "error_record",
    "note_record",
    "prediction_row",
    "InferenceTables",
]

# the warnings keep the name of the module that wrote these files before they had their own (log filters use it)
logger = logging.getLogger(f"{__package__}.inference")

#: key of the error message in an item that failed (and the second column of errors.csv)
ERROR_KEY = "error"
#: third column of errors.csv: what an image that was processed (its error cell empty) should be read with
NOTE_KEY = "note"
ERROR_COLUMNS = ["image", ERROR_KEY, NOTE_KEY]
PREDICTION_COLUMNS = [
    "image",
    "output_stem",
    *(f"prob_{c}" for c in CLASS_NAMES),
    *(f"label_{c}" for c in CLASS_NAMES),
    "height",
    "width",
    "patch_boxes",
]
#: pixel size (mm) the NIfTI maps state when the input's is unknown (PNG inputs; DICOMs without a valid spacing)
FALLBACK_SPACING_MM = 1.0
# input formats that seldom state a pixel spacing (a PNG may, in its pHYs chunk): their maps get the fallback without
# a warning
_FORMATS_WITHOUT_SPACING = ("png", "pil")


# -- writing one file ------------------------------------------------------------------------------------------------
def write_replacing(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, then rename it over ``path``.

    The temporary name ends with ``path``'s name, so writers that choose the format from the extension (PIL,
    nibabel's compression) still do; it is removed when ``write`` fails.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp{os.getpid()}-{path.name}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def save_png(path: Path, array: np.ndarray) -> None:
    """An 8-bit RGB or 16-bit grey array as a PNG file."""
    from PIL import Image

    # zlib level 3: half the time of PIL's default 6 on 16-bit maps, files about 1.6x larger (tens of KB)
    write_replacing(path, lambda tmp: Image.fromarray(array).save(tmp, format="PNG", compress_level=3))


def save_nifti(path: Path, maps: np.ndarray, spacing: Sequence[float] | None) -> None:
    """(C, H, W) -> NIfTI (W, H, 1, 1, C), intent 'vector': x = column, y = row as the readers expect.

    ``spacing``: the (row, column) pixel size in mm; None states :data:`FALLBACK_SPACING_MM`.
    """
    import nibabel as nib

    data = np.ascontiguousarray(np.transpose(maps, (2, 1, 0))[:, :, None, None, :].astype(np.float32))
    row_mm, col_mm = (float(s) for s in spacing) if spacing is not None else (FALLBACK_SPACING_MM,) * 2
    img = nib.Nifti1Image(data, np.diag([col_mm, row_mm, 1.0, 1.0]))
    img.header.set_intent("vector", (), name=",".join(CLASS_NAMES))
    img.header.set_xyzt_units("mm")
    write_replacing(path, lambda tmp: nib.save(img, str(tmp)))


# -- file names ------------------------------------------------------------------------------------------------------
def _strip_suffix(name: str) -> str:
    # the longest suffix first: ".nii.gz" before ".gz"
    for suffix in sorted(SUPPORTED_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


class OutputStems:
    """The stem of each input's output files: its file name without the suffix, made unique within the run by
    ``_2``, ``_3``, ... (inputs from different folders may share a name)."""

    def __init__(self) -> None:
        self._used: set[str] = set()

    def reset(self) -> None:
        self._used = set()

    def __call__(self, path: str) -> str:
        name = _strip_suffix(Path(path).name)
        stem, n = name or "image", 2
        while stem in self._used:
            stem, n = f"{name}_{n}", n + 1
        self._used.add(stem)
        return stem


# -- saliency maps ---------------------------------------------------------------------------------------------------
class MapFiles:
    """Per image and map S (S_g, S_l, S_c): ``<folder>/<stem>_<S>.nii.gz`` (float32, one channel per class, with the
    input's pixel spacing) and ``<folder>/<stem>_<S>_<class>.png`` (16-bit, value = map x 65535)."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)

    def write(self, path: str, stem: str, maps: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        """Write the files of one image: ``maps`` name -> (C, H, W) in [0, 1]; ``meta`` the reader's metadata of
        the input file ``path`` (its ``spacing`` goes into the NIfTI files)."""
        spacing = meta.get("spacing")
        if spacing is None and meta.get("format") not in _FORMATS_WITHOUT_SPACING:
            logger.warning(
                "%s: no valid pixel spacing in the file (missing, zero or negative): the NIfTI maps state %g mm "
                "per pixel",
                path,
                FALLBACK_SPACING_MM,
            )
        for name in MAP_NAMES:
            save_nifti(self.folder / f"{stem}_{name}.nii.gz", maps[name], spacing)
            for c, cls in enumerate(CLASS_NAMES):
                save_png(self.folder / f"{stem}_{name}_{cls}.png", np.round(maps[name][c] * 65535).astype(np.uint16))


# -- overlay panels --------------------------------------------------------------------------------------------------
def ground_truth_masks(item: Mapping[str, Any]) -> np.ndarray | None:
    """The item's lesion masks (C, H, W) from its ``mask_<class>`` paths; None unless every class has one."""
    paths = [item.get(f"mask_{cls}") for cls in CLASS_NAMES]
    if not all(isinstance(p, str) and p for p in paths):
        return None
    return np.stack([read_mammogram(p, mask=True)[0] for p in paths])


def panel_title_lines(
    file_name: str, scores: Sequence[float], labels: Sequence[int | str], with_masks: bool
) -> list[str]:
    """The panel's title: the file, its scores y_g (and labels, when known), what each tile shows, the colours."""
    truth = "" if labels[0] == "" else "   label: " + ", ".join(f"{c} {labels[i]}" for i, c in enumerate(CLASS_NAMES))
    return [
        f"{file_name}   y_g: " + ", ".join(f"{c} {scores[i]:.3f}" for i, c in enumerate(CLASS_NAMES)) + truth,
        f"image{' + ground truth' if with_masks else ''} | " + " | ".join(MAP_NAMES),
        "green benign, red malignant, blue: selected patches",
    ]


def add_title(panel: np.ndarray, lines: Sequence[str]) -> np.ndarray:
    """Put text lines above the panel, the font as large as fits the panel's width (at most 1/30 of its height)."""
    from PIL import Image, ImageDraw, ImageFont

    width = panel.shape[1]
    size = max(12, panel.shape[0] // 30)
    font = ImageFont.load_default()
    while size >= 8:
        try:
            font = ImageFont.load_default(size=size)
        except TypeError:  # Pillow < 10.1: one fixed-size bitmap font
            break
        if max(font.getlength(t) for t in lines) <= width - 8:
            break
        size -= 1
    line_h = int(size * 1.25) + 2
    strip = Image.new("RGB", (width, line_h * len(lines) + 4), (255, 255, 255))
    draw = ImageDraw.Draw(strip)
    for i, text in enumerate(lines):
        draw.text((4, 2 + i * line_h), text, fill=(0, 0, 0), font=font)
    return np.concatenate([np.asarray(strip), panel], axis=0)


def _panel_step(rows: int, max_rows: int | None) -> int:
    """Pixel step that brings ``rows`` to at most ``max_rows`` (None or 0: full resolution)."""
    return int(np.ceil(rows / max_rows)) if max_rows and rows > max_rows else 1


def overlay_panel(
    image: np.ndarray,
    maps: Mapping[str, np.ndarray],
    boxes: Sequence[tuple[int, int, int, int]],
    masks: np.ndarray | None,
    title: Sequence[str],
    max_rows: int | None = None,
) -> np.ndarray:
    """The titled panel of one image (:func:`~scripts.visualize.saliency_panel`: the image with its masks, then the
    maps with the patches), every ``step``-th pixel so that the image has at most ``max_rows`` rows.

    ``image`` (H, W); ``maps`` name -> (C, H, W); ``boxes`` (top, left, bottom, right), end-exclusive; ``masks``
    (C, H, W) or None. Returns (rows, cols, 3) uint8.
    """
    step = _panel_step(image.shape[0], max_rows)
    sub = (slice(None, None, step), slice(None, None, step))
    small_maps = {name: maps[name][(slice(None), *sub)] for name in MAP_NAMES}
    # saliency_panel draws (top, left, height, width)
    small_boxes = [(t // step, left // step, (b - t) // step, (r - left) // step) for t, left, b, r in boxes]
    small_masks = None if masks is None else masks[(slice(None), *sub)]
    return add_title(saliency_panel(image[sub], small_maps, small_boxes, small_masks), title)


class PanelFiles:
    """``<folder>/<stem>_panel.png``: the overlay panels as RGB PNG files."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)

    def write(self, stem: str, panel: np.ndarray) -> None:
        save_png(self.folder / f"{stem}_panel.png", panel)


# -- tables ----------------------------------------------------------------------------------------------------------
def error_record(path: str, exc: BaseException) -> dict[str, str]:
    """An errors.csv row: the input and ``"<ExceptionType>: <message>"``."""
    return {"image": str(path), ERROR_KEY: f"{type(exc).__name__}: {exc}"}


def note_record(path: str, note: str) -> dict[str, str]:
    """An errors.csv row of an image that was processed: the input, an empty error and the note."""
    return {"image": str(path), ERROR_KEY: "", NOTE_KEY: note}


def prediction_row(
    path: str,
    stem: str,
    scores: Sequence[float],
    labels: Sequence[int | str],
    size: tuple[int, int],
    boxes: Iterable[Sequence[int]],
) -> dict[str, Any]:
    """A predictions.csv row: the input, its stem, the scores y_g (6 decimals) and labels per class, the file's
    size and the patch boxes on the file (``top left bottom right`` per patch, patches separated by ``;``)."""
    return {
        "image": path,
        "output_stem": stem,
        **{f"prob_{c}": f"{scores[i]:.6f}" for i, c in enumerate(CLASS_NAMES)},
        **{f"label_{c}": labels[i] for i, c in enumerate(CLASS_NAMES)},
        "height": size[0],
        "width": size[1],
        "patch_boxes": ";".join(" ".join(str(v) for v in b) for b in boxes),
    }


class InferenceTables:
    """The run's ``predictions.csv`` and ``errors.csv`` under ``output_dir``: rows collected per image, written
    (atomically) at the end of the run, also when it stops on an exception.

    errors.csv has the columns ``image``, ``error``, ``note``: first the inputs that failed (``error`` set), then the
    notes on images that were processed (``error`` empty, ``note`` set), so a failure is a row with an error."""

    def __init__(self, output_dir: str | os.PathLike) -> None:
        self.output_dir = Path(output_dir)
        self.rows: list[dict[str, Any]] = []
        self.errors: list[dict[str, str]] = []
        self.notes: list[dict[str, str]] = []

    def reset(self) -> None:
        self.rows, self.errors, self.notes = [], [], []

    def write(self) -> None:
        """Write both files; errors.csv has its header even when empty."""
        _write_csv(self.output_dir / "predictions.csv", PREDICTION_COLUMNS, self.rows)
        _write_csv(self.output_dir / "errors.csv", ERROR_COLUMNS, [*self.errors, *self.notes])


def _write_csv(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    with atomic_write(path, "w") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
