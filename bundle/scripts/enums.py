"""The project's names for stages, classes, maps and outputs, as MONAI's ``monai/utils/enums.py``.

The values are part of the interface (file names, CSV columns, metric names); inside TorchScript use ``Member.value``.
"""

from __future__ import annotations

from monai.utils import StrEnum


class Stage(StrEnum):
    """GLAM's three training stages: the global module, the local module on its patches, then both jointly."""

    GLOBAL = "global"
    LOCAL = "local"
    JOINT = "joint"


STAGES: tuple[str, ...] = tuple(s.value for s in Stage)


class LesionClass(StrEnum):
    """The two image-level labels, in channel order."""

    BENIGN = "benign"
    MALIGNANT = "malignant"


CLASS_NAMES: tuple[str, ...] = tuple(c.value for c in LesionClass)
#: a datalist item's lesion masks, one per class in channel order (docs/data.md)
MASK_KEYS: tuple[str, ...] = tuple(f"mask_{c}" for c in CLASS_NAMES)


class MapName(StrEnum):
    """The saliency maps on the image grid: S_g (global module), S_l (local module's patches), S_c (combined)."""

    GLOBAL = "S_g"
    LOCAL = "S_l"
    COMBINED = "S_c"


MAP_NAMES: tuple[str, ...] = tuple(m.value for m in MapName)


class OutputKey(StrEnum):
    """Keys of the networks' output dicts (docs/model.md, "Outputs")."""

    Y_GLOBAL = "y_global"
    Y_SCALES = "y_scales"
    Z_GLOBAL = "z_global"
    SALIENCY_GLOBAL = "saliency_global"
    SALIENCY_SCALE0 = "saliency_scale0"
    SALIENCY_SCALE1 = "saliency_scale1"
    SALIENCY_SCALE2 = "saliency_scale2"
    Y_LOCAL = "y_local"
    Z_LOCAL = "z_local"
    ATTENTION = "attention"
    PATCH_BOXES = "patch_boxes"
    PATCH_MAPS = "patch_maps"
    PATCH_FEATURES = "patch_features"
    Y_FUSION = "y_fusion"
    SALIENCY_LOCAL = "saliency_local"
    SALIENCY = "saliency"


class InferenceOutput(StrEnum):
    """The optional files of an inference run, as its ``outputs`` setting names them (maps by :class:`MapName`)."""

    PANEL = "panel"  # panels/<stem>_panel.png: the image with an overlay of each written map
    PNG = "png"  # maps/<stem>_<map>_<class>.png: each written map also as 16-bit PNGs, one per class
    DICOM_SC = "dicom_sc"  # dicom/<stem>_sc.dcm: the panel as a DICOM Secondary Capture (DICOM inputs)
    DICOM_MAP = "dicom_map"  # dicom/<stem>_map.dcm: S_c as a FRACTIONAL DICOM Segmentation (DICOM inputs)
