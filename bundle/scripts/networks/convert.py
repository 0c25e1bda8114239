"""Conversion of the GLAM authors' released checkpoints (github nyukat/GLAM) into this model's state dict, every
tensor accounted for (the authors' loader used ``strict=False``, which hides mismatches)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import UsageError
from .glam import GLAM
from .settings import SETTINGS_KEY, decode_settings, encode_settings

#: authors' key prefix -> this model's prefix (the rest of the key is identical)
NYUKAT_PREFIX_MAP: dict[str, str] = {
    "global_network.downsampling_branch.": "global_network.downsampling_branch.",
    "global_network.postprocess_module.gn_conv_": "global_network.postprocess_module.gn_conv_",
    "detection_network.dn_resnet.": "local_network.dn_resnet.",
    "detection_network.gn_conv_last.": "local_network.gn_conv_last.",
    "mil.mil_attn_V.": "attention.attn_v.",
    "mil.mil_attn_U.": "attention.attn_u.",
    "mil.mil_attn_w.": "attention.attn_w.",
    "fusion_dnn.": "fusion.linear.",
}

#: tensors of the authors' files that GLAM does not use, reported rather than loaded
NYUKAT_UNUSED_PREFIXES: tuple[str, ...] = (
    "global_network.postprocess_module.combine.",
    "mil.classifier_linear.",
    "shared_rep_filter.",
)

_JOINT_PREFIXES = ("attention.", "fusion.")


@dataclasses.dataclass
class ConversionReport:
    """What the conversion did: ``mapped`` (source -> target key), ``dropped`` keys, ``unfitted`` (key -> reason)."""

    mapped: dict[str, str] = dataclasses.field(default_factory=dict)
    dropped: list[str] = dataclasses.field(default_factory=list)
    unfitted: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def has_joint_modules(self) -> bool:
        targets = self.mapped.values()
        return any(t.startswith("attention.") for t in targets) and any(t.startswith("fusion.") for t in targets)

    def summary(self) -> str:
        lines = [f"mapped {len(self.mapped)} tensors"]
        if self.dropped:
            lines.append(f"dropped {len(self.dropped)} unused tensors: {', '.join(self.dropped)}")
        for key, why in self.unfitted.items():
            lines.append(f"not mapped: {key}: {why}")
        return "\n".join(lines)


def _target_key(source_key: str) -> str | None:
    for src, dst in NYUKAT_PREFIX_MAP.items():
        if source_key.startswith(src):
            return dst + source_key[len(src) :]
    return None


def convert_nyukat_state_dict(
    state_dict: Mapping[str, Any], template: Mapping[str, torch.Tensor] | None = None
) -> tuple[dict[str, torch.Tensor], ConversionReport]:
    """Convert an authors' GLAM state dict to this model's key layout.

    Args:
        state_dict: the authors' flat state dict (a ``module.`` prefix from DataParallel is removed).
        template: the target model's state dict, for names and shapes; by default that of
            ``GLAM.reference(joint_modules=True)`` (ResNet-34-HR, width 64).

    Returns:
        ``(converted, report)``: the converted state dict (CPU tensors) and what was mapped, dropped or not fitted.

    Raises:
        ValueError: naming every unexpected key, and every missing or mis-shaped tensor of the global or local module.
    """
    if not isinstance(state_dict, Mapping):
        raise UsageError(f"state_dict must be a mapping of tensor names to tensors, got {type(state_dict).__name__}")
    if template is None:
        template = GLAM.reference(joint_modules=True).state_dict()
    source = {k.removeprefix("module."): v for k, v in state_dict.items()}
    report = ConversionReport()
    converted: dict[str, torch.Tensor] = {}
    problems: list[str] = []
    for key, value in source.items():
        if key.startswith(NYUKAT_UNUSED_PREFIXES):
            report.dropped.append(key)
            continue
        target = _target_key(key)
        if target is None:
            problems.append(f"unexpected key {key!r}")
            continue
        if not isinstance(value, torch.Tensor):
            problems.append(f"{key!r} is a {type(value).__name__}, not a tensor")
            continue
        expected = template.get(target)
        joint = target.startswith(_JOINT_PREFIXES)
        if expected is None:
            if joint:
                report.unfitted[key] = f"this model has no {target!r}"
            else:
                problems.append(f"unexpected key {key!r} (no {target!r} in the model)")
            continue
        if tuple(value.shape) != tuple(expected.shape):
            msg = f"shape {tuple(value.shape)} does not fit {target!r} of shape {tuple(expected.shape)}"
            if joint:
                report.unfitted[key] = msg
            else:
                problems.append(f"{key!r}: {msg}")
            continue
        converted[target] = value.detach().to("cpu", expected.dtype).clone()
        report.mapped[key] = target
    for target in template:
        if target == SETTINGS_KEY:
            continue
        if not target.startswith(_JOINT_PREFIXES) and target not in converted:
            problems.append(f"missing key for {target!r}")
    if problems:
        raise UsageError("cannot convert the authors' checkpoint:\n  " + "\n  ".join(problems))
    # attention and fusion are loaded only as a whole: a partial set would leave random weights in use
    joint_keys = [k for k in converted if k.startswith(_JOINT_PREFIXES)]
    expected_joint = [k for k in template if k.startswith(_JOINT_PREFIXES)]
    if joint_keys and sorted(joint_keys) != sorted(expected_joint):
        for key in joint_keys:
            del converted[key]
        for src, dst in list(report.mapped.items()):
            if dst in joint_keys:
                report.unfitted[src] = "the joint modules are incomplete in the checkpoint; not loaded"
                del report.mapped[src]
    if SETTINGS_KEY in template:
        settings = {**decode_settings(template[SETTINGS_KEY]), "joint_modules": report.has_joint_modules}
        converted[SETTINGS_KEY] = encode_settings(settings)
    return converted, report


def load_nyukat_glam(state_dict: Mapping[str, Any], **overrides: Any) -> GLAM:
    """The authors' GLAM with their weights: the reference-compatible preset, eval mode, loaded strictly.

    Args:
        state_dict: the authors' flat state dict.
        overrides: constructor arguments that differ from :data:`~scripts.networks.glam.REFERENCE_PRESET`.

    Returns:
        the model, with ``conversion_report``.
    """
    template = GLAM.reference(**{**overrides, "joint_modules": True}).state_dict()
    converted, report = convert_nyukat_state_dict(state_dict, template)
    model = GLAM.reference(**{"joint_modules": report.has_joint_modules, **overrides})
    model.load_state_dict(converted, strict=True)
    model.conversion_report = report
    return model.eval()
