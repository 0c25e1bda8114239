"""MONAI Label app serving the GLAM bundle's saliency maps (one segmentation model, ``glam``).

Started by ``tools/start_label_server.sh`` (docs/monailabel.md), or with this folder on ``PYTHONPATH``:

    PYTHONPATH=label_app python -m monailabel.main start_server --app label_app --studies DIR \
        --host 127.0.0.1 --port 8000 --uvicorn_app glam_server:app \
        --conf bundle bundle --conf model runs/quickstart/models/joint/model.pt

``--conf`` keys: ``bundle`` (default ``../bundle``), ``model`` (default ``<bundle>/models/model.pt``), ``preset``
(config files over ``inference.yaml``, comma-separated), ``device``. Nothing a request names reaches outside the
studies folder: inputs are datastore ids or uploads of the request, sessions and whole-slide inference are off, and
the checkpoint is not served.
"""

from __future__ import annotations

import atexit
import copy
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from monailabel.config import settings
from monailabel.interfaces.app import MONAILabelApp
from monailabel.interfaces.datastore import Datastore, DefaultLabelTag
from monailabel.interfaces.tasks.batch_infer import BatchInferTask
from monailabel.interfaces.tasks.infer_v2 import InferTask

APP_DIR = Path(__file__).resolve().parent
MODEL_NAME = "glam"

logger = logging.getLogger(__name__)


def _conf_path(conf: dict[str, str], key: str, default: Path) -> Path:
    value = conf.get(key)
    return Path(value).expanduser().resolve() if value else default


def _check_served_safely() -> None:
    """Refuse to start in MONAI Label's FastAPI app unless ``glam_server`` configured it (it grants any origin)."""
    from glam_safety import SERVER_FLAG

    served = sys.modules.get("monailabel.app")
    if served is not None and not getattr(served.app.state, SERVER_FLAG, False):
        raise RuntimeError(
            "label_app must be served by its own server module: pass --uvicorn_app glam_server:app with label_app/ "
            "on PYTHONPATH (tools/start_label_server.sh does both); MONAI Label's default app lets any web page "
            "drive the server"
        )


def _status_and_message(error: Exception) -> tuple[int, str]:
    """The HTTP status and message of a request that failed with ``error`` (``glam_server``'s rules)."""
    from fastapi import HTTPException
    from glam_safety import RequestRefused
    from monailabel.interfaces.exception import (
        ImageNotFoundException,
        LabelNotFoundException,
        MONAILabelError,
        MONAILabelException,
    )

    if isinstance(error, RequestRefused):
        return error.status_code, str(error)
    if isinstance(error, HTTPException):
        return error.status_code, str(error.detail)
    if isinstance(error, (ImageNotFoundException, LabelNotFoundException)):
        return 404, error.msg
    if isinstance(error, MONAILabelException) and error.error == MONAILabelError.INVALID_INPUT:
        return 400, error.msg
    return 500, f"{type(error).__name__}: {error}"


