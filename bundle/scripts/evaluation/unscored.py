"""The images an evaluation cannot score, named one by one in ``unscored.csv``.

An image is unscored when its preprocessing fails or a lesion of its datalist item keeps no pixel in the model's
window: its Dice and PxAP would be undefined and the lesion would fall out of the FROC's count unnoticed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.data import list_data_collate
from monai.transforms import Compose, LoadImaged
from scipy import ndimage

from ..enums import MASK_KEYS
from ..errors import UsageError
from ..transforms.mammo.coverage import BREAST_KEYS, breast_refusal
from ..transforms.mammo.dictionary import BestCenterWindowd, FlipToRightd
from ..transforms.mammo.spacing import ResampleToSpacingd
from ..transforms.thumbnail import THUMBNAIL_STEP_KEY, THUMBNAIL_SUFFIX, Thumbnaild

#: a marker item's key: the one-line reason its image cannot be scored
UNSCORED_KEY = "unscored"
#: per mask key, the number of lesions (8-connected components) before the flip, crop and window
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

    Args:
        item: the item right after the window is cut (:class:`ScoringDataset`), its masks holding lesion numbers.
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
    """Each mask's lesions numbered 1, 2, ... (int32), their count in :data:`LESIONS_KEY`."""
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
    """The split through the validation's preprocessing, with a marker for an image that cannot be scored.

    Args:
        data: the datalist items of the split (or of this rank's block).
        transform: ``validate#preprocessing`` (with ``ResampleToSpacingd``, ``FlipToRightd``, ``BestCenterWindowd``).
        mask_keys: the per-class mask keys.
    """

    def __init__(self, data: Sequence[Any], transform: Compose, mask_keys: Sequence[str] = MASK_KEYS) -> None:
        self.data = data
        self.transform = transform
        self.mask_keys = list(mask_keys)
        steps = list(transform.transforms)
        self._resample = _first(steps, ResampleToSpacingd, "the model's pixel spacing")
        self._flip = _first(steps, FlipToRightd, "the breast facing right")
        self._window = _first(steps, BestCenterWindowd, "the model's window")
        # breast_refusal measures the breast on the image as read
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
    """``collate_fn`` giving ``{"batch": the scored items collated or None, "unscored": the markers}``."""
    kept = [item for item in batch if UNSCORED_KEY not in item]
    markers = [{"image": item["image_path"], "reason": item[UNSCORED_KEY]} for item in batch if UNSCORED_KEY in item]
    return {"batch": list_data_collate(kept) if kept else None, "unscored": markers}


class ScoredLoader:
    """The batches of ``loader`` without the markers, which :attr:`unscored` keeps for :attr:`on_end`."""

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
