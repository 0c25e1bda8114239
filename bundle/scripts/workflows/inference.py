"""GLAM inference on a folder or a datalist: per-image probabilities, saliency maps on the original image geometry,
overlay panels and a record of every input that failed (used from ``configs/inference.yaml``).

The pieces plug into a MONAI ``SupervisedEvaluator``: :class:`SafeDataset` turns a failing input into an error
record instead of an exception, :func:`collate_inference` stacks the good images and carries the errors along,
:class:`GLAMInferenceStep` is the evaluator's iteration (runs the inferer on the good images only) and
:class:`GLAMInferenceWriter` (an Ignite handler) maps every map back through the preprocessing's inverse
(``Invertd``, :func:`maps_on_original`) and has the writers of :mod:`scripts.workflows.inference_files` write the
files.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.data import Dataset, MetaTensor
from monai.transforms import Compose, Invertd

from ..data.readers import SUPPORTED_SUFFIXES, read_mammogram
from ..enums import CLASS_NAMES, MAP_NAMES, MapName, OutputKey
from ..patches import render_saliency
from ..transforms.mammo.spacing import MODEL_SPACING_KEY, SPACING_ASSUMED_KEY, format_spacing
from .dicom_outputs import dicom_output_kinds, write_dicom_outputs
from .inference_files import (
    ERROR_KEY,
    FALLBACK_SPACING_MM,
    NOTE_KEY,
    PREDICTION_COLUMNS,
    InferenceTables,
    MapFiles,
    OutputStems,
    PanelFiles,
    error_record,
    ground_truth_masks,
    note_record,
    overlay_panel,
    panel_title_lines,
    prediction_row,
)

logger = logging.getLogger(__name__)

__all__ = [
    "ERROR_KEY",
    "FALLBACK_SPACING_MM",
    "NOTE_KEY",
    "PREDICTION_COLUMNS",
    "SafeDataset",
    "collate_inference",
    "inference_items",
    "GLAMInferenceStep",
    "GLAMInferenceWriter",
    "window_box_to_original",
    "invert_maps",
    "maps_on_original",
    "spacing_note",
]


# -- the inputs ------------------------------------------------------------------------------------------------------
def _is_supported(path: Path) -> bool:
    name = path.name.lower()
    return any(name.endswith(s) for s in SUPPORTED_SUFFIXES)


def inference_items(
    input_dir: str | os.PathLike | None = None,
    datalist: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    split: str = "test",
) -> list[dict[str, Any]]:
    """The images to run on: every supported file under ``input_dir`` (recursively, sorted, hidden files skipped),
    or, when ``input_dir`` is empty, the items of ``datalist[split]`` (paths already resolved).

    Raises ``ValueError`` naming the folder or the split when there is nothing to run on.
    """
    if (input_dir is None or str(input_dir) == "") and datalist is not None:
        if split not in datalist:
            raise ValueError(f"datalist has no split {split!r} (splits: {sorted(datalist)})")
        items = [dict(item) for item in datalist[split]]
        if not items:
            raise ValueError(f"datalist split {split!r} is empty")
        return items
    if input_dir is None or str(input_dir) == "":
        raise ValueError("give input_dir (a folder of mammograms) or datalist")
    folder = Path(input_dir)
    if not folder.is_dir():
        raise ValueError(f"input_dir {str(folder)!r} is not a folder")
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts) and _is_supported(p)
    )
    if not files:
        raise ValueError(f"input_dir {str(folder)!r} holds no file of a supported type {SUPPORTED_SUFFIXES}")
    return [{"image": str(p)} for p in files]


def root_cause(exc: BaseException) -> BaseException:
    """The first error in the chain that is not one of MONAI's "applying transform ..." wrappers (the reader's
    own message, e.g. a ``MammogramReadError`` naming the file and the problem)."""
    seen = set()
    while (
        isinstance(exc, RuntimeError)
        and "applying transform" in str(exc)
        and exc.__cause__ is not None
        and id(exc) not in seen
    ):
        seen.add(id(exc))
        exc = exc.__cause__
    return exc


class SafeDataset(Dataset):
    """A ``Dataset`` whose items never raise: an input that fails to load or preprocess becomes
    ``{"image": path, "error": "<ExceptionType>: <message>"}``, so one bad file does not stop the run."""

    def _transform(self, index: int) -> Any:
        item = self.data[index]
        try:
            return super()._transform(index)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error record, by design
            path = item.get("image") if isinstance(item, Mapping) else item
            return error_record(path, root_cause(exc))


def collate_inference(items: Sequence[Mapping[Hashable, Any]]) -> dict[str, Any]:
    """Batch of :class:`SafeDataset` items -> ``{"image": (B, 1, H, W) tensor or None, "items": [good items],
    "errors": [error records]}``. Good items keep their ``MetaTensor`` (with the applied operations to invert)."""
    good = [d for d in items if ERROR_KEY not in d]
    errors = [{"image": d["image"], ERROR_KEY: d[ERROR_KEY]} for d in items if ERROR_KEY in d]
    image = torch.stack([torch.as_tensor(d["image"]) for d in good]) if good else None
    return {"image": image, "items": good, "errors": errors}


class GLAMInferenceStep:
    """The evaluator's iteration: run ``engine.inferer`` (:class:`~scripts.networks.GLAMInferer`, returning the GLAM
    output dict) on the batch's good images without gradients, outputs moved to the CPU.

    Returns ``{"items", "errors", "pred"}``; ``pred`` is ``None`` when every item of the batch failed.
    """

    def __init__(self, amp: bool = False, amp_dtype: torch.dtype = torch.bfloat16) -> None:
        self.amp = bool(amp)
        self.amp_dtype = amp_dtype

    def __call__(self, engine: Any, batch: Mapping[str, Any]) -> dict[str, Any]:
        pred = None
        if batch["image"] is not None:
            network = engine.network
            network.eval()
            device = next(network.parameters()).device
            image = batch["image"].to(device)
            with torch.no_grad(), torch.autocast(device.type, dtype=self.amp_dtype, enabled=self.amp):
                out = engine.inferer(image, network)
            pred = {
                k: (v.detach().float().cpu() if v.is_floating_point() else v.detach().cpu())
                for k, v in out.items()
                if isinstance(v, torch.Tensor)
            }
        return {"items": batch["items"], "errors": batch["errors"], "pred": pred}


# -- back onto the file's geometry -----------------------------------------------------------------------------------
def window_box_to_original(
    box: Sequence[int], meta: Mapping[str, Any], original_size: Sequence[int]
) -> tuple[int, int, int, int]:
    """A box ``(row, col, height, width)`` in window coordinates -> ``(top, left, bottom, right)`` (end-exclusive)
    in the original file, clipped to it, from the preprocessing metadata (``window_start``, ``crop_box``,
    ``flipped_to_right``). Used to check the ``Invertd`` route independently."""
    r, c, h, w = (int(v) for v in box)
    H, W = int(original_size[0]), int(original_size[1])
    top, left = (int(v) for v in np.asarray(meta["window_start"]).reshape(-1)[:2])
    crop = [int(v) for v in np.asarray(meta["crop_box"]).reshape(-1)[:4]]
    r0, c0 = r + top + crop[0], c + left + crop[1]
    r1, c1 = r0 + h, c0 + w
    if bool(meta["flipped_to_right"]):
        c0, c1 = W - c1, W - c0
    return max(0, r0), max(0, c0), min(H, r1), min(W, c1)


def invert_maps(item: Mapping[str, Any], maps: Mapping[str, torch.Tensor], transform: Compose) -> dict[str, np.ndarray]:
    """Window-coordinate maps ``name -> (C, h, w)`` -> arrays ``(C, H, W)`` on the original file's pixel grid,
    through ``Invertd(transform)`` with ``item["image"]`` (the preprocessed ``MetaTensor``) as the reference."""
    d: dict[str, Any] = {"image": item["image"]}
    for k, v in maps.items():
        d[k] = MetaTensor(v.float())
    inv = Invertd(list(maps), transform=transform, orig_keys="image", nearest_interp=False)(d)
    return {k: np.asarray(torch.as_tensor(inv[k]).cpu().numpy(), dtype=np.float32) for k in maps}


# key of the patch indicators inverted along with the maps (not a map name)
_BOXES = "boxes"


def _patch_indicators(boxes: torch.Tensor, window: tuple[int, ...]) -> torch.Tensor:
    """(K, h, w): 1 inside patch k's box ``(row, col, height, width)``, 0 elsewhere."""
    indicator = torch.zeros((boxes.shape[0], *window))
    for k, (r, c, h, w) in enumerate(boxes.tolist()):
        indicator[k, max(0, r) : r + h, max(0, c) : c + w] = 1.0
    return indicator


