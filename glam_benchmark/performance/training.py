"""Training speed, memory and scaling of GLAM (figures for docs/performance.md).

    python -m glam_benchmark.performance.training speed   [--device cuda] [--bf16] [--channels-last] [--k 6] [--batch 2]
    python -m glam_benchmark.performance.training memory  [--device cuda] [--bf16] --ks 1 2 3 [--budgets-gb 16 40 80]
    python -m glam_benchmark.performance.training scaling [--sizes 736x480 1472x960 2944x1920] [--ks 1 2 4]
    python -m glam_benchmark.performance.training ddp     [--height 368 --width 240 --patch 128 ...]
    python -m glam_benchmark.performance.training pipeline --datalist D/datalist.json [--num-workers 14]
        [--stage global]

- ``speed``: one optimiser step per stage (global, local with the global module frozen, joint), random images and
  labels at the model's full size by default; images/s = batch / best step time over ``--repeats`` after
  ``--warmup``; peak memory of the step (CUDA: ``max_memory_allocated``; CPU: the process's peak resident memory).
- ``memory``: the peak memory of one joint-stage step for each K in ``--ks``, with and without activation
  checkpointing of the local module, each in a fresh process (so peaks do not mix); a straight line through
  (K, peak) per setting gives the memory per patch and the largest K that fits each budget in ``--budgets-gb``.
  On a GPU ``--search`` also finds the largest K for real under ``torch.cuda.set_per_process_memory_fraction``
  (budget / device memory), doubling then bisecting on out-of-memory errors.
- ``scaling``: step time of the joint stage as the image size and K grow (a table).
- ``ddp``: joint-stage throughput of DistributedDataParallel with 2 processes against 1 (gloo on CPU, NCCL on
  CUDA with 2 devices), each rank with ``--batch`` images, on the same total cores (CPU: threads split).
- ``pipeline``: the training workflow's own objects (``bundle/configs/train.yaml`` + ``--config`` presets, sizes,
  workers, cache and device from the flags) on a real datalist, in one run: the PNG/DICOM decode of each image once,
  the first pass that fills the cache (with the share of each cached transform; then the whole cache, in the
  loader's processes), the loader in steady state (``--num-workers`` processes, cache warm; with pinned memory, also
  without), the per-step device transforms (with their shares, after one untimed pass), the model-only step on a
  prepared batch, and the whole training step (loader + device transforms + model, MONAI's trainer without
  validation); the whole step against the model-only step is the fraction of the model's speed reached.

Prints a Markdown table; ``--json PATH`` also writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from scripts import precision
from scripts.enums import STAGES, OutputKey, Stage
from scripts.losses import GLAMLoss
from scripts.networks import GLAM
from scripts.patches import map_window_size, max_disjoint_windows

REPO_ROOT = Path(__file__).resolve().parents[2]
TRAIN_CONFIG = REPO_ROOT / "bundle" / "configs" / "train.yaml"


def build(stage: str, args: argparse.Namespace, k: int, checkpointing: bool, device: torch.device):
    """(model in training mode for ``stage``, loss, Adam over its trainable parameters)."""
    net = GLAM(
        stage=stage,
        patch_size=args.patch,
        num_patches_train=k,
        local_depth=args.local_depth,
        local_width=args.local_width,
        activation_checkpointing=checkpointing,
    ).to(device)
    if args.channels_last:
        net = net.to(memory_format=torch.channels_last)
    net.train()
    loss = GLAMLoss(stage=stage, lambda_sparsity=1e-4)
    params = [p for p in net.parameters() if p.requires_grad]
    return net, loss, torch.optim.Adam(params, lr=1e-5)


def make_batch(args: argparse.Namespace, batch: int, height: int, width: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    image = torch.randn(batch, 1, height, width, generator=g)
    label = (torch.rand(batch, 2, generator=g) > 0.5).float()
    if args.channels_last:
        image = image.contiguous(memory_format=torch.channels_last)
    return image.to(device), label.to(device)


def step(net, loss_fn, opt, image, label, device: torch.device, bf16: bool) -> None:
    opt.zero_grad(set_to_none=True)
    with precision.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        out = net(image)
    loss = loss_fn(out, label)
    loss.backward()
    opt.step()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: kB


def time_steps(stage, args, k, checkpointing, device, height, width, batch) -> dict:
    net, loss_fn, opt = build(stage, args, k, checkpointing, device)
    image, label = make_batch(args, batch, height, width, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for i in range(args.warmup + args.repeats):
        _sync(device)
        t = time.perf_counter()
        step(net, loss_fn, opt, image, label, device, args.bf16)
        _sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - t)
    best = min(times)
    return {
        "stage": stage,
        "height": height,
        "width": width,
        "k": k,
        "batch": batch,
        "checkpointing": checkpointing,
        "step_s": best,
        "images_per_s": batch / best,
        "peak_gib": peak_bytes(device) / 2**30,
    }


def cmd_speed(args, device) -> list[dict]:
    return [
        time_steps(s, args, args.k, args.checkpointing, device, args.height, args.width, args.batch) for s in STAGES
    ]


def _one_peak(args, k: int, checkpointing: bool) -> dict:
    """One joint step in a fresh interpreter: its peak memory is this configuration's alone."""
    cmd = [sys.executable, "-m", "glam_benchmark.performance.training", "_peak", "--k", str(k), "--device", args.device]
    cmd += ["--height", str(args.height), "--width", str(args.width), "--patch", str(args.patch)]
    cmd += ["--local-depth", str(args.local_depth), "--local-width", str(args.local_width), "--batch", str(args.batch)]
    cmd += ["--bf16"] * args.bf16 + ["--channels-last"] * args.channels_last + ["--checkpointing"] * checkpointing
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=REPO_ROOT)
    if res.returncode != 0:
        raise RuntimeError(f"K={k} checkpointing={checkpointing} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def cmd_peak(args, device) -> list[dict]:
    net, loss_fn, opt = build(Stage.JOINT, args, args.k, args.checkpointing, device)
    image, label = make_batch(args, args.batch, args.height, args.width, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    before = peak_bytes(device)
    t = time.perf_counter()
    step(net, loss_fn, opt, image, label, device, args.bf16)
    _sync(device)
    seconds = time.perf_counter() - t
    return [
        {
            "k": args.k,
            "checkpointing": args.checkpointing,
            "peak_gib": peak_bytes(device) / 2**30,
            "before_step_gib": before / 2**30,
            "step_s": seconds,
        }
    ]


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y = a + b x."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - b * mx, b


def cmd_memory(args, device) -> list[dict]:
    if len(set(args.ks)) < 2:
        raise SystemExit("--ks needs at least two different K values to fit memory per patch")
    rows = [_one_peak(args, k, ckpt) for ckpt in (False, True) for k in args.ks]
    for ckpt in (False, True):
        a, b = fit_line([(r["k"], r["peak_gib"]) for r in rows if r["checkpointing"] == ckpt])
        summary = {"k": "fit", "checkpointing": ckpt, "base_gib": a, "per_patch_gib": b}
        for budget in args.budgets_gb:
            summary[f"max_k_{budget:g}gb"] = int((budget * 1e9 / 2**30 - a) // b) if b > 0 else None
        rows.append(summary)
    if args.search and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        limit = max_patches(args)
        for ckpt in (False, True):
            for budget in args.budgets_gb:
                max_k = _search_max_k(args, device, ckpt, budget * 1e9 / total, limit)
                rows.append(
                    {
                        "k": "search",
                        "checkpointing": ckpt,
                        "budget_gb": budget,
                        "max_k": max_k,
                        "image_limit_k": limit,
                        "limited_by": "image" if max_k == limit else "memory",
                    }
                )
    return rows


def max_patches(args) -> int:
    """The largest K Algorithm 1 can select in an image of ``--height`` x ``--width``: the disjoint patch windows on
    the global module's map (its size read off a forward pass on the meta device, which allocates nothing)."""
    net = GLAM(stage=Stage.GLOBAL, patch_size=args.patch, local_depth=18, local_width=1).to("meta")
    with torch.no_grad():
        image = torch.empty(1, 1, args.height, args.width, device="meta")
        map_size = list(net.global_network(image)[OutputKey.SALIENCY_GLOBAL].shape[-2:])
    window = map_window_size([args.patch] * 2, [args.height, args.width], map_size)
    return max_disjoint_windows(map_size, window)


def _fits(args, device, k: int, ckpt: bool) -> bool:
    try:
        net, loss_fn, opt = build(Stage.JOINT, args, k, ckpt, device)
        image, label = make_batch(args, args.batch, args.height, args.width, device)
        step(net, loss_fn, opt, image, label, device, args.bf16)
        _sync(device)
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        torch.cuda.empty_cache()


def largest_fitting(fits, limit: int) -> int:
    """The largest K in [1, ``limit``] with ``fits(K)`` (0 if none), for a ``fits`` that is monotone (true up to some
    K): doubling from 1, then bisecting; never asks for a K above ``limit``."""
    lo, hi = 0, 1
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _search_max_k(args, device, ckpt: bool, fraction: float, limit: int) -> int:
    """The largest K <= ``limit`` whose joint step fits in ``fraction`` of the device's memory (0: not even K = 1)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(min(fraction, 1.0), index)
    try:
        return largest_fitting(lambda k: _fits(args, device, k, ckpt), limit)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)


def cmd_scaling(args, device) -> list[dict]:
    rows = []
    for size in args.sizes:
        h, w = (int(v) for v in size.lower().split("x"))
        rows.append(time_steps(Stage.JOINT, args, args.ks[0], args.checkpointing, device, h, w, args.batch))
    h, w = args.height, args.width
    for k in args.ks[1:]:
        rows.append(time_steps(Stage.JOINT, args, k, args.checkpointing, device, h, w, args.batch))
    return rows


def _ddp_worker(rank: int, world: int, args, port: int, queue) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    cuda = args.device == "cuda"
    device = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(max(1, args.threads // world))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    net, loss_fn, opt = build(Stage.JOINT, args, args.k, args.checkpointing, device)
    model = DistributedDataParallel(net, device_ids=[rank] if cuda else None, find_unused_parameters=False)
    image, label = make_batch(args, args.batch, args.height, args.width, device)
    times = []
    for i in range(args.warmup + args.repeats):
        dist.barrier()
        t = time.perf_counter()
        step(model, loss_fn, opt, image, label, device, args.bf16)
        _sync(device)
        dist.barrier()
        if i >= args.warmup:
            times.append(time.perf_counter() - t)
    if rank == 0:
        queue.put(min(times))
    dist.destroy_process_group()


def cmd_ddp(args, device) -> list[dict]:
    import socket

    import torch.multiprocessing as mp

    rows = []
    for world in (1, 2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=_ddp_worker, args=(r, world, args, port, queue)) for r in range(world)]
        for p in procs:
            p.start()
        best = queue.get(timeout=3600)
        for p in procs:
            p.join()
        images = args.batch * world
        rows.append(
            {
                "processes": world,
                "threads_each": max(1, args.threads // world) if device.type == "cpu" else None,
                "images_per_step": images,
                "step_s": best,
                "images_per_s": images / best,
            }
        )
    rows.append({"speedup_2_vs_1": rows[1]["images_per_s"] / rows[0]["images_per_s"]})
    return rows


def pipeline_parser(args, device: torch.device, work_dir: Path):
    """``train.yaml`` + ``--config`` presets with the flags' sizes, stage, workers, cache and device."""
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), *[str(c) for c in args.config]])
    overrides = {
        "bundle_root": str(REPO_ROOT / "bundle"),
        "datalist": str(Path(args.datalist).resolve()),
        "dataset_dir": str(Path(args.datalist).resolve().parent),
        "stage": args.stage,
        "device": f"$torch.device({str(device)!r})",
        "amp": bool(args.bf16),
        "channels_last": bool(args.channels_last),
        "num_workers": args.num_workers,
        "train_cache": args.cache,
        "check_data": False,
        "ckpt_root": str(work_dir / "models"),
        "output_root": str(work_dir / "eval"),
        "image_size": [args.height, args.width],
        "patch_size": args.patch,
        "num_patches": args.k,
        "local_depth": args.local_depth,
        "local_width": args.local_width,
        "batch_size": {s: args.batch for s in STAGES},
        "activation_checkpointing": bool(args.checkpointing),
    }
    if args.cache_dir:
        overrides["cache_dir"] = str(args.cache_dir)
    for key, value in overrides.items():
        parser[key] = value
    return parser


