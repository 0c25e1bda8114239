"""Time GLAM inference at full resolution and compare its throughput with a same-run convolution benchmark.

    python -m glam_benchmark.performance.model                      # CPU or the default CUDA device, float32
    python -m glam_benchmark.performance.model --device cuda --bf16 --channels-last

Prints images/s, latency, peak memory, the model's GFLOP per image (counted from its convolutions and linear
layers), the achieved GFLOP/s, and the same for a 3x3 convolution (256 -> 256 channels, 128x128, batch 1),
then the ratio of the two throughputs. Figures go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch import nn

from scripts import precision
from scripts.networks import GLAM


def count_flops(model: nn.Module, *inputs: torch.Tensor) -> float:
    """FLOPs (2 x multiply-adds) of the convolutions and linear layers in one forward pass."""
    total = 0

    def conv_hook(m: nn.Conv2d, _inp, out):
        nonlocal total
        kh, kw = m.kernel_size
        total += 2 * (m.in_channels // m.groups) * kh * kw * out.numel()

    def linear_hook(m: nn.Linear, _inp, out):
        nonlocal total
        total += 2 * m.in_features * out.numel()

    handles = [
        m.register_forward_hook(conv_hook if isinstance(m, nn.Conv2d) else linear_hook)
        for m in model.modules()
        if isinstance(m, (nn.Conv2d, nn.Linear))
    ]
    with torch.no_grad():
        model(*inputs)
    for h in handles:
        h.remove()
    return float(total)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn, device: torch.device, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--height", type=int, default=2944)
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--patches", type=int, default=1, help="M, patches per image at inference")
    parser.add_argument("--bf16", action="store_true", help="autocast to bfloat16")
    parser.add_argument("--channels-last", action="store_true", help="channels-last memory format")
    parser.add_argument("--no-fuse", action="store_true", help="keep batch norms unfused (as in training)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    torch.manual_seed(0)
    model = GLAM(num_patches_eval=args.patches).eval()
    if not args.no_fuse:
        model = model.fuse_for_inference()
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(device, memory_format=memory_format)
    image = torch.randn(args.batch, 1, args.height, args.width, device=device)
    flops = count_flops(model, image) / args.batch

    conv = nn.Conv2d(256, 256, 3, padding=1, bias=False).to(device, memory_format=memory_format).eval()
    conv_in = torch.randn(1, 256, 128, 128, device=device).to(memory_format=memory_format)
    conv_flops = 2 * 256 * 9 * 256 * 128 * 128

    autocast = precision.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)

    def run_model():
        with torch.inference_mode(), autocast:
            model(image)

    def run_conv():
        with torch.inference_mode(), autocast:
            conv(conv_in)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # Interleave the two so that both see the same machine state (other load, clocks, caches).
    time_call(run_model, device, args.warmup, 0)
    time_call(run_conv, device, 2, 0)
    model_times, conv_times = [], []
    for _ in range(args.repeats):
        conv_times += time_call(run_conv, device, 0, 3)
        model_times += time_call(run_model, device, 0, 1)
    conv_times += time_call(run_conv, device, 0, 3)
    latency = min(model_times)
    conv_latency = min(conv_times)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu ({torch.get_num_threads()} threads)",
        "input": [args.batch, 1, args.height, args.width],
        "patches": args.patches,
        "dtype": "bf16" if args.bf16 else "float32",
        "channels_last": args.channels_last,
        "fused_bn": not args.no_fuse,
        "latency_s": latency,
        "images_per_s": args.batch / latency,
        "peak_memory_gib": peak / 2**30,
        "gflop_per_image": flops / 1e9,
        "model_gflops": flops * args.batch / latency / 1e9,
        "conv_gflops": conv_flops / conv_latency / 1e9,
    }
    result["ratio"] = result["model_gflops"] / result["conv_gflops"]
    for k, v in result.items():
        print(f"{k:>16}: {v:.4g}" if isinstance(v, float) else f"{k:>16}: {v}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
