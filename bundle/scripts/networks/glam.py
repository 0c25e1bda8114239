"""GLAM: the global module, saliency-guided patches, the local module, aggregation and fusion, composed."""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..aggregation import AGGREGATIONS, PAPER_AGGREGATION, AggregationSpec, FusionHead
from ..bundle_info import bundle_version
from ..data.geometry import as_pixel_spacing
from ..enums import STAGES, MapName, OutputKey, Stage
from ..patches import (
    _check_patch_count,
    as_pair,
    crop_patches,
    random_patch_boxes,
    render_saliency,
    select_patch_boxes,
    shift_patch_boxes,
)
from ..pooling import check_fraction
from .global_network import GlobalNetwork
from .local_network import LocalNetwork
from .settings import SETTINGS_KEY, check_settings, encode_settings, read_checkpoint_settings

__all__ = ["GLAM", "GLAM_DEFAULTS", "REFERENCE_PRESET", "checkpoint_setting"]

#: The authors' released inference behaviour (docs/model.md, the reference-compatible preset): pooling after
#: upsampling with t = 3%, concatenation aggregation with t = 30%, one patch of 512 px, gamma 0.2/0.6/0.2,
#: gamma_c = 0.5, 2944x1920 windows; the pixel spacing of the authors' data is not published (docs/model.md), so it
#: is unknown and inputs are not resampled.
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


def check_image(image: torch.Tensor, patch_size: Sequence[int] | None = None, name: str = "image") -> None:
    """Validate a batch of mammograms (B, 1, H, W): rank, channels, size, finite values (one host sync)."""
    if not isinstance(image, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor (B, 1, H, W), got {type(image).__name__}")
    if image.ndim != 4:
        raise ValueError(f"{name} must be (B, 1, H, W), got shape {tuple(image.shape)} (rank {image.ndim})")
    if image.shape[1] != 1:
        raise ValueError(f"{name} must have 1 channel (grey-level mammogram), got {image.shape[1]} channels")
    if patch_size is not None and (image.shape[-2] < patch_size[0] or image.shape[-1] < patch_size[1]):
        raise ValueError(
            f"{name} of {image.shape[-2]}x{image.shape[-1]} is smaller than the {patch_size[0]}x{patch_size[1]} patch"
        )
    if not bool(torch.isfinite(image).all()):
        raise ValueError(f"{name} contains NaN or infinite values")


def _check_arguments(
    patch_size: tuple[int, int],
    num_patches_train: Any,
    num_patches_eval: Any,
    gamma_c: Any,
    aggregation: str | None,
    joint_modules: bool,
    stage: str,
) -> None:
    """``ValueError`` for GLAM arguments that cannot build a working network (see :class:`GLAM`)."""
    if patch_size[0] % 4 or patch_size[1] % 4:
        raise ValueError(f"patch_size must be a multiple of 4 (the local module's stride), got {patch_size}")
    for name, k in (("num_patches_train", num_patches_train), ("num_patches_eval", num_patches_eval)):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"{name} must be a positive int, got {k!r}")
    if not 0.0 <= float(gamma_c) <= 1.0:
        raise ValueError(f"gamma_c must be in [0, 1], got {gamma_c}")
    chosen: AggregationSpec | None = None
    if aggregation is not None:
        chosen = AGGREGATIONS.look_up(aggregation, "aggregation")
    if not joint_modules and (stage == Stage.JOINT or (chosen is not None and chosen.joint_module)):
        raise ValueError("joint_modules=False leaves no attention/fusion: use stage 'global'/'local' with concat")


def _as_is(value: Any) -> Any:
    return value


#: GLAM's settings record: its constructor's arguments of these names, each as the JSON value recorded
_RECORDED: dict[str, Callable[[Any], Any]] = {
    "patch_size": lambda value: list(as_pair(value, "patch_size")),
    "num_patches_train": _as_is,
    "num_patches_eval": _as_is,
    "t_global": float,
    "t_local": float,
    "global_pool_after_upsampling": bool,
    "gammas": lambda value: [float(g) for g in value],
    "gamma_c": float,
    "aggregation": _as_is,
    "local_depth": int,
    "local_width": int,
    "attention_hidden": int,
    "joint_modules": bool,
    "global_backbone": lambda value: dict(value or {}),
    "pool_in_breast": bool,
    "image_size": lambda value: list(as_pair(value, "image_size")),
    "pixel_spacing": lambda value: None if (spacing := as_pixel_spacing(value)) is None else list(spacing),
}