def _timed_chain(transforms, item, totals: dict, device: torch.device):
    for t in transforms:
        start = time.perf_counter()
        item = t(item)
        _sync(device)
        totals[type(t).__name__] = totals.get(type(t).__name__, 0.0) + time.perf_counter() - start
    return item


def _discard(items: list) -> None:
    """A collate function that keeps nothing (filling a cache reads every item once)."""
    return None


def _loader_row(parser, epochs: int, keep: list, fresh: bool = False) -> dict:
    """``train#dataloader``'s images/s over ``epochs`` epochs after one untimed epoch (it starts the workers); the
    first three batches go into ``keep``. ``fresh``: parse the config again first (after an override); else the
    loader is built on the objects already parsed (the dataset whose cache was just filled)."""
    loader = parser.get_parsed_content("train#dataloader", lazy=not fresh)
    sampler = parser.get_parsed_content("train#sampler")
    count, seconds = 0, 0.0
    for epoch in range(epochs + 1):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        n = 0
        for batch in loader:
            n += int(batch["image"].shape[0])
            if len(keep) < 3:
                keep.append(batch)
        if epoch > 0:
            count, seconds = count + n, seconds + time.perf_counter() - start
    return _rate_row("loader", count, seconds)


def _share_rows(stage: str, totals: dict, images: int) -> list[dict]:
    whole = sum(totals.values()) or 1.0
    return [
        {"measure": f"{stage}: {name}", "ms_per_image": 1000 * t / images, "share": t / whole}
        for name, t in sorted(totals.items(), key=lambda kv: -kv[1])
    ]