def _bounding_boxes(indicators: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(K, H, W) inverted indicators -> ``(top, left, bottom, right)`` (end-exclusive) of each non-empty one."""
    boxes = []
    for k in range(indicators.shape[0]):
        rows, cols = np.nonzero(indicators[k] > 0.5)
        if rows.size:  # a patch entirely in padding has no pixel of the file
            boxes.append((int(rows.min()), int(cols.min()), int(rows.max()) + 1, int(cols.max()) + 1))
    return boxes


def maps_on_original(
    item: Mapping[str, Any], pred: Mapping[str, torch.Tensor], transform: Compose, gamma_c: float = 0.5
) -> tuple[dict[str, np.ndarray], list[tuple[int, int, int, int]]]:
    """One image's GLAM outputs on the original file's geometry.

    Args:
        item: the preprocessed item (``item["image"]``: ``(1, h, w)`` ``MetaTensor`` with its applied operations).
        pred: that image's network outputs (``saliency_global`` ``(2, h/4/.., w/..)``, ``patch_maps``
            ``(K, 2, p/4, p/4)``, ``patch_boxes`` ``(K, 4)`` row, col, height, width in the window).
        transform: the preprocessing ``Compose`` the item went through.
        gamma_c: weight of S_g in S_c.

    Returns:
        ``{"S_g", "S_l", "S_c": (2, H, W) float32 in [0, 1]}`` rendered at full window resolution and taken back
        through the inverse of the preprocessing (pixels the model never saw are 0), and the patch boxes
        ``(top, left, bottom, right)`` (end-exclusive) on the file (patches entirely in padding are dropped).
    """
    window = tuple(item["image"].shape[-2:])
    boxes = pred[OutputKey.PATCH_BOXES]
    maps = render_saliency(
        pred[OutputKey.SALIENCY_GLOBAL][None], pred[OutputKey.PATCH_MAPS][None], boxes[None], window, 1, gamma_c
    )
    to_invert = {name: maps[name][0] for name in MAP_NAMES}
    to_invert[_BOXES] = _patch_indicators(boxes, window)
    back = invert_maps(item, to_invert, transform)
    return {name: np.clip(back[name], 0.0, 1.0) for name in MAP_NAMES}, _bounding_boxes(back[_BOXES])


# -- the handler -----------------------------------------------------------------------------------------------------
def _image_path(item: Mapping[str, Any]) -> str:
    image = item["image"]
    if isinstance(image, MetaTensor):
        return str(image.meta.get("filename_or_obj", ""))
    return str(image)


def _labels(item: Mapping[str, Any]) -> list[int | str]:
    """The item's image-level labels, one per class; empty cells when it has none (a folder has no labels)."""
    label = item.get("label")
    if isinstance(label, (list, tuple)) and len(label) == len(CLASS_NAMES):
        return [int(v) for v in label]
    return [""] * len(CLASS_NAMES)


