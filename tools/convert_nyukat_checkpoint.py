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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bundle"))

import torch  # noqa: E402

from scripts.atomic import atomic_path  # noqa: E402
from scripts.networks.convert import convert_nyukat_state_dict, load_nyukat_glam  # noqa: E402


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
