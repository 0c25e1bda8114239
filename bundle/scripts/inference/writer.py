"""The inference writer: an Ignite handler that takes each batch's outputs off the engine and writes every image's
files in background threads while the model runs on the next batch (see docs/inference.md).

Each image goes forward through one step per module, in a writer thread (:meth:`GLAMInferenceWriter.write_item`):

1. :mod:`.geometry`: the maps the run writes and the patch boxes back onto the file's grid through the
   preprocessing's inverse, and the model's window on it (everything needed travels with the item: the applied
   operations, the file's size, spacing and format in the metadata, the thumbnails for the panel);
2. :mod:`.facts`: what the image was read as (laterality, view, spacing and their sources);
3. :mod:`.maps`: the NIfTI / PNG map files, staged under temporary names (:class:`~.files.StagedFiles`);
4. :mod:`.panel`: the overlay panel;
5. :mod:`.dicom`: the DICOM objects of a DICOM input;
6. the staged files renamed into place together and recorded in the image's manifest (``manifests/<stem>.json``),
   then :mod:`.tables`: the notes (errors.csv) and the image's row (predictions.csv), appended only once its files
   are in place and recorded.

A failure of one image is its row in errors.csv; the others go on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import torch
from monai.data import MetaTensor
from monai.transforms import Compose

from ..enums import CLASS_NAMES, InferenceOutput, MapName, OutputKey
from .dicom import dicom_objects, save_dicom
from .facts import image_facts, image_notes
from .files import StagedFiles, manifest_name
from .folder import FINGERPRINT_KEY, InferenceOutputFolder
from .geometry import maps_on_original, original_size
from .inputs import cores_per_process
from .maps import map_spacing_note, save_png, write_map_files
from .panel import item_panel
from .tables import error_record, escape_text, note_record, prediction_row

__all__ = ["GLAMInferenceWriter", "writer_threads"]

logger = logging.getLogger(__name__)

#: the parts of a writer thread's time on one image, reported in timing.json as ``writing_<part>_s``
WRITING_PARTS = ("maps_back", "map_files", "panel", "dicom")


def writer_threads(threads: int | str = "auto", cpus: int | None = None) -> int:
    """``threads`` as a number; ``"auto"``: half the CPU cores (``cpus``, default ``os.cpu_count()``; under torchrun
    this process's part of them, :func:`~.inputs.cores_per_process`), at least 2, at most 8 (on 2 cores the run took
    8.5 s with 2 writer threads against 11.6-12.6 s with 1; docs/performance.md, "Inference on a folder")."""
    if str(threads).strip().lower() == "auto":
        return max(2, min(8, cores_per_process(cpus) // 2))
    return int(threads)


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


class GLAMInferenceWriter:
    """Ignite handler writing GLAM's inference outputs into an opened :class:`~.folder.InferenceOutputFolder`
    (see docs/inference.md for the files).

    Attach it to the inference evaluator: each iteration's images are queued to ``threads`` writer threads (at most
    ``max_pending`` images wait, so memory stays bounded and the model never runs far ahead); at the end of the run
    (also when it stops on an exception) the queue is drained and the folder's tables compacted. :meth:`finish`
    does the same for a run with nothing left to do.

    Args:
        folder: the output folder, opened (:meth:`~.folder.InferenceOutputFolder.open`) before the run.
        transform: the preprocessing ``Compose`` the items went through (its inverse maps the maps back).
        gamma_c: weight of S_g in S_c (the network's value).
        threads: writer threads (at least 1), or ``"auto"`` (:func:`writer_threads`).
        max_pending: images queued at most (default: twice the threads).
    """

    def __init__(
        self,
        folder: InferenceOutputFolder,
        transform: Compose,
        gamma_c: float = 0.5,
        threads: int | str = 1,
        max_pending: int | None = None,
    ) -> None:
        self.folder = folder
        self.outputs = folder.outputs
        self.transform = transform
        self.gamma_c = float(gamma_c)
        self.threads = max(1, writer_threads(threads))
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
            image, error = str(record.get("image", "")), str(record["error"])
            logger.warning("%s", escape_text(error if image in error else f"{image}: {error}"))
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
        written_notes: list[str] = []
        try:
            row = self.write_item(item, pred, written_notes)
        except Exception as exc:  # noqa: BLE001 - one image's failure must not lose the others
            logger.warning("%s: outputs not written: %s: %s", escape_text(path), type(exc).__name__, exc)
            self.folder.tables.add_error(error_record(path, exc))
            return
        finally:
            self._add_seconds("writing", time.perf_counter() - begin)
        notes = image_notes(item, default_view=self._default_view()) + written_notes
        maps_note = map_spacing_note(item["image"].meta, self.outputs)
        if maps_note is not None:
            note, first = maps_note
            notes.insert(0 if first else len(notes), note)
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

    def write_item(
        self, item: Mapping[str, Any], pred: Mapping[str, torch.Tensor], notes: list[str] | None = None
    ) -> dict[str, Any]:
        """Write one image's files (under temporary names, then renamed together), each step after the other (see
        the module's docstring); returns its predictions.csv row. What the map files and the DICOM step could not do
        as asked is appended to ``notes``."""
        path = _image_path(item)
        meta = item["image"].meta
        stem = str(item["output_stem"])
        dicom_input = meta.get("format") == "dicom"
        # 1. onto the file's grid
        begin = time.perf_counter()
        back = maps_on_original(item, pred, self.transform, self.gamma_c, self.outputs.maps_on_file())
        self._add_seconds("maps_back", time.perf_counter() - begin)
        # 2. what the image was read as, its scores and labels
        facts = image_facts(item)
        scores = pred[OutputKey.Y_GLOBAL].tolist()
        labels = _labels(item)
        files = self.outputs.files(stem, dicom_input)
        staged = StagedFiles(self.folder.path, manifest_name(stem))
        try:
            # 3. the map files
            begin = time.perf_counter()
            write_map_files(staged, files, back.maps, self.outputs, meta, notes)
            self._add_seconds("map_files", time.perf_counter() - begin)
            # 4. the panel (also the Secondary Capture's picture)
            panel = None
            if self.outputs.needs_panel():
                begin = time.perf_counter()
                shown = {name: back.maps[name] for name in self.outputs.panel_maps()}
                panel = item_panel(path, item, shown, back.boxes, back.window, scores, labels, facts)
                if self.outputs.panel:
                    save_png(staged.path(files[InferenceOutput.PANEL.value]), panel)
                self._add_seconds("panel", time.perf_counter() - begin)
            # 5. the DICOM objects
            if self.outputs.dicom:
                begin = time.perf_counter()
                s_c = back.maps.get(MapName.COMBINED.value)
                self._write_dicom(path, dicom_input, staged, files, panel, s_c, notes)
                self._add_seconds("dicom", time.perf_counter() - begin)
            # 6. into place together, then recorded in the image's manifest (what a rerun checks)
            written = staged.commit()
        finally:
            staged.discard()
        size = original_size(meta)
        fingerprint = item.get(FINGERPRINT_KEY)
        return prediction_row(path, stem, scores, labels, size, back.boxes, written, facts, back.window, fingerprint)

    def _write_dicom(
        self,
        path: str,
        dicom_input: bool,
        staged: StagedFiles,
        files: Mapping[str, str],
        panel: Any,
        s_c: Any,
        notes: list[str] | None = None,
    ) -> None:
        """The DICOM objects of a DICOM input. A header they cannot be made from (highdicom refusing a value) fails
        the DICOM outputs only: a note says why, the maps, the panel and the row are written."""
        if not dicom_input:
            logger.info(
                "%s: not a DICOM input, DICOM outputs %s skipped", escape_text(path), "/".join(self.outputs.dicom)
            )
            return
        found: list[str] = []
        try:
            objects = dicom_objects(path, self.outputs.dicom, panel, s_c, found)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:  # the source's header, as highdicom reads it
            found.append(f"DICOM outputs not written: {type(exc).__name__}: {exc}")
            objects = {}
        for kind, ds in objects.items():
            save_dicom(ds, staged.path(files[f"dicom_{kind}"]))
        if notes is not None:
            notes.extend(found)

    def stats(self) -> dict[str, Any]:
        """For timing.json: images skipped (done before), written and failed by this run, writer threads, and the
        seconds of the writer threads (``writing`` and its parts) and of the engine waiting for them."""
        plan = self.folder.plan
        return {
            "skipped": plan.skipped if plan is not None else 0,
            "written": self.folder.tables.written,
            "failed": self.folder.tables.failed,
            "writer_threads": self.threads,
            **{f"{k}_s": v for k, v in self.seconds.items() if k not in WRITING_PARTS},
            **{f"writing_{k}_s": self.seconds[k] for k in WRITING_PARTS},
        }
