#!/usr/bin/env python
"""Where does the local module lose? Per-image diagnostics of a trained GLAM's three maps (S_g, S_l, S_c).

    python tools/probe_local_module.py --preset configs/benchmark_cpu.yaml --preset configs/calibrated_lesions.yaml \
        --ckpt bundle/models/model.pt --set benchmark_data_seed=7 --split test --json runs/probe_local/shipped.json

The paper's Table 2 has the local map S_l beating the global map S_g and their combination S_c beating both; where
ours does not, this probe says which of the paper's failure modes (and ours) is at work, with no training: the
model, the data and the preprocessing come from the bundle's configs as the evaluation workflow builds them (train.yaml,
the presets in order, ``--set`` overrides; the checkpoint's settings record decides the network), the split's
preprocessed tensors are cached on disk (``--cache``), and for every (image, class) with a lesion of that class it
measures:

- ``dice_g`` / ``dice_l`` / ``dice_c``: soft Dice of each map on the image grid (the evaluation's metric);
- ``in_patch``: the share of the lesion's pixels inside the union of the M selected patches (Algorithm 1's boxes;
  the paper's first failure mode is a patch that misses the lesion);
- ``lesion_to_patch``: the lesion's area over one patch's area (its second: a lesion larger than a patch);
- ``dice_l_patch``: S_l's Dice against the part of the lesion inside the patches (what the local module could reach);
- ``dice_l_scaled`` / ``dice_g_scaled``: the Dice of the map divided by its maximum (soft Dice punishes a map whose
  values on the lesion are low: this is the Dice the same map would score at full scale);
- ``peak_l`` / ``peak_g``: the map's maximum on the lesion, and ``hit_l`` / ``hit_g`` / ``hit_c``: pointing game;
- ``mass_g`` / ``mass_l``: the share of the map's mass inside the patches that lies on the lesion (how concentrated
  each map is where both exist), and ``hot_l``: the share of the patches' pixels where S_l > 0.5 (top t% pooling with
  t_local asks for about t of the patch to be hot on a positive image, whatever the lesion's size).

The summary groups them by ``in_patch`` (missed < 0.1 <= partial < 0.9 <= held), by ``lesion_to_patch`` and, on the
synthetic data (whose datalist names each image's lesions), by the kinds of the class's lesions, for each M of
``--num_patches`` (M is an inference choice: it changes no weight). Everything is printed as a markdown table and
written to ``--json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
BUNDLE_ROOT = REPO_ROOT / "bundle"
for _path in (BUNDLE_ROOT, REPO_ROOT / "scripts"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from glam_benchmark.trivial import validation_transform  # noqa: E402
from monai.bundle import ConfigParser  # noqa: E402
from probe_localisation import parse_value, preprocess_split  # noqa: E402

from scripts.atomic import atomic_write  # noqa: E402
from scripts.enums import CLASS_NAMES, MapName, OutputKey, Stage  # noqa: E402
from scripts.metrics.pointing_game import PointingGameMetric  # noqa: E402
from scripts.metrics.soft_dice import compute_soft_dice  # noqa: E402
from scripts.networks import GLAM, GLAMSettings  # noqa: E402
from scripts.networks.settings import read_checkpoint_settings  # noqa: E402
from scripts.networks.weights import load_weights  # noqa: E402

TRAIN_CONFIG = BUNDLE_ROOT / "configs" / "train.yaml"
DEFAULT_CACHE = REPO_ROOT / "data" / "probe_cache"
IN_PATCH_GROUPS = (("missed", 0.0, 0.1), ("partial", 0.1, 0.9), ("held", 0.9, 1.01))
SIZE_GROUPS = (("< 1/16 patch", 0.0, 1 / 16), ("1/16-1/4", 1 / 16, 0.25), (">= 1/4 patch", 0.25, math.inf))
MEASURES = (
    "dice_g",
    "dice_l",
    "dice_c",
    "dice_l_patch",
    "dice_g_scaled",
    "dice_l_scaled",
    "peak_g",
    "peak_l",
    "mass_g",
    "mass_l",
    "hot_l",
    "hit_g",
    "hit_l",
    "hit_c",
)


def load_parser(presets: Sequence[Path], overrides: Mapping[str, Any]) -> ConfigParser:
    """train.yaml + presets (in order) + overrides, as the evaluation workflow layers them."""
    files = [TRAIN_CONFIG, *presets]
    for f in files:
        if not Path(f).is_file():
            raise SystemExit(f"config file not found: {f}")
    parser = ConfigParser()
    parser.read_config([str(f) for f in files])
    parser["bundle_root"] = str(BUNDLE_ROOT) if parser.get("bundle_root") == "." else parser.get("bundle_root")
    for key, value in overrides.items():
        parser[key] = value
    return parser


def glam_from_checkpoint(ckpt: Path, **overrides: Any) -> tuple[GLAM, dict[str, Any]]:
    """The GLAM the checkpoint's settings record describes (``overrides`` replacing recorded values), with its
    weights, and the record."""
    settings = read_checkpoint_settings(ckpt)
    if settings is None:
        raise SystemExit(f"{ckpt}: no settings record (a checkpoint written by this bundle's workflows is needed)")
    accepted = {f.name for f in dataclasses.fields(GLAMSettings)}
    kwargs = {k: v for k, v in settings.items() if k in accepted}  # the record also names the bundle version
    network = GLAM(**{**kwargs, **overrides})
    load_weights(network, ckpt)
    return network, settings


def build_network(ckpt: Path, num_patches: int) -> GLAM:
    """The checkpoint's GLAM in its last stage (joint when it has the joint modules), M = ``num_patches``, eval mode."""
    network, settings = glam_from_checkpoint(ckpt, num_patches_eval=int(num_patches))
    stage = Stage.JOINT if settings.get("joint_modules") else Stage.LOCAL
    return network.set_stage(stage).eval()


