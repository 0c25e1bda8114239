"""TensorBoard panels of validation images: the image with its masks, S_g, S_l and S_c with the patches."""

from __future__ import annotations

import os

import numpy as np
from ignite.engine import Engine, Events

from ..enums import MAP_NAMES, OutputKey
from ..visualize import saliency_panel


class SaliencyPanelWriter:
    """After each validation, write panels of the first ``num_images`` validation images to TensorBoard.

    Args:
        log_dir: TensorBoard folder.
        num_images: how many validation images to show.
        stride: pixel step of the panels, to keep event files small.
        tag: image tag prefix.
    """

    def __init__(
        self, log_dir: str | os.PathLike, num_images: int = 4, stride: int = 4, tag: str = "validation"
    ) -> None:
        self.log_dir = str(log_dir)
        self.num_images = int(num_images)
        self.stride = max(1, int(stride))
        self.tag = tag
        self._panels: list[np.ndarray] = []
        self._writer = None

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.EPOCH_STARTED, lambda e: self._panels.clear())
        engine.add_event_handler(Events.ITERATION_COMPLETED, self._collect)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self._write)

    def _collect(self, engine: Engine) -> None:
        outputs = engine.state.output if isinstance(engine.state.output, list) else [engine.state.output]
        s = self.stride
        for item in outputs:
            if len(self._panels) >= self.num_images:
                return
            image = np.asarray(item["image"].detach().cpu())[0, ::s, ::s]
            maps = {k: np.asarray(item[k].detach().cpu())[:, ::s, ::s] for k in MAP_NAMES if k in item}
            boxes = item.get(OutputKey.PATCH_BOXES)
            boxes = None if boxes is None else [[v // s for v in b] for b in boxes.tolist()]
            mask = item.get("lesion_mask")
            mask = None if mask is None else np.asarray(mask.detach().cpu())[:, ::s, ::s]
            self._panels.append(saliency_panel(image, maps, boxes, mask))

    def _write(self, engine: Engine) -> None:
        if not self._panels:
            return
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=self.log_dir)
        step = engine.state.epoch
        for i, panel in enumerate(self._panels):
            self._writer.add_image(f"{self.tag}/image{i}", panel, step, dataformats="HWC")
        self._writer.flush()
