from .glam import GLAM, REFERENCE_PRESET, STAGES
from .global_network import GlobalBackbone, GlobalNetwork, PreActBasicBlock
from .inference import GLAMInferer, GLAMSaliencyNet
from .local_network import BasicBlock, LocalNetwork, ResNetHR

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
]
