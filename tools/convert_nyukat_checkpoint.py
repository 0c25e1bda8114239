#!/usr/bin/env python
"""Convert a checkpoint released by the GLAM authors (github nyukat/GLAM) into this bundle's state dict.

    python tools/convert_nyukat_checkpoint.py AUTHORS.pth bundle/models/model_reference.pt

Every tensor is accounted for: mapped to exactly one parameter or buffer of ``scripts.networks.GLAM``, or
reported as unused (the global module's ``combine`` conv, GMIC's patch classifier, ``shared_rep_filter``), and a
missing, unexpected or mis-shaped tensor stops the conversion with an error that names it. The output is a plain
CPU state dict for ``GLAM.reference(joint_modules=...)`` (the preset that reproduces the authors' inference),
written atomically; load it with ``torch.load(path, weights_only=True)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bundle"))

import torch  # noqa: E402

from scripts.atomic import atomic_path  # noqa: E402
from scripts.errors import UsageError  # noqa: E402
from scripts.networks.glam import GLAM  # noqa: E402
from scripts.networks.settings import SETTINGS_KEY, decode_settings, encode_settings  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="the authors' checkpoint (a flat state dict)")
    parser.add_argument("output", type=Path, help="where to write the converted state dict")
    args = parser.parse_args(argv)
    if not args.source.is_file():
        parser.error(f"source checkpoint {args.source} does not exist")
    try:
        state = torch.load(args.source, map_location="cpu", weights_only=True)
    except Exception as exc:  # a pickle with objects, a truncated file, not a checkpoint at all
        parser.error(f"cannot read {args.source} as a weights-only checkpoint: {exc}")
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    try:
        converted, report = convert_nyukat_state_dict(state)
        load_nyukat_glam(state)  # proves the result loads strictly into the reference preset
    except ValueError as exc:
        print(f"{args.source}: {exc}", file=sys.stderr)
        return 1
    # staged as <name>.tmp: torch.save records the staged name less its suffix (<name>) in the archive
    with atomic_path(args.output, staged_name=args.output.name + ".tmp") as tmp:
        torch.save(converted, tmp)
    print(report.summary())
    print(f"joint modules (attention, fusion) included: {report.has_joint_modules}")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
