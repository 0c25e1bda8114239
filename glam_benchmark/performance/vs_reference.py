"""Time our GLAM against the authors' code on the same weights and the same full-size image, alternating in one
process, and check that the outputs agree.

    git clone https://github.com/nyukat/GLAM /path/to/nyukat-GLAM      # their code (not a dependency)
    python -m glam_benchmark.performance.vs_reference --reference-code /path/to/nyukat-GLAM --repeats 6
    python -m glam_benchmark.performance.vs_reference --reference-code ... --precision fp32   # our float32 path

The authors' model is built from their code with their released inference settings (184x120 saliency map, one
512-px patch, top-t 3 % / 30 %) and random weights (seeded); ours is ``load_nyukat_glam`` (tools/) of the same
state dict, then ``optimize_for_inference`` at ``--precision`` (default ``auto``: bf16 on CPUs with bf16
convolutions). One fix to their code, in memory: their window search divides integer tensors with ``/``, which
was floor division in the torch they used and is true division today (see ``_max_window_with_floor_division``).
Their code imports torchvision and OpenCV for helpers its forward pass does not use; where those
are not installed the script puts stand-ins in ``sys.modules`` (torchvision's ``conv3x3`` is the only piece their
forward reaches: a 3x3 convolution, padding 1, no bias) and says so.

Each repeat runs both models once, the order alternating between repeats (both orders are reported), after one
warm-up call each. Printed: per model and order the median, min and max seconds, the ratio of the medians
(ours / theirs), and the differences of the outputs: |dy| (y_global), max and mean |dS_c| (their full-size
``saliency_map`` sampled every 4 px, the grid of our S_c) and whether the patch is the same. Figures go to
docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch
from torch import nn

from scripts.enums import OutputKey
from scripts.networks import optimize_for_inference, resolve_precision

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tools"))
from convert_nyukat_checkpoint import load_nyukat_glam  # noqa: E402

#: the authors' inference settings (their run script's parameters)
REFERENCE_PARAMETERS = {
    "device_type": "cpu",
    "gpu_number": 0,
    "max_crop_noise": (100, 100),
    "max_crop_size_noise": 100,
    "cam_size": (184, 120),
    "top_k_per_class": 1,
    "crop_shape": (512, 512),
    "percent_k": 0.03,
    "detection_pooling_percent_k": 0.3,
}
SAMPLE_VIEW = REPO_ROOT.parent / "shared" / "sample_data" / "glam_exam0" / "images" / "0_L-CC.png"


def _conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def install_stand_ins() -> list[str]:
    """Stand-ins for the authors' imports that are not installed; returns their names."""
    installed = []
    try:
        import torchvision  # noqa: F401
    except ImportError:
        tv = types.ModuleType("torchvision")
        tv.transforms = types.ModuleType("torchvision.transforms")
        tv.models = types.ModuleType("torchvision.models")
        tv.models.resnet = types.ModuleType("torchvision.models.resnet")
        tv.models.resnet.conv3x3 = _conv3x3
        for name, module in {
            "torchvision": tv,
            "torchvision.transforms": tv.transforms,
            "torchvision.models": tv.models,
            "torchvision.models.resnet": tv.models.resnet,
        }.items():
            sys.modules[name] = module
        installed.append("torchvision (conv3x3 only)")
    try:
        import cv2  # noqa: F401
    except ImportError:
        sys.modules["cv2"] = types.ModuleType("cv2")
        installed.append("cv2 (empty)")
    return installed


