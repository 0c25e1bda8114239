"""The inference writer: an Ignite handler that takes each batch's outputs off the engine and writes every image's
files in background threads while the model runs on the next batch (see docs/inference.md).

Per image, in a writer thread: the maps the run writes (and the patch boxes) are taken back onto the file's grid
through the preprocessing's inverse (:func:`~.inference.maps_on_original`, everything it needs travels with the
item: the applied operations, the file's size, spacing and format in the metadata, the thumbnail for the panel), the
files are written under temporary names and renamed into place together, and only then is the image's row appended
to predictions.csv. A failure of one image is its row in errors.csv; the others go on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.data import MetaTensor
from monai.transforms import Compose

from ..enums import CLASS_NAMES, InferenceOutput, MapName, OutputKey
from ..transforms.thumbnail import THUMBNAIL_STEP_KEY, THUMBNAIL_SUFFIX
from .dicom import dicom_objects, save_dicom
from .files import (
    FALLBACK_SPACING_MM,
    StagedFiles,
    map_spacing,
    overlay_panel,
    panel_title_lines,
    quantize,
    save_nifti,
    save_png,
    used_spacing,
)
from .folder import FINGERPRINT_KEY, InferenceOutputFolder
from .step import image_facts, image_notes, maps_on_original
from .tables import error_record, escape_text, note_record, prediction_row

__all__ = ["GLAMInferenceWriter"]

# the warnings keep the name of the module that wrote these files before they had their own (log filters use it)
logger = logging.getLogger(f"{__package__}.inference")

# formats that seldom state a pixel spacing (a PNG may, in its pHYs chunk): maps of unknown spacing state 1 mm per pixel
# without a note
_FORMATS_WITHOUT_SPACING = ("png", "pil")
_NO_SPACING = "no valid pixel spacing in the file (missing, zero or negative) nor stated, and the model has none"

#: the parts of a writer thread's time on one image, reported in timing.json as ``writing_<part>_s``
WRITING_PARTS = ("maps_back", "map_files", "panel", "dicom")


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


def _thumbnail(item: Mapping[str, Any], key: str) -> np.ndarray | None:
    value = item.get(f"{key}{THUMBNAIL_SUFFIX}")
    return None if value is None else np.asarray(torch.as_tensor(value).cpu().numpy(), dtype=np.float32)[0]


def _mask_thumbnails(item: Mapping[str, Any]) -> np.ndarray | None:
    """(C, h, w) thumbnails of the item's lesion masks (the datalist's ``mask_<class>``); None unless every class has
    one."""
    masks = [_thumbnail(item, f"mask_{cls}") for cls in CLASS_NAMES]
    return None if any(m is None for m in masks) else np.stack(masks)


class GLAMInferenceWriter:
    """Ignite handler writing GLAM's inference outputs into an opened :class:`~.inference_folder.InferenceOutputFolder`
    (see docs/inference.md for the files).

    Attach it to the inference evaluator: each iteration's images are queued to ``threads`` writer threads (at most
    ``max_pending`` images wait, so memory stays bounded and the model never runs far ahead); at the end of the run
    (also when it stops on an exception) the queue is drained and the folder's tables compacted. :meth:`finish`
    does the same for a run with nothing left to do.

    Args:
        folder: the output folder, opened (:meth:`~.inference_folder.InferenceOutputFolder.open`) before the run.
        transform: the preprocessing ``Compose`` the items went through (its inverse maps the maps back).
        gamma_c: weight of S_g in S_c (the network's value).
        threads: writer threads (at least 1).
        max_pending: images queued at most (default: twice the threads).
    """

    def __init__(
        self,
        folder: InferenceOutputFolder,
        transform: Compose,
        gamma_c: float = 0.5,
        threads: int = 1,
        max_pending: int | None = None,
    ) -> None:
        self.folder = folder
        self.outputs = folder.outputs
        self.transform = transform
        self.gamma_c = float(gamma_c)
        self.threads = max(1, int(threads))
        self.max_pending = max(1, int(max_pending) if max_pending else 2 * self.threads)
        self._executor: ThreadPoolExecutor | None = None
        self._pending: set[Future] = set()
        self._lock = threading.Lock()
        self._finished = False
        self.seconds = dict.fromkeys((*WRITING_PARTS, "writing", "waiting_for_writers"), 0.0)

    # -- engine events -----------------------------------------------------------------------------------------------
    def attach(self, engine: Any) -> None:
        from ignite.engine import Events

        engine.add_event_handler(Events.STARTED, self.start)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self)
        engine.add_event_handler(Events.COMPLETED, self.finish)
        engine.add_event_handler(Events.EXCEPTION_RAISED, self._on_exception)

    def start(self, engine: Any = None) -> None:
        if self.folder.plan is None:
            raise RuntimeError(
                "GLAMInferenceWriter: open the output folder (InferenceOutputFolder.open) before the run"
            )
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="glam-writer")

    def __call__(self, engine: Any) -> None:
        out = engine.state.output
        for record in out["errors"]:
            logger.warning("%s", escape_text(record["error"]))
            self.folder.tables.add_error(record)
        for i, item in enumerate(out["items"]):
            self._submit(item, {k: v[i] for k, v in out["pred"].items()})

    def _submit(self, item: Mapping[str, Any], pred: Mapping[str, torch.Tensor]) -> None:
        self.start()
        if len(self._pending) >= self.max_pending:
            begin = time.perf_counter()
            done, self._pending = wait(self._pending, return_when=FIRST_COMPLETED)
            self.seconds["waiting_for_writers"] += time.perf_counter() - begin
            for future in done:
                future.result()  # an image's failure is its errors.csv row; this raises only when the tables fail
        self._pending.add(self._executor.submit(self._write_safely, item, pred))

    def finish(self, engine: Any = None) -> None:
        """Wait for every queued image, then compact the folder's tables and release it (once). Raises what a writer
        thread could not record (the tables themselves failing, e.g. a full disk) after the folder is released."""
        if self._finished:
            return
        self._finished = True
        begin = time.perf_counter()
        done, _ = wait(self._pending)
        self._pending = set()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self.seconds["waiting_for_writers"] += time.perf_counter() - begin
        self.folder.finish()
        for future in done:
            future.result()

    def _on_exception(self, engine: Any, exc: BaseException) -> None:
        self.finish()  # the images done so far keep their rows and files; the run still fails
        raise exc

    # -- one image ---------------------------------------------------------------------------------------------------
    def _write_safely(self, item: Mapping[str, Any], pred: Mapping[str, torch.Tensor]) -> None:
        path = _image_path(item)
        begin = time.perf_counter()
        try:
            row = self.write_item(item, pred)
        except Exception as exc:  # noqa: BLE001 - one image's failure must not lose the others
            logger.warning("%s: outputs not written: %s: %s", escape_text(path), type(exc).__name__, exc)
            self.folder.tables.add_error(error_record(path, exc))
            return
        finally:
            self._add_seconds("writing", time.perf_counter() - begin)
        notes = image_notes(item, default_view=self._default_view())
        meta = item["image"].meta
        if self.outputs.maps and map_spacing(meta) is None and meta.get("format") not in _FORMATS_WITHOUT_SPACING:
            if used_spacing(meta) is None:
                notes.insert(0, f"{_NO_SPACING}: the NIfTI maps state {FALLBACK_SPACING_MM:g} mm per pixel")
            else:  # the model saw it at a stated or estimated spacing; the maps keep the file's own grid
                notes.append(f"the NIfTI maps keep the file's grid at {FALLBACK_SPACING_MM:g} mm per pixel")
        if notes:  # before the row: a run killed in between redoes the image, the note is not lost
            note = "; ".join(notes)
            logger.warning("%s: %s", escape_text(path), note)
            self.folder.tables.add_note(note_record(path, note))
        self.folder.tables.add_prediction(row)

    def _default_view(self) -> str | None:
        """The window rule of unknown views: the preprocessing's ``BestCenterWindowd(default_view=...)``."""
        for t in getattr(self.transform, "transforms", ()):
            cropper = getattr(t, "cropper", None)
            if hasattr(cropper, "default_view"):
                return cropper.default_view
        return "CC"

    def _add_seconds(self, part: str, seconds: float) -> None:
        with self._lock:
            self.seconds[part] += seconds

    def _panel_maps(self) -> tuple[str, ...]:
        return self.outputs.maps or (MapName.COMBINED.value,)

    def write_item(self, item: Mapping[str, Any], pred: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """Write one image's files (under temporary names, then renamed together); returns its predictions.csv row."""
        path = _image_path(item)
        meta = item["image"].meta
        size = tuple(int(v) for v in np.asarray(meta["spatial_shape"]).reshape(-1)[:2])
        stem = str(item["output_stem"])
        dicom_input = meta.get("format") == "dicom"
        needed = set(self.outputs.maps_needed()) | (set(self._panel_maps()) if self.outputs.needs_panel() else set())
        begin = time.perf_counter()
        maps, boxes, window = maps_on_original(item, pred, self.transform, self.gamma_c, tuple(needed), True)
        for name, m in maps.items():
            if m.shape[-2:] != size:
                raise ValueError(f"{path}: inverted {name} has shape {m.shape[-2:]}, the file {size}")
        self._add_seconds("maps_back", time.perf_counter() - begin)
        files = self.outputs.files(stem, dicom_input)
        staged = StagedFiles(self.folder.path)
        try:
            begin = time.perf_counter()
            spacing = map_spacing(meta)
            for name in self.outputs.maps:
                quantized = quantize(maps[name])
                save_nifti(staged.path(files[name]), quantized, spacing)
                for c, cls in enumerate(CLASS_NAMES if self.outputs.png else ()):
                    save_png(staged.path(files[f"{name}_{cls}"]), quantized[c])
            self._add_seconds("map_files", time.perf_counter() - begin)
            scores = pred[OutputKey.Y_GLOBAL].tolist()
            labels = _labels(item)
            facts = image_facts(item)
            panel = None
            if self.outputs.needs_panel():
                begin = time.perf_counter()
                panel = self._panel(path, item, maps, boxes, scores, labels, window, facts)
                if self.outputs.panel:
                    save_png(staged.path(files[InferenceOutput.PANEL.value]), panel)
                self._add_seconds("panel", time.perf_counter() - begin)
            self._write_dicom(path, dicom_input, staged, files, panel, maps)
            written = staged.commit()
        finally:
            staged.discard()
        fingerprint = item.get(FINGERPRINT_KEY)
        return prediction_row(path, stem, scores, labels, size, boxes, written, facts, window, fingerprint)

    def _panel(
        self,
        path: str,
        item: Mapping[str, Any],
        maps: Mapping[str, np.ndarray],
        boxes: Sequence[tuple[int, int, int, int]],
        scores: Sequence[float],
        labels: Sequence[int | str],
        window: Sequence[int] | None,
        facts: Mapping[str, Any],
    ) -> np.ndarray:
        thumbnail = _thumbnail(item, "image")
        if thumbnail is None:
            raise ValueError(
                f"{path}: no image thumbnail to draw the panel on (the preprocessing needs "
                "scripts.transforms.Thumbnaild after loading, as configs/inference.yaml has it)"
            )
        masks = _mask_thumbnails(item)
        shown = {name: maps[name] for name in self._panel_maps()}
        with_masks = masks is not None
        title = panel_title_lines(Path(path).name, scores, labels, list(shown), with_masks=with_masks, facts=facts)
        step = int(item.get(THUMBNAIL_STEP_KEY, 1))
        return overlay_panel(thumbnail, shown, boxes, masks, title, step, window=window)

    def _write_dicom(
        self,
        path: str,
        dicom_input: bool,
        staged: StagedFiles,
        files: Mapping[str, str],
        panel: np.ndarray | None,
        maps: Mapping[str, np.ndarray],
    ) -> None:
        if not self.outputs.dicom:
            return
        if not dicom_input:
            logger.info(
                "%s: not a DICOM input, DICOM outputs %s skipped", escape_text(path), "/".join(self.outputs.dicom)
            )
            return
        begin = time.perf_counter()
        objects = dicom_objects(path, self.outputs.dicom, panel, maps.get(MapName.COMBINED.value))
        for kind, ds in objects.items():
            save_dicom(ds, staged.path(files[f"dicom_{kind}"]))
        self._add_seconds("dicom", time.perf_counter() - begin)

    def stats(self) -> dict[str, Any]:
        """For timing.json: images skipped (done before), written and failed by this run, writer threads, and the
        seconds of the writer threads (``writing`` and its parts) and of the engine waiting for them."""
        plan = self.folder.plan
        return {
            "skipped": plan.skipped if plan else 0,
            "written": self.folder.tables.written,
            "failed": self.folder.tables.failed,
            "writer_threads": self.threads,
            **{f"{k}_s": v for k, v in self.seconds.items() if k not in WRITING_PARTS},
            **{f"writing_{k}_s": self.seconds[k] for k in WRITING_PARTS},
        }
