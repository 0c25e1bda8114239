"""Evaluation of a trained GLAM on a labelled split with the paper's metrics (``configs/evaluate.yaml``)."""

from . import files, metrics, report

__all__ = ["files", "metrics", "report"]
