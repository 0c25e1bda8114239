from .cam import CAM
from .glam import GLAM, REFERENCE_PRESET, STAGES
from .global_network import GlobalBackbone, GlobalNetwork, PreActBasicBlock
from .gmic import GMIC
from .inference import GLAMInferer, GLAMSaliencyNet
from .local_network import BasicBlock, LocalNetwork, ResNetHR
from .unet import UNetSaliency

__all__ = [
    "GLAM",
    "GLAMSaliencyNet",
    "GLAMInferer",
    "REFERENCE_PRESET",
    "STAGES",
    "GlobalBackbone",
    "GlobalNetwork",
    "PreActBasicBlock",
    "BasicBlock",
    "LocalNetwork",
    "ResNetHR",
    "CAM",
    "GMIC",
    "UNetSaliency",
]