def _settings_record(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The settings record of a GLAM built with ``arguments`` (its constructor's), and the bundle's version."""
    return {**{name: record(arguments[name]) for name, record in _RECORDED.items()}, "bundle_version": bundle_version()}


class GLAM(nn.Module):
    """GLAM (Liu et al., MIDL 2021): weakly supervised high-resolution saliency for mammograms.

    ``GLAM()`` is the paper's full-size model: 2944x1920 inputs, ResNet-34-HR local module, 512 px patches,
    K = 6 patches in training and M = 1 in eval mode, top-t 3% (global) and 20% (local).

    Args:
        stage: ``"global"`` (global module only), ``"local"`` (global module frozen, local module with
            concatenation aggregation) or ``"joint"`` (both, attention aggregation and fusion). See :meth:`set_stage`.
        patch_size: local patch size in input pixels, int or (rows, cols); a multiple of 4.
        num_patches_train: K, patches per image in training mode.
        num_patches_eval: M, patches per image in eval mode.
        t_global: top-t% fraction of the global module's per-scale pooling.
        t_local: top-t% fraction of the patch aggregation.
        global_pool_after_upsampling: pool every global scale after upsampling it to S_0's size (authors' code).
        gammas: weights of S_0, S_1, S_2 in S_g.
        gamma_c: weight of S_g in S_c = gamma_c S_g + (1 - gamma_c) S_l.
        aggregation: ``None`` for the paper's choice per stage (concatenation in ``local``, gated attention in
            ``joint``), or a name in :data:`~scripts.aggregation.AGGREGATIONS` (``"concat"``, ``"attention"`` or
            one registered with :func:`~scripts.aggregation.register_aggregation`) for every stage.
        local_depth, local_width: the local ResNet-HR (34, 64 in the paper; smaller for tests and CPU presets).
        activation_checkpointing: recompute the local module's activations in backward to fit more patches.
        attention_hidden: hidden size of the gated attention (128).
        joint_modules: hold the gated attention and the fusion head (needed by the ``joint`` stage and attention
            aggregation). ``False`` gives the authors' inference layout (global and local modules only).
        global_backbone: keyword arguments of the global module's
            :class:`~scripts.networks.global_network.GlobalBackbone` (width, strides, blocks_per_layer,
            stem_stride, stem_pool, padding_mode); the paper's ResNet-22 when empty.
        pool_in_breast: the global module pools only map cells on the breast (see
            :class:`~scripts.networks.global_network.GlobalNetwork`).
        image_size: the preprocessing window (rows, cols) the network is trained on; recorded in its settings for
            inference to use the same window, not used by the forward pass (which takes any size).
        pixel_spacing: the (row, col) pixel size in mm of the images the network is trained on (a number: the same
            both ways), or None when unknown; recorded for inference, which resamples inputs of known spacing to it.

    Forward: ``image`` (B, 1, H, W) standardised mammograms; optional ``patch_boxes`` (B, K, 4) to use instead
    of Algorithm 1; optional ``random_patch_mask`` (B,) bool: those images get K random patches inside the breast
    (the negatives of stage 2), drawn with ``generator``; optional ``patch_shift`` (pixels, training mode only):
    Algorithm 1's boxes each move by a random offset of up to that many pixels per axis (also drawn with
    ``generator``), so that a lesion does not always sit at the same place in its patch. Returns a dict of tensors:

    - ``y_global`` (B, 2): y_g, probabilities (benign, malignant): GLAM's classification output;
    - ``y_scales`` (B, 3, 2): per-scale pooled predictions; ``z_global`` (B, 256);
    - ``saliency_global`` (B, 2, H/16, W/16): S_g; ``saliency_scale0|1|2``: S_0 (H/16), S_1 (H/32), S_2 (H/64);
    - stages ``local``/``joint`` also: ``patch_boxes`` (B, K, 4) long (row, col, height, width);
      ``patch_maps`` (B, K, 2, p/4, p/4); ``y_local`` (B, 2); ``saliency_local`` S_l and ``saliency`` S_c,
      (B, 2, H/4, W/4), exactly the full-size maps sampled every 4 px (:meth:`full_resolution` renders full size);
    - stage ``joint``: ``attention`` (B, K) (with attention aggregation) and ``y_fusion`` (B, 2).
    """

    def __init__(
        self,
        stage: str = Stage.JOINT,
        patch_size: int | Sequence[int] = 512,
        num_patches_train: int = 6,
        num_patches_eval: int = 1,
        t_global: float = 0.03,
        t_local: float = 0.2,
        global_pool_after_upsampling: bool = False,
        gammas: Sequence[float] = (0.2, 0.6, 0.2),
        gamma_c: float = 0.5,
        aggregation: str | None = None,
        local_depth: int = 34,
        local_width: int = 64,
        activation_checkpointing: bool = False,
        attention_hidden: int = 128,
        joint_modules: bool = True,
        global_backbone: Mapping[str, Any] | None = None,
        pool_in_breast: bool = False,
        image_size: Sequence[int] = (2944, 1920),
        pixel_spacing: float | Sequence[float] | None = None,
    ) -> None:
        arguments = dict(locals())  # before any is normalised: the settings record reads them (_RECORDED)
        super().__init__()
        self.patch_size = as_pair(patch_size, "patch_size")
        _check_arguments(
            self.patch_size, num_patches_train, num_patches_eval, gamma_c, aggregation, joint_modules, stage
        )
        check_fraction(t_local, "t_local")
        # the recorded-only settings are checked before any weight is drawn (and written down at the end)
        as_pair(image_size, "image_size")
        as_pixel_spacing(pixel_spacing)
        self.num_patches_train = num_patches_train
        self.num_patches_eval = num_patches_eval
        self.gamma_c = float(gamma_c)
        self.aggregation = aggregation
        # the submodules in the order their initial weights are drawn: global, local, aggregations, fusion (so a seed
        # gives the same network as every earlier version)
        self.global_network = GlobalNetwork(
            t=t_global,
            gammas=gammas,
            pool_after_upsampling=global_pool_after_upsampling,
            backbone=global_backbone,
            pool_in_breast=pool_in_breast,
        )
        self.local_network = LocalNetwork(
            depth=local_depth, width=local_width, activation_checkpointing=activation_checkpointing
        )
        self._add_aggregations(aggregation, joint_modules, int(attention_hidden), float(t_local))
        self.fusion: FusionHead | None = None
        if joint_modules:
            self.fusion = FusionHead(self.global_network.representation_size, self.local_network.representation_size)
        self.stage = Stage.JOINT.value
        self.global_frozen = False
        self.set_stage(stage)
        # how this network was built, inside every state dict it saves (scripts/networks/settings.py); the stage is
        # not a setting: one checkpoint serves the next stage and inference
        self.settings: dict[str, Any] = _settings_record(arguments)
        self.register_buffer(SETTINGS_KEY, encode_settings(self.settings), persistent=True)

    def _add_aggregations(self, aggregation: str | None, joint_modules: bool, hidden: int, t_local: float) -> None:
        """The aggregation modules, in :data:`~scripts.aggregation.AGGREGATIONS`' registration order (the order their
        initial weights are drawn in), and :attr:`stage_aggregation`, the one each stage runs (the global stage runs
        none). Held: the paper's two (concatenation, without weights, always: ``concat_aggregation`` has always been
        there; gated attention with the joint modules, since their checkpoints carry its weights whatever aggregation
        they trained with) and the chosen one."""
        self.stage_aggregation: dict[str, str] = {
            stage_name: aggregation or default for stage_name, default in PAPER_AGGREGATION.items()
        }
        held = {*PAPER_AGGREGATION.values(), *self.stage_aggregation.values()}
        self.held_aggregations: list[str] = []
        for name, spec in AGGREGATIONS:
            if name not in held:
                continue
            if spec.joint_module and not joint_modules:
                setattr(self, spec.attribute, None)  # e.g. ``attention`` is None in the authors' inference layout
                continue
            if spec.attribute in self.__dict__ or spec.attribute in self._modules:
                raise ValueError(f"aggregation {name!r}: GLAM already has an attribute {spec.attribute!r}")
            self.add_module(spec.attribute, spec.factory(self.local_network.representation_size, hidden, t_local))
            self.held_aggregations.append(name)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors):
        key = prefix + SETTINGS_KEY
        if key in state_dict:
            check_settings(state_dict[key], self.settings)
        # this network's own record: inference choices (M, gamma_c, t...) may differ, and older checkpoints have none
        state_dict[key] = getattr(self, SETTINGS_KEY)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors)

    @classmethod
    def reference(cls, **overrides: Any) -> GLAM:
        """The authors' inference behaviour (:data:`REFERENCE_PRESET`), in eval mode."""
        return cls(**{**REFERENCE_PRESET, **overrides}).eval()

    # -- stages and freezing -------------------------------------------------------------------------------------
    def set_stage(self, stage: str) -> GLAM:
        """Select the training stage and which parameters train in it.

        ``global``: only the global module trains; ``local``: the global module is frozen (no gradients, BN in eval
        mode) and only the local module trains; ``joint``: everything trains. Parts a stage does not use (the local
        module in ``global``; attention and fusion in ``local``) are frozen too, so that every trainable parameter
        receives a gradient.
        """
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
        if stage == Stage.JOINT and self.fusion is None:
            raise ValueError("stage 'joint' needs the attention and fusion modules (joint_modules=True)")
        self.stage = str(Stage(stage))
        self.freeze_global(stage == Stage.LOCAL)
        uses_local = stage != Stage.GLOBAL
        for p in self.local_network.parameters():
            p.requires_grad_(uses_local)
        # only the stage's own aggregation trains (none in the global stage)
        active = self.stage_aggregation.get(self.stage)
        for name in self.held_aggregations:
            for p in getattr(self, AGGREGATIONS.look_up(name, "aggregation").attribute).parameters():
                p.requires_grad_(name == active)
        if self.fusion is not None:
            for p in self.fusion.parameters():
                p.requires_grad_(stage == Stage.JOINT)
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
        """The aggregation module that ``stage`` (default: the current one) runs; the global stage runs none, and
        gets the local stage's (so that the TorchScript copy has one to compile)."""
        stage = self.stage if stage is None else str(Stage(stage))
        name = self.stage_aggregation.get(stage, self.stage_aggregation[Stage.LOCAL.value])
        return getattr(self, AGGREGATIONS.look_up(name, "aggregation").attribute)

    def __prepare_scriptable__(self) -> GLAM:
        """The copy ``torch.jit.script`` compiles: TorchScript resolves attributes by their names in the source, not
        by a name held in a variable, so the copy also holds the current stage's aggregation as
        ``scripted_aggregation``, which the scripted forward calls (the eager network is left as it is; the
        exported state dict has that module's weights under both names)."""
        clone = copy.copy(self)
        clone._modules = dict(self._modules)  # its own module table: adding to it leaves this network unchanged
        clone._modules["scripted_aggregation"] = self.aggregation_module()
        return clone

    @property
    def num_patches(self) -> int:
        """K in training mode, M in eval mode."""
        return self.num_patches_train if self.training else self.num_patches_eval

    # -- forward ---------------------------------------------------------------------------------------------------
    def forward_all(
        self,
        image: torch.Tensor,
        patch_boxes: torch.Tensor | None = None,
        random_patch_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        patch_shift: int = 0,
    ) -> dict[str, torch.Tensor]:
        """The output dict of the class docstring (``forward`` of GLAM; subclasses may return less from ``forward``)."""
        if not torch.jit.is_scripting():
            check_image(image, self.patch_size if self.stage != Stage.GLOBAL.value else None)
        if self.global_frozen:
            with torch.no_grad():
                g = self.global_network(image)
        else:
            g = self.global_network(image)
        out: dict[str, torch.Tensor] = {}
        for key in (
            OutputKey.Y_GLOBAL.value,
            OutputKey.Y_SCALES.value,
            OutputKey.Z_GLOBAL.value,
            OutputKey.SALIENCY_GLOBAL.value,
            OutputKey.SALIENCY_SCALE0.value,
            OutputKey.SALIENCY_SCALE1.value,
            OutputKey.SALIENCY_SCALE2.value,
        ):
            out[key] = g[key]
        if self.stage == Stage.GLOBAL.value:
            return out

        image_size = [image.shape[-2], image.shape[-1]]
        patch_size = [self.patch_size[0], self.patch_size[1]]
        if torch.jit.is_scripting():
            # the exported network runs Algorithm 1 (inference); given and random boxes are for training in Python
            if patch_boxes is not None or random_patch_mask is not None:
                raise RuntimeError("the TorchScript GLAM selects its patches itself: patch_boxes/random_patch_mask")
            boxes = select_patch_boxes(
                g[OutputKey.SALIENCY_GLOBAL.value].detach(), image_size, patch_size, self.num_patches_eval
            )
        else:
            boxes = self._patch_boxes(
                image, g[OutputKey.SALIENCY_GLOBAL.value], patch_boxes, random_patch_mask, generator, patch_shift
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
        if OutputKey.ATTENTION.value in agg:  # attention weights (B, K), from aggregations that have them
            out[OutputKey.ATTENTION.value] = agg[OutputKey.ATTENTION.value]
        out[OutputKey.Y_LOCAL.value] = agg[OutputKey.Y_LOCAL.value]
        out[OutputKey.PATCH_BOXES.value] = boxes
        out[OutputKey.PATCH_MAPS.value] = patch_maps
        fusion = self.fusion
        if self.stage == Stage.JOINT.value and fusion is not None:
            out[OutputKey.Y_FUSION.value] = fusion(g[OutputKey.Z_GLOBAL.value], agg[OutputKey.Z_LOCAL.value])
        maps = render_saliency(
            g[OutputKey.SALIENCY_GLOBAL.value], patch_maps, boxes, image_size, stride=4, gamma_c=self.gamma_c
        )
        out[OutputKey.SALIENCY_LOCAL.value] = maps[MapName.LOCAL.value]
        out[OutputKey.SALIENCY.value] = maps[MapName.COMBINED.value]
        return out

    # GLAM's forward is the whole output dict; GLAMSaliencyNet overrides forward and keeps forward_all
    forward = forward_all

    @torch.jit.unused
    def _patch_boxes(
        self,
        image: torch.Tensor,
        saliency_global: torch.Tensor,
        patch_boxes: torch.Tensor | None,
        random_patch_mask: torch.Tensor | None,
        generator: torch.Generator | None,
        patch_shift: int = 0,
    ) -> torch.Tensor:
        image_size = tuple(image.shape[-2:])
        if patch_boxes is not None:
            if patch_boxes.ndim != 3 or patch_boxes.shape[0] != image.shape[0] or patch_boxes.shape[-1] != 4:
                raise ValueError(f"patch_boxes must be (B, K, 4), got shape {tuple(patch_boxes.shape)}")
            if (patch_boxes[..., 2:] != torch.tensor(self.patch_size, device=patch_boxes.device)).any():
                raise ValueError(f"patch_boxes must all have the model's patch size {self.patch_size}")
            return patch_boxes.to(device=image.device, dtype=torch.long)
        k = self.num_patches
        _check_patch_count(k, saliency_global.shape[-2:], image_size, self.patch_size)
        boxes = select_patch_boxes(saliency_global.detach(), image_size, self.patch_size, k)
        if patch_shift:
            if not self.training:
                raise ValueError("patch_shift is a training augmentation: inference keeps Algorithm 1's boxes")
            boxes = shift_patch_boxes(boxes, image_size, patch_shift, generator)
        if random_patch_mask is not None:
            if random_patch_mask.shape != (image.shape[0],):
                raise ValueError(
                    f"random_patch_mask must be (B,) = ({image.shape[0]},), got {tuple(random_patch_mask.shape)}"
                )
            random_boxes = random_patch_boxes(image, self.patch_size, k, generator=generator)
            mask = random_patch_mask.to(device=boxes.device, dtype=torch.bool)[:, None, None]
            boxes = torch.where(mask, random_boxes, boxes)
        return boxes

    def fuse_for_inference(self) -> GLAM:
        """An eval-mode copy with the local module's batch norms folded into its convolutions (same outputs up to
        float rounding, faster; its state dict has no local BN entries, so fuse after loading weights)."""
        fused = copy.deepcopy(self).eval()
        fused.local_network.fuse_batchnorm()
        return fused

    def full_resolution(self, outputs: dict[str, torch.Tensor], image_size: Sequence[int]) -> dict[str, torch.Tensor]:
        """Render S_g, S_l and S_c at full input resolution (B, 2, H, W) from a forward's outputs."""
        if OutputKey.PATCH_MAPS not in outputs:
            raise ValueError("full_resolution needs the outputs of a 'local' or 'joint' stage forward")
        return render_saliency(
            outputs[OutputKey.SALIENCY_GLOBAL],
            outputs[OutputKey.PATCH_MAPS],
            outputs[OutputKey.PATCH_BOXES],
            image_size,
            1,
            self.gamma_c,
        )


#: GLAM's own default of every constructor argument (the paper's values)
GLAM_DEFAULTS: dict[str, Any] = {
    name: parameter.default
    for name, parameter in inspect.signature(GLAM.__init__).parameters.items()
    if parameter.default is not inspect.Parameter.empty
}


def checkpoint_setting(path: str | os.PathLike, name: str, default: Any = inspect.Parameter.empty) -> Any:
    """The value of setting ``name`` recorded in the checkpoint at ``path``; when the file is missing or does not
    record it, ``default``, or else GLAM's own default for it (:data:`GLAM_DEFAULTS`, the paper's value). Through
    :func:`scripts.networks.inference.checkpoint_settings` (inference.yaml's ``checkpoint_settings``) a checkpoint
    rebuilds the network it was trained as."""
    record = read_checkpoint_settings(path)
    if record is not None and name in record:
        return record[name]
    if default is not inspect.Parameter.empty:
        return default
    if name not in GLAM_DEFAULTS:
        raise KeyError(f"{name!r} is not a GLAM setting with a default")
    return GLAM_DEFAULTS[name]
