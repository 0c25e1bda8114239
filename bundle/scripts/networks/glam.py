"""GLAM (Liu et al., MIDL 2021): the global module, saliency-guided patches, the local module, aggregation and
fusion."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..aggregation import AGGREGATIONS, PAPER_AGGREGATION, FusionHead
from ..enums import STAGES, MapName, OutputKey, Stage
from ..errors import UsageError
from ..patches import (
    _check_patch_count,
    as_pair,
    crop_patches,
    random_patch_boxes,
    render_saliency,
    select_patch_boxes,
    select_peak_centred_boxes,
    shift_patch_boxes,
)
from .glam_settings import GLAMSettings
from .global_network import GlobalNetwork
from .local_network import LocalNetwork
from .settings import RecordsSettings

#: the authors' released inference behaviour; their data's pixel spacing is not published, so inputs are not resampled
REFERENCE_PRESET: dict[str, Any] = {
    "stage": Stage.LOCAL.value,
    "patch_size": 512,
    "num_patches_eval": 1,
    "t_global": 0.03,
    "t_local": 0.3,
    "global_pool_after_upsampling": True,
    "gammas": (0.2, 0.6, 0.2),
    "gamma_c": 0.5,
    "aggregation": "concat",
    "local_depth": 34,
    "local_width": 64,
    "joint_modules": False,
    "image_size": (2944, 1920),
    "pixel_spacing": None,
}


#: the global module's outputs, in the order GLAM's output dict starts with them
GLOBAL_OUTPUTS = tuple(
    key.value
    for key in (
        OutputKey.Y_GLOBAL,
        OutputKey.Y_SCALES,
        OutputKey.Z_GLOBAL,
        OutputKey.SALIENCY_GLOBAL,
        OutputKey.SALIENCY_SCALE0,
        OutputKey.SALIENCY_SCALE1,
        OutputKey.SALIENCY_SCALE2,
    )
)


def check_image(image: torch.Tensor, patch_size: Sequence[int] | None = None, name: str = "image") -> None:
    """Validate a batch of mammograms (B, 1, H, W): rank, channels, size, finite values."""
    if not isinstance(image, torch.Tensor):
        raise UsageError(f"{name} must be a torch.Tensor (B, 1, H, W), got {type(image).__name__}")
    if image.ndim != 4:
        raise UsageError(f"{name} must be (B, 1, H, W), got shape {tuple(image.shape)} (rank {image.ndim})")
    if image.shape[1] != 1:
        raise UsageError(f"{name} must have 1 channel (grey-level mammogram), got {image.shape[1]} channels")
    if patch_size is not None and (image.shape[-2] < patch_size[0] or image.shape[-1] < patch_size[1]):
        raise UsageError(
            f"{name} of {image.shape[-2]}x{image.shape[-1]} is smaller than the {patch_size[0]}x{patch_size[1]} patch"
        )
    if not bool(torch.isfinite(image).all()):
        raise UsageError(f"{name} contains NaN or infinite values")


def add_aggregations(network: GLAM, settings: GLAMSettings) -> None:
    """Add the paper's two aggregation modules and the chosen one, in their weights' draw order."""
    network.stage_aggregation = {name: settings.aggregation or default for name, default in PAPER_AGGREGATION.items()}
    held = {*PAPER_AGGREGATION.values(), *network.stage_aggregation.values()}
    network.held_aggregations = []
    size, hidden, t_local = network.local_network.representation_size, int(settings.attention_hidden), settings.t_local
    for name, spec in AGGREGATIONS:
        if name not in held:
            continue
        if spec.joint_module and not settings.joint_modules:
            setattr(network, spec.attribute, None)
            continue
        if spec.attribute in network.__dict__ or spec.attribute in network._modules:
            raise UsageError(f"aggregation {name!r}: GLAM already has an attribute {spec.attribute!r}")
        network.add_module(spec.attribute, spec.factory(size, hidden, float(t_local)))
        network.held_aggregations.append(name)


def training_patch_boxes(
    network: GLAM,
    image: torch.Tensor,
    saliency_global: torch.Tensor,
    patch_boxes: torch.Tensor | None,
    random_patch_mask: torch.Tensor | None,
    generator: torch.Generator | None,
    patch_shift: int = 0,
    centre_patches: bool = False,
) -> torch.Tensor:
    """The patch boxes (B, K, 4): the given ones, else Algorithm 1's, random ones for ``random_patch_mask``.

    In training, ``centre_patches`` centres Algorithm 1's boxes on S_g's peak inside each window, then ``patch_shift``
    moves them; both are refused in eval mode, where the boxes are Algorithm 1's.
    """
    image_size = tuple(image.shape[-2:])
    if patch_boxes is not None:
        if patch_boxes.ndim != 3 or patch_boxes.shape[0] != image.shape[0] or patch_boxes.shape[-1] != 4:
            raise UsageError(f"patch_boxes must be (B, K, 4), got shape {tuple(patch_boxes.shape)}")
        if (patch_boxes[..., 2:] != torch.tensor(network.patch_size, device=patch_boxes.device)).any():
            raise UsageError(f"patch_boxes must all have the model's patch size {network.patch_size}")
        return patch_boxes.to(device=image.device, dtype=torch.long)
    k = network.num_patches
    _check_patch_count(k, saliency_global.shape[-2:], image_size, network.patch_size)
    if centre_patches:
        if not network.training:
            raise UsageError("centre_patches is a training option: inference keeps Algorithm 1's boxes")
        boxes = select_peak_centred_boxes(saliency_global.detach(), image_size, network.patch_size, k)
    else:
        boxes = select_patch_boxes(saliency_global.detach(), image_size, network.patch_size, k)
    if patch_shift:
        if not network.training:
            raise UsageError("patch_shift is a training augmentation: inference keeps Algorithm 1's boxes")
        boxes = shift_patch_boxes(boxes, image_size, patch_shift, generator)
    if random_patch_mask is not None:
        if random_patch_mask.shape != (image.shape[0],):
            raise UsageError(
                f"random_patch_mask must be (B,) = ({image.shape[0]},), got {tuple(random_patch_mask.shape)}"
            )
        random_boxes = random_patch_boxes(image, network.patch_size, k, generator=generator)
        mask = random_patch_mask.to(device=boxes.device, dtype=torch.bool)[:, None, None]
        boxes = torch.where(mask, random_boxes, boxes)
    return boxes


def train_stage_parameters(network: GLAM) -> None:
    """Freeze what ``network``'s stage does not train or use, so every trainable parameter gets a gradient."""
    stage = network.stage
    network.freeze_global(stage == Stage.LOCAL)
    for p in network.local_network.parameters():
        p.requires_grad_(stage != Stage.GLOBAL)
    active = network.stage_aggregation.get(stage)
    for name in network.held_aggregations:
        for p in getattr(network, AGGREGATIONS.look_up(name, "aggregation").attribute).parameters():
            p.requires_grad_(name == active)
    if network.fusion is not None:
        for p in network.fusion.parameters():
            p.requires_grad_(stage == Stage.JOINT)


