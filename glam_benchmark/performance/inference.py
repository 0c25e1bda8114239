"""Time ``monai.bundle run inference`` on a folder of synthetic mammograms against the work it cannot avoid: decoding
every input once and the run's own model time.

    python -m glam_benchmark.performance.inference       # the shipped model, 16 PNGs of 2944x1920 (CPU figure)
    python -m glam_benchmark.performance.inference --weights full --n 64 --copies 8 -- --batch_size 16  # GPU, full size

The folder is generated once (``python -m glam_benchmark.synthetic``'s generator, 16-bit PNGs stating 0.1 mm pixels at
2944x1920) and kept under ``data/``; ``--copies K`` runs on K hard links to each image (K x n inputs, each
decoded and written separately; symbolic links would be one input each, as inference knows a file by the path it
resolves to) for a long run without generating K times as many. ``--weights full`` saves a
randomly initialised paper-size GLAMSaliencyNet (2944x1920 window, ResNet-34-HR patches, no pixel spacing: nothing
is resampled); ``shipped`` is ``bundle/models/model.pt`` (a 736x480 window at 0.4 mm: each input is resampled to it
and its maps back). Arguments after ``--`` go to the inference command (e.g. ``--outputs``, ``--num_workers``,
``--writer_threads``).

In one invocation it times decoding every file with PIL (before and after the run, single thread), runs the
command into a fresh output folder, and prints the run's ``timing.json`` split with the ratio
``wall_s / (decode_s + model_s)`` and the machine load (figures for docs/performance.md). ``--json`` saves them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]

SHIPPED = REPO_ROOT / "bundle" / "models" / "model.pt"


def decode_seconds(files: list[Path]) -> float:
    """Seconds to decode every file once with PIL into an array, one thread (the work no run can avoid)."""
    from PIL import Image

    begin = time.perf_counter()
    for f in files:
        with Image.open(f) as img:
            np.asarray(img)
    return time.perf_counter() - begin


def make_folder(folder: Path, n: int, size: tuple[int, int], seed: int, copies: int = 1) -> tuple[Path, list[Path]]:
    """``n`` synthetic PNG mammograms in ``folder/images`` (generated once); with ``copies`` > 1 a folder
    ``folder/links_n<n>_x<K>`` of K hard links to each (copies where the file system has none). Returns the input
    folder and its files."""
    images = folder / "images"
    files = sorted(images.glob("*.png")) if images.is_dir() else []
    if len(files) < n:
        from glam_benchmark.synthetic import make_synthetic_dataset

        shutil.rmtree(folder, ignore_errors=True)
        print(f"generating {n} synthetic {size[0]}x{size[1]} PNGs in {folder} ...", flush=True)
        make_synthetic_dataset(folder, n, size=size, seed=seed, fmt="png")
        files = sorted(images.glob("*.png"))
    files = files[:n]
    if copies <= 1:
        if len(list(images.glob("*.png"))) == n:
            return images, files
        copies = 1  # a folder of exactly n: links to the first n
    linked = folder / f"links_n{n}_x{copies}"
    shutil.rmtree(linked, ignore_errors=True)
    linked.mkdir()
    for k in range(copies):
        for f in files:
            try:
                os.link(f, linked / f"c{k}_{f.name}")
            except OSError:
                shutil.copyfile(f, linked / f"c{k}_{f.name}")
    return linked, sorted(linked.iterdir())


def full_size_weights(path: Path, seed: int = 0) -> Path:
    """A randomly initialised paper-size GLAMSaliencyNet (its settings record included) saved to ``path``."""
    import torch

    from scripts.enums import Stage
    from scripts.networks import GLAMSaliencyNet

    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(seed)
        torch.save(GLAMSaliencyNet(stage=Stage.JOINT).state_dict(), path)
    return path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=16, help="images in the folder")
    parser.add_argument("--size", type=int, nargs=2, default=(2944, 1920), metavar=("H", "W"))
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--copies", type=int, default=1, help="links to each image in the input folder")
    parser.add_argument("--data", type=Path, default=None, help="the folder (default data/benchmark_inference_...)")
    parser.add_argument("--weights", default="shipped", help="shipped | full | a checkpoint path")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a temporary one, removed)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(own)

    height, width = args.size
    data = args.data or REPO_ROOT / "data" / f"benchmark_inference_n{args.n}_{height}x{width}_seed{args.seed}"
    inputs, files = make_folder(data, args.n, (height, width), args.seed, args.copies)
    work = Path(tempfile.mkdtemp(prefix="glam_benchmark_inference_"))
    if args.weights == "shipped":
        ckpt = SHIPPED
    elif args.weights == "full":
        ckpt = full_size_weights(REPO_ROOT / "data" / "benchmark_inference_full_size_random.pt")
    else:
        ckpt = Path(args.weights)
    out = args.out or work / "out"
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "monai.bundle", "run", "inference", "--config_file", "bundle/configs/inference.yaml"]
    cmd += ["--meta_file", "bundle/configs/metadata.json", "--bundle_root", "bundle"]
    cmd += ["--input_dir", str(inputs), "--output_dir", str(out), "--ckpt_path", str(ckpt), *extra]

    load_before = os.getloadavg()
    decode_before = decode_seconds(files)
    begin = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    command_s = time.perf_counter() - begin
    decode_after = decode_seconds(files)
    load_after = os.getloadavg()
    if proc.returncode != 0:
        print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
        return 1
    timing = json.loads((out / "timing.json").read_text())
    if args.out is None:
        shutil.rmtree(work, ignore_errors=True)

    decode = (decode_before + decode_after) / 2
    bound = decode + timing["model_s"]
    result = {
        "images": timing["images"],
        "distinct_images": args.n,
        "size": [height, width],
        "weights": str(args.weights),
        "extra_args": extra,
        "cpus": os.cpu_count(),
        "cpu": cpu_model(),
        "load_before": [round(v, 2) for v in load_before],
        "load_after": [round(v, 2) for v in load_after],
        "decode_s": decode,
        "decode_before_s": decode_before,
        "decode_after_s": decode_after,
        "command_s": command_s,
        "bound_s": bound,
        "wall_over_bound": timing["wall_s"] / bound,
        "timing": timing,
    }
    parts = ("model", "waiting_for_data", "waiting_for_writers", "other")
    print(f"{timing['images']} images of {height}x{width} (PNG), weights {args.weights}, extra args {extra or 'none'}")
    print(
        f"machine: {os.cpu_count()} CPUs ({result['cpu']}), load average {load_before[0]:.2f} before, "
        f"{load_after[0]:.2f} after"
    )
    print(
        f"decoding every input once (PIL, 1 thread): {decode:.2f} s ({decode_before:.2f} before, {decode_after:.2f} "
        "after the run)"
    )
    print(
        f"run: wall {timing['wall_s']:.2f} s (engine; the whole command {command_s:.1f} s), model_s "
        f"{timing['model_s']:.2f} s, {timing['images_per_s']:.2f} images/s"
    )
    print(f"wall / (decode + model_s) = {timing['wall_s']:.2f} / {bound:.2f} = {result['wall_over_bound']:.2f}")
    print(
        "wall split: " + ", ".join(f"{k} {timing[f'{k}_s']:.2f} s ({100 * timing[f'{k}_share']:.0f} %)" for k in parts)
    )
    writing = ", ".join(
        f"{k} {timing.get(f'writing_{k}_s', 0.0):.2f} s" for k in ("maps_back", "map_files", "panel", "dicom")
    )
    print(
        f"work beside the engine: loading {timing['loading_s']:.2f} s (loader workers), writing "
        f"{timing.get('writing_s', 0.0):.2f} s ({timing.get('writer_threads', '?')} threads: {writing})"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
