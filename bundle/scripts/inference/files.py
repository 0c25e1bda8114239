"""The files of a GLAM inference run (see docs/inference.md for the layout and the measurements behind the formats):

- :class:`OutputSelection`: what a run writes (the ``outputs`` setting) and the file names of one image;
- :class:`StagedFiles`: one image's files, written under temporary names and renamed into place together;
- :func:`save_nifti`: a map (C, H, W) in [0, 1] as a gzip NIfTI of 16-bit integers with ``scl_slope`` 1/65535
  (readers get floats within 0.5/65535 of the map);
- :func:`save_png`: an 8-bit RGB or 16-bit grey array as a PNG;
- :func:`overlay_panel`: the titled overlay panel of one image, from the thumbnail taken when it was loaded.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..enums import CLASS_NAMES, MAP_NAMES, InferenceOutput, LesionClass, MapName
from ..visualize import reading_panel
from .dicom import DICOM_OUTPUT_MODES

__all__ = [
    "FALLBACK_SPACING_MM",
    "map_spacing",
    "MAP_SCALE",
    "TEMPORARY_PREFIX",
    "is_temporary",
    "OutputSelection",
    "StagedFiles",
    "write_replacing",
    "quantize",
    "save_png",
    "save_nifti",
    "panel_title_lines",
    "add_title",
    "overlay_panel",
]

# the warnings keep the name of the module that wrote these files before they had their own (log filters use it)
logger = logging.getLogger(f"{__package__}.inference")

#: pixel size (mm) the NIfTI maps state when the input's is unknown (PNG inputs; DICOMs without a valid spacing)
FALLBACK_SPACING_MM = 1.0
#: maps are stored as round(map x MAP_SCALE) in 16 bits (NIfTI with scl_slope 1 / MAP_SCALE, PNG)
MAP_SCALE = 65535
#: temporary files of this module start with this; :func:`is_temporary` also knows ``atomic_write``'s
TEMPORARY_PREFIX = ".tmp-"
# zlib level of the PNGs (maps and panels): measured on 2944x1920 maps and their panels, level 1 took about half the
# time of PIL's default 6 for files about 10 % larger (docs/inference.md, "Formats")
PNG_LEVEL = 1
# the folders of each kind of file under the output folder
MAPS_DIR, PANELS_DIR, DICOM_DIR = "maps", "panels", "dicom"


def is_temporary(name: str) -> bool:
    """Whether a file name is one of the temporary names this workflow writes (``.tmp-…`` here, ``.<name>.<random>.tmp``
    by ``scripts.atomic.atomic_write``): what an interrupted run leaves behind."""
    return (
        name.startswith(TEMPORARY_PREFIX) or name.startswith(".tmp") or (name.startswith(".") and name.endswith(".tmp"))
    )


# -- what to write ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OutputSelection:
    """What a run writes besides the tables: ``maps`` (map names, as NIfTI), ``png`` (those maps also as 16-bit PNGs
    per class), ``panel``, ``dicom`` (``"sc"`` and / or ``"map"``, DICOM inputs only)."""

    maps: tuple[str, ...] = (MapName.COMBINED.value,)
    png: bool = False
    panel: bool = True
    dicom: tuple[str, ...] = ()

    #: the names the ``outputs`` setting accepts
    NAMES = (*MAP_NAMES, *(o.value for o in InferenceOutput))

    @classmethod
    def parse(cls, outputs: str | Sequence[str] | None, dicom_outputs: str | None = "none") -> OutputSelection:
        """``outputs``: a list of names (or one comma-separated string) from :attr:`NAMES`; ``dicom_outputs``
        (``none | sc | map | both``, the older setting) adds the DICOM objects. A ValueError names an unknown name."""
        if outputs is None:
            names: list[str] = []
        elif isinstance(outputs, str):
            names = [n.strip() for n in outputs.split(",") if n.strip()]
        else:
            names = [str(n).strip() for n in outputs]
        unknown = sorted({n for n in names if n not in cls.NAMES})
        if unknown:
            raise ValueError(f"outputs: unknown {unknown}; choose from {list(cls.NAMES)}")
        key = "none" if dicom_outputs is None else str(dicom_outputs).strip().lower()
        if key not in DICOM_OUTPUT_MODES:
            raise ValueError(f"dicom_outputs must be one of {sorted(DICOM_OUTPUT_MODES)}, got {dicom_outputs!r}")
        dicom = set(DICOM_OUTPUT_MODES[key])
        dicom |= {"sc" for n in names if n == InferenceOutput.DICOM_SC} | {
            "map" for n in names if n == InferenceOutput.DICOM_MAP
        }
        maps = tuple(m for m in MAP_NAMES if m in names)
        if InferenceOutput.PNG in names and not maps:
            raise ValueError("outputs: 'png' writes the chosen maps as PNG too: name at least one map (e.g. S_c)")
        return cls(
            maps,
            InferenceOutput.PNG in names,
            InferenceOutput.PANEL in names,
            tuple(k for k in ("sc", "map") if k in dicom),
        )

    def names(self) -> list[str]:
        """The selection as the ``outputs`` setting writes it (the run record compares it)."""
        out = [*self.maps]
        out += [InferenceOutput.PNG.value] if self.png else []
        out += [InferenceOutput.PANEL.value] if self.panel else []
        out += [{"sc": InferenceOutput.DICOM_SC, "map": InferenceOutput.DICOM_MAP}[k].value for k in self.dicom]
        return out

    def folders(self) -> list[str]:
        """The sub-folders this selection writes into."""
        return [MAPS_DIR] * bool(self.maps) + [PANELS_DIR] * self.panel + [DICOM_DIR] * bool(self.dicom)

    def files(self, stem: str, dicom_input: bool) -> dict[str, str]:
        """``what -> relative path`` of one image's files: ``<map>`` (NIfTI), ``<map>_<class>`` (PNG), ``panel``,
        ``dicom_sc``, ``dicom_map`` (DICOM inputs only)."""
        files = {}
        for name in self.maps:
            files[name] = f"{MAPS_DIR}/{stem}_{name}.nii.gz"
            for cls in CLASS_NAMES if self.png else ():
                files[f"{name}_{cls}"] = f"{MAPS_DIR}/{stem}_{name}_{cls}.png"
        if self.panel:
            files[InferenceOutput.PANEL.value] = f"{PANELS_DIR}/{stem}_panel.png"
        for kind in self.dicom if dicom_input else ():
            files[f"dicom_{kind}"] = f"{DICOM_DIR}/{stem}_{kind}.dcm"
        return files

    def maps_needed(self) -> tuple[str, ...]:
        """The maps to bring back onto the file: those written, and S_c for a DICOM Segmentation."""
        needed = set(self.maps) | ({MapName.COMBINED.value} if "map" in self.dicom else set())
        return tuple(m for m in MAP_NAMES if m in needed)

    def needs_panel(self) -> bool:
        return self.panel or "sc" in self.dicom  # the Secondary Capture shows the panel


# -- writing files ---------------------------------------------------------------------------------------------------
class StagedFiles:
    """One image's files under ``root``: each is written to a temporary name beside its final one
    (``.tmp-<pid>-<name>``, ending with the final name so that writers that pick the format from the extension still
    do), and :meth:`commit` renames them all into place once every one is complete; :meth:`discard` removes them."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self._staged: list[tuple[Path, Path, str]] = []

    def path(self, relative: str) -> Path:
        """The temporary path to write ``relative``'s content to."""
        final = self.root / relative
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f"{TEMPORARY_PREFIX}{os.getpid()}-{final.name}")
        self._staged.append((tmp, final, relative))
        return tmp

    def commit(self) -> list[str]:
        """Rename every staged file into place; returns their relative paths."""
        for tmp, final, _ in self._staged:
            os.replace(tmp, final)
        done = [relative for _, _, relative in self._staged]
        self._staged = []
        return done

    def discard(self) -> None:
        for tmp, _, _ in self._staged:
            tmp.unlink(missing_ok=True)
        self._staged = []


