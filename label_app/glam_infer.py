"""GLAM saliency as a MONAI Label segmentation task: a label map or a heatmap on the original image geometry.

Runs the bundle's own ``preprocessing``, ``network_def`` and ``maps_on_original``, so a served map is the map
``monai.bundle run inference`` writes. Request parameters: ``overlay`` (``label``: 0 background, 1 benign,
2 malignant where S_c reaches ``threshold``; ``heatmap``: round(255 x S_c) of ``heatmap_class``), ``threshold``,
``result_extension`` (``.nrrd``, ``.nii.gz``, ``.nii``, ``.png``).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fastapi import HTTPException
from glam_safety import Limits, check_model_settings
from monai.bundle import ConfigParser
from monailabel.interfaces.tasks.infer_v2 import InferType
from monailabel.tasks.infer.basic_infer import BasicInferTask
from nrrd_io import write_nrrd_2d

from scripts.enums import CLASS_NAMES, LesionClass, MapName, OutputKey

logger = logging.getLogger(__name__)

#: label value of each class (0: background)
LABELS = {c: i + 1 for i, c in enumerate(CLASS_NAMES)}
OVERLAYS = ("label", "heatmap")
EXTENSIONS = (".nrrd", ".nii.gz", ".nii", ".png")
#: how messages name an upload
UPLOADED = "the uploaded file"


def _first(value: Any) -> Any:
    """The first entry of a list default (a drop-down in the clients)."""
    return value[0] if isinstance(value, (list, tuple)) and value else value


def _bad_request(message: str) -> HTTPException:
    return HTTPException(status_code=400, detail=message)


def overlay_settings(request: Mapping[str, Any]) -> dict[str, Any]:
    """Validated ``overlay``, ``heatmap_class``, ``threshold`` and ``result_extension`` of a request."""
    overlay = str(_first(request.get("overlay", "label"))).lower()
    if overlay not in OVERLAYS:
        raise _bad_request(f"overlay must be one of {list(OVERLAYS)}, got {overlay!r}")
    heatmap_class = str(_first(request.get("heatmap_class", LesionClass.MALIGNANT.value))).lower()
    if heatmap_class not in CLASS_NAMES:
        raise _bad_request(f"heatmap_class must be one of {list(CLASS_NAMES)}, got {heatmap_class!r}")
    try:
        threshold = float(_first(request.get("threshold", 0.5)))
    except (TypeError, ValueError) as e:
        raise _bad_request(f"threshold must be a number in [0, 1], got {request.get('threshold')!r}") from e
    if not 0.0 <= threshold <= 1.0:
        raise _bad_request(f"threshold must be in [0, 1], got {threshold}")
    ext = str(_first(request.get("result_extension") or ".nrrd")).lower()
    if not ext.startswith("."):
        ext = "." + ext
    if ext not in EXTENSIONS:
        raise _bad_request(f"result_extension must be one of {list(EXTENSIONS)}, got {ext!r}")
    return {"overlay": overlay, "heatmap_class": heatmap_class, "threshold": threshold, "result_extension": ext}


def overlay_map(saliency: np.ndarray, settings: Mapping[str, Any]) -> np.ndarray:
    """S_c ``(2, H, W)`` in [0, 1] (channel 0 benign, 1 malignant) -> the served ``(H, W)`` uint8 map."""
    if settings["overlay"] == "heatmap":
        channel = CLASS_NAMES.index(settings["heatmap_class"])
        return np.round(np.clip(saliency[channel], 0.0, 1.0) * 255.0).astype(np.uint8)
    winner = np.argmax(saliency, axis=0)  # ties go to benign, the lower class
    strongest = np.max(saliency, axis=0)
    return np.where(strongest >= settings["threshold"], winner + 1, 0).astype(np.uint8)


def outputs_as_float32(out: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The first item of a batch of outputs on the CPU, floats as float32 (numpy has no bfloat16)."""
    return {
        k: (v[0].detach().float() if v.is_floating_point() else v[0].detach()).cpu()
        for k, v in out.items()
        if isinstance(v, torch.Tensor)
    }


def unreadable_image_message(exc: BaseException, path: str, name: str) -> str:
    """Why ``path`` could not be preprocessed, as batch inference says it, the server's path replaced by ``name``."""
    from scripts.data.readers import MammogramReadError
    from scripts.inference.inputs import root_cause

    cause = root_cause(exc)
    text = cause.problem if isinstance(cause, MammogramReadError) else f"{type(cause).__name__}: {cause}"
    for shown in {path, os.path.realpath(path)}:
        text = text.replace(shown, name)
    return text


#: the settings that size what every image allocates
BOUNDED_SETTINGS = ("image_size", "patch_size", "num_patches_eval")


