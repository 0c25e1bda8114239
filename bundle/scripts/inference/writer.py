"""The inference writer: an Ignite handler writing each image's files in background threads while the model runs on
the next batch; one image's failure is its errors.csv row, the others go on."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import torch
from monai.transforms import Compose

from ..enums import CLASS_NAMES, InferenceOutput, MapName, OutputKey
from ..transforms.mammo.coverage import original_size
from .dicom import dicom_objects, save_dicom
from .facts import image_facts, image_notes
from .files import StagedFiles, manifest_name
from .folder import FINGERPRINT_KEY, InferenceOutputFolder
from .inputs import cores_per_process, item_path
from .maps import map_spacing_note, maps_on_original, save_png, write_map_files
from .panel import item_panel
from .tables import error_record, escape_text, note_record, prediction_row

logger = logging.getLogger(__name__)

#: the parts of a writer thread's time on one image, reported in timing.json as ``writing_<part>_s``
WRITING_PARTS = ("maps_back", "map_files", "panel", "dicom")


def writer_threads(threads: int | str = "auto", cpus: int | None = None) -> int:
    """Writer threads: ``threads``, or ``"auto"``: half this process's cores, at least 2, at most 8."""
    if str(threads).strip().lower() == "auto":
        return max(2, min(8, cores_per_process(cpus) // 2))
    return int(threads)


def _labels(item: Mapping[str, Any]) -> list[int | str]:
    """The item's image-level labels, one per class; empty cells when it has none."""
    label = item.get("label")
    if isinstance(label, (list, tuple)) and len(label) == len(CLASS_NAMES):
        return [int(v) for v in label]
    return [""] * len(CLASS_NAMES)


class GLAMInferenceWriter:
    """Ignite handler writing GLAM's inference outputs into an opened :class:`~.folder.InferenceOutputFolder`.

    Args:
        folder: the output folder, opened before the run.
        transform: the preprocessing ``Compose`` the items went through (its inverse maps the maps back).
        gamma_c: weight of S_g in S_c.
        threads: writer threads, or ``"auto"`` (:func:`writer_threads`).
        max_pending: images queued at most, so that memory stays bounded (default: twice the threads).
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
        """Wait for every queued image, then compact the folder's tables and release it (once).

        Raises:
            OSError: what a writer thread could not record (the tables failing, e.g. a full disk).
        """
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

    def _write_safely(self, item: Mapping[str, Any], pred: Mapping[str, torch.Tensor]) -> None:
        path = item_path(item)
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
        """The preprocessing's ``BestCenterWindowd(default_view=...)``: the window rule of unknown views."""
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
        """Write one image's files together and return its predictions.csv row."""
        path = item_path(item)
        meta = item["image"].meta
        stem = str(item["output_stem"])
        dicom_input = meta.get("format") == "dicom"
        begin = time.perf_counter()
        back = maps_on_original(item, pred, self.transform, self.gamma_c, self.outputs.maps_on_file())
        self._add_seconds("maps_back", time.perf_counter() - begin)
        facts = image_facts(item)
        scores = pred[OutputKey.Y_GLOBAL].tolist()
        labels = _labels(item)
        files = self.outputs.files(stem, dicom_input)
        staged = StagedFiles(self.folder.path, manifest_name(stem))
        try:
            begin = time.perf_counter()
            write_map_files(staged, files, back.maps, self.outputs, meta, notes)
            self._add_seconds("map_files", time.perf_counter() - begin)
            # the panel is also the Secondary Capture's picture
            panel = None
            if self.outputs.needs_panel():
                begin = time.perf_counter()
                shown = {name: back.maps[name] for name in self.outputs.panel_maps()}
                panel = item_panel(path, item, shown, back.boxes, back.window, scores, labels, facts)
                if self.outputs.panel:
                    save_png(staged.path(files[InferenceOutput.PANEL.value]), panel)
                self._add_seconds("panel", time.perf_counter() - begin)
            if self.outputs.dicom:
                begin = time.perf_counter()
                s_c = back.maps.get(MapName.COMBINED.value)
                self._write_dicom(path, dicom_input, staged, files, panel, s_c, notes)
                self._add_seconds("dicom", time.perf_counter() - begin)
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
        """Stage the DICOM objects of a DICOM input; a header highdicom refuses fails them only, with a note."""
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
        """For timing.json: images skipped, written and failed, the writer threads and their seconds."""
        plan = self.folder.plan
        return {
            "skipped": plan.skipped if plan is not None else 0,
            "written": self.folder.tables.written,
            "failed": self.folder.tables.failed,
            "writer_threads": self.threads,
            **{f"{k}_s": v for k, v in self.seconds.items() if k not in WRITING_PARTS},
            **{f"writing_{k}_s": self.seconds[k] for k in WRITING_PARTS},
        }
