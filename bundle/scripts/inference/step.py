"""GLAM inference on a folder or a datalist: the evaluator's iteration and the way back from the model's window onto
each input file's geometry (used from ``configs/inference.yaml``).

The pieces plug into a MONAI ``SupervisedEvaluator``: :class:`~.inference_inputs.SafeDataset` turns a failing input
into an error record instead of an exception, :func:`~.inference_inputs.collate_inference` stacks the good images
and carries the errors along, :class:`GLAMInferenceStep` is the evaluator's iteration (runs the inferer on the good
images only) and :class:`~.inference_writer.GLAMInferenceWriter` (an Ignite handler) maps the maps back through the
preprocessing's inverse (``Invertd``, :func:`maps_on_original`) and writes the files in background threads.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.data import MetaTensor
from monai.transforms import Compose, Invertd

from ..enums import MAP_NAMES, OutputKey
from ..patches import render_saliency
from ..transforms.mammo.breast import view_kind
from ..transforms.mammo.spacing import (
    MODEL_SPACING_KEY,
    SPACING_SOURCE_KEY,
    SPACING_USED_KEY,
    format_spacing,
)
from .inputs import LOAD_SECONDS_KEY

logger = logging.getLogger(__name__)

__all__ = [
    "GLAMInferenceStep",
    "window_box_to_original",
    "window_on_original",
    "invert_maps",
    "maps_on_original",
    "spacing_note",
    "image_facts",
    "image_notes",
    "quiet_library_logs",
]

#: libraries whose INFO lines flood an inference log (one per file read or written): WARNING and above only
_CHATTY_LIBRARIES = ("highdicom", "pydicom", "nibabel", "PIL")


def quiet_library_logs(level: int = logging.WARNING) -> None:
    """Raise the log level of the readers' and writers' libraries (highdicom, pydicom, nibabel, PIL) to ``level``,
    unless a configuration (a ``logging.conf``) already set one for them: their warnings stay, their INFO lines go."""
    for name in _CHATTY_LIBRARIES:
        lib = logging.getLogger(name)
        if lib.level == logging.NOTSET:
            lib.setLevel(level)


@contextlib.contextmanager
def _exact_float32(device: torch.device) -> Iterator[None]:
    """On CUDA, convolutions and matrix products in true float32 (no TF32, which keeps 10 bits of mantissa and is
    PyTorch's default for cuDNN convolutions), restored afterwards; nothing to do elsewhere."""
    if device.type != "cuda":
        yield
        return
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


class GLAMInferenceStep:
    """The evaluator's iteration: run ``engine.inferer`` (:class:`~scripts.networks.GLAMInferer`, returning the GLAM
    output dict) on the batch's good images without gradients; floating-point outputs come back as float32 on the
    CPU whatever the network computed in (bf16 under autocast), so everything after the model is bf16-safe.

    With ``amp`` the network runs under ``torch.autocast(amp_dtype)`` (bf16 by default); without it, on CUDA, in
    true float32 (TF32 off), so that ``precision: fp32`` gives float32 numbers on a GPU too.

    Returns ``{"items", "errors", "pred", "load_s"}``; ``pred`` is ``None`` when every item of the batch failed.
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
            precise = contextlib.nullcontext() if self.amp else _exact_float32(device)
            with torch.no_grad(), precise, torch.autocast(device.type, dtype=self.amp_dtype, enabled=self.amp):
                out = engine.inferer(image, network)
            pred = {
                k: (v.detach().float().cpu() if v.is_floating_point() else v.detach().cpu())
                for k, v in out.items()
                if isinstance(v, torch.Tensor)
            }
        return {
            "items": batch["items"],
            "errors": batch["errors"],
            "pred": pred,
            LOAD_SECONDS_KEY: float(batch.get(LOAD_SECONDS_KEY, 0.0)),
        }


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


def window_on_original(meta: Mapping[str, Any], original_size: Sequence[int]) -> tuple[int, int, int, int] | None:
    """The model's window on the original file: ``(top, left, bottom, right)`` (end-exclusive), the part of the file
    it saw (the window clipped to the crop, whose outside the maps leave at 0), from the preprocessing metadata
    (``window_start``, ``window_size``, ``crop_box``, ``flipped_to_right``, and ``resampled_shape`` when the image was
    resampled: the box is scaled back outwards to whole pixels). None when the window holds none of the file."""
    H, W = int(original_size[0]), int(original_size[1])
    shape = meta.get("resampled_shape")
    h, w = (int(v) for v in np.asarray(shape).reshape(-1)[:2]) if shape is not None else (H, W)
    top, left = (int(v) for v in np.asarray(meta["window_start"]).reshape(-1)[:2])
    rows, cols = (int(v) for v in np.asarray(meta["window_size"]).reshape(-1)[:2])
    c0, c1, c2, c3 = (int(v) for v in np.asarray(meta["crop_box"]).reshape(-1)[:4])
    y0, y1 = max(c0 + top, c0), min(c0 + top + rows, c2)
    x0, x1 = max(c1 + left, c1), min(c1 + left + cols, c3)
    if y1 <= y0 or x1 <= x0:
        return None
    if bool(meta.get("flipped_to_right", False)):
        x0, x1 = w - x1, w - x0
    sy, sx = H / h, W / w
    box = (int(np.floor(y0 * sy)), int(np.floor(x0 * sx)), int(np.ceil(y1 * sy)), int(np.ceil(x1 * sx)))
    return max(0, box[0]), max(0, box[1]), min(H, box[2]), min(W, box[3])


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
        inside = indicators[k] > 0.5
        rows, cols = np.flatnonzero(inside.any(axis=1)), np.flatnonzero(inside.any(axis=0))
        if rows.size:  # a patch entirely in padding has no pixel of the file
            boxes.append((int(rows[0]), int(cols[0]), int(rows[-1]) + 1, int(cols[-1]) + 1))
    return boxes


# channels per inverted tensor: PyTorch's CPU bilinear resize of a (1, 3, H, W) tensor takes a slow path (measured
# at 2944x1920: 143 ms for 3 channels, 15 ms for 1 and 30 ms for 2), so the patch indicators go back in pairs (each
# map has two channels, benign and malignant)
_CHANNELS_PER_PASS = 2


def maps_on_original(
    item: Mapping[str, Any],
    pred: Mapping[str, torch.Tensor],
    transform: Compose,
    gamma_c: float = 0.5,
    names: Sequence[str] = MAP_NAMES,
    with_window: bool = False,
) -> tuple:
    """One image's GLAM outputs on the original file's geometry.

    Args:
        item: the preprocessed item (``item["image"]``: ``(1, h, w)`` ``MetaTensor`` with its applied operations).
        pred: that image's network outputs (``saliency_global`` ``(2, h/4/.., w/..)``, ``patch_maps``
            ``(K, 2, p/4, p/4)``, ``patch_boxes`` ``(K, 4)`` row, col, height, width in the window).
        transform: the preprocessing ``Compose`` the item went through.
        gamma_c: weight of S_g in S_c.
        names: the maps to bring back (the others are not computed on the file's grid).

    Returns:
        ``{name: (2, H, W) float32 in [0, 1]}`` for the maps named, rendered at full window resolution and taken
        back through the inverse of the preprocessing (pixels the model never saw are 0), and the patch boxes
        ``(top, left, bottom, right)`` (end-exclusive) on the file (patches entirely in padding are dropped). The
        maps and the patch indicators go through one ``Invertd``, two channels per tensor. With ``with_window``, a
        third element: the model's window on the file, ``(top, left, bottom, right)`` (end-exclusive, the part of
        the file the model saw; None when it saw none of it), computed from the metadata
        (:func:`window_on_original`).
    """
    window = tuple(item["image"].shape[-2:])
    boxes = pred[OutputKey.PATCH_BOXES]
    maps = render_saliency(
        pred[OutputKey.SALIENCY_GLOBAL][None], pred[OutputKey.PATCH_MAPS][None], boxes[None], window, 1, gamma_c
    )
    names = [n for n in MAP_NAMES if n in names]
    indicators = torch.split(_patch_indicators(boxes, window), _CHANNELS_PER_PASS)
    to_invert = {name: maps[name][0] for name in names}
    to_invert.update({f"{_BOXES}{i}": chunk for i, chunk in enumerate(indicators)})
    back = invert_maps(item, to_invert, transform)
    out = {name: np.clip(back[name], 0.0, 1.0, out=back[name]) for name in names}
    patches = _bounding_boxes(np.concatenate([back[f"{_BOXES}{i}"] for i in range(len(indicators))]))
    if not with_window:
        return out, patches
    meta = item["image"].meta
    size = tuple(int(v) for v in np.asarray(meta["spatial_shape"]).reshape(-1)[:2])
    return out, patches, window_on_original(meta, size)


def _meta(image: Any) -> Mapping[str, Any]:
    return image.meta if isinstance(image, MetaTensor) else {}


def _spacing_pair(value: Any) -> tuple[float, float]:
    flat = np.asarray(value if value is not None else (np.nan, np.nan), dtype=np.float64).reshape(-1)
    return (float(flat[0]), float(flat[1])) if flat.size >= 2 else (np.nan, np.nan)


def spacing_note(image: Any, window: Sequence[int] | None = None) -> str | None:
    """What was assumed about the pixel spacing of a preprocessed image (``MetaTensor``, after
    :class:`~scripts.transforms.ResampleToSpacingd`), for a log line and errors.csv; None when the spacing was stated
    (by the file, the datalist or ``input_spacing``) or when the model has none (nothing resampled):

    - ``"pixel spacing not stated: estimated 0.31 mm, the breast fitted into the model's 736 x 480 window at 0.4
      mm"`` (``spacing_source`` ``fit_breast``; ``window`` is the model's, from the image's shape when not given);
    - ``"pixel spacing not stated: assumed the model's 0.4 mm (spacing_fallback: model)"``."""
    meta = _meta(image)
    source = str(meta.get(SPACING_SOURCE_KEY, ""))
    if source not in ("fit_breast", "model"):
        return None
    model = format_spacing(_spacing_pair(meta.get(MODEL_SPACING_KEY)))
    if source == "model":
        return f"pixel spacing not stated: assumed the model's {model} mm (spacing_fallback: model)"
    used = format_spacing(tuple(float(f"{v:.4g}") for v in _spacing_pair(meta.get(SPACING_USED_KEY))))
    rows, cols = (int(v) for v in (window if window is not None else tuple(image.shape[-2:])))
    fitted = f"the breast fitted into the model's {rows} x {cols} window at {model} mm"
    return f"pixel spacing not stated: estimated {used} mm, {fitted}"


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def image_facts(item: Mapping[str, Any]) -> dict[str, Any]:
    """What predictions.csv states about how an image was read (``item``: the preprocessed item, its ``image`` a
    ``MetaTensor``): ``laterality`` / ``laterality_source`` and ``view`` / ``view_source`` as the preprocessing used
    them (a datalist item's value, source ``"datalist"``, before the file's; ``""`` and ``"unknown"`` when neither
    states one), and the input's pixel spacing used (``spacing_row_mm``, ``spacing_col_mm``, empty when unknown) with
    its ``spacing_source``."""
    meta = _meta(item["image"])
    facts: dict[str, Any] = {}
    for key in ("laterality", "view"):
        given = _text(item.get(key))
        if given:
            value, source = given.upper(), "datalist"
        else:
            value = _text(meta.get(key)).upper()
            source = _text(meta.get(f"{key}_source")) or ("file" if value else "unknown")
        facts[key], facts[f"{key}_source"] = value, source
    row_mm, col_mm = _spacing_pair(meta.get(SPACING_USED_KEY))
    known = np.isfinite(row_mm) and np.isfinite(col_mm)
    facts["spacing_row_mm"] = f"{row_mm:.6g}" if known else ""
    facts["spacing_col_mm"] = f"{col_mm:.6g}" if known else ""
    facts["spacing_source"] = _text(meta.get(SPACING_SOURCE_KEY)) or "unknown"
    return facts


def image_notes(
    item: Mapping[str, Any], window: Sequence[int] | None = None, default_view: str | None = "CC"
) -> list[str]:
    """Everything assumed about one image, for its log line and errors.csv note: an estimated or assumed pixel spacing
    (:func:`spacing_note`), a view that is unknown or not a CC- / MLO-like code (the ``default_view`` window rule was
    used), a laterality inferred from the image (the side of the chest wall decided the mirroring)."""
    facts = image_facts(item)
    notes = [note for note in [spacing_note(item["image"], window)] if note]
    view = facts["view"]
    try:
        view_kind(view, None)
    except ValueError:
        rule = view_kind(default_view, None) if default_view else "CC"
        what = "view unknown" if not view else f"view {view!r} is not a CC- or MLO-like code"
        notes.append(f"{what}: the {rule} window rule was used")
    if facts["laterality_source"] == "image":
        notes.append(f"laterality not stated: {facts['laterality'] or '?'} inferred from the side of the chest wall")
    elif not facts["laterality"] and str(item.get("facing", "")).lower() not in ("left", "right"):
        notes.append("laterality unknown: the side of the chest wall decided the mirroring")
    return notes
