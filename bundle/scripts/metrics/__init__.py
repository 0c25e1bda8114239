"""The paper's localisation metrics (appendix E) as MONAI cumulative metrics, computed on the inputs' device, and
the lesion-level FROC of a map (:mod:`.froc`).

Image-level classification AUC needs nothing new: ``monai.metrics.ROCAUCMetric(average="none")``; the breast-level
AUC (:mod:`.breasts`) groups the images' scores by breast first (see docs/metrics.md).
"""

from .breasts import BreastAUC, breast_auc, breast_key
from .froc import FROC_RATES, FROCMetric
from .pointing_game import PointingGameMetric, compute_pointing_game, map_peaks
from .pxap import PxAPMetric, average_precision_from_histograms, compute_pxap_histograms, pxap_bin_edges
from .soft_dice import SoftDiceMetric, compute_soft_dice

__all__ = [
    "FROC_RATES",
    "BreastAUC",
    "FROCMetric",
    "PointingGameMetric",
    "PxAPMetric",
    "SoftDiceMetric",
    "average_precision_from_histograms",
    "breast_auc",
    "breast_key",
    "compute_pointing_game",
    "compute_pxap_histograms",
    "compute_soft_dice",
    "map_peaks",
    "pxap_bin_edges",
]
