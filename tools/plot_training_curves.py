"""Training curves of a GLAM training run from its TensorBoard scalars, as one PNG (bundle/docs/README.md).

    python tools/plot_training_curves.py runs/curves/eval bundle/docs/training_curves.png

Reads ``<output_root>/<stage>/events.out.tfevents.*`` of each stage that has them and draws, per stage, the epoch
means of the loss terms (``train_bce_*``, ``train_l1_*``, ``train_loss_epoch``; log scale: the sparsity terms are
orders of magnitude below the BCE terms) and the validation metrics (``val_*``) per epoch. Pillow only (no
matplotlib in the project's requirements).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bundle"))

from scripts.enums import STAGES  # noqa: E402

LOSS_TAGS = ("train_loss_epoch", "train_bce_global", "train_l1_global", "train_bce_local", "train_l1_local")
LOSS_TAGS += ("train_bce_fusion",)
VAL_TAGS = ("val_soft_dice", "val_dice_benign", "val_dice_malignant", "val_pointing_game", "val_auc_benign")
VAL_TAGS += ("val_auc_malignant",)
PALETTE = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75))

Series = Mapping[str, Sequence[tuple[int, float]]]


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of the event files in ``log_dir`` -> [(step, value)] sorted by step (the last value of a
    step wins when a resumed run wrote it twice)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: dict[str, dict[int, float]] = {}
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            tags.setdefault(tag, {}).update({e.step: float(e.value) for e in acc.Scalars(tag)})
    return {tag: sorted(values.items()) for tag, values in tags.items()}


def _font(size: int = 13):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: a fixed-size bitmap font
        return ImageFont.load_default()


def line_panel(series: Series, title: str, log_y: bool = False, size: tuple[int, int] = (580, 300)) -> np.ndarray:
    """A line chart of ``series`` (name -> [(epoch, value)]) with axes, ticks and a legend -> (H, W, 3) uint8.
    Non-finite values (an AUC with one class absent) and, on a log scale, values <= 0 are left out."""
    from PIL import Image, ImageDraw

    width, height = size
    left, right, top, bottom = 62, 130, 26, 34  # the legend goes right of the plot
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    font = _font()
    draw.text((left, 6), title, fill="black", font=font)

    def keep(v: float) -> bool:
        return math.isfinite(v) and (v > 0 or not log_y)

    points = {k: [(s, math.log10(v) if log_y else v) for s, v in pts if keep(v)] for k, pts in series.items()}
    points = {k: p for k, p in points.items() if p}
    if not points:
        draw.text((left, height // 2), "no data", fill="gray", font=font)
        return np.asarray(img)
    xs = [s for p in points.values() for s, _ in p]
    ys = [v for p in points.values() for _, v in p]
    x0, x1 = min(xs), max(max(xs), min(xs) + 1)
    y0, y1 = min(ys), max(ys)
    if log_y:
        y0, y1 = math.floor(y0), math.ceil(y1) if math.ceil(y1) > math.floor(y0) else math.floor(y0) + 1
    else:
        pad = 0.05 * (y1 - y0) if y1 > y0 else 0.5
        y0, y1 = y0 - pad, y1 + pad

    def px(x: float, y: float) -> tuple[float, float]:
        return (
            left + (x - x0) / (x1 - x0) * (width - left - right),
            height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom),
        )

    draw.rectangle([left, top, width - right, height - bottom], outline="black")
    for x in range(int(x0), int(x1) + 1):
        u, _ = px(x, y0)
        draw.line([u, height - bottom, u, height - bottom + 4], fill="black")
        draw.text((u - 3, height - bottom + 6), str(x), fill="black", font=font)
    draw.text(((left + width - right) / 2 - 15, height - 14), "epoch", fill="black", font=font)
    ticks = range(int(y0), int(y1) + 1) if log_y else np.linspace(y0, y1, 5)
    for t in ticks:
        _, v = px(x0, t)
        draw.line([left - 4, v, left, v], fill="black")
        label = f"1e{int(t)}" if log_y else f"{t:.3g}"
        draw.text((4, v - 7), label, fill="black", font=font)
    for i, (name, pts) in enumerate(points.items()):
        colour = PALETTE[i % len(PALETTE)]
        xy = [px(s, v) for s, v in pts]
        if len(xy) > 1:
            draw.line(xy, fill=colour, width=2)
        for u, v in xy:
            draw.ellipse([u - 3, v - 3, u + 3, v + 3], fill=colour)
        draw.text((width - right + 10, top + 4 + 14 * i), name, fill=colour, font=font)
    return np.asarray(img)


def curves_figure(log_root: Path, stages: Sequence[str] = STAGES) -> np.ndarray:
    """One row per stage found under ``log_root``: its loss terms (log scale) and its validation metrics."""
    rows = []
    for stage in stages:
        if not (log_root / stage).is_dir():
            continue
        scalars = read_scalars(log_root / stage)
        losses = {t.removeprefix("train_"): scalars[t] for t in LOSS_TAGS if t in scalars}
        metrics = {t.removeprefix("val_"): scalars[t] for t in VAL_TAGS if t in scalars}
        rows.append(
            np.concatenate(
                [
                    line_panel(losses, f"{stage} stage: loss terms (epoch means)", log_y=True),
                    line_panel(metrics, f"{stage} stage: validation"),
                ],
                axis=1,
            )
        )
    if not rows:
        raise FileNotFoundError(f"no stage folder ({', '.join(stages)}) under {log_root}")
    return np.concatenate(rows, axis=0)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: the run's ``output_root`` and the PNG to write."""
    from PIL import Image

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output_root", type=Path, help="the training run's output_root (<output_root>/<stage>/)")
    parser.add_argument("png", type=Path, help="the figure to write")
    args = parser.parse_args(argv)
    args.png.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(curves_figure(args.output_root)).save(args.png, optimize=True)
    print(args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
