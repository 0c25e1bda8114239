#!/usr/bin/env python
"""Generate the synthetic mammogram data set (images, per-class masks, patient-split datalist.json).

Examples:
    python -m glam_benchmark.synthetic --out data/synthetic --n 200 --size 736 480 --seed 0 --format png
    python -m glam_benchmark.synthetic --out data/synthetic_dcm --n 40 --format dcm --photometric mix
    python -m glam_benchmark.synthetic --preview docs/images/synthetic_examples.png --seed 0

See docs/data.md for what the generator models and how its difficulty was calibrated.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from glam_benchmark.synthetic import (
    BENIGN_TYPES,
    MALIGNANT_TYPES,
    SyntheticCase,
    SyntheticConfig,
    SyntheticMammogramGenerator,
    make_synthetic_dataset,
)
from scripts.atomic import atomic_path
from scripts.enums import LesionClass

BENIGN_RGB = (60, 220, 60)
MALIGNANT_RGB = (255, 50, 50)


def _display(image: np.ndarray, breast: np.ndarray) -> np.ndarray:
    """12-bit image -> 8-bit RGB with a window over the breast's 0.5-99.8 percentiles."""
    vals = image[breast] if breast.any() else image.ravel()
    lo, hi = np.percentile(vals, [0.5, 99.8])
    out = np.clip((image.astype(np.float32) - lo) / max(hi - lo, 1.0), 0, 1) * 255
    out[~breast] = 0
    return np.repeat(out.astype(np.uint8)[..., None], 3, axis=2)


def _outline(mask: np.ndarray, thickness: int = 1) -> np.ndarray:
    from scipy import ndimage

    m = mask.astype(bool)
    edge = m & ~ndimage.binary_erosion(m)
    return ndimage.binary_dilation(edge, iterations=thickness - 1) if thickness > 1 else edge