def _max_window_with_floor_division(original):
    """Their ``get_max_window`` as it ran on the torch they used: it turns the flat index of the best window into
    (row, col) with ``index / width``, an integer division before torch 1.5 and a true division since (their
    columns come out fractional or negative and their own asserts stop the forward pass). Same argmax (first
    maximum), floor division."""

    def get_max_window(input_image: torch.Tensor, window_shape, pooling_logic: str = "avg") -> torch.Tensor:
        if pooling_logic != "avg":
            return original(input_image, window_shape, pooling_logic)
        pooled = torch.nn.functional.avg_pool2d(input_image, window_shape, stride=1)
        index = pooled.flatten(2).argmax(dim=-1)
        return torch.stack([index // pooled.shape[-1], index % pooled.shape[-1]], dim=-1)

    return get_max_window


def reference_model(code_dir: Path, size: tuple[int, int], seed: int = 0) -> nn.Module:
    """The authors' ``MILSingleImageModel`` from their code in ``code_dir`` (a clone of nyukat/GLAM) for inputs of
    ``size``, eval mode (their saliency map is fixed at 1/16 of the input: 184x120 for 2944x1920)."""
    if not (code_dir / "src" / "modeling" / "glam.py").is_file():
        raise SystemExit(f"error: --reference-code {code_dir}: no src/modeling/glam.py (a clone of nyukat/GLAM)")
    sys.path.insert(0, str(code_dir))
    from src.modeling import common_functions as their_functions
    from src.modeling import glam as their_glam

    their_functions.get_max_window = _max_window_with_floor_division(their_functions.get_max_window)

    torch.manual_seed(seed)
    model = their_glam.MILSingleImageModel({**REFERENCE_PARAMETERS, "cam_size": (size[0] // 16, size[1] // 16)})
    # random weights with running statistics away from the (0, 1) defaults, so batch norms do real work
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def full_size_image(path: Path, size: tuple[int, int]) -> torch.Tensor:
    """(1, 1, H, W): the mammogram at ``path`` through the bundle's inference preprocessing (inference.yaml's
    ``preprocessing`` at the window ``size``, no resampling: both models see the file's pixels)."""
    from monai.bundle import ConfigParser

    if not path.is_file():
        raise SystemExit(f"error: --image {path}: no such file")
    parser = ConfigParser()
    parser.read_config(str(REPO_ROOT / "bundle" / "configs" / "inference.yaml"))
    parser.update({"bundle_root": str(REPO_ROOT / "bundle"), "image_size": list(size), "pixel_spacing": None})
    item = parser.get_parsed_content("preprocessing")({"image": str(path)})
    return torch.from_numpy(np.array(item["image"], dtype=np.float32))[None]  # a plain tensor, not a MetaTensor


def compare_outputs(theirs: nn.Module, y_theirs: torch.Tensor, ours_out: dict) -> dict:
    """|dy|, max / mean |dS_c| on our S_c grid, same patch."""
    s_theirs = torch.as_tensor(theirs.saliency_map).float()[..., ::4, ::4]
    s_ours = ours_out[OutputKey.SALIENCY].float()
    their_corner = np.asarray(theirs.patch_locations).reshape(-1, 2)[0].astype(int).tolist()
    our_corner = ours_out["patch_boxes"][0, 0, :2].tolist()
    d = (s_ours - s_theirs).abs()
    return {
        "max_abs_dy": float((ours_out["y_global"].float() - y_theirs.float()).abs().max()),
        "max_abs_dS_c": float(d.max()),
        "mean_abs_dS_c": float(d.mean()),
        "same_patch": their_corner == our_corner,
        "patch_theirs": their_corner,
        "patch_ours": our_corner,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference-code", type=Path, required=True, help="a clone of github.com/nyukat/GLAM")
    parser.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"))
    parser.add_argument("--image", type=Path, default=SAMPLE_VIEW, help="a mammogram (default: the sample exam)")
    parser.add_argument("--height", type=int, default=2944)
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--repeats", type=int, default=6, help="calls of each model (orders alternate)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    stand_ins = install_stand_ins()
    if stand_ins:
        print(f"stand-ins for modules the authors' forward pass does not use: {', '.join(stand_ins)}")
    theirs = reference_model(args.reference_code.resolve(), (args.height, args.width))
    state = {k: v.detach().clone() for k, v in theirs.state_dict().items()}
    precision = resolve_precision(args.precision, "cpu")
    ours = optimize_for_inference(load_nyukat_glam(state), precision)
    image = full_size_image(args.image, (args.height, args.width))

    def run_theirs() -> torch.Tensor:
        with torch.no_grad():
            return theirs(image)

    def run_ours() -> dict:
        with torch.no_grad():
            return ours(image)

    y_theirs, ours_out = run_theirs(), run_ours()  # warm-up, and the outputs compared
    times: dict[str, dict[str, list[float]]] = {
        "theirs": {"first": [], "second": []},
        "ours": {"first": [], "second": []},
    }
    for i in range(args.repeats):
        order = (
            (("theirs", run_theirs), ("ours", run_ours)) if i % 2 == 0 else (("ours", run_ours), ("theirs", run_theirs))
        )
        for position, (name, fn) in zip(("first", "second"), order):
            start = time.perf_counter()
            fn()
            times[name][position].append(time.perf_counter() - start)

    def summary(values: list[float]) -> dict:
        return {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values), "n": len(values)}

    result = {
        "input": [1, 1, args.height, args.width],
        "image": str(args.image),
        "threads": torch.get_num_threads(),
        "precision": precision,
        "stand_ins": stand_ins,
        "timings": {
            name: {
                **summary(by_pos["first"] + by_pos["second"]),
                "first": summary(by_pos["first"]) if by_pos["first"] else None,
                "second": summary(by_pos["second"]) if by_pos["second"] else None,
            }
            for name, by_pos in times.items()
        },
        "outputs": compare_outputs(theirs, y_theirs, ours_out),
    }
    result["ratio_of_medians"] = result["timings"]["ours"]["median_s"] / result["timings"]["theirs"]["median_s"]
    for name, t in result["timings"].items():
        orders = ", ".join(
            f"{pos}: median {t[pos]['median_s']:.3f} s (n {t[pos]['n']})" for pos in ("first", "second") if t[pos]
        )
        print(f"{name:>6}: median {t['median_s']:.3f} s, min {t['min_s']:.3f}, max {t['max_s']:.3f} ({orders})")
    print(
        f"ours / theirs (medians): {result['ratio_of_medians']:.3f}, precision {precision}, {result['threads']} threads"
    )
    o = result["outputs"]
    print(
        f"|dy| {o['max_abs_dy']:.2e}   max |dS_c| {o['max_abs_dS_c']:.2e}   mean |dS_c| {o['mean_abs_dS_c']:.2e}   "
        f"same patch: {o['same_patch']} (theirs {o['patch_theirs']}, ours {o['patch_ours']})"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