class GLAMBatchInfer(BatchInferTask):
    """``POST /batch/infer/glam``: GLAM on each image listed, its map saved under ``label_tag`` (default its own).

    A failed image is answered as ``{"error": message, "status": code}`` under its id and the others are done
    (MONAI Label's task stops at the first failure and defaults to the ``original`` tag).
    """

    def __call__(self, request: dict[str, Any], datastore: Datastore, infer: Any) -> dict[str, Any]:
        from glam_safety import RequestRefused, check_name

        tag = request.get("label_tag")
        if tag is not None:
            check_name(tag, "label tag")
            if tag == DefaultLabelTag.ORIGINAL:
                raise RequestRefused(
                    "label_tag 'original' is kept for the readers' annotations: send a JSON body without label_tag "
                    "(maps go under glam_label or glam_heatmap_<class>) or name another tag (MONAI Label's default "
                    "batch body names 'original')"
                )
        image_ids = self.get_images(request, datastore)
        if not isinstance(image_ids, list) or not all(isinstance(i, str) for i in image_ids):
            raise RequestRefused(
                f"images must be 'all', 'labeled', 'unlabeled' or a list of ids, got {image_ids!r:.80}"
            )
        image_ids = sorted(image_ids)
        limit = request.get("max_batch_size") or 0
        if isinstance(limit, int) and limit > 0:
            image_ids = image_ids[:limit]
        logger.info("GLAM batch inference: %d images, label tag %s", len(image_ids), tag or "(the map's own)")
        begin, result, failed = time.time(), {}, 0
        for image_id in image_ids:
            req = {
                **{k: v for k, v in request.items() if k not in ("images", "device", "multi_gpu", "gpus")},
                "image": image_id,
                "save_label": True,
            }
            try:
                answer = infer(req, datastore)
            except Exception as e:  # noqa: BLE001 - every image is answered: the error is its result
                status, message = _status_and_message(e)
                logger.warning(
                    "GLAM batch inference: %s failed (%d): %s", image_id, status, message, exc_info=status >= 500
                )
                result[image_id] = {"error": message, "status": status}
                failed += 1
                continue
            if answer.get("file"):
                Path(answer.pop("file")).unlink(missing_ok=True)
            result[image_id] = answer
        logger.info(
            "GLAM batch inference: %d done, %d failed in %.1f s", len(image_ids) - failed, failed, time.time() - begin
        )
        return result


