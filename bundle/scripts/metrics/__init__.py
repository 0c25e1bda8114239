"""The paper's localisation metrics (appendix E) as MONAI cumulative metrics, computed on the inputs' device.

Classification AUC needs nothing new: ``monai.metrics.ROCAUCMetric(average="none")`` (see docs/metrics.md).
"""

from .pointing_game import PointingGameMetric, compute_pointing_game, map_peaks
from .pxap import PxAPMetric, average_precision_from_histograms, compute_pxap_histograms, pxap_bin_edges
from .soft_dice import SoftDiceMetric, compute_soft_dice

__all__ = [
    "PointingGameMetric",
    "PxAPMetric",
    "SoftDiceMetric",
    "average_precision_from_histograms",
    "compute_pointing_game",
    "compute_pxap_histograms",
    "compute_soft_dice",
    "map_peaks",
    "pxap_bin_edges",
]
