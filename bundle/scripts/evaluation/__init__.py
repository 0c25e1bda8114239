"""Evaluation of a trained GLAM on a labelled split with the paper's metrics: ``configs/evaluate.yaml``.

The submodules are imported here so that a config expression can name them after ``$import scripts.evaluation``.
"""

from . import files, metrics, report

__all__ = ["files", "metrics", "report"]
