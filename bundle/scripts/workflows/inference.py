"""GLAM inference on a folder or a datalist: per-image probabilities, saliency maps on the original image geometry,
overlay panels and a record of every input that failed (used from ``configs/inference.yaml``).

The pieces plug into a MONAI ``SupervisedEvaluator``: :class:`SafeDataset` turns a failing input into an error
record instead of an exception, :func:`collate_inference` stacks the good images and carries the errors along,
:class:`GLAMInferenceStep` is the evaluator's iteration (runs the inferer on the good images only) and
:class:`GLAMInferenceWriter` (an Ignite handler) maps every map back through the preprocessing's inverse
(``Invertd``) and writes the files.
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.data import Dataset, MetaTensor
from monai.transforms import Compose, Invertd

from ..atomic import atomic_write
from ..data.readers import SUPPORTED_SUFFIXES, read_mammogram
from ..patches import render_saliency
from ..visualize import saliency_panel
from .dicom_outputs import dicom_output_kinds, write_dicom_outputs

logger = logging.getLogger(__name__)

__all__ = [
    "ERROR_KEY",
    "MAP_NAMES",
    "PREDICTION_COLUMNS",
    "SafeDataset",
    "collate_inference",
    "inference_items",
    "GLAMInferenceStep",
    "GLAMInferenceWriter",
    "window_box_to_original",
    "invert_maps",
    "maps_on_original",
]

#: key of the error message in an item that failed
ERROR_KEY = "error"
#: output name -> key of the full-resolution map returned by ``render_saliency``
MAP_NAMES = {"S_g": "saliency_global_image", "S_l": "saliency_local", "S_c": "saliency"}
CLASS_NAMES = ("benign", "malignant")
PREDICTION_COLUMNS = [
    "image",
    "output_stem",
    "prob_benign",
    "prob_malignant",
    "label_benign",
    "label_malignant",
    "height",
    "width",
    "patch_boxes",
]


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


def _root_cause(exc: BaseException) -> BaseException:
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
            cause = _root_cause(exc)
            path = item.get("image") if isinstance(item, Mapping) else item
            return {"image": str(path), ERROR_KEY: f"{type(cause).__name__}: {cause}"}


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


def _save_png(path: Path, array: np.ndarray) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp{os.getpid()}-{path.name}")  # keeps the extension for PIL
    try:
        # zlib level 3: half the time of PIL's default 6 on 16-bit maps, files about 1.6x larger (tens of KB)
        Image.fromarray(array).save(tmp, format="PNG", compress_level=3)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


#: pixel size (mm) the NIfTI maps state when the input's is unknown (PNG inputs; DICOMs without a valid spacing)
FALLBACK_SPACING_MM = 1.0


def _save_nifti(path: Path, maps: np.ndarray, spacing: Sequence[float] | None) -> None:
    """(C, H, W) -> NIfTI (W, H, 1, 1, C), intent 'vector': x = column, y = row as the readers expect."""
    import nibabel as nib

    data = np.ascontiguousarray(np.transpose(maps, (2, 1, 0))[:, :, None, None, :].astype(np.float32))
    row_mm, col_mm = (float(s) for s in spacing) if spacing is not None else (FALLBACK_SPACING_MM,) * 2
    img = nib.Nifti1Image(data, np.diag([col_mm, row_mm, 1.0, 1.0]))
    img.header.set_intent("vector", (), name="benign,malignant")
    img.header.set_xyzt_units("mm")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp{os.getpid()}-{path.name}")  # nibabel picks compression from the extension
    try:
        nib.save(img, str(tmp))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _panel_title(panel: np.ndarray, lines: Sequence[str]) -> np.ndarray:
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


def invert_maps(item: Mapping[str, Any], maps: Mapping[str, torch.Tensor], transform: Compose) -> dict[str, np.ndarray]:
    """Window-coordinate maps ``name -> (C, h, w)`` -> arrays ``(C, H, W)`` on the original file's pixel grid,
    through ``Invertd(transform)`` with ``item["image"]`` (the preprocessed ``MetaTensor``) as the reference."""
    d: dict[str, Any] = {"image": item["image"]}
    for k, v in maps.items():
        d[k] = MetaTensor(v.float())
    inv = Invertd(list(maps), transform=transform, orig_keys="image", nearest_interp=False)(d)
    return {k: np.asarray(torch.as_tensor(inv[k]).cpu().numpy(), dtype=np.float32) for k in maps}


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
    boxes = pred["patch_boxes"]
    maps = render_saliency(pred["saliency_global"][None], pred["patch_maps"][None], boxes[None], window, 1, gamma_c)
    to_invert = {name: maps[key][0] for name, key in MAP_NAMES.items()}
    indicator = torch.zeros((boxes.shape[0], *window))
    for k, (r, c, h, w) in enumerate(boxes.tolist()):
        indicator[k, max(0, r) : r + h, max(0, c) : c + w] = 1.0
    to_invert["boxes"] = indicator
    back = invert_maps(item, to_invert, transform)
    boxes_orig = []
    for k in range(back["boxes"].shape[0]):
        rows, cols = np.nonzero(back["boxes"][k] > 0.5)
        if rows.size:  # a patch entirely in padding has no pixel of the file
            boxes_orig.append((int(rows.min()), int(cols.min()), int(rows.max()) + 1, int(cols.max()) + 1))
    return {name: np.clip(back[name], 0.0, 1.0) for name in MAP_NAMES}, boxes_orig


class GLAMInferenceWriter:
    """Ignite handler writing GLAM's inference outputs under ``output_dir`` (see docs/inference.md).

    Per image (``<stem>`` = the file name without suffix, made unique): ``maps/<stem>_<S>.nii.gz`` (float32, two
    channels benign/malignant) and ``maps/<stem>_<S>_<class>.png`` (16-bit, value = map x 65535) for S in S_g, S_l,
    S_c, all on the original file's pixel grid; ``panels/<stem>_panel.png``. At the end of the run (also when it
    stops on an exception) ``predictions.csv`` and ``errors.csv``. Maps are rendered at full window resolution
    (``render_saliency``, stride 1) and taken back through ``Invertd(transform)``: window, padding, crop and flip
    undone, pixels the model never saw are 0.

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
        self.rows: list[dict[str, Any]] = []
        self.errors: list[dict[str, str]] = []
        self._stems: set[str] = set()

    def attach(self, engine: Any) -> None:
        from ignite.engine import Events

        engine.add_event_handler(Events.STARTED, self.reset)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self)
        engine.add_event_handler(Events.COMPLETED, self.write_tables)
        engine.add_event_handler(Events.EXCEPTION_RAISED, self._on_exception)

    def reset(self, engine: Any = None) -> None:
        self.rows, self.errors, self._stems = [], [], set()

    def _on_exception(self, engine: Any, exc: BaseException) -> None:
        self.write_tables()
        raise exc

    def __call__(self, engine: Any) -> None:
        out = engine.state.output
        self.errors.extend(out["errors"])
        for i, item in enumerate(out["items"]):
            try:
                self.rows.append(self.write_item(item, {k: v[i] for k, v in out["pred"].items()}))
            except Exception as exc:  # noqa: BLE001 - one image's failure must not lose the others
                self.errors.append({"image": str(_image_path(item)), ERROR_KEY: f"{type(exc).__name__}: {exc}"})

    def _stem(self, path: str) -> str:
        name = Path(path).name
        for s in sorted(SUPPORTED_SUFFIXES, key=len, reverse=True):
            if name.lower().endswith(s):
                name = name[: -len(s)]
                break
        stem, n = name or "image", 2
        while stem in self._stems:
            stem, n = f"{name}_{n}", n + 1
        self._stems.add(stem)
        return stem

    def invert(self, item: Mapping[str, Any], maps: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
        """Window-coordinate maps ``name -> (C, h, w)`` -> original-geometry arrays ``(C, H, W)``."""
        return invert_maps(item, maps, self.transform)

    def write_item(self, item: Mapping[str, Any], pred: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """Write one image's files; returns its predictions.csv row."""
        path = str(_image_path(item))
        back, boxes_orig = maps_on_original(item, pred, self.transform, self.gamma_c)
        original, meta = read_mammogram(path)
        H, W = original.shape
        for name in MAP_NAMES:
            if back[name].shape[-2:] != (H, W):
                raise ValueError(f"{path}: inverted {name} has shape {back[name].shape[-2:]}, the file {(H, W)}")
        stem = self._stem(path)
        maps_dir = self.output_dir / "maps"
        if meta.get("spacing") is None and meta.get("format") not in ("png", "pil"):  # those formats hold none
            logger.warning(
                "%s: no valid pixel spacing in the file (missing, zero or negative): the NIfTI maps state %g mm "
                "per pixel",
                path,
                FALLBACK_SPACING_MM,
            )
        for name in MAP_NAMES:
            m = back[name]
            _save_nifti(maps_dir / f"{stem}_{name}.nii.gz", m, meta.get("spacing"))
            for c, cls in enumerate(CLASS_NAMES):
                _save_png(maps_dir / f"{stem}_{name}_{cls}.png", np.round(m[c] * 65535).astype(np.uint16))
        y = pred["y_global"].tolist()
        label = item.get("label")
        labels = [int(v) for v in label] if isinstance(label, (list, tuple)) and len(label) == 2 else ["", ""]
        panel = None
        if self.panels or "sc" in self.dicom_kinds:
            panel = self._write_panel(stem, item, original, back, boxes_orig, y, labels, save=self.panels)
        if self.dicom_kinds and meta.get("format") == "dicom":
            write_dicom_outputs(path, self.output_dir, stem, self.dicom_kinds, panel, back["S_c"])
        elif self.dicom_kinds:
            logger.info("%s: not a DICOM input, DICOM outputs %s skipped", path, "/".join(self.dicom_kinds))
        return {
            "image": path,
            "output_stem": stem,
            "prob_benign": f"{y[0]:.6f}",
            "prob_malignant": f"{y[1]:.6f}",
            "label_benign": labels[0],
            "label_malignant": labels[1],
            "height": H,
            "width": W,
            "patch_boxes": ";".join(" ".join(str(v) for v in b) for b in boxes_orig),
        }

    def _write_panel(self, stem, item, original, back, boxes, y, labels, save: bool = True) -> np.ndarray:
        masks = None
        mask_paths = [item.get(f"mask_{cls}") for cls in CLASS_NAMES]
        if all(isinstance(p, str) and p for p in mask_paths):
            masks = np.stack([read_mammogram(p, mask=True)[0] for p in mask_paths])
        step = 1
        if self.panel_height and original.shape[0] > self.panel_height:
            step = int(np.ceil(original.shape[0] / self.panel_height))
        sub = (slice(None, None, step), slice(None, None, step))
        maps = {name: back[name][(slice(None), *sub)] for name in MAP_NAMES}
        small_boxes = [(t // step, left // step, (b - t) // step, (r - left) // step) for t, left, b, r in boxes]
        panel = saliency_panel(original[sub], maps, small_boxes, None if masks is None else masks[(slice(None), *sub)])
        truth = "" if labels[0] == "" else f"   label: benign {labels[0]}, malignant {labels[1]}"
        lines = [
            f"{Path(_image_path(item)).name}   y_g: benign {y[0]:.3f}, malignant {y[1]:.3f}{truth}",
            f"image{' + ground truth' if masks is not None else ''} | S_g | S_l | S_c",
            "green benign, red malignant, blue: selected patches",
        ]
        panel = _panel_title(panel, lines)
        if save:
            _save_png(self.output_dir / "panels" / f"{stem}_panel.png", panel)
        return panel

    def write_tables(self, engine: Any = None) -> None:
        """Write predictions.csv and errors.csv (atomically; errors.csv has its header even when empty)."""
        with atomic_write(self.output_dir / "predictions.csv", "w") as f:
            writer = csv.DictWriter(f, fieldnames=PREDICTION_COLUMNS)
            writer.writeheader()
            writer.writerows(self.rows)
        with atomic_write(self.output_dir / "errors.csv", "w") as f:
            writer = csv.DictWriter(f, fieldnames=["image", ERROR_KEY])
            writer.writeheader()
            writer.writerows(self.errors)


def _image_path(item: Mapping[str, Any]) -> str:
    image = item["image"]
    if isinstance(image, MetaTensor):
        return str(image.meta.get("filename_or_obj", ""))
    return str(image)
