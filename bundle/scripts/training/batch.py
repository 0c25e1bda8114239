"""How a GLAM workflow turns a collated batch into model inputs and targets (MONAI ``prepare_batch``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import ignite.distributed as idist
import torch
from monai.data import decollate_batch, list_data_collate
from monai.data.meta_obj import get_track_meta, set_track_meta
from monai.data.utils import set_rnd
from monai.engines.utils import PrepareBatch

from ..errors import UsageError


class GLAMPrepareBatch(PrepareBatch):
    """``prepare_batch`` for GLAM trainers and evaluators: ``(image, targets, (), kwargs)``.

    Random state restarts per (seed, epoch, rank) in :meth:`set_epoch`, so it does not depend on the loader workers.

    Args:
        with_masks: return ``{"label", "mask"}`` targets (evaluators) instead of the labels.
        random_negatives: random in-breast patches for lesion-free images (stage ``local`` training).
        seed: base seed of the patch generator and the transform.
        patch_shift: the largest random offset (pixels) of Algorithm 1's patches in training; 0: none.
        centre_patches: centre each of Algorithm 1's training patches on S_g's peak inside its window (before
            ``patch_shift``).
        transform: per-image dictionary transform run on the device.
    """

    def __init__(
        self,
        with_masks: bool = False,
        random_negatives: bool = False,
        seed: int = 0,
        patch_shift: int = 0,
        centre_patches: bool = False,
        transform: Callable | None = None,
    ) -> None:
        if isinstance(patch_shift, bool) or not isinstance(patch_shift, int) or patch_shift < 0:
            raise UsageError(f"patch_shift must be a non-negative int (pixels), got {patch_shift!r}")
        if not isinstance(centre_patches, bool):
            raise UsageError(f"centre_patches must be true or false, got {centre_patches!r}")
        self.centre_patches = centre_patches
        self.with_masks = bool(with_masks)
        self.random_negatives = bool(random_negatives)
        self.patch_shift = patch_shift
        self.seed = int(seed)
        self.transform = transform
        self.epoch = 0
        self._generators: dict[str, torch.Generator] = {}
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Restart the patch generator and the transform's random state from (seed, epoch, rank)."""
        self.epoch = int(epoch)
        self._generators.clear()
        if self.transform is not None:
            set_rnd(self.transform, (self.seed * 1_000_003 + self.epoch * 1_009 + idist.get_rank()) % (2**31))

    def _generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self._generators:
            seed = (self.seed * 100_003 + self.epoch * 1_009 + idist.get_rank()) % (2**63)
            self._generators[key] = torch.Generator(device=device).manual_seed(seed)
        return self._generators[key]

    def _transform_on_device(
        self, batchdata: Mapping[str, Any], device: str | torch.device | None, non_blocking: bool
    ) -> dict[str, Any]:
        # only the pixels travel: the transforms read the small bookkeeping on the host, with no device sync
        moved = dict(batchdata)
        for key in ("image", "mask"):
            if isinstance(moved.get(key), torch.Tensor):
                moved[key] = moved[key].to(device=device, non_blocking=non_blocking)
        # plain tensors: MONAI's transforms would otherwise wrap every intermediate in a MetaTensor
        track_meta = get_track_meta()
        set_track_meta(False)
        try:
            items = [self.transform(item) for item in decollate_batch(moved, detach=False)]
        finally:
            set_track_meta(track_meta)
        return list_data_collate(items)

    def __call__(
        self,
        batchdata: Mapping[str, torch.Tensor],
        device: str | torch.device | None = None,
        non_blocking: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | dict[str, torch.Tensor], tuple, dict]:
        for key in ("image", "label") + (("mask",) if self.with_masks else ()):
            if key not in batchdata:
                raise UsageError(f"GLAM batches need a {key!r} entry, got keys {sorted(batchdata)}")
        if self.transform is not None:
            batchdata = self._transform_on_device(batchdata, device, non_blocking)
        image = batchdata["image"].to(device=device, non_blocking=non_blocking, **kwargs)
        label = batchdata["label"].to(device=device, non_blocking=non_blocking).float()
        if label.ndim != 2 or label.shape[1] != 2:
            raise UsageError(f"'label' must be (B, 2) benign/malignant labels, got shape {tuple(label.shape)}")
        model_kwargs: dict = {}
        if self.random_negatives:
            model_kwargs["random_patch_mask"] = label.sum(dim=1) == 0
        if self.patch_shift:
            model_kwargs["patch_shift"] = self.patch_shift
        if self.centre_patches:
            model_kwargs["centre_patches"] = True
        if model_kwargs:
            model_kwargs["generator"] = self._generator(image.device)
        if label.shape[0] != image.shape[0]:
            raise UsageError(f"'label' has {label.shape[0]} rows for a batch of {image.shape[0]} images")
        if self.with_masks:
            mask = batchdata["mask"].to(device=device, non_blocking=non_blocking).float()
            expected = (image.shape[0], label.shape[1], *image.shape[-2:])
            if tuple(mask.shape) != expected:
                raise UsageError(f"'mask' must be (B, 2, H, W) = {expected} for these images, got {tuple(mask.shape)}")
            return image, {"label": label, "mask": mask}, (), model_kwargs
        return image, label, (), model_kwargs
