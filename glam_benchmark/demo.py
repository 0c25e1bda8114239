"""Demo forward pass of GLAM on a synthetic mammogram: prints the predictions and writes a saliency PNG.

    python -m glam_benchmark.demo --out output/demo_saliency.png

The weights are random (the trained bundle comes with the training workflow), so the maps show the pipeline
(global map, selected patches, S_l and S_c at a quarter of the input resolution), not a diagnosis. By default the
model is CPU-sized (736x480 image, 128 px patches, ResNet-18-HR of width 16); ``--full`` runs the paper's
2944x1920 model (about 730 GFLOP: several seconds on a CPU).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from glam_benchmark.synthetic import SyntheticConfig, SyntheticMammogramGenerator
from scripts.atomic import atomic_path
from scripts.enums import MAP_NAMES
from scripts.networks import GLAM


def _to_uint8(a: np.ndarray) -> np.ndarray:
    lo, hi = float(a.min()), float(a.max())
    return np.zeros(a.shape, np.uint8) if hi <= lo else ((a - lo) / (hi - lo) * 255).astype(np.uint8)


def _heat(image: np.ndarray, saliency: np.ndarray, colour: tuple[int, int, int]) -> Image.Image:
    """Grey image with the saliency (values in [0, 1]) blended in ``colour``."""
    grey = np.repeat(_to_uint8(image)[..., None], 3, axis=2).astype(np.float32)
    alpha = np.clip(saliency, 0, 1)[..., None] * 0.8
    return Image.fromarray((grey * (1 - alpha) + np.array(colour, np.float32) * alpha).astype(np.uint8))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("output/demo_saliency.png"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--full", action="store_true", help="the paper's full-size model and image")
    args = parser.parse_args(argv)

    size = (2944, 1920) if args.full else (736, 480)
    generator = SyntheticMammogramGenerator(SyntheticConfig(size=size, lesion_prevalence=1.0), seed=args.seed)
    case = generator.generate(0, "L", "CC")
    image = case.image.astype(np.float32)
    standardised = (image - image.mean()) / max(float(image.std()), 1e-5)

    torch.manual_seed(args.seed)
    kwargs = {} if args.full else {"patch_size": 128, "local_depth": 18, "local_width": 16}
    model = GLAM(**kwargs).eval()
    with torch.inference_mode():
        out = model(torch.from_numpy(standardised)[None, None])
        full = model.full_resolution(out, size)

    y = out["y_global"][0].tolist()
    print(f"image: synthetic {size[0]}x{size[1]}, label [benign, malignant] = {case.label}")
    print(f"y_global (benign, malignant) = ({y[0]:.3f}, {y[1]:.3f})   [random weights]")
    print(f"patch boxes (row, col, height, width): {out['patch_boxes'][0].tolist()}")

    panels = []
    for title, maps in ((name, full[name]) for name in MAP_NAMES):
        s = maps[0].numpy()
        panel = _heat(image, s[0], (0, 200, 0))  # benign in green
        panel = Image.blend(panel, _heat(image, s[1], (220, 0, 0)), 0.5)  # malignant in red
        draw = ImageDraw.Draw(panel)
        for r, c, h, w in out["patch_boxes"][0].tolist():
            draw.rectangle([c, r, c + w - 1, r + h - 1], outline=(0, 120, 255), width=max(1, size[1] // 240))
        draw.text((8, 8), title, fill=(255, 255, 0))
        panels.append(panel)
    grey = Image.fromarray(_to_uint8(image)).convert("RGB")
    mask = np.zeros(size + (3,), np.uint8)
    mask[case.mask_benign > 0] = (0, 200, 0)
    mask[case.mask_malignant > 0] = (220, 0, 0)
    truth = Image.blend(grey, Image.fromarray(mask), 0.35)
    ImageDraw.Draw(truth).text((8, 8), "image + masks", fill=(255, 255, 0))
    sheet = Image.new("RGB", (size[1] * 4, size[0]))
    for i, p in enumerate([truth, *panels]):
        sheet.paste(p, (i * size[1], 0))
    with atomic_path(args.out, staged_name=args.out.name + ".tmp.png") as tmp:
        sheet.save(tmp)  # the format from the staged name's extension
    print(f"wrote {args.out}")
    return {"y_global": y, "patch_boxes": out["patch_boxes"][0].tolist(), "png": str(args.out)}


if __name__ == "__main__":
    main()
