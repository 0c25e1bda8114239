"""What needs no learning: how well image-wide intensity statistics of the breast classify the images, and how
often a map that points at the brightest cell of the image hits the lesion. A weakly supervised model that does no
better has not learnt to look at lesions. Used by the benchmark's report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from scripts.enums import CLASS_NAMES

STATISTICS = ("max", "q99.9", "mean", "std")


def breast_statistics(images: torch.Tensor) -> dict[str, np.ndarray]:
    """Per image (N, 1, H, W), intensity statistics over the breast (the pixels above the image's minimum, which
    is the background after the preprocessing)."""
    out: dict[str, list[float]] = {name: [] for name in STATISTICS}
    for image in images.float():
        values = image[image > image.min()]
        if values.numel() == 0:
            values = image.flatten()
        out["max"].append(float(values.max()))
        # quantile of a regular subsample: torch.quantile refuses inputs of more than 2^24 values
        out["q99.9"].append(float(torch.quantile(values[:: max(1, values.numel() // 200_000)], 0.999)))
        out["mean"].append(float(values.mean()))
        out["std"].append(float(values.std()))
    return {k: np.asarray(v) for k, v in out.items()}


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC by ranks (ties count half); NaN when one class is missing."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels)
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).mean()
    ties = (pos[:, None] == neg[None, :]).mean()
    return float(greater + 0.5 * ties)


def brightest_cell_maps(images: torch.Tensor, cell: int) -> torch.Tensor:
    """A trivial saliency map of images (B, 1, H, W): the mean intensity of each ``cell`` x ``cell`` block, rescaled
    to [0, 1] per image and nearest-upsampled, the same for both classes (B, 2, H, W)."""
    pooled = F.avg_pool2d(images.float(), cell, ceil_mode=True)
    lo = pooled.amin(dim=(-2, -1), keepdim=True)
    hi = pooled.amax(dim=(-2, -1), keepdim=True)
    scaled = (pooled - lo) / (hi - lo).clamp_min(1e-12)
    upsampled = scaled.repeat_interleave(cell, dim=-2).repeat_interleave(cell, dim=-1)
    return upsampled[..., : images.shape[-2], : images.shape[-1]].clamp(0, 1).expand(-1, 2, -1, -1)


def no_learning_baselines(
    images: torch.Tensor, masks: torch.Tensor, labels: torch.Tensor, cell: int, tolerance: float
) -> dict[str, Any]:
    """For preprocessed images (N, 1, H, W), masks (N, 2, H, W) and labels (N, 2) (benign, malignant):

    - ``statistics``: per statistic, the AUC of the statistic as a score for any lesion / benign / malignant;
    - ``brightest_cell_hit``: per class, the pointing-game hit rate of :func:`brightest_cell_maps` (peak within
      ``tolerance`` px of a lesion of the class), over the images with a lesion of that class, and
      ``brightest_cell_pooled`` over both classes; ``cell`` and ``tolerance`` as used.
    """
    from scripts.metrics import PointingGameMetric

    y = labels.float().numpy()
    stats = breast_statistics(images)
    statistics = {
        name: {"any": auc(v, y.max(1)), **{c: auc(v, y[:, i]) for i, c in enumerate(CLASS_NAMES)}}
        for name, v in stats.items()
    }
    hit = PointingGameMetric(tolerance=tolerance, check_values=False)
    for start in range(0, len(images), 16):
        sl = slice(start, start + 16)
        hit(brightest_cell_maps(images[sl], cell), masks[sl])
    rates = hit.aggregate().tolist()
    has_lesion = masks.flatten(2).amax(2).float().sum(0).tolist()  # images with a lesion, per class
    pooled_n = sum(has_lesion)
    pooled = sum(r * n for r, n in zip(rates, has_lesion) if n) / pooled_n if pooled_n else float("nan")
    return {
        "statistics": statistics,
        "brightest_cell_hit": dict(zip(CLASS_NAMES, rates)),
        "brightest_cell_pooled": float(pooled),
        "cell": int(cell),
        "tolerance": float(tolerance),
    }


def validation_transform(parser: Any) -> Any:
    """The validation preprocessing of a parsed ``train.yaml`` as one per-image transform: its cached half
    (``validate#preprocessing``: the window, uint16) then its per-step half (``validate#batch_transforms``: the
    standardisation), i.e. the model's input as the validation workflow makes it, with ``mask`` and ``label``."""
    from monai.transforms import Compose

    return Compose(
        [parser.get_parsed_content("validate#preprocessing"), parser.get_parsed_content("validate#batch_transforms")]
    )


def preprocess_items(items: Sequence[Mapping[str, Any]], transform: Any) -> dict[str, torch.Tensor]:
    """Images (N, 1, H, W) float16, masks (N, 2, H, W) uint8 and labels (N, 2) of datalist ``items`` after a
    deterministic preprocessing ``transform`` that gives ``image``, ``mask`` and ``label``."""
    from monai.utils import convert_to_tensor

    def plain(value: Any) -> torch.Tensor:  # no MetaTensor: the cache must load with weights_only=True
        return convert_to_tensor(value, track_meta=False)

    images, masks, labels = [], [], []
    for item in items:
        d = transform(dict(item))
        images.append(plain(d["image"]).to(torch.float16))
        masks.append(plain(d["mask"]).to(torch.uint8))
        labels.append(plain(d["label"]).to(torch.float32).reshape(-1))
    return {"image": torch.stack(images), "mask": torch.stack(masks), "label": torch.stack(labels)}