def write_replacing(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, then rename it over ``path`` (removed when ``write``
    fails)."""
    staged = StagedFiles(path.parent)
    try:
        write(staged.path(path.name))
        staged.commit()
    finally:
        staged.discard()


def quantize(maps: np.ndarray) -> np.ndarray:
    """Maps in [0, 1] -> ``round(map x 65535)`` as uint16 (values outside [0, 1] are clipped)."""
    scaled = np.multiply(maps, np.float32(MAP_SCALE), dtype=np.float32)
    scaled += np.float32(0.5)
    np.clip(scaled, 0.0, MAP_SCALE + 0.5, out=scaled)
    return scaled.astype(np.uint16)


def save_png(path: Path, array: np.ndarray) -> None:
    """An 8-bit RGB or 16-bit grey array as a PNG file at ``path`` (written as it is: stage it for atomicity)."""
    from PIL import Image

    Image.fromarray(array).save(path, format="PNG", compress_level=PNG_LEVEL)


def save_nifti(path: Path, quantized: np.ndarray, spacing: Sequence[float] | None) -> None:
    """(C, H, W) uint16 (:func:`quantize`) -> gzip NIfTI (W, H, 1, 1, C), intent 'vector', ``scl_slope`` 1/65535 (a
    reader's floats are the map within 0.5/65535): x = column, y = row as the readers expect.

    ``spacing``: the (row, column) pixel size in mm; None states :data:`FALLBACK_SPACING_MM`. The transposed view is
    handed to nibabel as it is: NIfTI stores x fastest, which is the (C, H, W) array's own memory order.
    """
    import nibabel as nib

    if quantized.dtype != np.uint16 or quantized.ndim != 3:
        raise ValueError(f"save_nifti takes (C, H, W) uint16 maps, got {quantized.dtype} {quantized.shape}")
    row_mm, col_mm = (float(s) for s in spacing) if spacing is not None else (FALLBACK_SPACING_MM,) * 2
    img = nib.Nifti1Image(np.transpose(quantized, (2, 1, 0))[:, :, None, None, :], np.diag([col_mm, row_mm, 1.0, 1.0]))
    img.header.set_slope_inter(1.0 / MAP_SCALE, 0.0)
    img.header.set_intent("vector", (), name=",".join(CLASS_NAMES))
    img.header.set_xyzt_units("mm")
    nib.save(img, str(path))


def map_spacing(meta: Mapping[str, Any]) -> tuple[float, float] | None:
    """The (row, col) mm the map files state: the file's own spacing (``meta["spacing"]``), so that a map lies on its
    image in any viewer; None when the file states none (the maps then state :data:`FALLBACK_SPACING_MM`, as viewers
    show such a file). A spacing from the datalist, ``input_spacing`` or the estimate is what the model saw the image
    at, stated in predictions.csv, not the file's geometry."""
    value = meta.get("spacing")
    flat = None if value is None else np.asarray(value, dtype=np.float64).reshape(-1)
    if flat is not None and flat.size == 2 and np.isfinite(flat).all() and (flat > 0).all():
        return float(flat[0]), float(flat[1])
    return None


def used_spacing(meta: Mapping[str, Any]) -> tuple[float, float] | None:
    """The (row, col) mm the maps on the file's grid state: the input's spacing the preprocessing used
    (``meta["spacing_used"]``: the file's, the datalist's, ``input_spacing`` or the estimate; predictions.csv states
    which), else the file's (``meta["spacing"]``); None (the maps state :data:`FALLBACK_SPACING_MM`) when neither is
    known, which predictions.csv states as ``spacing_source`` ``unknown``."""
    for key in ("spacing_used", "spacing"):
        value = meta.get(key)
        flat = None if value is None else np.asarray(value, dtype=np.float64).reshape(-1)
        if flat is not None and flat.size == 2 and np.isfinite(flat).all() and (flat > 0).all():
            return float(flat[0]), float(flat[1])
    return None


# -- overlay panels --------------------------------------------------------------------------------------------------
_SPACING_SOURCE_WORDS = {
    "fit_breast": "estimated: the breast fitted into the window",
    "model": "assumed: the model's",
    "datalist": "from the datalist",
    "option": "from input_spacing",
}


def panel_title_lines(
    file_name: str,
    scores: Sequence[float],
    labels: Sequence[int | str],
    maps: Sequence[str],
    with_masks: bool,
    facts: Mapping[str, Any] | None = None,
) -> list[str]:
    """The panel's title, in plain words: the file and its scores (malignant first: ``"malignant 0.16 · benign
    0.14"``) and labels when known; how it was read (spacing, view, laterality and where each came from, ``facts``
    of :func:`~.inference.image_facts`); what the tiles and the colours show."""
    order = sorted(range(len(CLASS_NAMES)), key=lambda i: CLASS_NAMES[i] != LesionClass.MALIGNANT)
    scored = " · ".join(f"{CLASS_NAMES[i]} {scores[i]:.2f}" for i in order)
    truth = "" if labels[0] == "" else "   (labels: " + ", ".join(f"{CLASS_NAMES[i]} {labels[i]}" for i in order) + ")"
    lines = [f"{file_name}   {scored}{truth}"]
    if facts is not None:
        source = str(facts.get("spacing_source", ""))
        if facts.get("spacing_row_mm"):
            row, col = float(facts["spacing_row_mm"]), float(facts["spacing_col_mm"])
            spacing = f"{row:.3g}" if np.isclose(row, col) else f"{row:.3g} x {col:.3g}"
            spacing = f"{spacing} mm ({_SPACING_SOURCE_WORDS.get(source, source)})"
        else:
            spacing = "unknown (not resampled)"
        view = f"{facts['view']} ({facts.get('view_source', '')})" if facts.get("view") else "unknown"
        side = f"{facts['laterality']} ({facts.get('laterality_source', '')})" if facts.get("laterality") else "unknown"
        lines.append(f"pixel spacing {spacing} · view {view} · laterality {side}")
    tiles = f"image{' + ground truth' if with_masks else ''} | " + " | ".join(maps)
    lines.append(f"{tiles}   yellow: the model's window · blue: selected patches · colours per map, see its bars")
    return lines


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


def overlay_panel(
    thumbnail: np.ndarray,
    maps: Mapping[str, np.ndarray],
    boxes: Sequence[tuple[int, int, int, int]],
    masks: np.ndarray | None,
    title: Sequence[str],
    step: int = 1,
    window: Sequence[int] | None = None,
) -> np.ndarray:
    """The titled panel of one image (:func:`~scripts.visualize.reading_panel`: the image with its masks, then each
    map scaled to its maximum with its colour bars; the model's ``window`` and the patches on every tile), at the
    thumbnail's resolution.

    ``thumbnail`` (h, w): every ``step``-th pixel of the image (``scripts.transforms.Thumbnail``); ``maps`` name ->
    (C, H, W) on the image's full grid (every ``step``-th pixel is shown); ``boxes`` (top, left, bottom, right) on
    the full grid, end-exclusive; ``window`` likewise (None: not drawn); ``masks`` (C, h, w) thumbnails or None.
    Returns (rows, cols, 3) uint8.
    """
    sub = (slice(None), slice(None, None, step), slice(None, None, step))
    small_maps = {name: maps[name][sub] for name in maps}
    for name, m in small_maps.items():
        if m.shape[-2:] != thumbnail.shape:
            raise ValueError(f"{name} at step {step} has shape {m.shape[-2:]}, the thumbnail {thumbnail.shape}")

    def small(box: Sequence[int]) -> tuple[int, int, int, int]:  # end-exclusive boxes at the thumbnail's step
        top, left, bottom, right = (int(v) for v in box)
        return top // step, left // step, -(-bottom // step), -(-right // step)

    panel = reading_panel(
        thumbnail,
        small_maps,
        [small(b) for b in boxes],
        masks,
        None if window is None else small(window),
        classes=CLASS_NAMES,
    )
    return add_title(panel, title)