def check_settings_record(parser: ConfigParser, model_path: str | os.PathLike, limits: Limits | None = None) -> None:
    """Refuse, before anything is built, a model whose :data:`BOUNDED_SETTINGS` (as the network will be built:
    the checkpoint's record unless a preset overrides it) lie outside ``limits`` (``ValueError``)."""
    from scripts.networks.settings import read_checkpoint_settings

    limits = limits or Limits.from_env()
    record = read_checkpoint_settings(model_path) or {}
    from scripts.networks.inference import FROM_CHECKPOINT

    values = {name: parser.get_parsed_content(name) for name in BOUNDED_SETTINGS}
    # "checkpoint" takes the checkpoint's record
    checkpoint = parser.get_parsed_content("checkpoint_settings")
    values = {k: checkpoint[k] if v == FROM_CHECKPOINT else v for k, v in values.items()}
    values = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
    recorded = [k for k, v in values.items() if k in record and record[k] == v]
    source = f"model {model_path}" + (f" (its settings record gives {', '.join(recorded)})" if recorded else "")
    check_model_settings(values, limits, source)


def load_model(parser: ConfigParser, model_path: Path, device: torch.device) -> torch.nn.Module:
    """The bundle's ``network_def`` with ``model_path``'s weights through ``load_for_inference``; a one-line
    ``ValueError`` naming the file for weights that do not load."""
    from scripts.networks.checkpoint_file import CheckpointError
    from scripts.networks.fast_inference import load_for_inference

    network = parser.get_parsed_content("network_def")
    try:
        return load_for_inference(network, model_path, device, str(parser.get_parsed_content("precision")))
    except CheckpointError:
        raise  # names the file already
    except ValueError as e:
        raise ValueError(f"model {model_path} does not load into the bundle's network_def: {e}") from None


def write_map(path: str, array: np.ndarray, affine: np.ndarray, spacing: Sequence[float] | None) -> None:
    """Write an ``(H, W)`` map with the input's RAS ``affine``; a NRRD gets no geometry without ``spacing``."""
    if path.endswith(".nrrd"):
        write_nrrd_2d(path, array, affine=affine if spacing is not None else None)
    elif path.endswith((".nii", ".nii.gz")):
        import nibabel as nib

        # column first, as ITK expects of a 2-D NIfTI
        nib.save(nib.Nifti1Image(np.ascontiguousarray(array.T), affine), path)
    else:
        from PIL import Image

        Image.fromarray(array).save(path)


