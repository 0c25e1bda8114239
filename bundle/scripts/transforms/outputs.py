"""Turn a decollated GLAM output into the full-resolution maps and scores that metrics and writers use."""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import torch
from monai.transforms import MapTransform
from monai.utils import str2bool

from ..enums import MAP_NAMES, MapName, OutputKey
from ..enums import MAP_OUTPUT_KEYS as MAP_KEYS
from ..errors import UsageError
from ..networks.global_network import nearest_resize
from ..patches import render_saliency

__all__ = ["GLAMOutputsd", "MAP_KEYS"]

# network outputs passed on as they are; the keys this transform writes are plain values, as the network's are
_PASSED_ON = tuple(k.value for k in (OutputKey.Y_GLOBAL, OutputKey.Y_LOCAL, OutputKey.Y_FUSION, OutputKey.PATCH_BOXES))
# GLAM's global saliency scales, written as S_0, S_1, S_2
_SCALE_KEYS = (OutputKey.SALIENCY_SCALE0, OutputKey.SALIENCY_SCALE1, OutputKey.SALIENCY_SCALE2)


class GLAMOutputsd(MapTransform):
    """Unpack one image's GLAM outputs (``d[pred_key]``, a dict) into flat entries at full image resolution.

    Writes ``S_g`` (and, when the model ran its local module, ``S_l`` and ``S_c``) as (2, H, W) maps rendered at
    the resolution of ``d[label_key]["mask"]`` (or of ``d[image_key]``) exactly as docs/model.md ("Outputs") defines
    them, plus ``y_global`` / ``y_local`` / ``y_fusion`` scores (2,), ``patch_boxes``, and, from dict targets,
    ``label`` (2,) and ``lesion_mask`` (2, H, W). (Not ``mask``: MONAI's engines send a postprocessed key that
    also names a batch entry back to the batch, where the metric handlers would not see it.)

    Models other than GLAM (the baselines in ``scripts.networks``) give their one map as ``saliency_global``, so it
    becomes ``S_g``; ``score_key`` names the output that is the model's classification output, which is written as
    ``y_global``, the score that the validation AUC and the report read (GMIC's is ``y_fusion``).

    With ``scales=True`` it also writes GLAM's three global saliency scales as ``S_0`` (H/16), ``S_1`` (H/32) and
    ``S_2`` (H/64), each nearest-upsampled to the output resolution (S_g is their gamma-weighted sum): what each
    scale of the global module looks at, for diagnostic figures (models without scales write none).

    Floating-point outputs are converted to float32 first (a bf16 autocast forward pass returns bf16 ones).

    Args:
        gamma_c: S_c = gamma_c S_g + (1 - gamma_c) S_l (the model's setting).
        pred_key, label_key, image_key: where the model outputs, the targets and the image are.
        score_key: the model output reported as ``y_global`` (GLAM: ``y_global``, its y_g).
        scales: also write ``S_0``, ``S_1``, ``S_2``.
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
        # under bf16 autocast the network returns bf16 scores and maps; the metrics, the AUC (numpy has no bfloat16),
        # the panels and the reports all read float32 from here on
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
