"""GLAM's three-stage training (global, local, joint) on MONAI / PyTorch-Ignite engines: ``configs/train.yaml``.

The submodules are imported here so that a config expression can name them after ``$import scripts.training``.
"""

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