def config_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as a dict (values as Python literals when they are)."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set needs KEY=VALUE, got {item!r}")
        overrides[key] = parse_value(value)
    return overrides


def cached_splits(parser: ConfigParser, names: Sequence[str], cache: Path) -> tuple[Path, dict[str, dict]]:
    """The datalist's path and the preprocessed tensors of its splits ``names`` (the validation preprocessing),
    computed once and kept in ``cache``."""
    from scripts.data import load_datalist
    from scripts.data.datalist import resolve_paths

    datalist_path = Path(parser.get_parsed_content("datalist"))
    datalist = resolve_paths(load_datalist(str(datalist_path)), str(datalist_path.parent.resolve()))
    transform = validation_transform(parser)
    image_size = parser.get_parsed_content("image_size")
    splits = {
        name: preprocess_split(datalist[name], transform, cache, {"split": name, "image_size": image_size})
        for name in names
    }
    return datalist_path, splits


def _bucket(value: float, groups: Sequence[tuple[str, float, float]]) -> str:
    return next(name for name, lo, hi in groups if lo <= value < hi)


def per_lesion_rows(network: GLAM, split: Mapping[str, torch.Tensor], tolerance: float, batch: int) -> list[dict]:
    """One row per (image, class) with a lesion of that class: the measures of the module docstring."""
    rows: list[dict] = []
    patch_area = float(network.patch_size[0] * network.patch_size[1])
    hit = PointingGameMetric(tolerance=tolerance, check_values=False)
    with torch.no_grad():
        for start in range(0, len(split["image"]), batch):
            x = split["image"][start : start + batch].float()
            masks = split["mask"][start : start + batch].float()
            out = network(x)
            maps = network.full_resolution(out, x.shape[-2:])
            s_g, s_l, s_c = (maps[m].float().clamp(0, 1) for m in (MapName.GLOBAL, MapName.LOCAL, MapName.COMBINED))
            in_boxes = torch.zeros_like(masks[:, :1])
            for b, boxes in enumerate(out[OutputKey.PATCH_BOXES].tolist()):
                for y0, x0, h, w in boxes:
                    in_boxes[b, 0, y0 : y0 + h, x0 : x0 + w] = 1.0
            lesion_in_patch = masks * in_boxes

            def scaled(m: torch.Tensor) -> torch.Tensor:
                return m / m.amax(dim=(-2, -1), keepdim=True).clamp_min(1e-12)

            dice = {
                "dice_g": compute_soft_dice(s_g, masks, False),
                "dice_l": compute_soft_dice(s_l, masks, False),
                "dice_c": compute_soft_dice(s_c, masks, False),
                "dice_l_patch": compute_soft_dice(s_l, lesion_in_patch, False),
                "dice_g_scaled": compute_soft_dice(scaled(s_g), masks, False),
                "dice_l_scaled": compute_soft_dice(scaled(s_l), masks, False),
            }
            hits = {}
            for name, m in (("hit_g", s_g), ("hit_l", s_l), ("hit_c", s_c)):
                hit.reset()
                hit(m, masks)
                hits[name] = hit.get_buffer()
            for b in range(x.shape[0]):
                for c, cls in enumerate(CLASS_NAMES):
                    area = float(masks[b, c].sum())
                    if area == 0:
                        continue
                    lesion = masks[b, c] > 0
                    row = {
                        "image": start + b,
                        "class": cls,
                        "lesion_px": area,
                        "lesion_to_patch": area / patch_area,
                        "in_patch": float(lesion_in_patch[b, c].sum()) / area,
                        "peak_g": float(s_g[b, c][lesion].max()),
                        "peak_l": float(s_l[b, c][lesion].max()),
                        "hot_l": float((s_l[b, c] * in_boxes[b, 0] > 0.5).sum()) / float(in_boxes[b, 0].sum()),
                    }
                    for name, m in (("mass_g", s_g), ("mass_l", s_l)):
                        inside = m[b, c] * in_boxes[b, 0]
                        total = float(inside.sum())
                        row[name] = float(inside[lesion].sum()) / total if total > 0 else float("nan")
                    row.update({k: float(v[b, c]) for k, v in dice.items()})
                    row.update({k: float(v[b, c]) for k, v in hits.items()})
                    rows.append(row)
    return rows


