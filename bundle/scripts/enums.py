"""The project's vocabulary: one name per thing, in the spirit of MONAI's ``monai/utils/enums.py``.

Every stage, lesion class, saliency map and network output is spelled here and only here; code elsewhere uses
these members (they are ``str`` subclasses, so they compare, hash, format and serialise as their values), configs
and tests may spell the values. The values are part of the bundle's interface: file names, CSV columns, metric
names and checkpoint settings are built from them, so renaming a value changes what users see on disk.

Inside TorchScript-compiled code use ``Member.value`` (TorchScript supports enums through their values).
"""

from __future__ import annotations

from monai.utils import StrEnum

__all__ = [
    "Stage",
    "STAGES",
    "LesionClass",
    "CLASS_NAMES",
    "MapName",
    "MAP_NAMES",
    "OutputKey",
    "MAP_OUTPUT_KEYS",
    "InferenceOutput",
]


class Stage(StrEnum):
    """GLAM's three training stages (paper section 2.3): the global module alone, the local module on patches
    chosen by the frozen global module, then both with the fusion head. Baselines train one ``GLOBAL`` stage."""

    GLOBAL = "global"
    LOCAL = "local"
    JOINT = "joint"


STAGES: tuple[str, ...] = tuple(s.value for s in Stage)


class LesionClass(StrEnum):
    """The two image-level labels; their order is the channel order of labels, masks, maps and scores."""

    BENIGN = "benign"
    MALIGNANT = "malignant"


CLASS_NAMES: tuple[str, ...] = tuple(c.value for c in LesionClass)


class MapName(StrEnum):
    """The three saliency maps on the image grid, as postprocessing, the writers, the reports and file names call
    them: S_g from the global module, S_l from the patches of the local module, S_c their combination."""

    GLOBAL = "S_g"
    LOCAL = "S_l"
    COMBINED = "S_c"


MAP_NAMES: tuple[str, ...] = tuple(m.value for m in MapName)


class OutputKey(StrEnum):
    """Keys of the networks' output dicts (docs/model.md, "Outputs"). ``SALIENCY_GLOBAL`` is S_g on the global
    module's coarsest-stride grid (B, C, h, w); ``SALIENCY_LOCAL`` and ``SALIENCY`` are S_l and S_c on the image grid
    sampled every 4 px."""

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
    LOGITS = "logits"


# which network output holds each map (S_g's output is on its own grid; the renderer puts it on the image grid)
MAP_OUTPUT_KEYS: dict[str, str] = {
    MapName.GLOBAL: OutputKey.SALIENCY_GLOBAL,
    MapName.LOCAL: OutputKey.SALIENCY_LOCAL,
    MapName.COMBINED: OutputKey.SALIENCY,
}


class InferenceOutput(StrEnum):
    """What an inference run writes besides ``predictions.csv`` and ``errors.csv``, as the ``outputs`` setting names
    it (docs/inference.md); the maps themselves are named by :class:`MapName` (``S_c`` in ``outputs``: the S_c map
    as NIfTI). The values are part of the interface: they are what users type."""

    PANEL = "panel"  # panels/<stem>_panel.png: the image with an overlay of each written map
    PNG = "png"  # maps/<stem>_<map>_<class>.png: each written map also as 16-bit PNGs, one per class
    DICOM_SC = "dicom_sc"  # dicom/<stem>_sc.dcm: the panel as a DICOM Secondary Capture (DICOM inputs)
    DICOM_MAP = "dicom_map"  # dicom/<stem>_map.dcm: S_c as a FRACTIONAL DICOM Segmentation (DICOM inputs)
