"""The benchmark's figures: the per-image Dice scatter of GLAM's S_g vs S_l (the paper's Figure 4,
:func:`dice_scatter`), the qualitative examples (a few test images through each model with the bundle's own
evaluation pipeline, :func:`example_rows`, :func:`examples_figure`), GLAM's global module scale by scale
(:func:`global_scale_models`), and :func:`make_figures`, which makes those a run's results allow."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scripts.enums import CLASS_NAMES, MAP_NAMES, MapName, Stage

from . import EVAL_CONFIG, TRAIN_CONFIG
from .files import write_png
from .metrics import CLASSES
from .presets import Budget
from .report import ModelResult
from .steps import Runner


def _font(size: int = 14) -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: a fixed-size bitmap font
        return ImageFont.load_default()


def per_image_dice(
    csv_path: Path, maps: Sequence[str] = (MapName.GLOBAL, MapName.LOCAL)
) -> dict[str, list[tuple[float, ...]]]:
    """Per class, the (map_0, map_1, ...) soft Dice of every image that has a lesion of the class, from a
    ``metrics.csv`` (empty cells: no lesion of that class)."""
    out: dict[str, list[tuple[float, ...]]] = {c: [] for c in CLASSES}
    with open(csv_path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            for cls in CLASSES:
                cells = [row.get(f"{m}_dice_{cls}", "") for m in maps]
                if all(cells):
                    out[cls].append(tuple(float(c) for c in cells))
    return out


def dice_scatter(points: Mapping[str, Sequence[tuple[float, float]]], title: str, size: int = 520) -> np.ndarray:
    """Scatter of per-image Dice, S_g on x and S_l on y, one colour per class, the diagonal, axes from 0 to the
    largest value rounded up to 0.1 -> (size, size, 3) uint8."""
    from PIL import Image, ImageDraw

    from scripts.visualize import CLASS_COLOURS

    colours = dict(zip(CLASS_NAMES, CLASS_COLOURS))
    values = [v for pts in points.values() for p in pts for v in p]
    top = max(0.1, math.ceil(max(values, default=0.0) * 10 - 1e-9) / 10)
    img = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(img)
    font, small = _font(15), _font(12)
    left, bottom, right, top_margin = 76, size - 56, size - 20, 40
    span_x, span_y = right - left, bottom - top_margin

    def px(x: float, y: float) -> tuple[float, float]:
        return left + x / top * span_x, bottom - y / top * span_y

    draw.rectangle([left, top_margin, right, bottom], outline="black")
    for i in range(6):
        v = top * i / 5
        x, y = px(v, v)
        draw.line([x, bottom, x, bottom + 5], fill="black")
        draw.line([left - 5, y, left, y], fill="black")
        draw.text((x - 12, bottom + 8), f"{v:.2f}", fill="black", font=small)
        draw.text((left - 42, y - 7), f"{v:.2f}", fill="black", font=small)
    draw.line([*px(0, 0), *px(top, top)], fill=(150, 150, 150))
    for cls, pts in points.items():
        for x, y in pts:
            cx, cy = px(x, y)
            draw.ellipse([cx - 3, cy - 3, cx + 3, cy + 3], fill=colours[cls], outline=colours[cls])
    draw.text((left, 10), title, fill="black", font=font)
    draw.text((left + span_x // 2 - 70, size - 24), "Dice of S_g (global)", fill="black", font=font)
    label = Image.new("RGB", (160, 20), "white")
    ImageDraw.Draw(label).text((0, 0), "Dice of S_l (local)", fill="black", font=font)
    img.paste(label.rotate(90, expand=True), (4, top_margin + span_y // 2 - 80))
    for i, cls in enumerate(CLASSES):
        x0, y0 = left + 10, top_margin + 10 + 18 * i
        draw.ellipse([x0, y0 + 3, x0 + 8, y0 + 11], fill=colours[cls])
        draw.text((x0 + 14, y0), f"{cls} ({len(points.get(cls, []))})", fill="black", font=small)
    return np.asarray(img)


def _label_strip(titles: Sequence[str], width: int, separator: int, height: int = 22) -> np.ndarray:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (len(titles) * (width + separator) - separator, height), "white")
    draw = ImageDraw.Draw(img)
    for i, title in enumerate(titles):
        draw.text((i * (width + separator) + 4, 3), title, fill="black", font=_font(14))
    return np.asarray(img)


#: one model of a figure: config files, overrides, checkpoint (model.pt or a last.pt), {output map key: title}
FigureModel = tuple[list[Path], dict[str, Any], Path, dict[str, str]]


def example_rows(items: Sequence[Mapping[str, Any]], models: Sequence[FigureModel]) -> list[dict[str, np.ndarray]]:
    """Run each model once on each item with the bundle's evaluation pipeline, in this process.

    Per item returns ``image`` (H, W), ``mask`` (2, H, W) and, under its title, each (2, H, W) map a model's
    entry names, all at the preprocessed image's size; ``patch_boxes`` (K, 4) rows (top, left, height, width) when
    a model crops patches (GLAM).
    """
    import torch
    from monai.bundle import ConfigParser
    from monai.data import decollate_batch, list_data_collate

    rows: list[dict[str, np.ndarray]] = [{} for _ in items]
    for configs, overrides, ckpt, maps in models:
        parser = ConfigParser()
        parser.read_config([str(c) for c in configs])
        parser.update(dict(overrides))
        device = parser.get_parsed_content("device")
        network = parser.get_parsed_content("network_def").to(device)
        state = torch.load(ckpt, map_location=device, weights_only=True)
        # a workflow's last.pt holds the network beside the optimizer; model.pt is the plain state dict
        network.load_state_dict(state.get("network", state), strict=True)
        network.eval()
        preprocessing = parser.get_parsed_content("validate#preprocessing")
        prepare_batch = parser.get_parsed_content("validate#prepare_batch")
        postprocessing = parser.get_parsed_content("validate#postprocessing")
        for row, item in zip(rows, items):
            batch = list_data_collate([preprocessing(dict(item))])
            image, targets, args, kwargs = prepare_batch(batch, device)
            with torch.no_grad():
                pred = network(image, *args, **kwargs)
            # the evaluator's path: decollate {image, label, pred}, then the postprocessing per item
            out = postprocessing(decollate_batch({"image": image, "label": targets, "pred": pred})[0])
            for map_key, title in maps.items():
                row[title] = out[map_key].detach().float().cpu().numpy()
            if "patch_boxes" in pred:
                row["patch_boxes"] = pred["patch_boxes"][0].detach().cpu().numpy().astype(int)
            row["image"] = out["image"].detach().float().cpu().numpy()[0]
            row["mask"] = out["lesion_mask"].detach().float().cpu().numpy()
    return rows


def examples_figure(
    rows: Sequence[Mapping[str, np.ndarray]],
    titles: Sequence[str],
    separator: int = 4,
    boxes_on: Sequence[str] = (),
) -> np.ndarray:
    """One row per image: input, ground truth, then each model's map as a coloured overlay (benign green,
    malignant red), with the row's ``patch_boxes`` outlined on the panels named in ``boxes_on`` -> (H', W', 3)
    uint8."""
    from scripts.visualize import draw_boxes, overlay

    strips = []
    h, w = rows[0]["image"].shape
    strips.append(_label_strip(["input", "ground truth", *titles], w, separator))
    for row in rows:
        panels = [overlay(row["image"], np.zeros((0, h, w))), overlay(row["image"], 0.5 * (row["mask"] > 0))]
        for t in titles:
            panel = overlay(row["image"], row[t])
            if t in boxes_on and "patch_boxes" in row:
                draw_boxes(panel, row["patch_boxes"].tolist(), width=max(1, h // 240))
            panels.append(panel)
        line = np.full((h, len(panels) * (w + separator) - separator, 3), 255, np.uint8)
        for i, p in enumerate(panels):
            line[:, i * (w + separator) : i * (w + separator) + w] = p
        strips.append(line)
        strips.append(np.full((separator, line.shape[1], 3), 255, np.uint8))
    return np.concatenate(strips[:-1], axis=0)


def pick_examples(test_items: Sequence[Mapping[str, Any]], n: int) -> list[Mapping[str, Any]]:
    """Up to ``n`` test images with a lesion, alternating malignant and benign ones, in split order."""
    malignant = [it for it in test_items if (it.get("label") or [0, 0])[1]]
    benign = [it for it in test_items if (it.get("label") or [0, 0])[0] and not (it.get("label") or [0, 0])[1]]
    picked: list[Mapping[str, Any]] = []
    while len(picked) < n and (malignant or benign):
        for pool in (malignant, benign):
            if pool and len(picked) < n:
                picked.append(pool.pop(0))
    return picked


def _figure_titles(models: Sequence[FigureModel]) -> list[str]:
    return [title for *_, maps in models for title in maps.values()]


#: GLAM's global maps in the scales figure: output key -> title
GLOBAL_SCALE_MAPS = {"S_0": "S_0 (finest)", "S_1": "S_1", "S_2": "S_2 (coarsest)", MapName.GLOBAL: str(MapName.GLOBAL)}


def global_scale_models(configs: Sequence[Path], overrides: Mapping[str, Any], global_dir: Path) -> list[FigureModel]:
    """The :func:`example_rows` entries of GLAM's global module, every scale: the checkpoint the workflow selected
    (``model.pt``, the one the local stage started from) and the last epoch of the same run (``last.pt``)."""
    overrides = {**overrides, "stage": Stage.GLOBAL, "validate#postprocessing#scales": True}
    return [
        (
            list(configs),
            overrides,
            global_dir / ckpt,
            {key: f"{when} {title}" for key, title in GLOBAL_SCALE_MAPS.items()},
        )
        for when, ckpt in (("selected", "model.pt"), ("last", "last.pt"))
    ]


def make_figures(
    results: Mapping[str, ModelResult],
    work_dir: Path,
    docs_dir: Path,
    datalist: Path,
    budget: Budget,
    preset: Path,
    common: Mapping[str, Any],
    runner: Runner,
    prefix: str = "benchmark",
) -> dict[str, Path | None]:
    """The scatter (GLAM's joint test CSV) and the qualitative examples (each model run on a few test images), as
    ``<docs_dir>/images/<prefix>_*.png``."""
    import torch

    from scripts.data.datalist import load_datalist, resolve_paths

    figures: dict[str, Path | None] = {"scatter": None, "examples": None, "scales": None, "glam": None}
    images = docs_dir / "images"
    glam = results.get("glam")
    if glam is not None and glam.test_csv is not None and glam.test_csv.is_file():
        points = per_image_dice(glam.test_csv)
        figures["scatter"] = images / f"{prefix}_dice_scatter.png"
        write_png(figures["scatter"], dice_scatter(points, "GLAM (joint), test split: per-image Dice"))
    shown = [k for k in ("cam", "gmic", "glam") if k in results and results[k].selected is not None]
    ready = [k for k in shown if results[k].test is not None]
    if budget.examples == 0 or len(ready) != len(shown) or not ready:
        if budget.examples:
            runner.skip("examples_figure", "a model's test evaluation is missing")
        return figures
    content = resolve_paths(load_datalist(datalist), datalist.parent)
    items = pick_examples(content.get("test", []), budget.examples)
    if not items:
        runner.skip("examples_figure", "the test split has no image with a lesion")
        return figures
    models = []
    for key in ready:
        r = results[key]
        trial_dir = work_dir / key / f"trial_{r.selected:02d}"
        spec = r.spec
        configs = spec.configs(preset, evaluate=True)
        overrides = dict(r.trials[r.selected]["overrides"])
        if key == "glam":
            ckpt, title, map_key = (
                trial_dir / "models" / Stage.JOINT / "model.pt",
                f"GLAM {MapName.COMBINED}",
                MapName.COMBINED,
            )
            overrides["stage"] = Stage.JOINT
        else:
            ckpt, title, map_key = trial_dir / "models" / key / "model.pt", spec.title, MapName.GLOBAL
        models.append((configs, overrides, ckpt, {map_key: title}))
    torch.set_num_threads(max(1, runner.threads))
    figures["examples"] = images / f"{prefix}_examples.png"
    write_png(figures["examples"], examples_figure(example_rows(items, models), _figure_titles(models)))
    if "glam" in ready:
        configs, overrides, ckpt, _ = models[ready.index("glam")]
        glam_model = [(configs, overrides, ckpt, {name: name for name in MAP_NAMES})]
        figures["glam"] = images / f"{prefix}_glam_maps.png"
        glam_rows = example_rows(items, glam_model)
        write_png(
            figures["glam"], examples_figure(glam_rows, list(MAP_NAMES), boxes_on=(MapName.LOCAL, MapName.COMBINED))
        )
        r = results["glam"]
        global_dir = work_dir / "glam" / f"trial_{r.selected:02d}" / "models" / Stage.GLOBAL
        scale_models = global_scale_models(
            [TRAIN_CONFIG, preset, EVAL_CONFIG], dict(r.trials[r.selected]["overrides"]), global_dir
        )
        figures["scales"] = images / f"{prefix}_global_scales.png"
        write_png(figures["scales"], examples_figure(example_rows(items, scale_models), _figure_titles(scale_models)))
    return figures