def spacing_note(image: Any) -> str | None:
    """``"pixel spacing unknown, assumed the model's 0.4 mm"`` for a preprocessed image (``MetaTensor``) whose file
    states no pixel spacing while the model has one (``meta["spacing_assumed"]``, set by
    :class:`~scripts.transforms.ResampleToSpacingd`: the image was used as it is); None otherwise."""
    meta = image.meta if isinstance(image, MetaTensor) else {}
    if not bool(meta.get(SPACING_ASSUMED_KEY, False)):
        return None
    model = format_spacing(np.asarray(meta[MODEL_SPACING_KEY]).reshape(-1))
    return f"pixel spacing unknown, assumed the model's {model} mm"


def _check_on_file_grid(path: str, maps: Mapping[str, np.ndarray], size: tuple[int, int]) -> None:
    for name in MAP_NAMES:
        if maps[name].shape[-2:] != size:
            raise ValueError(f"{path}: inverted {name} has shape {maps[name].shape[-2:]}, the file {size}")


class GLAMInferenceWriter:
    """Ignite handler writing GLAM's inference outputs under ``output_dir`` (see docs/inference.md).

    Per image (``<stem>`` = the file name without suffix, made unique): ``maps/<stem>_<S>.nii.gz`` (float32, two
    channels benign/malignant) and ``maps/<stem>_<S>_<class>.png`` (16-bit, value = map x 65535) for S in S_g, S_l,
    S_c, all on the original file's pixel grid; ``panels/<stem>_panel.png``. At the end of the run (also when it
    stops on an exception) ``predictions.csv`` and ``errors.csv``. Maps are rendered at full window resolution
    (``render_saliency``, stride 1) and taken back through ``Invertd(transform)``: window, padding, crop, flip and
    the resampling to the model's pixel spacing undone, pixels the model never saw are 0. An image whose file states
    no pixel spacing while the model has one is processed as it is, with a warning and a note in errors.csv
    (:func:`spacing_note`).

    The handler maps the outputs back and composes the writers: :class:`~.inference_files.OutputStems` (names),
    :class:`~.inference_files.MapFiles`, :class:`~.inference_files.PanelFiles`, the DICOM objects of
    :mod:`~scripts.workflows.dicom_outputs` and :class:`~.inference_files.InferenceTables` (the CSV files).

    Args:
        output_dir: where to write.
        transform: the preprocessing ``Compose`` the items went through (its inverse maps the maps back).
        gamma_c: weight of S_g in S_c (the network's value).
        panels: write the overlay panels.
        panel_height: panels are scaled to at most this many rows of the image (None: full resolution).
        dicom_outputs: "none" | "sc" | "map" | "both": for DICOM inputs also ``dicom/<stem>_sc.dcm`` (Secondary
            Capture of the panel) and/or ``dicom/<stem>_map.dcm`` (FRACTIONAL Segmentation of S_c), see
            :mod:`scripts.workflows.dicom_outputs`; other inputs skip them (logged).
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        transform: Compose,
        gamma_c: float = 0.5,
        panels: bool = True,
        panel_height: int | None = 1024,
        dicom_outputs: str | None = "none",
    ) -> None:
        self.output_dir = Path(output_dir)
        self.transform = transform
        self.gamma_c = float(gamma_c)
        self.panels = bool(panels)
        self.panel_height = panel_height
        self.dicom_kinds = dicom_output_kinds(dicom_outputs)
        self.stems = OutputStems()
        self.map_files = MapFiles(self.output_dir / "maps")
        self.panel_files = PanelFiles(self.output_dir / "panels")
        self.tables = InferenceTables(self.output_dir)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The predictions.csv rows so far."""
        return self.tables.rows

    @property
    def errors(self) -> list[dict[str, str]]:
        """The errors.csv rows of the inputs that failed so far."""
        return self.tables.errors

    @property
    def notes(self) -> list[dict[str, str]]:
        """The errors.csv rows of the notes on processed images so far."""
        return self.tables.notes

    def attach(self, engine: Any) -> None:
        from ignite.engine import Events

        engine.add_event_handler(Events.STARTED, self.reset)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self)
        engine.add_event_handler(Events.COMPLETED, self.write_tables)
        engine.add_event_handler(Events.EXCEPTION_RAISED, self._on_exception)

    def reset(self, engine: Any = None) -> None:
        """Start a run: no rows, no errors, every stem free again."""
        self.tables.reset()
        self.stems.reset()

    def _on_exception(self, engine: Any, exc: BaseException) -> None:
        # the images done so far keep their rows, the run still fails
        self.write_tables()
        raise exc

    def __call__(self, engine: Any) -> None:
        out = engine.state.output
        self.errors.extend(out["errors"])
        for i, item in enumerate(out["items"]):
            try:
                self.rows.append(self.write_item(item, {k: v[i] for k, v in out["pred"].items()}))
            except Exception as exc:  # noqa: BLE001 - one image's failure must not lose the others
                self.errors.append(error_record(_image_path(item), exc))
                continue
            note = spacing_note(item["image"])
            if note is not None:
                logger.warning("%s: %s", _image_path(item), note)
                self.notes.append(note_record(_image_path(item), note))

    def invert(self, item: Mapping[str, Any], maps: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
        """Window-coordinate maps ``name -> (C, h, w)`` -> original-geometry arrays ``(C, H, W)``."""
        return invert_maps(item, maps, self.transform)

    def write_item(self, item: Mapping[str, Any], pred: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """Write one image's files; returns its predictions.csv row."""
        path = _image_path(item)
        maps, boxes = maps_on_original(item, pred, self.transform, self.gamma_c)
        image, meta = read_mammogram(path)
        height, width = image.shape
        _check_on_file_grid(path, maps, (height, width))
        stem = self.stems(path)
        self.map_files.write(path, stem, maps, meta)
        scores = pred[OutputKey.Y_GLOBAL].tolist()
        labels = _labels(item)
        panel = None
        if self.panels or "sc" in self.dicom_kinds:  # the Secondary Capture shows the panel
            panel = self._panel(path, item, image, maps, boxes, scores, labels)
            if self.panels:
                self.panel_files.write(stem, panel)
        self._write_dicom(path, stem, meta, panel, maps)
        return prediction_row(path, stem, scores, labels, (height, width), boxes)

    def _panel(
        self,
        path: str,
        item: Mapping[str, Any],
        image: np.ndarray,
        maps: Mapping[str, np.ndarray],
        boxes: Sequence[tuple[int, int, int, int]],
        scores: Sequence[float],
        labels: Sequence[int | str],
    ) -> np.ndarray:
        masks = ground_truth_masks(item)
        title = panel_title_lines(Path(path).name, scores, labels, with_masks=masks is not None)
        return overlay_panel(image, maps, boxes, masks, title, self.panel_height)

    def _write_dicom(
        self, path: str, stem: str, meta: Mapping[str, Any], panel: np.ndarray | None, maps: Mapping[str, np.ndarray]
    ) -> None:
        if not self.dicom_kinds:
            return
        if meta.get("format") != "dicom":
            logger.info("%s: not a DICOM input, DICOM outputs %s skipped", path, "/".join(self.dicom_kinds))
            return
        write_dicom_outputs(path, self.output_dir, stem, self.dicom_kinds, panel, maps[MapName.COMBINED])

    def write_tables(self, engine: Any = None) -> None:
        """Write predictions.csv and errors.csv (atomically; errors.csv has its header even when empty)."""
        self.tables.write()
