"""The images an evaluation cannot score, named one by one (``unscored.csv``), never dropped without a word.

An image is scored when its preprocessing succeeds and every lesion of its datalist item (a mask's 8-connected
component or a box: the lesions the FROC counts) keeps at least one pixel in the model's window. Otherwise its
numbers would be wrong without showing it: an unreadable file or an image the preprocessing refuses has no output at
all, and a lesion outside the window (beyond the breast's crop or the window placed in it) leaves an empty mask, so the
image's Dice and PxAP are undefined and the lesion falls out of the FROC's count. :func:`unscored_reason` says, per
preprocessed image, why it cannot be scored; :class:`ScoringDataset` runs the validation's preprocessing per image and
returns, in place of an image it cannot score, a marker with the reason; :func:`scored_collate` leaves the markers out
of the batches and :class:`ScoredLoader` keeps them, for the report (``MetricsReport``: ``unscored.csv``, the log,
and a refusal unless ``skip_unscored``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.data import list_data_collate
from monai.transforms import Compose, LoadImaged
from scipy import ndimage

from ..errors import UsageError
from ..transforms.mammo.coverage import BREAST_KEYS, breast_refusal
from ..transforms.mammo.dictionary import BestCenterWindowd, FlipToRightd
from ..transforms.mammo.spacing import ResampleToSpacingd
from ..transforms.targets import MASK_KEYS
from ..transforms.thumbnail import THUMBNAIL_STEP_KEY, THUMBNAIL_SUFFIX, Thumbnaild

__all__ = ["UNSCORED_KEY", "LESIONS_KEY", "unscored_reason", "ScoringDataset", "scored_collate", "ScoredLoader"]

#: a marker item's key: the one-line reason its image cannot be scored
UNSCORED_KEY = "unscored"
#: per mask key, the lesions (8-connected components) before the flip, crop and window; the masks then hold each
#: lesion's number until the window is placed (:class:`ScoringDataset`)
LESIONS_KEY = "lesions_before_window"
#: per mask key, whether the mask held a lesion pixel before it was resampled to the model's pixel spacing
_BEFORE_RESAMPLING = "lesions_before_resampling"


def _class_name(mask_key: str) -> str:
    return mask_key.removeprefix("mask_")


def _lesions_outside_window(item: Mapping[str, Any]) -> list[str]:
    """Per class, the lesions that lie wholly outside the window (or vanished in the resampling)."""
    found = []
    for key, had_pixels in item.get(_BEFORE_RESAMPLING, {}).items():
        if had_pixels and not item.get(LESIONS_KEY, {}).get(key):
            found.append(
                f"the {_class_name(key)} lesion(s) (mask or box) vanished when resampled to the model's spacing"
            )
    for key, n_lesions in item.get(LESIONS_KEY, {}).items():
        if not n_lesions:
            continue
        labels = item[key]
        kept = int(np.count_nonzero(np.unique(np.asarray(labels.detach().cpu())) > 0))
        if kept < n_lesions:
            rows, cols = (int(v) for v in tuple(labels.shape[-2:]))
            found.append(
                f"{n_lesions - kept} of {n_lesions} {_class_name(key)} lesion(s) (mask or box) lie wholly outside "
                f"the model's {rows} x {cols} window"
            )
    return found


def unscored_reason(item: Mapping[str, Any]) -> str | None:
    """Why the evaluation cannot score this image, in one line; None when it can.

    Every per-image reason of a preprocessed image is decided here: a window that misses the breast (inference's
    rule, :func:`~scripts.transforms.mammo.coverage.breast_refusal`), a lesion (mask or box) wholly outside the model's
    window, or gone in the resampling to the model's pixel spacing.

    Args:
        item: the item right after the model's window is cut (:class:`ScoringDataset`): ``image`` a ``MetaTensor``
            with the preprocessing's metadata (``window_start``, ``crop_box`` ...), the masks holding each lesion's
            number (0 background), :data:`LESIONS_KEY` the lesions per mask before the flip, crop and window, and
            the image's thumbnail taken at loading (``image_thumbnail``, for the breast's share in the window).
    """
    refusal = breast_refusal(item)
    reasons = ([refusal] if refusal is not None else []) + _lesions_outside_window(item)
    return "; ".join(reasons) if reasons else None


def _root_message(err: BaseException) -> str:
    """The first line of the innermost cause's message (MONAI wraps a transform's error in its own)."""
    while err.__cause__ is not None:
        err = err.__cause__
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def _label_lesions(d: dict[str, Any], mask_keys: Sequence[str]) -> dict[str, Any]:
    """Each mask's lesions numbered 1, 2, ... in place of its 0/1 values (int32), their count in :data:`LESIONS_KEY`:
    the flip, crop and window move the numbers as they move the pixels."""
    counts = {}
    for key in mask_keys:
        if key in d:
            lesions = np.asarray(d[key]) > 0
            plane = np.zeros((3,) * lesions.ndim, dtype=bool)  # 8-connected in (H, W), the channels apart
            plane[(1,) * (lesions.ndim - 2)] = True
            labels, counts[key] = ndimage.label(lesions, structure=plane)
            d[key] = torch.as_tensor(d[key]).to(torch.int32)  # a MetaTensor keeps its metadata
            d[key].copy_(torch.from_numpy(labels))
    return {**d, LESIONS_KEY: counts}


def _binary_masks(d: dict[str, Any], mask_keys: Sequence[str]) -> dict[str, Any]:
    """The numbered masks back to 0/1 bytes, as the preprocessing made them."""
    for key in mask_keys:
        if key in d:
            d[key] = (d[key] > 0).to(torch.uint8)
    return d


def _first(transforms: Sequence[Any], kind: type, what: str) -> int:
    index = next((i for i, t in enumerate(transforms) if isinstance(t, kind)), None)
    if index is None:
        raise UsageError(f"ScoringDataset: the preprocessing has no {kind.__name__} ({what})")
    return index


class ScoringDataset(torch.utils.data.Dataset):
    """The evaluated split, each item through the validation's preprocessing, or a marker where it cannot be scored.

    The preprocessing runs step by step, so that a step that fails names the image's fault: the loading
    (``unreadable: ...``) or another step (``preprocessing refused (<step>): ...``). Its masks hold each lesion's
    number from the flip (the first step after the resampling) to the window, where :func:`unscored_reason` decides;
    then they are 0/1 again and the chain finishes: a scored image's item is the preprocessing's own output.

    Args:
        data: the datalist items of the split (or of this rank's block).
        transform: the preprocessing (``validate#preprocessing``: a ``Compose`` with a ``ResampleToSpacingd``, a
            ``FlipToRightd`` and a ``BestCenterWindowd``).
        mask_keys: the per-class mask keys.

    Returns (per item): the preprocessed item, or ``{"unscored": reason, "image_path": the item's image}``.
    """

    def __init__(self, data: Sequence[Any], transform: Compose, mask_keys: Sequence[str] = MASK_KEYS) -> None:
        self.data = data
        self.transform = transform
        self.mask_keys = list(mask_keys)
        steps = list(transform.transforms)
        self._resample = _first(steps, ResampleToSpacingd, "the model's pixel spacing")
        self._flip = _first(steps, FlipToRightd, "the breast facing right")
        self._window = _first(steps, BestCenterWindowd, "the model's window")
        # the image as read, shrunk as inference's panels take it: breast_refusal measures the breast on it
        self._thumbnail = Thumbnaild(keys="image")

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = self.data[index]
        path = str(item.get("image", "")) if isinstance(item, Mapping) else ""
        d: Any = item
        for i, step in enumerate(self.transform.transforms):
            if i == self._resample:
                d = {**d, _BEFORE_RESAMPLING: {k: bool(torch.as_tensor(d[k]).any()) for k in self.mask_keys if k in d}}
            if i == self._flip:
                d = _label_lesions(dict(d), self.mask_keys)
            try:
                d = self.transform(d, start=i, end=i + 1)
            except Exception as err:  # noqa: BLE001 - any image's fault is named, the other images go on
                what = (
                    "unreadable" if isinstance(step, LoadImaged) else f"preprocessing refused ({type(step).__name__})"
                )
                return {UNSCORED_KEY: f"{what}: {_root_message(err)}", "image_path": path}
            if isinstance(step, LoadImaged) and i < self._resample:
                d = self._thumbnail(d)
            if i == self._window:
                reason = unscored_reason(d)
                if reason is not None:
                    return {UNSCORED_KEY: reason, "image_path": path}
                d = _binary_masks(dict(d), self.mask_keys)
                for key in (f"image{THUMBNAIL_SUFFIX}", THUMBNAIL_STEP_KEY, *BREAST_KEYS):
                    d.pop(key, None)
        return d


def scored_collate(batch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"batch": the scored items collated (MONAI's list_data_collate), or None; "unscored": the markers}``: the
    evaluation's ``collate_fn``, so that a batch never mixes a marker with images."""
    kept = [item for item in batch if UNSCORED_KEY not in item]
    markers = [{"image": item["image_path"], "reason": item[UNSCORED_KEY]} for item in batch if UNSCORED_KEY in item]
    return {"batch": list_data_collate(kept) if kept else None, "unscored": markers}


class ScoredLoader:
    """The evaluator's data: the batches of ``loader`` (whose ``collate_fn`` is :func:`scored_collate`) without its
    markers, which :attr:`unscored` keeps (``{"image", "reason"}`` in the split's order, reset by each pass).

    It has no length: the evaluator's epoch ends when the loader does (a batch left empty is not run). At the end of
    each pass it calls :attr:`on_end` (when set) with :attr:`unscored`: the report's check runs there, before the
    epoch's metrics, which would fail first on a split with no image scored.
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.unscored: list[dict[str, str]] = []
        self.on_end: Callable[[list[dict[str, str]]], Any] | None = None

    def __iter__(self) -> Iterator[Any]:
        self.unscored = []
        for out in self.loader:
            self.unscored.extend(out["unscored"])
            if out["batch"] is not None:
                yield out["batch"]
        if self.on_end is not None:
            self.on_end(self.unscored)
