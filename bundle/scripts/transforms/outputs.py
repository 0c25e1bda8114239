"""Turn a decollated GLAM output into the full-resolution maps and scores that metrics and writers use."""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import torch
from monai.transforms import MapTransform
from monai.utils import str2bool

from ..enums import MAP_NAMES, MapName, OutputKey
from ..errors import UsageError
from ..networks.global_network import nearest_resize
from ..patches import render_saliency

# network outputs passed on as they are
_PASSED_ON = tuple(k.value for k in (OutputKey.Y_GLOBAL, OutputKey.Y_LOCAL, OutputKey.Y_FUSION, OutputKey.PATCH_BOXES))
_SCALE_KEYS = (OutputKey.SALIENCY_SCALE0, OutputKey.SALIENCY_SCALE1, OutputKey.SALIENCY_SCALE2)


class GLAMOutputsd(MapTransform):
    """Unpack one image's GLAM outputs (``d[pred_key]``, a dict) into flat float32 entries at full resolution.

    Targets' masks go to ``lesion_mask``, not ``mask``, which MONAI's engines would send back to the batch.

    Args:
        gamma_c: S_c = gamma_c S_g + (1 - gamma_c) S_l.
        pred_key, label_key, image_key: where the model outputs, the targets and the image are.
        score_key: the output written as ``y_global`` (a baseline's one map comes as ``saliency_global``).
        scales: also write GLAM's global saliency scales ``S_0``, ``S_1``, ``S_2``, nearest-upsampled.
    """

    def __init__(
        self,
        gamma_c: float = 0.5,
        pred_key: str = "pred",
        label_key: str = "label",
        image_key: str = "image",
        score_key: str = OutputKey.Y_GLOBAL.value,
        scales: bool | str = False,
    ) -> None:
        super().__init__(keys=[pred_key])
        self.gamma_c = float(gamma_c)
        self.pred_key, self.label_key, self.image_key = pred_key, label_key, image_key
        self.score_key = score_key
        # a command-line override arrives as the string 'true' / 'false'
        self.scales = str2bool(scales)

    def __call__(self, data: Mapping[Hashable, object]) -> dict[Hashable, object]:
        d = dict(data)
        pred = d[self.pred_key]
        if not isinstance(pred, Mapping) or OutputKey.SALIENCY_GLOBAL not in pred:
            raise UsageError(f"GLAMOutputsd: {self.pred_key!r} must be a GLAM output dict, got {type(pred).__name__}")
        # numpy (the AUC, the panels, the reports) has no bfloat16
        pred = {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in pred.items()}
        target = d.get(self.label_key)
        if isinstance(target, Mapping):
            d["label"] = target["label"]
            d["lesion_mask"] = target["mask"]
        reference = d.get("lesion_mask", d.get(self.image_key))
        if not isinstance(reference, torch.Tensor):
            raise UsageError("GLAMOutputsd needs a mask or an image to know the output resolution")
        size = tuple(reference.shape[-2:])
        if self.score_key not in pred:
            raise UsageError(f"GLAMOutputsd: score_key {self.score_key!r} is not a model output ({sorted(pred)})")
        for key in _PASSED_ON:
            if key in pred:
                d[key] = pred[key]
        d[OutputKey.Y_GLOBAL.value] = pred[self.score_key]
        if OutputKey.PATCH_MAPS in pred:
            maps = render_saliency(
                pred[OutputKey.SALIENCY_GLOBAL][None],
                pred[OutputKey.PATCH_MAPS][None],
                pred[OutputKey.PATCH_BOXES][None],
                size,
                1,
                self.gamma_c,
            )
            d.update({name: maps[name][0] for name in MAP_NAMES})
        else:
            d[MapName.GLOBAL.value] = nearest_resize(pred[OutputKey.SALIENCY_GLOBAL][None].float(), size)[0]
        if self.scales:
            for i, key in enumerate(_SCALE_KEYS):
                if key in pred:
                    d[f"S_{i}"] = nearest_resize(pred[key][None].float(), size)[0]
        return d
