"""The GLAM paper's Table-1 baselines, built from the bundle's parts: CAM, GMIC and a fully supervised U-Net."""

from .cam import CAM
from .gmic import GMIC
from .losses import CAMLoss, GMICLoss, MaskDiceBCELoss
from .settings import model_setting
from .unet import UNetSaliency

__all__ = ["CAM", "GMIC", "UNetSaliency", "CAMLoss", "GMICLoss", "MaskDiceBCELoss", "model_setting"]
