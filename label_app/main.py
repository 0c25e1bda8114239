"""MONAI Label app serving the GLAM bundle's saliency maps (one segmentation model, ``glam``).

Started by ``scripts/start_label_server.sh`` (see docs/monailabel.md), or directly:

    monailabel start_server --app label_app --studies DIR --host 127.0.0.1 --port 8000 \
        --conf bundle bundle --conf model runs/quickstart/models/joint/model.pt

``--conf`` keys: ``bundle`` (the bundle folder; default ``../bundle`` beside this app), ``model`` (a state dict for
the bundle's inference ``network_def``; default ``<bundle>/models/model.pt``), ``preset`` (config files layered
over ``inference.yaml``, comma-separated; a checkpoint written by the bundle's training carries its settings and
needs none), ``device``.

A thin app on MONAI Label's ``BasicInferTask`` rather than the stock ``monaibundle`` app: the bundle's own
preprocessing inverse puts every map on the original image geometry, the weights load strictly, and the app needs
neither torchvision nor SAM2 (see docs/monailabel.md).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from monailabel.interfaces.app import MONAILabelApp
from monailabel.interfaces.tasks.infer_v2 import InferTask

APP_DIR = Path(__file__).resolve().parent
MODEL_NAME = "glam"

logger = logging.getLogger(__name__)


def _conf_path(conf: dict[str, str], key: str, default: Path) -> Path:
    value = conf.get(key)
    return Path(value).expanduser().resolve() if value else default


class GLAMApp(MONAILabelApp):
    def __init__(self, app_dir: str, studies: str, conf: dict[str, str]) -> None:
        conf = conf or {}
        self.bundle_dir = _conf_path(conf, "bundle", APP_DIR.parent / "bundle")
        self.model_path = _conf_path(conf, "model", self.bundle_dir / "models" / "model.pt")
        self.presets = [Path(p).expanduser().resolve() for p in conf.get("preset", "").split(",") if p.strip()]
        self.device = conf.get("device") or None
        # the bundle's components are imported as `scripts.…`, its sibling modules from this folder
        for path in (str(self.bundle_dir), str(APP_DIR)):
            if path not in sys.path:
                sys.path.insert(0, path)
        from glam_infer import LABELS

        super().__init__(
            app_dir=app_dir,
            studies=studies,
            conf=conf,
            name="GLAM mammography saliency",
            description="GLAM (Liu et al., MIDL 2021) weakly supervised saliency maps for 2-D mammograms",
            version=json.loads((self.bundle_dir / "configs" / "metadata.json").read_text())["version"],
            labels=dict(LABELS),
        )

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

    def init_trainers(self) -> dict[str, Any]:
        return {}  # GLAM trains with the bundle's three-stage workflow, not from annotations

    def infer(self, request: dict[str, Any], datastore: Any = None) -> dict[str, Any]:
        """Saved maps (``save_label``) go under their own label tag unless the client names one, so a heatmap never
        lands among a reader's annotations: ``glam_label`` or ``glam_heatmap_<class>``."""
        if str(request.get("save_label", "false")).lower() in ("true", "1", "yes") and not request.get("label_tag"):
            from glam_infer import overlay_settings

            settings = overlay_settings(request)
            overlay, cls = settings["overlay"], settings["heatmap_class"]
            request["label_tag"] = "glam_label" if overlay == "label" else f"glam_heatmap_{cls}"
        return super().infer(request, datastore)
