"""The paper's localisation metrics (appendix E) as MONAI cumulative metrics, the lesion FROC and breast-level AUC.

Image-level AUC is MONAI's ``ROCAUCMetric`` over the growing buffers of :mod:`.buffer` (``CompactROCAUCMetric``).
"""
# ruff: noqa: F401

from .breasts import breast_auc, breast_key
from .buffer import CompactCumulative, CompactROCAUCMetric
from .froc import FROC_RATES, FROCMetric
from .pointing_game import PointingGameMetric, compute_pointing_game, map_peaks
from .pxap import PxAPMetric, average_precision_from_histograms, compute_pxap_histograms, pxap_bin_edges
from .soft_dice import SoftDiceMetric, compute_soft_dice
