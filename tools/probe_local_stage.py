#!/usr/bin/env python
"""Train GLAM's local module alone, from a frozen global module, in minutes: one change at a time.

    python tools/probe_local_stage.py --preset configs/benchmark_cpu.yaml --preset configs/calibrated_lesions.yaml \
        --set benchmark_images=1200 --set benchmark_data_seed=77 --ckpt bundle/models/model.pt \
        --run control --run t_local=0.05 --run lambda_sparsity=1e-4 --epochs 3 --json runs/probe_local/stage.json

What the training workflow's local stage does, made fast: the global module of ``--ckpt`` is frozen, so its saliency
map, Algorithm 1's boxes and the patches are computed once per image (the splits' preprocessed tensors are cached on
disk, ``--cache``); each run trains a freshly initialised local module (torch seed ``--seed``, the same for every run,
so runs differ only by their setting) on the patches: the K = ``num_patches_train`` boxes of Algorithm 1 for images
with a lesion, moved by up to ``patch_shift`` px, and K random in-breast boxes for lesion-free images, as the
workflow's stage 2; balanced epochs, Adam with the workflow's cosine decay; the loss BCE(y, y_l) + lambda * sum |A_k|
through the aggregation of the local stage (the paper's concatenation unless the checkpoint's record says otherwise).

A run is ``name`` or ``KEY=VALUE[,KEY=VALUE]``; KEY is one of ``t_local``, ``lambda_sparsity``, ``learning_rate``,
``patch_shift``, ``negatives`` (``random`` | ``algorithm1``); ``control`` changes nothing. After every epoch the run is
scored on the validation split with ``tools/probe_local_module.py``'s per-lesion measures (S_l and S_c Dice, the share
of S_l's mass on the lesion, pointing game); the epoch with the best validation S_c Dice (mean of the classes) is
then scored on the test split. The settings not named come from the presets (``learning_rate`` and ``lambda_sparsity``
of the local stage, ``patch_shift``) with the checkpoint's ``t_local``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import sys
import time
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
import torch.nn.functional as F  # noqa: E402
from probe_local_module import (  # noqa: E402
    DEFAULT_CACHE,
    cached_splits,
    config_overrides,
    glam_from_checkpoint,
    load_parser,
    per_lesion_rows,
)
from probe_localisation import parse_value  # noqa: E402

from scripts.atomic import atomic_write  # noqa: E402
from scripts.enums import CLASS_NAMES, OutputKey, Stage  # noqa: E402
from scripts.networks import GLAM, GLAMSettings  # noqa: E402
from scripts.patches import crop_patches, random_patch_boxes, select_patch_boxes, shift_patch_boxes  # noqa: E402
from scripts.training.sampler import BalancedEpochSampler, positive_flags  # noqa: E402

RUN_KEYS = ("t_local", "lambda_sparsity", "learning_rate", "patch_shift", "negatives")
SCORES = ("dice_l", "dice_c", "dice_g", "mass_l", "hit_l", "hit_c")


def parse_run(text: str) -> tuple[str, dict[str, Any]]:
    """``control`` or ``KEY=VALUE[,KEY=VALUE]`` -> (name, changes)."""
    if text == "control":
        return text, {}
    changes = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or key not in RUN_KEYS:
            raise SystemExit(f"--run {text!r}: each change is KEY=VALUE with KEY one of {', '.join(RUN_KEYS)}")
        changes[key] = parse_value(value)
    if changes.get("negatives", "random") not in ("random", "algorithm1"):
        raise SystemExit(f"--run {text!r}: negatives is 'random' or 'algorithm1'")
    return text, changes


def stage_setting(parser: Any, key: str, stage: str = Stage.LOCAL) -> Any:
    value = parser.get_parsed_content(key)
    return value[stage] if isinstance(value, Mapping) else value


def fresh_model(
    settings: Mapping[str, Any], global_state: Mapping[str, torch.Tensor], t_local: float, seed: int
) -> GLAM:
    """A GLAM of the checkpoint's settings whose local module is freshly initialised from ``seed`` and whose global
    module holds ``global_state`` (frozen), in the local stage."""
    accepted = {f.name for f in dataclasses.fields(GLAMSettings)}
    kwargs = {k: v for k, v in settings.items() if k in accepted}
    torch.manual_seed(seed)
    model = GLAM(**{**kwargs, "t_local": float(t_local), "num_patches_eval": 1})
    model.global_network.load_state_dict(global_state)
    return model.set_stage(Stage.LOCAL).freeze_global()


def algorithm1_boxes(model: GLAM, images: torch.Tensor, k: int, batch: int = 16) -> torch.Tensor:
    """Algorithm 1's K boxes (N, K, 4) of the frozen global module for every image."""
    out = []
    model.eval()
    with torch.no_grad():
        for start in range(0, len(images), batch):
            x = images[start : start + batch].float()
            s_g = model.global_network(x)[OutputKey.SALIENCY_GLOBAL]
            out.append(select_patch_boxes(s_g, list(x.shape[-2:]), list(model.patch_size), k))
    return torch.cat(out)