class GLAM(RecordsSettings):
    """GLAM: (B, 1, H, W) standardised mammograms -> a dict of tensors.

    Outputs: ``y_global`` (B, 2), ``y_scales`` (B, 3, 2), ``z_global``, S_g ``saliency_global`` (B, 2, H/16, W/16) and
    ``saliency_scale0|1|2``; stages ``local``/``joint`` add ``patch_boxes`` (B, K, 4), ``patch_maps``
    (B, K, 2, p/4, p/4), ``y_local`` (B, 2), S_l ``saliency_local`` and S_c ``saliency`` (B, 2, H/4, W/4); ``joint``
    adds ``attention`` (B, K) and ``y_fusion`` (B, 2).

    Args:
        settings: a :class:`GLAMSettings` (default: the paper's full-size model).
        overrides: fields of ``settings`` to change, e.g. ``GLAM(patch_size=256, stage="local")``.
    """

    __constants__ = ["global_outputs"]  # TorchScript reads a tuple of names from the module, not from a global
    global_outputs = GLOBAL_OUTPUTS

    def __init__(self, settings: GLAMSettings | None = None, **overrides: Any) -> None:
        super().__init__()
        s = GLAMSettings.of(settings, **overrides)
        s.check()  # before any weight is drawn
        self.patch_size = as_pair(s.patch_size, "patch_size")
        self.num_patches_train, self.num_patches_eval = s.num_patches_train, s.num_patches_eval
        self.gamma_c, self.aggregation = float(s.gamma_c), s.aggregation
        self.stage, self.global_frozen = Stage.JOINT.value, False
        # the order the weights are drawn in: a seed gives the same network
        self.global_network = GlobalNetwork(
            t=s.t_global,
            gammas=s.gammas,
            pool_after_upsampling=s.global_pool_after_upsampling,
            backbone=s.global_backbone,
            pool_in_breast=s.pool_in_breast,
        )
        self.local_network = LocalNetwork(
            depth=s.local_depth,
            width=s.local_width,
            activation_checkpointing=s.activation_checkpointing,
            padding_mode=s.local_padding_mode,
        )
        add_aggregations(self, s)
        self.fusion: FusionHead | None = None
        if s.joint_modules:
            self.fusion = FusionHead(self.global_network.representation_size, self.local_network.representation_size)
        self.set_stage(s.stage)
        self.record_settings(s.recorded())

    @classmethod
    def reference(cls, **overrides: Any) -> GLAM:
        """The authors' inference behaviour (:data:`REFERENCE_PRESET`), in eval mode."""
        return cls(**{**REFERENCE_PRESET, **overrides}).eval()

    def set_stage(self, stage: str) -> GLAM:
        """Select the training stage and which parameters train in it."""
        if stage not in STAGES:
            raise UsageError(f"stage must be one of {STAGES}, got {stage!r}")
        if stage == Stage.JOINT and self.fusion is None:
            raise UsageError("stage 'joint' needs the attention and fusion modules (joint_modules=True)")
        self.stage = str(Stage(stage))
        train_stage_parameters(self)
        return self

    def freeze_global(self, frozen: bool = True) -> GLAM:
        """Freeze (or unfreeze) the global module: no gradients, batch-norm statistics kept (eval mode)."""
        self.global_frozen = bool(frozen)
        for p in self.global_network.parameters():
            p.requires_grad_(not frozen)
        self.train(self.training)
        return self

    def train(self, mode: bool = True) -> GLAM:
        super().train(mode)
        if self.global_frozen:
            self.global_network.eval()
        return self

    def aggregation_module(self, stage: str | None = None) -> nn.Module:
        """The aggregation module ``stage`` (default: the current) runs; the global stage's is the local stage's."""
        stage = self.stage if stage is None else str(Stage(stage))
        name = self.stage_aggregation.get(stage, self.stage_aggregation[Stage.LOCAL.value])
        return getattr(self, AGGREGATIONS.look_up(name, "aggregation").attribute)

    def __prepare_scriptable__(self) -> GLAM:
        """The copy ``torch.jit.script`` compiles, with the stage's aggregation also as ``scripted_aggregation``."""
        clone = copy.copy(self)
        clone._modules = dict(self._modules)  # its own module table: adding to it leaves this network unchanged
        clone._modules["scripted_aggregation"] = self.aggregation_module()
        return clone

    @property
    def num_patches(self) -> int:
        """K in training mode, M in eval mode."""
        return self.num_patches_train if self.training else self.num_patches_eval

    def forward_all(
        self,
        image: torch.Tensor,
        patch_boxes: torch.Tensor | None = None,
        random_patch_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        patch_shift: int = 0,
        centre_patches: bool = False,
    ) -> dict[str, torch.Tensor]:
        """The output dict of the class docstring.

        Args:
            image: (B, 1, H, W) standardised mammograms.
            patch_boxes: (B, K, 4) boxes to use instead of Algorithm 1's.
            random_patch_mask: (B,) bool: those images get K random in-breast patches.
            generator: the random patches' and shifts' generator.
            patch_shift: training only: Algorithm 1's boxes move by up to this many pixels per axis.
            centre_patches: training only: each of Algorithm 1's boxes is centred on S_g's peak inside its window
                (before ``patch_shift``).
        """
        if not torch.jit.is_scripting():
            check_image(image, self.patch_size if self.stage != Stage.GLOBAL.value else None)
        if self.global_frozen:
            with torch.no_grad():
                g = self.global_network(image)
        else:
            g = self.global_network(image)
        out: dict[str, torch.Tensor] = {}
        for key in self.global_outputs:
            out[key] = g[key]
        if self.stage == Stage.GLOBAL.value:
            return out
        image_size = [image.shape[-2], image.shape[-1]]
        patch_size = [self.patch_size[0], self.patch_size[1]]
        s_g = g[OutputKey.SALIENCY_GLOBAL.value]
        if torch.jit.is_scripting():
            if patch_boxes is not None or random_patch_mask is not None or centre_patches or patch_shift != 0:
                raise RuntimeError(
                    "the TorchScript GLAM selects its patches itself: "
                    "patch_boxes/random_patch_mask/centre_patches/patch_shift"
                )
            boxes = select_patch_boxes(s_g.detach(), image_size, patch_size, self.num_patches_eval)
        else:
            boxes = training_patch_boxes(
                self, image, s_g, patch_boxes, random_patch_mask, generator, patch_shift, centre_patches
            )
        B, K = boxes.shape[0], boxes.shape[1]
        patches = crop_patches(image, boxes, patch_size)  # (B, K, 1, p, p)
        local = self.local_network(patches.flatten(0, 1))
        patch_maps = local[OutputKey.PATCH_MAPS.value].unflatten(0, (B, K))
        patch_features = local[OutputKey.PATCH_FEATURES.value].unflatten(0, (B, K))
        if torch.jit.is_scripting():
            agg = self.scripted_aggregation(patch_maps, patch_features)  # see __prepare_scriptable__
        else:
            agg = self.aggregation_module()(patch_maps, patch_features)
        if OutputKey.ATTENTION.value in agg:
            out[OutputKey.ATTENTION.value] = agg[OutputKey.ATTENTION.value]
        out[OutputKey.Y_LOCAL.value] = agg[OutputKey.Y_LOCAL.value]
        out[OutputKey.PATCH_BOXES.value] = boxes
        out[OutputKey.PATCH_MAPS.value] = patch_maps
        fusion = self.fusion
        if self.stage == Stage.JOINT.value and fusion is not None:
            out[OutputKey.Y_FUSION.value] = fusion(g[OutputKey.Z_GLOBAL.value], agg[OutputKey.Z_LOCAL.value])
        maps = render_saliency(s_g, patch_maps, boxes, image_size, stride=4, gamma_c=self.gamma_c)
        out[OutputKey.SALIENCY_LOCAL.value] = maps[MapName.LOCAL.value]
        out[OutputKey.SALIENCY.value] = maps[MapName.COMBINED.value]
        return out

    forward = forward_all

    def fuse_for_inference(self) -> GLAM:
        """An eval-mode copy, the local module's batch norms folded into its convolutions (fuse after loading)."""
        fused = copy.deepcopy(self).eval()
        fused.local_network.fuse_batchnorm()
        return fused

    def full_resolution(self, outputs: dict[str, torch.Tensor], image_size: Sequence[int]) -> dict[str, torch.Tensor]:
        """Render S_g, S_l and S_c at full input resolution (B, 2, H, W) from a forward's outputs."""
        if OutputKey.PATCH_MAPS not in outputs:
            raise UsageError("full_resolution needs the outputs of a 'local' or 'joint' stage forward")
        maps = [outputs[key] for key in (OutputKey.SALIENCY_GLOBAL, OutputKey.PATCH_MAPS, OutputKey.PATCH_BOXES)]
        return render_saliency(*maps, image_size, 1, self.gamma_c)
