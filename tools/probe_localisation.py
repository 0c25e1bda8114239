#!/usr/bin/env python
"""Does weak supervision localise on my data? Train one global module for a few epochs and watch where it looks.

    python tools/probe_localisation.py --preset configs/benchmark_cpu.yaml                  # GLAM's global module
    python tools/probe_localisation.py --preset configs/benchmark_cpu.yaml --model cam --set cam_t=1.0
    python tools/probe_localisation.py --preset my_preset.yaml --set datalist=/data/datalist.json --epochs 8

The model, its loss, the data, the preprocessing and the optimiser settings come from the bundle's configs
(``bundle/configs/train.yaml``, a preset layered on it, the model's baseline overlay, ``--set`` overrides), so the
probe trains what the training workflow would train in its global stage. What it changes to be fast: the
deterministic preprocessing (load, flip, crop, window, standardise) runs once and its tensors are cached on disk
(``--cache``), training draws balanced epochs from those tensors with a random translation of up to the preset's
``max_shift`` as the only augmentation, and nothing is written but the cache. On a GPU (``--device cuda``, the
default when there is one) the cached tensors are moved to the device once and the module trains and evaluates in
bf16 autocast (``--no-bf16``: float32); on the CPU it runs in float32 unless ``--bf16``.

Before training it prints what needs no learning on the validation split: the classification AUC of image-wide
intensity statistics of the breast (its maximum, 99.9th percentile, mean, standard deviation: if one of them
separates the classes, a model can too without looking at the lesion) and the pointing game of a trivial map (the
brightest cell of S_g's grid). Then, per epoch: AUC per class of the model's prediction, soft Dice of its map, the
pointing-game hit rate (the map's peak within ``pointing_tolerance`` px of a lesion of its class), the share of
peaks on the image border (within ``peak_border`` px: the failure mode of a module that reads image-wide statistics
from the zero-padded border), and the epoch's time.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
BUNDLE_ROOT = REPO_ROOT / "bundle"
for _path in (BUNDLE_ROOT, REPO_ROOT / "scripts"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from glam_benchmark.trivial import (  # noqa: E402
    STATISTICS,
    auc,
    no_learning_baselines,
    preprocess_items,
    validation_transform,
)
from monai.bundle import ConfigParser  # noqa: E402

from scripts import precision  # noqa: E402
from scripts.atomic import atomic_write  # noqa: E402
from scripts.enums import CLASS_NAMES, OutputKey, Stage  # noqa: E402
from scripts.metrics import PointingGameMetric, SoftDiceMetric  # noqa: E402
from scripts.networks.global_network import nearest_resize  # noqa: E402
from scripts.networks.weights import load_weights, plain_state_dict, save_atomic  # noqa: E402
from scripts.training.sampler import BalancedEpochSampler, positive_flags  # noqa: E402

TRAIN_CONFIG = BUNDLE_ROOT / "configs" / "train.yaml"
OVERLAYS = {"glam": None, "cam": "baseline_cam.yaml", "gmic": "baseline_gmic.yaml"}
DEFAULT_CACHE = REPO_ROOT / "data" / "probe_cache"


# -- settings --------------------------------------------------------------------------------------------------
def parse_value(text: str) -> Any:
    """A ``--set`` value: a Python literal when it is one (numbers, lists, dicts, booleans), else the string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def load_parser(preset: Path | None, model: str, overrides: Mapping[str, Any]) -> ConfigParser:
    """train.yaml + preset + the model's baseline overlay (last, as the workflows layer them) + overrides, in the
    global stage."""
    if model not in OVERLAYS:
        raise ValueError(f"--model must be one of {sorted(OVERLAYS)}, got {model!r}")
    files = [TRAIN_CONFIG] + ([preset] if preset else [])
    if OVERLAYS[model]:
        files.append(BUNDLE_ROOT / "configs" / OVERLAYS[model])
    for f in files:
        if not Path(f).is_file():
            raise FileNotFoundError(f"config file not found: {f}")
    parser = ConfigParser()
    parser.read_config([str(f) for f in files])
    parser["bundle_root"] = str(BUNDLE_ROOT) if parser.get("bundle_root") == "." else parser.get("bundle_root")
    parser["stage"] = Stage.GLOBAL
    for key, value in overrides.items():
        parser[key] = value
    return parser