def lesion_kinds(items: Sequence[Mapping[str, Any]], rows: Sequence[dict]) -> None:
    """Add ``kinds`` to each row: the kinds of its class's lesions on its image, from the datalist item's
    ``lesions`` (what the synthetic generator writes, e.g. ``spiculated_mass``), joined by " + "; rows of items
    without that list are left as they are."""
    from scripts.data.synthetic import BENIGN_TYPES, MALIGNANT_TYPES

    types = dict(zip(CLASS_NAMES, (BENIGN_TYPES, MALIGNANT_TYPES)))
    for row in rows:
        lesions = items[row["image"]].get("lesions")
        if isinstance(lesions, (list, tuple)):
            row["kinds"] = " + ".join(sorted({k for k in lesions if k in types[row["class"]]})) or "unnamed"


def summarise(rows: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Mean of every measure per class over all rows, per in-patch group, per lesion-size group and, where the rows
    name them (:func:`lesion_kinds`), per combination of lesion kinds."""
    groups: list[tuple[str, str, list]] = []
    for cls in CLASS_NAMES:
        mine = [r for r in rows if r["class"] == cls]
        groups.append((cls, "all", mine))
        for name, _, _ in IN_PATCH_GROUPS:
            groups.append((cls, f"patch {name}", [r for r in mine if _bucket(r["in_patch"], IN_PATCH_GROUPS) == name]))
        for name, _, _ in SIZE_GROUPS:
            groups.append(
                (cls, f"lesion {name}", [r for r in mine if _bucket(r["lesion_to_patch"], SIZE_GROUPS) == name])
            )
        for kinds in sorted({r["kinds"] for r in mine if "kinds" in r}):
            groups.append((cls, kinds, [r for r in mine if r.get("kinds") == kinds]))
    out = []
    for cls, group, members in groups:
        entry = {"class": cls, "group": group, "n": len(members)}
        for key in MEASURES:
            values = [r[key] for r in members if not math.isnan(r[key])]
            entry[key] = float(np.mean(values)) if values else float("nan")
        out.append(entry)
    return out


def markdown(summary: Sequence[Mapping[str, Any]], num_patches: int) -> str:
    head = ["M", "class", "group", "n", *MEASURES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in summary:
        cells = [str(num_patches), e["class"], e["group"], str(e["n"])]
        cells += ["" if math.isnan(e[k]) else f"{e[k]:.3f}" for k in MEASURES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", type=Path, action="append", default=[], help="preset layered on train.yaml (repeat)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeat)")
    p.add_argument("--ckpt", type=Path, required=True, help="a local- or joint-stage checkpoint with a settings record")
    p.add_argument("--split", default="test", help="datalist split to measure (default: test)")
    p.add_argument("--num_patches", default="1", help="M at inference, comma-separated to compare (default: 1)")
    p.add_argument("--tolerance", type=float, default=16.0, help="pointing-game tolerance in px (default: 16)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"tensor cache folder (default: {DEFAULT_CACHE})")
    p.add_argument("--json", type=Path, default=None, help="write rows and summaries here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    parser = load_parser(args.preset, config_overrides(args.set))
    datalist_path, splits = cached_splits(parser, [args.split], args.cache)
    split = splits[args.split]
    from scripts.data import load_datalist

    items = load_datalist(str(datalist_path))[args.split]
    torch.set_grad_enabled(False)
    report: dict[str, Any] = {"ckpt": str(args.ckpt), "split": args.split, "datalist": str(datalist_path), "runs": {}}
    for m in (int(v) for v in args.num_patches.split(",")):
        network = build_network(args.ckpt, m)
        rows = per_lesion_rows(network, split, args.tolerance, args.batch)
        lesion_kinds(items, rows)
        summary = summarise(rows)
        report["runs"][str(m)] = {"rows": rows, "summary": summary}
        print(markdown(summary, m), flush=True)
    if args.json:
        with atomic_write(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