class GLAMApp(MONAILabelApp):
    def __init__(self, app_dir: str, studies: str, conf: dict[str, str]) -> None:
        conf = conf or {}
        self.bundle_dir = _conf_path(conf, "bundle", APP_DIR.parent / "bundle")
        self.model_path = _conf_path(conf, "model", self.bundle_dir / "models" / "model.pt")
        self.presets = [Path(p).expanduser().resolve() for p in conf.get("preset", "").split(",") if p.strip()]
        self.device = conf.get("device") or None
        for path in (str(self.bundle_dir), str(APP_DIR)):
            if path not in sys.path:
                sys.path.insert(0, path)
        _check_served_safely()
        from glam_infer import LABELS

        # uploads land in the app's own folder: the only place a path input is accepted from
        self.scratch = Path(tempfile.mkdtemp(prefix="glam_label_")).resolve()
        tempfile.tempdir = str(self.scratch)
        atexit.register(self.close)
        logger.info("GLAM temporary folder (uploads, results): %s", self.scratch)

        super().__init__(
            app_dir=app_dir,
            studies=studies,
            conf=conf,
            name="GLAM mammography saliency",
            description="GLAM (Liu et al., MIDL 2021) weakly supervised saliency maps for 2-D mammograms",
            version=json.loads((self.bundle_dir / "configs" / "metadata.json").read_text())["version"],
            labels=dict(LABELS),
        )

    def close(self) -> None:
        """Remove the app's temporary folder."""
        shutil.rmtree(self.scratch, ignore_errors=True)

    def init_datastore(self) -> Datastore:
        from glam_datastore import GLAMDatastore

        if self.studies.startswith(("http://", "https://")):
            raise ValueError(f"studies {self.studies}: the GLAM app serves a local studies folder, not a remote store")
        logger.info("GLAM datastore: %s (ids, tags and paths confined to it)", self.studies)
        return GLAMDatastore(
            self.studies,
            extensions=settings.MONAI_LABEL_DATASTORE_FILE_EXT,
            uploads_dir=self.scratch,
            auto_reload=settings.MONAI_LABEL_DATASTORE_AUTO_RELOAD,
            read_only=settings.MONAI_LABEL_DATASTORE_READ_ONLY,
        )

    def _load_sessions(self, load: bool = False) -> None:
        return None  # sessions live outside the studies folder

    def init_infers(self) -> dict[str, InferTask]:
        from glam_infer import GLAMSaliencyInfer

        task = GLAMSaliencyInfer(self.bundle_dir, self.model_path, self.presets, self.device)
        logger.info(
            "GLAM model %r: bundle %s, weights %s, presets %s",
            MODEL_NAME,
            self.bundle_dir,
            self.model_path,
            [str(p) for p in self.presets],
        )
        return {MODEL_NAME: task}

    def init_batch_infer(self) -> GLAMBatchInfer:
        return GLAMBatchInfer()

    def init_trainers(self) -> dict[str, Any]:
        return {}  # GLAM trains with the bundle's workflow

    def model_file(self, model: str, validate: bool = True) -> None:
        return None  # the checkpoint is not served over HTTP

    def infer_wsi(self, request: dict[str, Any], datastore: Any = None) -> dict[str, Any]:
        from glam_safety import RequestRefused

        raise RequestRefused(f"whole-slide inference is not offered: use /infer/{MODEL_NAME}", 404)

    def next_sample(self, request: dict[str, Any]) -> dict[str, Any]:
        from glam_safety import RequestRefused

        strategy = request.get("strategy") or "random"
        if strategy not in self._strategies:
            raise RequestRefused(f"strategy {strategy!r} is not offered; strategies: {sorted(self._strategies)}", 404)
        return super().next_sample(request)

    def _upload(self, image: Any) -> str | None:
        """``image`` if it is the file MONAI Label wrote for this request's upload."""
        if not isinstance(image, str) or not os.path.isabs(image):
            return None
        path = Path(image)
        if path.parent != self.scratch or not path.name.startswith(tempfile.template):
            return None
        return image if path.is_file() and not path.is_symlink() else None

    def infer(self, request: dict[str, Any], datastore: Any = None) -> dict[str, Any]:
        """MONAI Label's ``infer`` with the input a datastore id or this request's upload (else 400).

        ``save_label`` keeps the map under ``label_tag``, by default ``glam_label`` or ``glam_heatmap_<class>`` (never
        ``original``). The upload, and a map whose request failed, are removed here, also on failure.
        """
        upload = self._upload(request.get("image"))
        try:
            return self._infer(request, upload, datastore)
        finally:
            if upload is not None:
                Path(upload).unlink(missing_ok=True)

    def _infer(self, request: dict[str, Any], upload: str | None, datastore: Any) -> dict[str, Any]:
        from glam_infer import UPLOADED, overlay_settings
        from glam_inputs import inference_input
        from glam_safety import RequestRefused, as_bool, check_name
        from monailabel.utils.others.generic import handle_torch_linalg_multithread

        datastore = datastore if datastore else self.datastore()
        model = request.get("model")
        task = self._infers.get(model) if isinstance(model, str) else None
        if task is None:
            raise RequestRefused(f"model {model!r} is not served here; models: {sorted(self._infers)}", 404)
        request = copy.deepcopy(request)
        request["description"] = task.description
        if upload is None:
            image_id = check_name(request.get("image"), "image id")
            path = datastore.get_image_uri(image_id)  # 404 when the datastore has no such image
            # ingest's copy of a DICOM is read as the DICOM itself
            path, source = inference_input(datastore.root, path)
            request["image"], request["image_name"], request["image_source"] = path, image_id, source
        else:
            image_id = None
            request["image_name"] = UPLOADED
        save = image_id is not None and as_bool(request.get("save_label"), "save_label")
        tag = None
        if save:
            shown = overlay_settings(request)
            own_tag = "glam_label" if shown["overlay"] == "label" else f"glam_heatmap_{shown['heatmap_class']}"
            tag = check_name(request.get("label_tag") or own_tag, "label tag")
            if tag == DefaultLabelTag.ORIGINAL:
                raise RequestRefused(
                    "label_tag 'original' is kept for the readers' annotations: leave label_tag out (maps go under "
                    f"{own_tag}) or name another tag"
                )

        if self._infers_threadpool:

            def run(t: InferTask, r: dict[str, Any]) -> Any:
                handle_torch_linalg_multithread(r)
                return t(r)

            future = self._infers_threadpool.submit(run, task, request)
            result_file, result_json = future.result(settings.MONAI_LABEL_INFER_TIMEOUT)
        else:
            result_file, result_json = task(request)

        label_id = result_file
        if save and result_file and os.path.exists(result_file):
            try:
                label_id = datastore.save_label(image_id, result_file, tag, {"model": model, "params": result_json})
            except BaseException:
                Path(result_file).unlink(missing_ok=True)
                raise
        return {"label": label_id, "tag": tag or DefaultLabelTag.ORIGINAL, "file": result_file, "params": result_json}