def stage_value(parser: ConfigParser, key: str) -> Any:
    """A setting that may be one value or one per stage ({global: ..., local: ..., joint: ...})."""
    value = parser.get_parsed_content(key)
    return value[Stage.GLOBAL] if isinstance(value, Mapping) else value


# -- cached tensors --------------------------------------------------------------------------------------------
def cache_key(items: Sequence[Mapping[str, Any]], settings: Mapping[str, Any]) -> str:
    """Hash of the items and the preprocessing settings: another datalist or window never reads a stale cache."""
    blob = json.dumps([list(items), dict(settings)], sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def preprocess_split(
    items: Sequence[Mapping[str, Any]], transform: Any, cache_dir: Path, settings: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """Images (N, 1, H, W) float16, masks (N, 2, H, W) uint8 and labels (N, 2) of ``items`` after the
    deterministic preprocessing, computed once and kept in ``cache_dir`` (written atomically)."""
    path = cache_dir / f"{cache_key(items, settings)}.pt"
    if path.is_file():
        return torch.load(path, weights_only=True)
    split = preprocess_items(items, transform)
    # a unique temporary name: two probes started together on one cache (a paired comparison) both write it
    with atomic_write(path) as f:
        torch.save(split, f)
    return split


def shift_batch(images: torch.Tensor, max_shift: Sequence[int], generator: torch.Generator) -> torch.Tensor:
    """Translate a batch by one random offset of up to ``max_shift`` (rows, cols) pixels, filling with each image's
    minimum (the background), as the training workflow's random window shift moves the breast in its window."""
    dr = int(torch.randint(-max_shift[0], max_shift[0] + 1, (1,), generator=generator))
    dc = int(torch.randint(-max_shift[1], max_shift[1] + 1, (1,), generator=generator))
    if dr == 0 and dc == 0:
        return images
    fill = images.amin(dim=(-2, -1), keepdim=True)
    shifted = torch.roll(images, (dr, dc), dims=(-2, -1))
    rows = torch.arange(images.shape[-2], device=images.device)
    cols = torch.arange(images.shape[-1], device=images.device)
    wrapped_r = (rows < dr) if dr > 0 else (rows >= images.shape[-2] + dr)
    wrapped_c = (cols < dc) if dc > 0 else (cols >= images.shape[-1] + dc)
    wrapped = wrapped_r[:, None] | wrapped_c[None, :]
    return torch.where(wrapped, fill, shifted)


# -- training and evaluation -----------------------------------------------------------------------------------
def batches(images: torch.Tensor, size: int) -> Iterator[slice]:
    for start in range(0, len(images), size):
        yield slice(start, start + size)


def evaluate(
    network: torch.nn.Module,
    split: Mapping[str, torch.Tensor],
    tolerance: float,
    border: float,
    map_key: str = OutputKey.SALIENCY_GLOBAL,
    score_key: str = "y_global",
    batch_size: int = 8,
    memory_format: torch.memory_format = torch.contiguous_format,
    autocast: torch.dtype | None = None,
) -> dict[str, list[float]]:
    """AUC per class, soft Dice, pointing-game hit rate and share of peaks on the border, per class, on the device of
    ``split`` (the network's), the forward pass autocast to ``autocast`` when given."""
    network.eval()
    dice, hit = SoftDiceMetric(check_values=False), PointingGameMetric(tolerance=tolerance, check_values=False)
    on_border = PointingGameMetric(border=border, measure="border", check_values=False)
    scores = []
    with torch.no_grad():
        for sl in batches(split["image"], batch_size):
            x = split["image"][sl].float().contiguous(memory_format=memory_format)
            with precision.autocast(x.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                out = network(x)
            maps = nearest_resize(out[map_key].float(), x.shape[-2:])
            masks = split["mask"][sl]
            dice(maps, masks)
            hit(maps, masks)
            on_border(maps, masks)
            scores.append(out[score_key].float().cpu())
    network.train()
    y = torch.cat(scores).numpy()
    labels = split["label"].cpu().numpy()
    return {
        "auc": [auc(y[:, c], labels[:, c]) for c in range(labels.shape[1])],
        "dice": dice.aggregate().tolist(),
        "hit": hit.aggregate().tolist(),
        "border": on_border.aggregate().tolist(),
    }


def train_epochs(
    network: torch.nn.Module,
    loss_fn: torch.nn.Module,
    train: Mapping[str, torch.Tensor],
    epochs: int,
    learning_rate: float,
    batch_size: int,
    max_shift: Sequence[int] = (0, 0),
    seed: int = 0,
    memory_format: torch.memory_format = torch.contiguous_format,
    autocast: torch.dtype | None = None,
) -> Iterator[tuple[int, float, float, int]]:
    """Adam with the training workflow's cosine decay (to 0.1 x), balanced epochs (every positive plus as many
    negatives), on the device of ``train`` (the network's), the forward pass autocast to ``autocast`` when given
    (the loss in float32, no gradient scaler: bf16); yields (epoch, mean loss, seconds, images) after each epoch.
    The draws (epochs, shifts) come from CPU generators, so a device changes the arithmetic, not the draws."""
    params = [p for p in network.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=learning_rate)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs, eta_min=learning_rate * 0.1)
    sampler = BalancedEpochSampler(positive_flags([{"label": y.tolist()} for y in train["label"].cpu()]), seed=seed)
    generator = torch.Generator().manual_seed(seed)
    network.train()
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        sampler.set_epoch(epoch)
        order = torch.as_tensor(list(sampler))
        losses = []
        for sl in batches(order, batch_size):
            idx = order[sl].to(train["image"].device)
            x = shift_batch(train["image"][idx].float(), max_shift, generator).contiguous(memory_format=memory_format)
            with precision.autocast(x.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                out = network(x)
            loss = loss_fn(out, train["label"][idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        schedule.step()
        mean_loss = float(torch.stack(losses).double().mean())  # one host synchronisation per epoch
        yield epoch, mean_loss, time.perf_counter() - start, len(order)


def _snapshot(network: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The network's weights now, as a model.pt holds them (copies: on the CPU ``.cpu()`` would alias the live ones)."""
    return {k: v.clone() for k, v in plain_state_dict(network).items()}


def _fmt_pair(values: Sequence[float]) -> str:
    return "/".join("n/a" if math.isnan(v) else f"{v:.2f}" for v in values)


def run_probe(
    parser: ConfigParser,
    epochs: int,
    cache_dir: Path = DEFAULT_CACHE,
    seed: int = 0,
    channels_last: bool = True,
    log: Any = print,
    device: str | torch.device = "cpu",
    bf16: bool = False,
    init: Path | None = None,
    save: Path | None = None,
    test: bool = False,
) -> dict[str, Any]:
    """Build the configured global module, cache the data, print the baselines and the per-epoch metrics; returns
    ``{"baselines": ..., "epochs": [per-epoch dicts], "best_epoch": ...}``. The module and the cached tensors go to
    ``device``; ``bf16`` autocasts its forward passes. ``init``: start from this checkpoint's weights (a model.pt of
    the same settings, e.g. a module trained on other lesions) instead of a fresh initialisation. The best epoch is
    the one with the highest validation pointing game (mean over the classes); ``save`` writes its weights (a
    model.pt, with the settings record), and ``test`` evaluates them on the test split with the no-learning
    baselines of that split (``result["test"]``, ``result["test_baselines"]``)."""
    torch.manual_seed(seed)
    datalist = parser.get_parsed_content("datalist_content")
    transform = validation_transform(parser)
    settings = {
        "image_size": parser.get_parsed_content("image_size"),
        "crop": [parser.get_parsed_content("crop_iterations"), parser.get_parsed_content("crop_buffer")],
    }
    spacing = parser.get_parsed_content("pixel_spacing") if "pixel_spacing" in parser else None
    if spacing is not None:  # resampled inputs are other tensors; without it the key stays the one of older caches
        settings["pixel_spacing"] = spacing
    start = time.perf_counter()
    train = preprocess_split(datalist["training"], transform, cache_dir, settings)
    val = preprocess_split(datalist["validation"], transform, cache_dir, settings)
    log(
        f"data: {len(train['image'])} training / {len(val['image'])} validation images of "
        f"{tuple(train['image'].shape[-2:])}, {int((train['label'].amax(1) > 0).sum())} training images with a "
        f"lesion (preprocessed or read from {cache_dir} in {time.perf_counter() - start:.0f} s)"
    )
    tolerance = float(parser.get_parsed_content("pointing_tolerance"))
    border = float(parser.get_parsed_content("peak_border"))
    network = parser.get_parsed_content("network_def")
    if init is not None:
        load_weights(network, init)
        log(f"initialised from {init}")
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    device = torch.device(device)
    autocast = torch.bfloat16 if bf16 else None
    network = network.to(device=device, memory_format=memory_format)
    with torch.no_grad(), precision.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        probe_out = network.eval()(val["image"][:1].float().to(device))
    cell = val["image"].shape[-2] // probe_out[OutputKey.SALIENCY_GLOBAL].shape[-2]

    baselines = no_learning_baselines(val["image"], val["mask"], val["label"], cell, tolerance)
    log("no learning (validation): AUC of image-wide breast statistics, benign/malignant (any lesion)")
    for name in STATISTICS:
        b = baselines["statistics"][name]
        log(f"  {name:6s} {_fmt_pair([b[c] for c in CLASS_NAMES])} ({b['any']:.2f})")
    hits = baselines["brightest_cell_hit"]
    log(f"  pointing game of the brightest {cell}-px cell: {_fmt_pair([hits[c] for c in CLASS_NAMES])}")

    loss_fn = parser.get_parsed_content("loss")
    # the cached tensors (float16 images, uint8 masks) live on the device for the whole run
    train, val = ({k: v.to(device) for k, v in split.items()} for split in (train, val))
    log(f"device: {device}{', bf16 autocast' if bf16 else ', float32'}")
    history = []
    epochs_iter = train_epochs(
        network,
        loss_fn,
        train,
        epochs,
        float(stage_value(parser, "learning_rate")),
        int(stage_value(parser, "batch_size")),
        max_shift=tuple(parser.get_parsed_content("max_shift")),
        seed=seed,
        memory_format=memory_format,
        autocast=autocast,
    )
    best_score, best_epoch, best_state = -1.0, 0, _snapshot(network)
    if init is not None:  # epoch 0: the loaded module as it is (what it brings to these lesions)
        ev = evaluate(network, val, tolerance, border, memory_format=memory_format, autocast=autocast)
        ev.update(epoch=0, loss=float("nan"), seconds=0.0, images_per_s=float("nan"))
        history.append(ev)
        best_score = float(np.nanmean(ev["hit"])) if not all(math.isnan(v) for v in ev["hit"]) else -1.0
        log(
            f"epoch   0  (loaded)    AUC b/m {_fmt_pair(ev['auc'])}  Dice {_fmt_pair(ev['dice'])}  "
            f"pointing game {_fmt_pair(ev['hit'])}  peak on border {_fmt_pair(ev['border'])}"
        )
    for epoch, loss, seconds, images in epochs_iter:
        ev = evaluate(network, val, tolerance, border, memory_format=memory_format, autocast=autocast)
        ev.update(epoch=epoch, loss=loss, seconds=seconds, images_per_s=images / seconds)
        history.append(ev)
        score = float(np.nanmean(ev["hit"])) if not all(math.isnan(v) for v in ev["hit"]) else -1.0
        if score > best_score:
            best_score, best_epoch, best_state = score, epoch, _snapshot(network)
        log(
            f"epoch {epoch:3d}  loss {loss:.3f}  AUC b/m {_fmt_pair(ev['auc'])}  Dice {_fmt_pair(ev['dice'])}  "
            f"pointing game {_fmt_pair(ev['hit'])}  peak on border {_fmt_pair(ev['border'])}  {seconds:.1f} s "
            f"({images / seconds:.0f} images/s)"
        )
    result = {
        "baselines": baselines,
        "epochs": history,
        "cell": cell,
        "tolerance": tolerance,
        "best_epoch": best_epoch,
        "images": {"training": len(train["image"]), "validation": len(val["image"])},
    }
    log(f"best epoch (validation pointing game): {best_epoch}")
    if save is not None:
        save_atomic(best_state, save)
        log(f"wrote {save}")
    if test:
        test_split = preprocess_split(datalist["test"], transform, cache_dir, settings)
        result["test_baselines"] = no_learning_baselines(
            test_split["image"], test_split["mask"], test_split["label"], cell, tolerance
        )
        network.load_state_dict(best_state)
        test_split = {k: v.to(device) for k, v in test_split.items()}
        result["test"] = evaluate(
            network, test_split, tolerance, border, memory_format=memory_format, autocast=autocast
        )
        t, hits = result["test"], result["test_baselines"]["brightest_cell_hit"]
        log(
            f"test ({len(test_split['image'])} images, epoch {best_epoch}): AUC b/m {_fmt_pair(t['auc'])}  Dice "
            f"{_fmt_pair(t['dice'])}  pointing game {_fmt_pair(t['hit'])}  peak on border {_fmt_pair(t['border'])}  "
            f"(brightest cell: {_fmt_pair([hits[c] for c in CLASS_NAMES])})"
        )
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", type=Path, help="a preset layered on bundle/configs/train.yaml (sizes, data, model)")
    p.add_argument("--model", default="glam", choices=sorted(OVERLAYS), help="the weakly supervised module to train")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--set", action="append", default=[], metavar="ID=VALUE", help="config override, repeatable")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="folder of the preprocessed tensors")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--no-channels-last", action="store_true", help="train in contiguous memory format")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where the module trains")
    p.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bf16 autocast of the forward passes (default: on CUDA, off on the CPU)",
    )
    p.add_argument("--json", type=Path, help="also write the baselines and per-epoch metrics to this file")
    p.add_argument("--init", type=Path, help="start from this model.pt (same settings) instead of a fresh module")
    p.add_argument("--save", type=Path, help="write the best epoch's weights (validation pointing game) here")
    p.add_argument("--test", action="store_true", help="evaluate the best epoch on the test split at the end")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.epochs < (0 if args.init else 1):
        raise SystemExit("--epochs must be >= 1 (0 with --init: score the loaded module only)")
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set needs ID=VALUE, got {item!r}")
        overrides[key] = parse_value(value)
    if args.threads:
        torch.set_num_threads(args.threads)
    parser = load_parser(args.preset, args.model, overrides)
    bf16 = torch.device(args.device).type == "cuda" if args.bf16 is None else args.bf16
    result = run_probe(
        parser,
        args.epochs,
        args.cache,
        args.seed,
        channels_last=not args.no_channels_last,
        device=args.device,
        bf16=bf16,
        init=args.init,
        save=args.save,
        test=args.test,
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