def _rate_row(measure: str, images: int, seconds: float, note: str = "") -> dict:
    return {"measure": measure, "images_per_s": images / seconds, "ms_per_image": 1000 * seconds / images, "note": note}


def cmd_pipeline(args, device) -> list[dict]:
    """See the module docstring (``pipeline``)."""
    import tempfile

    from monai.data import decollate_batch
    from monai.data.meta_obj import set_track_meta

    from scripts.data.readers import read_mammogram

    if not args.datalist:
        raise SystemExit("pipeline needs --datalist (a MONAI datalist of mammograms, e.g. from make_synthetic.py)")
    work_dir = Path(tempfile.mkdtemp(prefix="glam_pipeline_"))
    parser = pipeline_parser(args, device, work_dir)
    items = parser.get_parsed_content("train_datalist")
    rows: list[dict] = []

    # 1. decoding each file once: the floor the cached loader is compared with
    sample = items[: args.profile_images]
    start = time.perf_counter()
    for item in sample:
        read_mammogram(item["image"])
    rows.append(_rate_row("decode the image file once", len(sample), time.perf_counter() - start, "main process"))

    # 2. the cached half, transform by transform (what filling the cache costs per image)
    totals: dict = {}
    chain = parser.get_parsed_content("train#preprocessing")
    for item in sample:
        _timed_chain(chain.transforms, dict(item), totals, torch.device("cpu"))
    rows.append(_rate_row("cached half (fill)", len(sample), sum(totals.values()), "main process"))
    rows += _share_rows("cached", totals, len(sample))

    # 3. fill the cache through the dataset in the loader's processes, then the loader in steady state
    from torch.utils.data import DataLoader

    note = f"{args.num_workers} worker(s), one thread each" if args.num_workers else "main process"
    start = time.perf_counter()
    dataset = parser.get_parsed_content("train#dataset")
    for _ in DataLoader(dataset, batch_size=1, num_workers=args.num_workers, collate_fn=_discard):
        pass
    rows.append(_rate_row(f"fill the {args.cache} cache", len(dataset), time.perf_counter() - start, note))
    batches: list = []
    loader_row = _loader_row(parser, args.loader_epochs, batches)
    rows.append({**loader_row, "measure": f"loader, {args.cache} cache warm", "note": note})
    if parser.get_parsed_content("pin_memory"):  # train.yaml pins with CUDA
        # the same loader without the pinning thread's copy of every batch: what pinning costs the loader
        parser["pin_memory"] = False
        plain = _loader_row(parser, args.loader_epochs, [], fresh=True)
        rows.append({**plain, "measure": f"loader, {args.cache} cache warm, memory not pinned", "note": note})
        parser["pin_memory"] = True
        parser.parse()

    # 4. the per-step half on the device, transform by transform
    prepare = parser.get_parsed_content("train#prepare_batch")
    memory_format = parser.get_parsed_content("memory_format")
    totals = {}
    images = 0
    for i, batch in enumerate([batches[0], *batches]):  # the first pass loads the kernels: not timed
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        set_track_meta(False)
        try:
            for item in decollate_batch(moved, detach=False):
                _timed_chain(prepare.transform.transforms, item, totals if i else {}, device)
                images += int(i > 0)
        finally:
            set_track_meta(True)
    rows.append(_rate_row("per-step half on the device", images, sum(totals.values()), str(device)))
    rows += _share_rows("per-step", totals, images)

    # 5. the model-only step on one prepared batch
    network, loss_fn = parser.get_parsed_content("network"), parser.get_parsed_content("loss")
    optimizer, inferer = parser.get_parsed_content("optimizer"), parser.get_parsed_content("train#inferer")
    image, target, _, kwargs = prepare(batches[0], device, False, memory_format=memory_format)
    network.train()
    times = []
    for i in range(args.warmup + args.repeats):
        _sync(device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss_fn(inferer(image, network, **kwargs), target).backward()
        optimizer.step()
        _sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    model = _rate_row("model-only step", image.shape[0] * len(times), sum(times), f"batch {image.shape[0]}")
    rows.append(model)

    # 6. the whole training step: MONAI's trainer from the same config, without its handlers (no validation)
    parser["train#handlers"] = []
    parser["train#trainer#max_epochs"] = 1
    parser["train#trainer#epoch_length"] = args.warmup + args.steps
    trainer = parser.get_parsed_content("train#trainer")
    stamps: list[float] = []

    def stamp(engine) -> None:
        _sync(device)
        stamps.append(time.perf_counter())

    from ignite.engine import Events

    trainer.add_event_handler(Events.ITERATION_COMPLETED, stamp)
    trainer.run()
    steady = stamps[args.warmup - 1 :] if args.warmup else stamps
    whole = _rate_row(
        "whole training step", args.batch * (len(steady) - 1), steady[-1] - steady[0], "loader + device + model"
    )
    whole["of_model_only"] = whole["images_per_s"] / model["images_per_s"]
    rows.append(whole)
    return rows


def markdown(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        cells = [f"{r[k]:.4g}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["speed", "memory", "scaling", "ddp", "pipeline", "_peak"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--height", type=int, default=2944)
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--patch", type=int, default=512)
    ap.add_argument("--local-depth", type=int, default=34)
    ap.add_argument("--local-width", type=int, default=64)
    ap.add_argument("--k", type=int, default=6, help="patches per image (speed, ddp, _peak)")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3], help="K values (memory, scaling)")
    ap.add_argument("--sizes", nargs="+", default=["736x480", "1472x960", "2944x1920"], help="HxW (scaling)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--bf16", action="store_true", help="autocast to bfloat16")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing of the local module")
    ap.add_argument("--budgets-gb", type=float, nargs="+", default=[16, 40, 80])
    ap.add_argument("--search", action="store_true", help="memory on CUDA: also search the largest K for real")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="CPU threads in total (ddp)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    pipe = ap.add_argument_group("pipeline")
    pipe.add_argument("--datalist", type=Path, help="a MONAI datalist of mammogram files (its 'training' split)")
    pipe.add_argument("--config", type=Path, nargs="*", default=[], help="presets layered over train.yaml")
    pipe.add_argument("--stage", choices=list(STAGES), default=Stage.GLOBAL.value)
    pipe.add_argument("--num-workers", type=int, default=min(14, max(0, (os.cpu_count() or 1) - 2)))
    pipe.add_argument("--cache", choices=["none", "memory", "disk"], default="disk")
    pipe.add_argument("--cache-dir", type=Path, help="disk cache folder (default: a new temporary one)")
    pipe.add_argument("--profile-images", type=int, default=8, help="images decoded and profiled one by one")
    pipe.add_argument("--loader-epochs", type=int, default=2, help="timed loader epochs after a first one")
    pipe.add_argument("--steps", type=int, default=20, help="timed whole-training steps after --warmup")
    args = ap.parse_args(argv)
    for name in ("height", "width", "patch", "k", "batch", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.patch > min(args.height, args.width):
        ap.error(f"--patch {args.patch} is larger than the image {args.height}x{args.width}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device")
    modes = {
        "speed": cmd_speed,
        "memory": cmd_memory,
        "scaling": cmd_scaling,
        "ddp": cmd_ddp,
        "pipeline": cmd_pipeline,
        "_peak": cmd_peak,
    }
    rows = modes[args.mode](args, device)
    if args.mode == "_peak":
        print(json.dumps(rows[0]))
        return 0
    info = {
        "mode": args.mode,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "args": {k: v for k, v in vars(args).items() if k != "json" and not isinstance(v, Path)},
    }
    print(f"{info['device']}, torch {info['torch']}, {info['threads']} threads")
    print(markdown(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**info, "rows": rows}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
