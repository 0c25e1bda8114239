"""GLAM's three-stage training (global, local, joint) on MONAI / Ignite engines (``configs/train.yaml``)."""

from . import batch, checkpoints, datasets, distributed, preflight, sampler, selection, stage, tracking, workflow

__all__ = [
    "batch",
    "checkpoints",
    "datasets",
    "distributed",
    "preflight",
    "sampler",
    "selection",
    "stage",
    "tracking",
    "workflow",
]
