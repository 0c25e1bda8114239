"""GLAM (Global-Local Activation Maps) components for MONAI, imported from the configs as ``scripts.…``."""

from .aggregation import ConcatTopTAggregation, FusionHead, GatedAttentionAggregation
from .losses import GLAMLoss
from .metrics import PxAPMetric, SoftDiceMetric
from .networks import GLAM, REFERENCE_PRESET, GlobalNetwork, LocalNetwork
from .patches import (
    PatchSelector,
    crop_patches,
    random_patch_boxes,
    render_saliency,
    select_patch_boxes,
    shift_patch_boxes,
)
from .pooling import TopTPooling
from .training.workflow import GLAMWorkflow

__all__ = [
    "GLAM",
    "REFERENCE_PRESET",
    "GlobalNetwork",
    "LocalNetwork",
    "TopTPooling",
    "ConcatTopTAggregation",
    "GatedAttentionAggregation",
    "FusionHead",
    "GLAMLoss",
    "PatchSelector",
    "select_patch_boxes",
    "random_patch_boxes",
    "shift_patch_boxes",
    "crop_patches",
    "render_saliency",
    "SoftDiceMetric",
    "PxAPMetric",
    "GLAMWorkflow",
]