def train_run(
    model: GLAM,
    train: Mapping[str, torch.Tensor],
    boxes: torch.Tensor,
    setting: Mapping[str, Any],
    epochs: int,
    batch: int,
    seed: int,
    score: Any,
) -> list[dict[str, Any]]:
    """Train the local module for ``epochs``; ``score(model)`` after each; returns one record per epoch."""
    params = [p for p in model.parameters() if p.requires_grad]
    lr = float(setting["learning_rate"])
    optimizer = torch.optim.Adam(params, lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs, eta_min=lr * 0.1)
    positive = positive_flags([{"label": y.tolist()} for y in train["label"]])
    sampler = BalancedEpochSampler(positive, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    aggregation = model.aggregation_module(Stage.LOCAL)
    patch_size = list(model.patch_size)
    image_size = list(train["image"].shape[-2:])
    k = boxes.shape[1]
    records = []
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        sampler.set_epoch(epoch)
        order = torch.as_tensor(list(sampler))
        model.train()
        losses = []
        for s in range(0, len(order), batch):
            idx = order[s : s + batch]
            x = train["image"][idx].float()
            y = train["label"][idx]
            b = boxes[idx].clone()
            if setting["patch_shift"]:
                b = shift_patch_boxes(b, image_size, int(setting["patch_shift"]), generator)
            if setting["negatives"] == "random":
                lesion_free = y.amax(1) < 0.5
                if lesion_free.any():
                    b[lesion_free] = random_patch_boxes(x[lesion_free], patch_size, k, generator=generator)
            local = model.local_network(crop_patches(x, b, patch_size).flatten(0, 1))
            patch_maps = local[OutputKey.PATCH_MAPS].unflatten(0, (len(idx), k))
            features = local[OutputKey.PATCH_FEATURES].unflatten(0, (len(idx), k))
            y_local = aggregation(patch_maps, features)[OutputKey.Y_LOCAL]
            loss = F.binary_cross_entropy(y_local.float(), y.float())
            loss = loss + float(setting["lambda_sparsity"]) * patch_maps.float().abs().flatten(1).sum(1).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        schedule.step()
        seconds = time.perf_counter() - start
        model.eval()
        records.append(
            {
                "epoch": epoch,
                "loss": float(np.mean(losses)),
                "seconds": seconds,
                "images": len(order),
                "val": score(model),
                "state": copy.deepcopy(model.local_network.state_dict()),
            }
        )
    return records


def class_means(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Per measure, [benign, malignant] means over the rows (NaN-free values only)."""
    out = {}
    for key in SCORES:
        means = []
        for cls in CLASS_NAMES:
            values = [r[key] for r in rows if r["class"] == cls and not math.isnan(r[key])]
            means.append(float(np.mean(values)) if values else float("nan"))
        out[key] = means
    return out


def _pair(values: Sequence[float]) -> str:
    return " / ".join("n/a" if math.isnan(v) else f"{v:.3f}" for v in values)


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", type=Path, action="append", default=[], help="preset layered on train.yaml (repeat)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeat)")
    p.add_argument("--ckpt", type=Path, required=True, help="a checkpoint whose global module is kept (frozen)")
    p.add_argument("--run", action="append", default=[], help="'control' or KEY=VALUE[,KEY=VALUE] (repeat)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=0, help="torch seed of every run's local module and draws")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--json", type=Path, default=None, help="write every epoch's figures here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    runs = [parse_run(r) for r in (args.run or ["control"])]
    parser = load_parser(args.preset, config_overrides(args.set))
    datalist_path, splits = cached_splits(parser, ("training", "validation", "test"), args.cache)
    shipped, settings = glam_from_checkpoint(args.ckpt)
    global_state = copy.deepcopy(shipped.global_network.state_dict())
    k = int(settings.get("num_patches_train", 2))
    base = {
        "t_local": float(settings["t_local"]),
        "lambda_sparsity": float(stage_setting(parser, "lambda_sparsity")),
        "learning_rate": float(stage_setting(parser, "learning_rate")),
        "patch_shift": int(parser.get_parsed_content("patch_shift")),
        "negatives": "random",
    }
    begin = time.perf_counter()
    boxes = algorithm1_boxes(shipped, splits["training"]["image"], k)
    print(f"Algorithm 1 boxes of {len(boxes)} training images: {time.perf_counter() - begin:.0f} s; base {base}")
    report: dict[str, Any] = {"ckpt": str(args.ckpt), "datalist": str(datalist_path), "base": base, "runs": {}}
    for name, changes in runs:
        setting = {**base, **changes}
        model = fresh_model(settings, global_state, setting["t_local"], args.seed)

        def score(m: GLAM, split: str = "validation") -> dict[str, list[float]]:
            return class_means(per_lesion_rows(m, splits[split], 16.0, args.batch))

        records = train_run(model, splits["training"], boxes, setting, args.epochs, args.batch, args.seed, score)
        best = max(records, key=lambda r: np.nanmean(r["val"]["dice_c"]))
        model.local_network.load_state_dict(best["state"])
        test = score(model, "test")
        for r in records:
            v = r["val"]
            print(
                f"{name} epoch {r['epoch']}: loss {r['loss']:.3f}, {r['seconds']:.0f} s; val (b / m) S_l Dice "
                f"{_pair(v['dice_l'])}, S_c Dice {_pair(v['dice_c'])}, S_l mass on lesion {_pair(v['mass_l'])}, "
                f"S_l pointing {_pair(v['hit_l'])}, S_c pointing {_pair(v['hit_c'])}",
                flush=True,
            )
        print(
            f"{name} TEST (epoch {best['epoch']}): S_g Dice {_pair(test['dice_g'])}, S_l {_pair(test['dice_l'])}, "
            f"S_c {_pair(test['dice_c'])}, S_l mass {_pair(test['mass_l'])}, S_l pointing {_pair(test['hit_l'])}, "
            f"S_c pointing {_pair(test['hit_c'])}",
            flush=True,
        )
        report["runs"][name] = {
            "setting": setting,
            "epochs": [{k2: v2 for k2, v2 in r.items() if k2 != "state"} for r in records],
            "kept_epoch": best["epoch"],
            "test": test,
        }
        if args.json:
            with atomic_write(args.json, "w") as f:
                json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
