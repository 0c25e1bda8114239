from ..enums import STAGES
from .fast_inference import AutocastInference, cpu_supports_bf16, optimize_for_inference, resolve_precision
from .glam import GLAM, REFERENCE_PRESET
from .glam_settings import GLAM_DEFAULTS, GLAMSettings
from .global_network import GlobalBackbone, GlobalNetwork, PreActBasicBlock
from .inference import GLAMInferer, GLAMSaliencyNet
from .local_network import BasicBlock, LocalNetwork, ResNetHR
from .settings import checkpoint_setting, read_checkpoint_settings

__all__ = [
    "GLAM",
    "GLAMSettings",
    "GLAMSaliencyNet",
    "GLAMInferer",
    "AutocastInference",
    "optimize_for_inference",
    "resolve_precision",
    "cpu_supports_bf16",
    "REFERENCE_PRESET",
    "GLAM_DEFAULTS",
    "STAGES",
    "GlobalBackbone",
    "GlobalNetwork",
    "PreActBasicBlock",
    "BasicBlock",
    "LocalNetwork",
    "ResNetHR",
    "checkpoint_setting",
    "read_checkpoint_settings",
]