def _downsample(rgb: np.ndarray, masks: list[np.ndarray], factor: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Box-downsample an RGB image; masks keep any covered pixel so tiny clusters stay visible."""
    h, w = (rgb.shape[0] // factor) * factor, (rgb.shape[1] // factor) * factor
    small = rgb[:h, :w].reshape(h // factor, factor, w // factor, factor, 3).mean(axis=(1, 3)).astype(np.uint8)
    small_masks = [m[:h, :w].reshape(h // factor, factor, w // factor, factor).any(axis=(1, 3)) for m in masks]
    return small, small_masks


def _lesion_mask(case: SyntheticCase, les: dict) -> np.ndarray:
    """The mask pixels of one lesion (its class mask restricted to its bounding box)."""
    r0, c0, r1, c1 = les["bbox"]
    full = case.mask_benign if les["class"] == LesionClass.BENIGN else case.mask_malignant
    own = np.zeros(full.shape, dtype=bool)
    own[r0:r1, c0:c1] = full[r0:r1, c0:c1] > 0
    return own


def _draw(rgb: np.ndarray, mask_b: np.ndarray, mask_m: np.ndarray, thickness: int = 1) -> np.ndarray:
    out = rgb.copy()
    out[_outline(mask_b, thickness)] = BENIGN_RGB
    out[_outline(mask_m, thickness)] = MALIGNANT_RGB
    return out


def render_preview(cases: list[SyntheticCase], path: Path, n_full: int = 6, crop: int = 72, zoom: int = 3) -> None:
    """A grid: top row ``n_full`` whole views with mask outlines (benign green, malignant red), bottom row a
    zoomed crop per lesion type, without and with its outline."""
    from PIL import Image, ImageDraw

    tiles = []
    for case in cases[:n_full]:
        rgb = _display(case.image, case.breast_mask)
        small, (mb, mm) = _downsample(rgb, [case.mask_benign, case.mask_malignant], 2)
        tile = _draw(small, mb, mm)
        title = f"{case.laterality}-{case.view}  label b={case.label[0]} m={case.label[1]}"
        tiles.append((tile, title))
    crops = []
    for kind in BENIGN_TYPES + MALIGNANT_TYPES:
        # the most conspicuous example of the kind: the least compact mask (spicules present, particles spread)
        found = [
            (_outline(_lesion_mask(c, les)).sum() ** 2 / max(les["area"], 1), i, c, les)
            for i, c in enumerate(cases)
            for les in c.lesions
            if les["kind"] == kind
        ]
        if not found:
            continue
        _, _, case, les = max(found, key=lambda t: (t[0], -t[1]))
        r, c = (int(v) for v in les["center"])
        h, w = case.image.shape
        r0, c0 = min(max(r - crop // 2, 0), h - crop), min(max(c - crop // 2, 0), w - crop)
        window = (slice(r0, r0 + crop), slice(c0, c0 + crop))
        rgb = _display(case.image[window], case.breast_mask[window])  # a window of its own per crop
        mb = case.mask_benign[r0 : r0 + crop, c0 : c0 + crop]
        mm = case.mask_malignant[r0 : r0 + crop, c0 : c0 + crop]
        big = np.kron(rgb, np.ones((zoom, zoom, 1), dtype=np.uint8))
        big_b, big_m = np.kron(mb, np.ones((zoom, zoom), np.uint8)), np.kron(mm, np.ones((zoom, zoom), np.uint8))
        crops.append((big, kind.replace("_", " ")))
        crops.append((_draw(big, big_b, big_m), "mask outline"))

    pad, text_h = 6, 16
    top_w = sum(t.shape[1] for t, _ in tiles) + pad * (len(tiles) + 1)
    bottom_w = sum(t.shape[1] for t, _ in crops) + pad * (len(crops) + 1)
    top_h = max(t.shape[0] for t, _ in tiles) + text_h
    bottom_h = (max(t.shape[0] for t, _ in crops) + text_h) if crops else 0
    canvas = Image.new("RGB", (max(top_w, bottom_w), top_h + bottom_h + 3 * pad), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for row, y0 in ((tiles, pad), (crops, top_h + 2 * pad)):
        x = pad
        for tile, title in row:
            draw.text((x, y0), title, fill=(0, 0, 0))
            canvas.paste(Image.fromarray(tile), (x, y0 + text_h))
            x += tile.shape[1] + pad
    with atomic_path(path) as tmp:
        canvas.save(tmp, format="PNG", optimize=True)


def preview_cases(seed: int, size: tuple[int, int], n_full: int = 6) -> list[SyntheticCase]:
    """Views for the preview: a lesion-free MLO, then the views of 12 patients with lesions in every breast."""
    gen = SyntheticMammogramGenerator(SyntheticConfig(size=size, lesion_prevalence=1.0), seed)
    cases: list[SyntheticCase] = []
    for patient in range(12):
        for side in ("L", "R"):
            for view in ("CC", "MLO"):
                case = gen.generate(patient, side, view)
                if case.lesions or len(cases) < n_full:  # the crops pick their examples among all of these
                    cases.append(case)
    negative = SyntheticMammogramGenerator(SyntheticConfig(size=size, lesion_prevalence=0.0), seed).generate(
        0, "L", "MLO"
    )
    return [negative] + cases


def _oracle_dice(mask: np.ndarray, cell: int) -> float:
    """Best Dice of any binary map that is constant on ``cell`` x ``cell`` blocks (a saliency map of that
    resolution upsampled): take blocks in decreasing lesion coverage, keep the best prefix."""
    h, w = (mask.shape[0] // cell) * cell, (mask.shape[1] // cell) * cell
    counts = mask[:h, :w].reshape(h // cell, cell, w // cell, cell).sum(axis=(1, 3)).ravel()
    counts = np.sort(counts[counts > 0])[::-1].astype(np.float64)
    k = np.arange(1, counts.size + 1)
    return float((2 * np.cumsum(counts) / (k * cell * cell + mask.sum())).max())


def _pool(a: np.ndarray, cell: int) -> np.ndarray:
    h, w = (a.shape[0] // cell) * cell, (a.shape[1] // cell) * cell
    return a[:h, :w].reshape(h // cell, cell, w // cell, cell).mean(axis=(1, 3))


def calibration_table(n_breasts: int, seed: int, size: tuple[int, int]) -> str:
    """Markdown table of lesion statistics over ``n_breasts`` positive breasts (one view each), the numbers in
    docs/data.md: size, contrast (to texture std, to noise), CNR against a ring around the mask, best Dice
    reachable at the global module's saliency resolutions, and the lesion's signal after 16x16 / 4x4 average
    pooling relative to the clutter of pooled lesion-free tissue."""
    from dataclasses import replace

    from scipy import ndimage

    cfg = SyntheticConfig(size=size, lesion_prevalence=1.0)
    quiet = replace(cfg, noise_gain=0.0, electronic_noise=0.0)
    gen, gen_q = SyntheticMammogramGenerator(cfg, seed), SyntheticMammogramGenerator(quiet, seed)
    gen_0 = SyntheticMammogramGenerator(replace(quiet, lesion_prevalence=0.0), seed)
    stats: dict[str, list[dict[str, float]]] = {}
    sigma, noise = [], []
    for i in range(n_breasts):
        patient, side, view = i // 2, "LR"[i % 2], ("CC", "MLO")[(i // 2) % 2]
        case, clean, empty = (g.generate(patient, side, view) for g in (gen, gen_q, gen_0))
        breast = case.breast_mask
        img = case.image.astype(np.float64)
        sigma.append(case.sigma_tex)
        noise.append(float((img - clean.image)[breast].std()))
        signal = clean.image.astype(np.float64) - empty.image
        clutter = {
            c: _pool(empty.image.astype(np.float64), c)[_pool(breast.astype(float), c) == 1].std() for c in (4, 16)
        }
        for les in case.lesions:
            r0, c0, r1, c1 = les["bbox"]
            full = (case.mask_benign if les["class"] == LesionClass.BENIGN else case.mask_malignant).astype(bool)
            own = np.zeros_like(full)
            own[r0:r1, c0:c1] = full[r0:r1, c0:c1]
            if not own.any():
                continue
            ring = ndimage.binary_dilation(own, iterations=8) & ~ndimage.binary_dilation(own, iterations=3) & breast
            rows, cols = np.nonzero(own)
            d = {
                "area % of image": 100 * own.sum() / own.size,
                "extent % of width": 100 * (max(np.ptp(rows), np.ptp(cols)) + 1) / size[1],
                "CNR vs ring": (img[own].mean() - img[ring].mean()) / max(img[ring].std(), 1e-6),
                "peak / texture std": signal[r0:r1, c0:c1].max() / case.sigma_tex,
                "peak / noise std": signal[r0:r1, c0:c1].max() / max(noise[-1], 1e-6),
                "best Dice 46x30": _oracle_dice(own, size[1] // 30),
                "best Dice 92x60": _oracle_dice(own, size[1] // 60),
                "best Dice 184x120": _oracle_dice(own, size[1] // 120),
                "pooled signal / clutter, 1/16": _pool(signal, size[1] // 30).max() / clutter[16],
                "pooled signal / clutter, 1/4": _pool(signal, size[1] // 120).max() / clutter[4],
            }
            stats.setdefault(les["kind"], []).append(d)
    kinds = [k for k in BENIGN_TYPES + MALIGNANT_TYPES if k in stats]
    lines = [
        f"{n_breasts} positive breasts at {size[0]}x{size[1]}, seed {seed}: texture std {np.median(sigma):.0f} counts "
        f"(median; 10-90 %: {np.percentile(sigma, 10):.0f}-{np.percentile(sigma, 90):.0f}), "
        f"noise std {np.median(noise):.0f} counts; cells: median (10th-90th percentile)",
        "",
        "| measure | " + " | ".join(f"{k.replace('_', ' ')} (n={len(stats[k])})" for k in kinds) + " |",
        "|---|" + "---|" * len(kinds),
    ]
    for key in stats[kinds[0]][0]:
        cells = []
        for k in kinds:
            v = np.array([d[key] for d in stats[k]])
            cells.append(f"{np.median(v):.2f} ({np.percentile(v, 10):.2f}-{np.percentile(v, 90):.2f})")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="output folder (images/, masks/, datalist.json, generator.json)")
    parser.add_argument("--n", type=int, default=200, help="number of images (4 views per patient)")
    parser.add_argument("--size", type=int, nargs=2, default=(736, 480), metavar=("H", "W"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--format", choices=("png", "dcm", "nii"), default="png")
    parser.add_argument("--fractions", type=float, nargs=3, default=(0.7, 0.15, 0.15), metavar=("TRAIN", "VAL", "TEST"))
    parser.add_argument(
        "--prevalence", type=float, default=None, help="fraction of breasts with lesions (default 0.4; NYU: 0.014)"
    )
    parser.add_argument(
        "--facing", choices=("right", "native"), default=None, help="default: native for dcm, right otherwise"
    )
    parser.add_argument("--photometric", choices=("MONOCHROME2", "MONOCHROME1", "mix"), default="MONOCHROME2")
    parser.add_argument("--calc-mask", choices=("cluster", "particles"), default="cluster")
    parser.add_argument("--workers", type=int, default=1, help="processes (images are independent)")
    parser.add_argument("--preview", type=Path, help="write a PNG grid of examples with mask outlines and exit")
    parser.add_argument(
        "--calibration", type=int, metavar="BREASTS", help="print lesion statistics over BREASTS breasts and exit"
    )
    args = parser.parse_args(argv)

    size = (int(args.size[0]), int(args.size[1]))
    if args.calibration is not None:
        print(calibration_table(args.calibration, args.seed, size))
        return 0
    if args.preview is not None:
        render_preview(preview_cases(args.seed, size), args.preview)
        print(f"wrote {args.preview}")
        return 0
    if args.out is None:
        parser.error("--out is required (or --preview PNG)")
    try:
        config = SyntheticConfig(size=size, calc_mask=args.calc_mask)
        t0 = time.perf_counter()
        path = make_synthetic_dataset(
            args.out,
            args.n,
            size=size,
            seed=args.seed,
            fmt=args.format,
            fractions=args.fractions,
            lesion_prevalence=args.prevalence,
            facing=args.facing,
            photometric=args.photometric,
            config=config,
            workers=args.workers,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - t0
    print(f"wrote {args.n} images and {path} in {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