class GLAMSaliencyInfer(BasicInferTask):
    """The GLAM bundle as a 2-D segmentation model with labels benign = 1, malignant = 2.

    Args:
        bundle_dir: the GLAM bundle folder.
        model_path: a state dict for the inference config's ``network_def``, loaded strictly, weights only.
        presets: config files layered over ``inference.yaml`` (a checkpoint recording its settings needs none).
        device: ``"cuda"``/``"cpu"``; default CUDA when present.
        limits: what the model may ask for (default :meth:`glam_safety.Limits.from_env`).
    """

    def __init__(
        self,
        bundle_dir: str | os.PathLike,
        model_path: str | os.PathLike,
        presets: Sequence[str | os.PathLike] = (),
        device: str | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.bundle_dir = Path(bundle_dir).resolve()
        config_file = self.bundle_dir / "configs" / "inference.yaml"
        if not config_file.is_file():
            raise ValueError(f"bundle {self.bundle_dir}: no configs/inference.yaml")
        for preset in presets:
            if not Path(preset).is_file():
                raise ValueError(f"preset {preset}: no such file")
        model_path = Path(model_path)
        if not model_path.is_file():
            raise ValueError(f"model {model_path}: no such file (train one, or pass --model)")
        parser = ConfigParser()
        parser.read_config([str(config_file), *[str(p) for p in presets]])
        parser["bundle_root"] = str(self.bundle_dir)
        parser["ckpt_path"] = str(model_path)
        self.limits = limits or Limits.from_env()
        check_settings_record(parser, model_path, self.limits)
        # the reader refuses larger images from the header
        parser["max_image_pixels"] = self.limits.max_image_pixels
        self.gamma_c = float(parser.get_parsed_content("gamma_c"))
        window = parser.get_parsed_content("image_size")
        self.window = tuple(int(v) for v in window) if window is not None else None
        # `loading` is `preprocessing` (whose objects the maps are inverted through) plus the breast coverage
        self.transform = parser.get_parsed_content("preprocessing")
        self.loading = parser.get_parsed_content("loading")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.glam = load_model(parser, model_path, self.device)
        logger.info("GLAM weights %s loaded strictly", model_path)
        # one image on the model at a time; requests wait after their checks
        self.lock = threading.Lock()
        super().__init__(
            path=str(model_path),
            network=self.glam,
            type=InferType.SEGMENTATION,
            labels=dict(LABELS),
            dimension=2,
            description="GLAM weakly supervised saliency (S_c) for 2-D mammograms: label map or heatmap",
            config={
                "overlay": list(OVERLAYS),
                "heatmap_class": [LesionClass.MALIGNANT.value, LesionClass.BENIGN.value],
                "threshold": 0.5,
                "result_extension": ".nrrd",
            },
            load_strict=True,
        )

    def is_valid(self) -> bool:
        return True

    # __call__ runs the bundle's own pipeline
    def pre_transforms(self, data: Any = None) -> list:
        return []

    def post_transforms(self, data: Any = None) -> list:
        return []

    def __call__(self, request: Mapping[str, Any], callbacks: Any = None) -> tuple[str, dict[str, Any]]:
        """Run GLAM on ``request["image"]`` (a file path) and write the requested map to a temporary file.

        The request is refused from its parameters and the file's header before it waits for the model.
        """
        from glam_inputs import check_input

        from scripts.transforms.mammo.coverage import breast_refusal

        begin = time.time()
        settings = overlay_settings(request)
        path = request.get("image")
        name = str(request.get("image_name") or (os.path.basename(path) if isinstance(path, str) else path))
        shown = name if name == UPLOADED else f"image {name!r}"
        if not isinstance(path, str) or not os.path.isfile(path):
            raise _bad_request(f"{shown}: no such file")
        check_input(path, self.limits, shown)
        with self.lock:
            waited = time.time() - begin
            try:
                item = self.loading({"image": path})
            except Exception as e:  # noqa: BLE001 - any reader or transform failure is the input's problem: 400
                raise _bad_request(f"{shown} cannot be read: {unreadable_image_message(e, path, name)}") from e
            refusal = breast_refusal(item)
            if refusal:
                raise _bad_request(f"{shown}: {refusal}")
            try:
                out_file, result_json = self._run(item, settings)
            except Exception as e:  # noqa: BLE001 - a server-side failure: 500 with one line, the traceback logged
                logger.exception("GLAM failed on %s", path)
                text = unreadable_image_message(e, path, name)
                raise HTTPException(status_code=500, detail=f"GLAM failed on {shown}: {text}") from e
        if request.get("image_source"):
            result_json["read_from"] = request["image_source"]
        result_json["latencies"] = {"total": round(time.time() - begin, 4), "waited": round(waited, 4)}
        logger.info(
            "GLAM %s: y_g benign %.4f malignant %.4f -> %s",
            path,
            result_json["prob_benign"],
            result_json["prob_malignant"],
            out_file,
        )
        return out_file, result_json

    def _run(self, item: dict[str, Any], settings: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """The network on a preprocessed ``item``, the map written as ``settings`` ask, and the JSON result (scores,
        patch boxes and the image's facts as in the bundle's predictions.csv)."""
        from scripts.inference.facts import image_facts, image_notes, spacing_note
        from scripts.inference.maps import file_affine, map_spacing, maps_on_original
        from scripts.precision import autocast

        amp = self.device.type == "cuda"
        with torch.no_grad(), autocast(self.device.type, dtype=torch.bfloat16, enabled=amp):
            out = self.glam.forward_all(torch.as_tensor(item["image"])[None].to(self.device))
        pred = outputs_as_float32(out)
        back = maps_on_original(item, pred, self.transform, self.gamma_c)
        maps, boxes = back.maps, back.boxes
        result = overlay_map(maps[MapName.COMBINED], settings)
        meta = item["image"].meta
        spacing = map_spacing(meta)
        geometry_notes: list[str] = []
        affine = file_affine(meta, geometry_notes)

        fd, out_file = tempfile.mkstemp(suffix=settings["result_extension"], prefix="glam_")
        os.close(fd)
        write_map(out_file, result, affine, spacing)
        y = pred[OutputKey.Y_GLOBAL].tolist()
        facts = image_facts(item)
        used = [facts["spacing_row_mm"], facts["spacing_col_mm"]]
        result_json = {
            **{f"prob_{c}": float(y[i]) for i, c in enumerate(CLASS_NAMES)},
            "patch_boxes": [list(b) for b in boxes],
            **settings,
            "height": int(result.shape[0]),
            "width": int(result.shape[1]),
            "label_names": dict(LABELS),
            **{k: facts[k] for k in ("laterality", "laterality_source", "view", "view_source")},
            "breast_in_window": float(facts["breast_in_window"]) if facts["breast_in_window"] else None,
            "spacing_mm": [float(v) for v in used] if all(used) else None,
            "spacing_source": facts["spacing_source"],
            "file_spacing_mm": list(spacing) if spacing else None,
            "window": list(back.window) if back.window is not None else None,
            "model_window": list(self.window) if self.window else None,
            "notes": image_notes(item, self.window) + geometry_notes,
        }
        note = spacing_note(item["image"], self.window)
        if note:
            logger.warning("GLAM %s: %s", item["image"].meta.get("filename", "image"), note)
            result_json["note"] = note
        return out_file, result_json
