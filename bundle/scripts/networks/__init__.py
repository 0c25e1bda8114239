from .glam import GLAM, REFERENCE_PRESET, STAGES
from .global_network import GlobalBackbone, GlobalNetwork, PreActBasicBlock
from .local_network import BasicBlock, LocalNetwork, ResNetHR

__all__ = [
    "GLAM",
    "REFERENCE_PRESET",
    "STAGES",
    "GlobalBackbone",
    "GlobalNetwork",
    "PreActBasicBlock",
    "BasicBlock",
    "LocalNetwork",
    "ResNetHR",
]
