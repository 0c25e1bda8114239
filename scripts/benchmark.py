#!/usr/bin/env python
"""The GLAM paper's Table-1 benchmark on synthetic mammograms: GLAM (three stages), CAM, GMIC and a fully
supervised U-Net, each tuned by the same random search, selected by validation Dice and evaluated on the test split.

    python scripts/benchmark.py --preset configs/benchmark_cpu.yaml          # about 45 minutes on 2 CPU cores
    python scripts/benchmark.py --preset configs/benchmark_full.yaml         # the paper's image size, for a GPU

What it does, in order (every step is a subprocess of the bundle's own workflows, ``python -m monai.bundle run
training|evaluating`` with config lists and overrides, so nothing of training or evaluation is re-implemented):

1. generates the preset's synthetic dataset (fixed seed, training/validation/test split by patient) under
   ``<work_dir>/data`` and checks it once;
2. per model, ``benchmark#trials`` trials with hyper-parameters drawn from ``configs/benchmark_search.yaml``
   (the same number of trials and epochs for every model): each trains the model's one stage (GLAM: its global
   stage) with the workflow's checkpoint selection by validation Dice, then evaluates that checkpoint on the
   validation split (``metrics.json``); the trial with the best validation Dice (mean over the two classes of the
   mean soft Dice of the model's map) is kept;
3. GLAM: the local and joint stages train from the selected global module; the local-stage model (S_g, S_l and
   their average S_c-sep: the paper's Table 2) and the joint model (S_c) are evaluated on the test split;
   each baseline's selected checkpoint is evaluated on the test split (its map is the report's ``S_g`` row);
4. writes ``results.md`` (the paper's Table 1 and Table 2 layouts, relative gains over GMIC, the acceptance
   conditions, every trial, hardware, wall times, dataset settings), ``images/benchmark_dice_scatter.png``
   (per-image Dice of S_g vs S_l of the joint GLAM on the test split, from its ``metrics.csv``: the paper's
   Figure 4) and ``images/benchmark_examples.png`` (test images with lesions: input, ground truth, CAM, GMIC,
   GLAM S_c, each model run on them with the bundle's own preprocessing, network and postprocessing).

Resumable: a step whose output exists (a trial's ``validation/metrics.json``, a stage's ``*_trained.json``, a
test ``metrics.json``) is skipped, and an interrupted training continues from its ``last.pt``. A failed step is
reported and the steps that do not depend on it still run; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
BUNDLE_ROOT = REPO_ROOT / "bundle"
if str(BUNDLE_ROOT) not in sys.path:
    sys.path.insert(0, str(BUNDLE_ROOT))

TRAIN_CONFIG = BUNDLE_ROOT / "configs" / "train.yaml"
EVAL_CONFIG = BUNDLE_ROOT / "configs" / "evaluate.yaml"
META_FILE = BUNDLE_ROOT / "configs" / "metadata.json"
DEFAULT_SEARCH = REPO_ROOT / "configs" / "benchmark_search.yaml"

CLASSES = ("malignant", "benign")  # the paper's column order
#: the report's column groups: (key in a table row, title)
METRIC_GROUPS = (
    ("dice", "Dice"),
    ("pxap_image", "image-level PxAP"),
    ("pxap_dataset", "dataset-level PxAP"),
    ("auc", "classification AUC"),
)
#: the paper's Table 1 (GLAM_SPEC.md section 7; NYU data, test set), shown for reference next to ours
PAPER_TABLE1 = {
    "GLAM": {
        "dice": (0.390, 0.335),
        "pxap_image": (0.461, 0.396),
        "pxap_dataset": (0.341, 0.215),
        "auc": (0.882, 0.770),
    },
    "GMIC": {
        "dice": (0.325, 0.240),
        "pxap_image": (0.396, 0.283),
        "pxap_dataset": (0.295, 0.112),
        "auc": (0.886, 0.780),
    },
    "CAM": {
        "dice": (0.250, 0.207),
        "pxap_image": (0.279, 0.222),
        "pxap_dataset": (0.226, 0.084),
        "auc": (0.894, 0.770),
    },
    "U-Net": {
        "dice": (0.504, 0.412),
        "pxap_image": (0.589, 0.498),
        "pxap_dataset": (0.452, 0.265),
        "auc": (None, None),
    },
}
#: an AUC within this distance of a baseline's counts as "very similar classification accuracy" (the paper)
AUC_TOLERANCE = 0.03


FINDINGS_FILE = "results_findings.md"


@dataclass(frozen=True)
class ModelSpec:
    """One benchmarked model: its name (folder and search-space key), its title in the tables and the bundle
    overlay that turns train.yaml's ``global`` stage into it (None: GLAM itself)."""

    name: str
    title: str
    overlay: Path | None


MODELS: dict[str, ModelSpec] = {
    "glam": ModelSpec("glam", "GLAM", None),
    "cam": ModelSpec("cam", "CAM", BUNDLE_ROOT / "configs" / "baseline_cam.yaml"),
    "gmic": ModelSpec("gmic", "GMIC", BUNDLE_ROOT / "configs" / "baseline_gmic.yaml"),
    "unet": ModelSpec("unet", "U-Net", BUNDLE_ROOT / "configs" / "baseline_unet.yaml"),
}


class BenchmarkError(ValueError):
    """A preset, search space or previous run that the benchmark cannot use; the message names it."""


# ---------------------------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    """The same budget for every model: ``trials`` random-search trials of ``epochs`` epochs of the model's one
    stage (GLAM: its global stage), then GLAM's local and joint stages with ``local_epochs`` / ``joint_epochs``
    from the selected global module; ``examples`` test images in the qualitative figure. ``model_overrides``: per
    model, config ids set on its command lines (they win over the overlays, which are layered after the preset)."""

    search_space: str
    trials: int
    epochs: int
    local_epochs: int
    joint_epochs: int
    examples: int
    model_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)


def _load_yaml(path: Path) -> dict[str, Any]:
    from monai.bundle import ConfigParser

    if not Path(path).is_file():
        raise BenchmarkError(f"{path}: file not found")
    try:
        content = ConfigParser.load_config_file(str(path))
    except Exception as err:  # yaml/json syntax errors: name the file
        raise BenchmarkError(f"{path}: cannot read ({err})") from err
    if not isinstance(content, dict):
        raise BenchmarkError(f"{path}: expected a mapping at the top level, got {type(content).__name__}")
    return content


def _positive_int(value: Any, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < minimum:
        raise BenchmarkError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _model_overrides(value: Any, preset: Path) -> dict[str, dict[str, Any]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(v, Mapping) for v in value.values()):
        raise BenchmarkError(f"{preset}: benchmark#model_overrides must map a model to {{config id: value}}")
    unknown = sorted(set(value) - set(MODELS))
    if unknown:
        raise BenchmarkError(f"{preset}: benchmark#model_overrides: unknown model(s) {unknown} (have {sorted(MODELS)})")
    return {str(k): dict(v) for k, v in value.items()}


def read_preset(preset: Path) -> tuple[dict[str, Any], Budget]:
    """The merged ``train.yaml`` + preset configuration (raw, unparsed) and the benchmark budget it declares.

    The preset must set ``benchmark: {search_space, trials, examples}`` (optionally ``model_overrides``) and
    per-stage ``epochs``; the epochs of the ``global`` entry are every model's trial length.
    """
    from monai.bundle import ConfigParser

    content = _load_yaml(preset)
    section = content.get("benchmark")
    if not isinstance(section, Mapping):
        raise BenchmarkError(
            f"{preset}: a benchmark preset needs a 'benchmark' section (search_space, trials, examples)"
        )
    for key in ("search_space", "trials", "examples"):
        if key not in section:
            raise BenchmarkError(f"{preset}: 'benchmark' lacks {key!r}")
    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(preset)])
    config = parser.get()
    epochs = config.get("epochs")
    if not isinstance(epochs, Mapping) or not all(k in epochs for k in ("global", "local", "joint")):
        raise BenchmarkError(f"{preset}: 'epochs' must give the global, local and joint epochs, got {epochs!r}")
    budget = Budget(
        search_space=str(section["search_space"]),
        trials=_positive_int(section["trials"], f"{preset}: benchmark#trials"),
        epochs=_positive_int(epochs["global"], f"{preset}: epochs#global"),
        local_epochs=_positive_int(epochs["local"], f"{preset}: epochs#local"),
        joint_epochs=_positive_int(epochs["joint"], f"{preset}: epochs#joint"),
        examples=_positive_int(section["examples"], f"{preset}: benchmark#examples", minimum=0),
        model_overrides=_model_overrides(section.get("model_overrides"), preset),
    )
    if not isinstance(config.get("learning_rate"), Mapping):
        raise BenchmarkError(f"{preset}: 'learning_rate' must be per stage (global, local, joint)")
    return config, budget


@dataclass(frozen=True)
class SearchSpace:
    """Per parameter name, ``("log10_uniform", (lo, hi))`` or ``("choice", values)``; per model, which config id
    each parameter sets."""

    name: str
    params: dict[str, tuple[str, tuple[float, ...]]]
    models: dict[str, dict[str, str]]
    seed: int


def load_search_space(path: Path, name: str) -> SearchSpace:
    """Read ``spaces[name]`` and ``models`` from the search file; every model's parameters must exist in the space."""
    content = _load_yaml(path)
    spaces = content.get("spaces")
    if not isinstance(spaces, Mapping) or name not in spaces:
        known = sorted(spaces) if isinstance(spaces, Mapping) else []
        raise BenchmarkError(f"{path}: no search space {name!r} under 'spaces' (have {known})")
    params: dict[str, tuple[str, tuple[float, ...]]] = {}
    for key, spec in spaces[name].items():
        where = f"{path}: spaces#{name}#{key}"
        if not isinstance(spec, Mapping) or len(spec) != 1:
            raise BenchmarkError(f"{where} must be {{log10_uniform: [lo, hi]}} or {{choice: [...]}}, got {spec!r}")
        kind, values = next(iter(spec.items()))
        if kind == "log10_uniform":
            if not (isinstance(values, Sequence) and len(values) == 2 and float(values[0]) <= float(values[1])):
                raise BenchmarkError(f"{where}: log10_uniform needs [lo, hi] with lo <= hi, got {values!r}")
        elif kind == "choice":
            if not (isinstance(values, Sequence) and len(values) > 0):
                raise BenchmarkError(f"{where}: choice needs a non-empty list, got {values!r}")
        else:
            raise BenchmarkError(f"{where}: unknown kind {kind!r} (log10_uniform or choice)")
        params[str(key)] = (kind, tuple(float(v) for v in values))
    models = content.get("models")
    if not isinstance(models, Mapping):
        raise BenchmarkError(f"{path}: needs a 'models' mapping (model -> {{config id: space parameter}})")
    mapping: dict[str, dict[str, str]] = {}
    for model, ids in models.items():
        if model not in MODELS:
            raise BenchmarkError(f"{path}: models#{model}: unknown model (have {sorted(MODELS)})")
        for config_id, param in (ids or {}).items():
            if param not in params:
                raise BenchmarkError(f"{path}: models#{model}#{config_id} uses {param!r}, not in spaces#{name}")
        mapping[str(model)] = {str(k): str(v) for k, v in (ids or {}).items()}
    missing = sorted(set(MODELS) - set(mapping))
    if missing:
        raise BenchmarkError(f"{path}: models lacks {missing}")
    return SearchSpace(name, params, mapping, int(content.get("seed", 0)))


def sample_trials(space: SearchSpace, model: str, n: int) -> list[dict[str, float]]:
    """``n`` trials of ``model``: config id -> value, drawn from a generator seeded by (space seed, model name),
    so a model's trials do not depend on the other models or on the order they run in, and trial k is the same
    whatever ``n`` is. Log-uniform parameters are 10^u, u uniform in [lo, hi]."""
    if model not in space.models:
        raise BenchmarkError(f"no search parameters for model {model!r}")
    rng = np.random.default_rng([space.seed, zlib.crc32(model.encode())])
    trials = []
    for _ in range(int(n)):
        values: dict[str, float] = {}
        for config_id, param in space.models[model].items():
            kind, bounds = space.params[param]
            if kind == "log10_uniform":
                values[config_id] = float(10.0 ** rng.uniform(bounds[0], bounds[1]))
            else:
                values[config_id] = float(bounds[int(rng.integers(len(bounds)))])
        trials.append(values)
    return trials


def trial_overrides(params: Mapping[str, float], learning_rate: Mapping[str, float]) -> dict[str, Any]:
    """Bundle overrides of one trial: the searched learning rate replaces the ``global`` stage's (the stage every
    model's search trains), the other ids are set as drawn."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key == "learning_rate":
            out["learning_rate"] = {**{k: float(v) for k, v in learning_rate.items()}, "global": float(value)}
        else:
            out[key] = float(value)
    return out


# ---------------------------------------------------------------------------------------------------------------
# running the bundle's workflows
# ---------------------------------------------------------------------------------------------------------------
def _cli_value(value: Any) -> str:
    """A value as MONAI's command line (python-fire) parses it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple, float, int)):
        return repr(value)
    return str(value)


def bundle_command(run_id: str, configs: Sequence[Path], overrides: Mapping[str, Any]) -> list[str]:
    """``python -m monai.bundle run <run_id> --config_file [...] --meta_file ... --<id> <value>...``."""
    cmd = [sys.executable, "-m", "monai.bundle", "run", run_id]
    cmd += ["--config_file", repr([str(c) for c in configs]), "--meta_file", str(META_FILE)]
    for key, value in overrides.items():
        cmd += [f"--{key}", _cli_value(value)]
    return cmd


@dataclass
class Step:
    """One unit of work: a bundle command whose ``done_file`` proves it finished (then it is skipped)."""

    name: str
    command: list[str]
    done_file: Path
    marker: bool = False  # the driver writes done_file itself (training); else the workflow writes it (metrics.json)


@dataclass
class Runner:
    """Runs steps one at a time (the machine may be shared), logs each to ``<work_dir>/logs/<name>.log``, records
    wall times in ``<work_dir>/timings.json`` and remembers failures."""

    work_dir: Path
    threads: int
    quiet: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        path = self.work_dir / "timings.json"
        if path.is_file():
            self.timings = {str(k): float(v) for k, v in json.loads(path.read_text()).items()}

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[key] = str(self.threads)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BUNDLE_ROOT), env.get("PYTHONPATH", "")) if p)
        return env

    def _log(self, message: str) -> None:
        if not self.quiet:
            print(f"[benchmark {datetime.now():%H:%M:%S}] {message}", flush=True)

    def run(self, step: Step) -> bool:
        """Run ``step`` unless its output exists; False when it failed (the reason is in :attr:`failures`)."""
        if step.done_file.is_file():
            self._log(f"{step.name}: done already ({step.done_file})")
            return True
        log = self.work_dir / "logs" / f"{step.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log(f"{step.name}: running (log {log})")
        start = time.monotonic()
        with open(log, "w", encoding="utf-8") as f:
            f.write(shlex.join(step.command) + "\n\n")
            f.flush()
            done = subprocess.run(step.command, cwd=REPO_ROOT, env=self.env(), stdout=f, stderr=subprocess.STDOUT)
        wall = time.monotonic() - start
        if done.returncode != 0:
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-5:]
            self.failures[step.name] = f"exit status {done.returncode}; log {log}; last lines: " + " | ".join(tail)
            self._log(f"{step.name}: FAILED after {wall:.0f} s ({self.failures[step.name]})")
            return False
        if step.marker:
            _write_json(step.done_file, {"step": step.name, "wall_s": wall, "command": shlex.join(step.command)})
        elif not step.done_file.is_file():
            self.failures[step.name] = f"finished without writing {step.done_file}; log {log}"
            return False
        self.timings[step.name] = wall
        _write_json(self.work_dir / "timings.json", self.timings)
        self._log(f"{step.name}: finished in {wall:.0f} s")
        return True

    def skip(self, step_name: str, reason: str) -> None:
        self.failures.setdefault(step_name, f"not run: {reason}")


def _write_json(path: Path, content: Any) -> None:
    from scripts.atomic import atomic_write

    with atomic_write(path, "w") as f:
        f.write(json.dumps(content, indent=2, allow_nan=False) + "\n")


def _write_text(path: Path, text: str) -> None:
    from scripts.atomic import atomic_write

    with atomic_write(path, "w") as f:
        f.write(text)


def _write_png(path: Path, rgb: np.ndarray) -> None:
    from PIL import Image

    from scripts.atomic import atomic_write

    with atomic_write(path, "wb") as f:
        Image.fromarray(rgb).save(f, format="PNG")


# ---------------------------------------------------------------------------------------------------------------
# metrics
# ---------------------------------------------------------------------------------------------------------------
def read_metrics(path: Path) -> dict[str, Any]:
    """A ``metrics.json`` written by the bundle's ``MetricsReport``."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise BenchmarkError(f"{path}: cannot read the metrics report ({err})") from err


def validation_dice(summary: Mapping[str, Any], map_key: str = "S_g") -> float:
    """The selection score of a trial: mean over the classes of the map's mean soft Dice (the workflow's key
    metric); classes without a lesion image in the split are left out; NaN when no class has one."""
    stats = summary["metrics"][map_key]
    values = [stats[c]["dice_mean"] for c in summary["classes"] if stats[c]["dice_mean"] is not None]
    return float(np.mean(values)) if values else float("nan")


def table_row(summary: Mapping[str, Any], map_key: str) -> dict[str, dict[str, float | None]]:
    """One row of Table 1 from a metrics.json: ``{"dice": {class: mean}, "dice_std": ..., "pxap_image": ...,
    "pxap_image_std": ..., "pxap_dataset": ..., "auc": ...}``, classes by name."""
    stats = summary["metrics"][map_key]
    classes = list(summary["classes"])
    row: dict[str, dict[str, float | None]] = {
        "dice": {c: stats[c]["dice_mean"] for c in classes},
        "dice_std": {c: stats[c]["dice_std"] for c in classes},
        "pxap_image": {c: stats[c]["pxap_image_mean"] for c in classes},
        "pxap_image_std": {c: stats[c]["pxap_image_std"] for c in classes},
        "pxap_dataset": {c: stats[c]["pxap_dataset"] for c in classes},
        "auc": {c: summary["classification_auc"][c] for c in classes},
    }
    return row


def relative_gain(ours: float | None, theirs: float | None) -> float | None:
    """(ours - theirs) / theirs, None where undefined (missing value or theirs <= 0)."""
    if ours is None or theirs is None or theirs <= 0 or math.isnan(ours) or math.isnan(theirs):
        return None
    return (ours - theirs) / theirs


@dataclass(frozen=True)
class Check:
    """One acceptance condition: what was compared, the values, whether it holds."""

    condition: str
    detail: str
    holds: bool


def _value(rows: Mapping[str, Any], model: str, metric: str, cls: str) -> float | None:
    value = rows.get(model, {}).get(metric, {}).get(cls)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def acceptance_checks(rows: Mapping[str, Mapping[str, Mapping[str, float | None]]]) -> list[Check]:
    """The benchmark's acceptance conditions on Table-1 rows keyed ``GLAM``, ``GMIC``, ``CAM``, ``U-Net``:

    - GLAM S_c beats CAM and GMIC (strictly) on Dice, image-level PxAP and dataset-level PxAP, both classes;
    - GLAM's AUC is within :data:`AUC_TOLERANCE` of CAM's and of GMIC's, both classes;
    - the U-Net is above GLAM (strictly) on Dice, image-level PxAP and dataset-level PxAP, both classes.

    A missing value (a failed model, a class without lesion images) fails its check.
    """
    checks = []

    def fmt(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f}"

    for metric, title in METRIC_GROUPS[:3]:
        for other in ("CAM", "GMIC"):
            for cls in CLASSES:
                ours, theirs = _value(rows, "GLAM", metric, cls), _value(rows, other, metric, cls)
                holds = ours is not None and theirs is not None and ours > theirs
                checks.append(Check(f"GLAM beats {other}: {title} {cls}", f"{fmt(ours)} vs {fmt(theirs)}", holds))
    for other in ("CAM", "GMIC"):
        for cls in CLASSES:
            ours, theirs = _value(rows, "GLAM", "auc", cls), _value(rows, other, "auc", cls)
            holds = ours is not None and theirs is not None and abs(ours - theirs) <= AUC_TOLERANCE + 1e-12
            diff = "n/a" if ours is None or theirs is None else f"{ours - theirs:+.3f}"
            checks.append(
                Check(
                    f"GLAM AUC within {AUC_TOLERANCE} of {other}: {cls}",
                    f"{fmt(ours)} vs {fmt(theirs)} ({diff})",
                    holds,
                )
            )
    for metric, title in METRIC_GROUPS[:3]:
        for cls in CLASSES:
            unet, ours = _value(rows, "U-Net", metric, cls), _value(rows, "GLAM", metric, cls)
            holds = unet is not None and ours is not None and unet > ours
            checks.append(Check(f"U-Net above GLAM: {title} {cls}", f"{fmt(unet)} vs {fmt(ours)}", holds))
    return checks


# ---------------------------------------------------------------------------------------------------------------
# figures
# ---------------------------------------------------------------------------------------------------------------
def _font(size: int = 14) -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: a fixed-size bitmap font
        return ImageFont.load_default()


def per_image_dice(csv_path: Path, maps: Sequence[str] = ("S_g", "S_l")) -> dict[str, list[tuple[float, ...]]]:
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

    colours = {"benign": CLASS_COLOURS[0], "malignant": CLASS_COLOURS[1]}
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
    entry names, all at the preprocessed image's size.
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
            row["image"] = out["image"].detach().float().cpu().numpy()[0]
            row["mask"] = out["lesion_mask"].detach().float().cpu().numpy()
    return rows


def examples_figure(rows: Sequence[Mapping[str, np.ndarray]], titles: Sequence[str], separator: int = 4) -> np.ndarray:
    """One row per image: input, ground truth, then each model's map as a coloured overlay (benign green,
    malignant red) -> (H', W', 3) uint8."""
    from scripts.visualize import overlay

    strips = []
    h, w = rows[0]["image"].shape
    strips.append(_label_strip(["input", "ground truth", *titles], w, separator))
    for row in rows:
        panels = [overlay(row["image"], np.zeros((0, h, w))), overlay(row["image"], 0.5 * (row["mask"] > 0))]
        panels += [overlay(row["image"], row[t]) for t in titles]
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


# ---------------------------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------------------------
def _fmt(value: float | None, std: float | None = None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if std is None else f"{value:.3f} ± {std:.3f}"


def _table1_lines(rows: Mapping[str, Any], label: str) -> list[str]:
    """Markdown table in the paper's Table-1 layout; a row that is not a mapping is shown as a word in every cell."""
    head = f"| {label} | " + " | ".join(f"{title} {c}" for _, title in METRIC_GROUPS for c in CLASSES) + " |"
    lines = [head, "|---" * (1 + 2 * len(METRIC_GROUPS)) + "|"]
    for name, row in rows.items():
        if not isinstance(row, Mapping):  # None: the model's steps failed; or a word saying why there is no row
            word = "failed" if row is None else str(row)
            lines.append(f"| {name} | " + " | ".join([word] * (2 * len(METRIC_GROUPS))) + " |")
            continue
        cells = []
        for key, _ in METRIC_GROUPS:
            for c in CLASSES:
                std = row.get(f"{key}_std", {}).get(c) if key in ("dice", "pxap_image") else None
                cells.append(_fmt(row[key][c], std) if key != "auc" or row[key][c] is not None else "n/a")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _hardware(threads: int) -> list[str]:
    import monai
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    device = f"CUDA: {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "CPU"
    return [
        f"- CPU: {cpu}; {os.cpu_count()} logical cores, {usable} usable by this process; "
        f"OMP_NUM_THREADS={threads} for every workflow",
        f"- device the workflows trained and evaluated on: {device}",
        f"- Python {platform.python_version()}, torch {torch.__version__}, MONAI {monai.__version__}, "
        f"{platform.system()} {platform.release()}",
    ]


def _dataset_lines(datalist: Path) -> list[str]:
    from dataclasses import asdict

    from scripts.data.synthetic import SyntheticConfig

    lines = []
    generator = datalist.parent / "generator.json"
    if generator.is_file():
        desc = json.loads(generator.read_text())
        config = desc.get("config", {})
        defaults = asdict(SyntheticConfig())
        changed = {
            k: v for k, v in config.items() if k != "size" and defaults.get(k) != _tuple_like(v, defaults.get(k))
        }
        lines.append(
            f"- generator `scripts.data.synthetic` (seed {desc.get('seed')}, {desc.get('n')} images, "
            f"{config.get('size', ['?', '?'])[0]}x{config.get('size', ['?', '?'])[1]}, format {desc.get('format')}); "
            f"`{_display_path(datalist)}`"
        )
        if changed:
            settings = ", ".join(
                f"`{k}` {_short(v)} (default {_short(defaults[k])})" for k, v in sorted(changed.items())
            )
            lines.append(f"- settings that differ from the generator's calibrated defaults: {settings}")
        else:
            lines.append("- every generator setting at its calibrated default (docs/data.md)")
    content = json.loads(datalist.read_text())
    for split in ("training", "validation", "test"):
        items = content.get(split, [])
        patients = len({it.get("patient_id") for it in items})
        benign = sum(1 for it in items if (it.get("label") or [0, 0])[0])
        malignant = sum(1 for it in items if (it.get("label") or [0, 0])[1])
        lines.append(
            f"- {split}: {len(items)} images of {patients} patients; with a benign lesion {benign}, "
            f"with a malignant lesion {malignant}"
        )
    return lines


def _display_path(path: Path) -> Path:
    """Relative to the repository when inside it (what a reader can use), else as is."""
    path = Path(path)
    return path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path


def _tuple_like(value: Any, reference: Any) -> Any:
    return tuple(value) if isinstance(reference, tuple) and isinstance(value, list) else value


def _short(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    return f"{int(seconds // 60)} min {int(round(seconds % 60)):02d} s"


@dataclass
class ModelResult:
    """What the driver learned about one model: its trials, the selected one, its test report(s), wall time."""

    spec: ModelSpec
    trials: list[dict[str, Any]] = field(default_factory=list)
    selected: int | None = None
    test: dict[str, Any] | None = None  # GLAM: the joint model's report
    test_local: dict[str, Any] | None = None  # GLAM: the local-stage model's report (Table 2)
    test_csv: Path | None = None
    wall_s: float = 0.0
    wall_complete: bool = True


def write_results(
    path: Path,
    docs_dir: Path,
    results: Mapping[str, ModelResult],
    *,
    command: str,
    preset: Path,
    search_path: Path,
    space: SearchSpace,
    budget: Budget,
    datalist: Path,
    threads: int,
    total_wall_s: float,
    steps_wall_s: float,
    failures: Mapping[str, str],
    figures: Mapping[str, Path | None],
) -> dict[str, Any]:
    """Write results.md; returns the Table-1 rows and the checks (for the console and the tests)."""
    table1: dict[str, Any] = {}
    glam = results.get("glam")
    for key, map_key in (("glam", "S_c"), ("gmic", "S_g"), ("cam", "S_g"), ("unet", "S_g")):
        r = results.get(key)
        table1[MODELS[key].title] = (table_row(r.test, map_key) if r.test else None) if r else "not run"
    checks = acceptance_checks({k: v for k, v in table1.items() if isinstance(v, Mapping)})
    rel = lambda p: os.path.relpath(p, path.parent).replace(os.sep, "/")  # noqa: E731
    now = datetime.now(timezone.utc).astimezone()

    lines = [
        "# Benchmark: the GLAM paper's Table 1 on synthetic mammograms",
        "",
        f"Generated by `scripts/benchmark.py` on {now:%Y-%m-%d %H:%M %Z}. Wall time of all the workflow steps: "
        f"{_minutes(steps_wall_s)}; of this invocation of the driver: {_minutes(total_wall_s)} (they differ when "
        "an earlier, interrupted invocation ran some of the steps: those count with their recorded times). "
        "Every number below is read from the workflows' own reports (`metrics.json` / `metrics.csv`).",
        "",
        "```bash",
        command,
        "```",
        "",
        "## Setup",
        "",
        *_hardware(threads),
        f"- preset `{preset}`, search space `{space.name}` of `{search_path}` (seed {space.seed})",
        "",
        "Data:",
        "",
        *_dataset_lines(datalist),
        "",
        "Budget, the same for every model: "
        f"{budget.trials} random-search trial(s) of {budget.epochs} epoch(s) of the model's one stage (GLAM: its "
        "global stage; each epoch is every training image with a lesion plus as many lesion-free ones), the "
        "checkpoint of each trial selected by validation Dice by the workflow, the trial with the best validation "
        f"Dice kept. GLAM then trains its local stage for {budget.local_epochs} and its joint stage for "
        f"{budget.joint_epochs} epoch(s) from the selected global module (the paper: 30 trials of 50 epochs, "
        "then 20 local and < 5 joint epochs). This budget is tiny: the numbers show how the models compare after "
        "minutes of training on synthetic data, not what they reach, and a different seed can reorder close "
        "rows.",
        "",
    ]
    if failures:
        lines += ["**Steps that failed or did not run** (their rows are marked failed):", ""]
        lines += [f"- `{name}`: {why}" for name, why in failures.items()]
        lines += [""]

    lines += [
        "## Table 1: GLAM and the baselines (test split)",
        "",
        "GLAM's map is S_c of the jointly trained model; each baseline's is its only map (the `S_g` row of its "
        "report). Dice and PxAP: mean ± population std over the test images with a lesion of the class; AUC of "
        "each model's classification output (GLAM: y_global; CAM: its pooled map; GMIC: y_fusion; U-Net: its "
        "top-t% pooled map, reported for completeness: the paper gives none).",
        "",
        *_table1_lines(table1, "model"),
        "",
        "The paper's Table 1 (NYU screening data, test set), for reference:",
        "",
    ]
    paper_rows = {name: {k: dict(zip(CLASSES, v)) for k, v in values.items()} for name, values in PAPER_TABLE1.items()}
    lines += _table1_lines(paper_rows, "model (paper)")
    lines += ["", "## Relative Dice gain of GLAM over GMIC", ""]
    lines += ["| class | GLAM S_c | GMIC | gain (ours) | gain (paper) |", "|---|---|---|---|---|"]
    for i, cls in enumerate(CLASSES):
        ours = _value(table1, "GLAM", "dice", cls)
        theirs = _value(table1, "GMIC", "dice", cls)
        gain = relative_gain(ours, theirs)
        paper = relative_gain(PAPER_TABLE1["GLAM"]["dice"][i], PAPER_TABLE1["GMIC"]["dice"][i])
        lines.append(
            f"| {cls} | {_fmt(ours)} | {_fmt(theirs)} | {'n/a' if gain is None else f'{gain:+.0%}'} | {paper:+.0%} |"
        )
    n_hold = sum(c.holds for c in checks)
    lines += [
        "",
        "## Acceptance conditions",
        "",
        f"{n_hold} of {len(checks)} hold. GLAM S_c must beat CAM and GMIC (strictly) on malignant and benign Dice, "
        f"image-level and dataset-level PxAP; its AUC must be within {AUC_TOLERANCE} of CAM's and GMIC's; the "
        "fully supervised U-Net must be above GLAM on the segmentation metrics.",
        "",
        "| condition | values | holds |",
        "|---|---|---|",
    ]
    lines += [f"| {c.condition} | {c.detail} | {'yes' if c.holds else '**no**'} |" for c in checks]
    # what a person found when looking at a run (why a condition fails, what the benchmark needs): kept beside the
    # generated file and included verbatim, so a re-run does not lose it
    findings = docs_dir / FINDINGS_FILE
    if findings.is_file():
        lines += ["", "## Findings", "", f"(from `{FINDINGS_FILE}`, written after looking at this run)", ""]
        lines += [findings.read_text(encoding="utf-8").strip(), ""]

    lines += ["", "## Table 2: GLAM's maps (ablation, test split)", ""]
    lines += [
        "S_g: the global module trained alone; S_l: the local module trained on its patches with the global "
        "module frozen; S_c-sep: their average before joint training (these three from the local-stage model); "
        "S_g, S_l, S_c-joint of the jointly trained model (S_c-joint is GLAM's row of Table 1).",
        "",
    ]
    ablation: dict[str, dict[str, Any] | None] = {}
    if glam is not None:
        local, joint = glam.test_local, glam.test
        ablation["S_g (global alone)"] = table_row(local, "S_g") if local else None
        ablation["S_l (local, global frozen)"] = table_row(local, "S_l") if local else None
        ablation["S_c-sep"] = table_row(local, "S_c") if local else None
        ablation["S_g after joint training"] = table_row(joint, "S_g") if joint else None
        ablation["S_l after joint training"] = table_row(joint, "S_l") if joint else None
        ablation["**S_c-joint (GLAM)**"] = table_row(joint, "S_c") if joint else None
    else:
        ablation["GLAM"] = "not run"
    lines += _table1_lines(ablation, "map")

    lines += ["", "## Figures", ""]
    scatter, examples, scales = figures.get("scatter"), figures.get("examples"), figures.get("scales")
    if scatter is not None:
        lines += [
            f"![per-image Dice of S_g vs S_l]({rel(scatter)})",
            "",
            "Per-image soft Dice of S_g (x) and S_l (y) of the jointly trained GLAM on the test images with a "
            "lesion of the class (the paper's Figure 4; from the `S_g_dice_*` and `S_l_dice_*` columns of its "
            "test `metrics.csv`). Points above the diagonal: the local map is better.",
            "",
        ]
    if examples is not None:
        lines += [
            f"![examples]({rel(examples)})",
            "",
            "Test images with lesions: the input, the ground truth (benign green, malignant red), and each "
            "model's map in the same colours (CAM's and GMIC's maps are coarse: 1/64 of the input's height and width, "
            "upsampled by nearest neighbour).",
            "",
        ]
    if scales is not None:
        lines += [
            f"![GLAM's global module per scale]({rel(scales)})",
            "",
            "GLAM's global module on the same test images, scale by scale: S_0, S_1 and S_2 (1/16, 1/32 and 1/64 "
            "of the input, nearest-upsampled) and their weighted sum S_g, first from the checkpoint its workflow "
            "selected by validation Dice (the one the local and joint stages started from), then from the last "
            "epoch of the same training run. Where a scale lights up away from the lesion, at the image border, "
            "its units answer for the whole image rather than for the place they sit at.",
            "",
        ]

    lines += ["## Wall time per model", ""]
    lines += ["| model | wall time | what it covers |", "|---|---|---|"]
    for key, r in results.items():
        what = f"{len(r.trials)} trial(s): training + validation evaluation; test evaluation"
        if key == "glam":
            what += "; local and joint stages; test evaluation of the local-stage model"
        note = "" if r.wall_complete else " (some steps have no recorded time)"
        lines.append(f"| {r.spec.title} | {_minutes(r.wall_s)}{note} | {what} |")

    lines += ["", "## Every trial", ""]
    lines += [
        "Hyper-parameters drawn by random search (log-uniform learning rate and lambda, t from the paper's set; "
        "see the search file) and the validation soft Dice of the trial's selected checkpoint.",
        "",
        "| model | trial | learning rate | lambda | t | val Dice malignant | val Dice benign | val Dice (mean) "
        "| selected |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results.values():
        for t in r.trials:
            p = t["params"]
            t_value = p.get("t_global", p.get("cam_t"))
            val = t.get("validation")
            lines.append(
                f"| {r.spec.title} | {t['index']} | {p['learning_rate']:.2e} | "
                + (f"{p['lambda_sparsity']:.2e}" if "lambda_sparsity" in p else "-")
                + f" | {'-' if t_value is None else f'{t_value:g}'} | "
                + (
                    " | ".join(_fmt(val["dice"][c]) for c in CLASSES) + f" | {_fmt(t['score'])}"
                    if val
                    else "failed | failed | failed"
                )
                + f" | {'**yes**' if r.selected == t['index'] else ''} |"
            )
    lines += [
        "",
        "## Reproduce",
        "",
        "The command above re-runs everything into its `--work_dir` (steps already done there are skipped). "
        "Each step's exact `python -m monai.bundle run ...` command is the first line of its log under "
        "`<work_dir>/logs/`.",
        "",
    ]
    _write_text(path, "\n".join(lines))
    return {"table1": table1, "checks": checks}


# ---------------------------------------------------------------------------------------------------------------
# the driver
# ---------------------------------------------------------------------------------------------------------------
def prepare_data(preset: Path, work_dir: Path, datalist: str | None) -> Path:
    """The preset's synthetic dataset under ``<work_dir>/data`` (generated once), or ``datalist``; checked once
    here so that the workflows can skip their own check."""
    from monai.bundle import ConfigParser

    from scripts.data import assert_datalist_ok

    if datalist is None:
        parser = ConfigParser()
        parser.read_config([str(TRAIN_CONFIG), str(preset)])
        if "benchmark_data_root" not in parser.get():
            raise BenchmarkError(f"{preset}: needs 'benchmark_data_root' (or pass --datalist)")
        parser["benchmark_data_root"] = str(work_dir / "data")
        datalist = str(parser.get_parsed_content("datalist"))
    path = Path(datalist).resolve()
    if not path.is_file():
        raise BenchmarkError(f"--datalist {path}: file not found")
    assert_datalist_ok(str(path))
    return path


def run_benchmark(args: argparse.Namespace, argv: Sequence[str]) -> int:
    start = time.monotonic()
    preset = Path(args.preset).resolve()
    config, budget = read_preset(preset)
    if args.trials is not None:
        budget = Budget(**{**budget.__dict__, "trials": args.trials})
    search_path = Path(args.search).resolve()
    space = load_search_space(search_path, budget.search_space)
    work_dir = Path(args.work_dir).resolve()
    docs_dir = Path(args.docs_dir).resolve()
    results_path = Path(args.results).resolve() if args.results else docs_dir / "results.md"
    work_dir.mkdir(parents=True, exist_ok=True)
    runner = Runner(work_dir, args.threads, quiet=args.quiet)
    datalist = prepare_data(preset, work_dir, args.datalist)
    common = {"datalist": str(datalist), "check_data": False, "bundle_root": str(BUNDLE_ROOT)}
    lr = config["learning_rate"]

    results: dict[str, ModelResult] = {}
    for name in args.models:
        spec = MODELS[name]
        result = ModelResult(spec)
        results[name] = result
        extra = [spec.overlay] if spec.overlay else []
        train_cfg = [TRAIN_CONFIG, preset, *extra]
        eval_cfg = [TRAIN_CONFIG, preset, EVAL_CONFIG, *extra]
        stage = {"stage": "global"} if spec.overlay is None else {}
        steps: list[str] = []
        for k, params in enumerate(sample_trials(space, name, budget.trials)):
            trial_dir = work_dir / name / f"trial_{k:02d}"
            record = {"model": name, "index": k, "params": params}
            saved = trial_dir / "trial.json"
            if saved.is_file():
                previous = json.loads(saved.read_text())
                if previous.get("params") != params:
                    raise BenchmarkError(
                        f"{saved}: this trial ran with {previous.get('params')}, the search now draws {params} "
                        "(another preset or search file?): use another --work_dir"
                    )
            else:
                _write_json(saved, record)
            folders = {"ckpt_root": str(trial_dir / "models"), "output_root": str(trial_dir / "eval")}
            overrides = {**common, **folders, **budget.model_overrides.get(name, {}), **trial_overrides(params, lr)}
            overrides.update(stage)
            train = Step(
                f"{name}_trial{k:02d}_train",
                bundle_command("training", train_cfg, {**overrides, "resume": True}),
                trial_dir / "global_trained.json",
                marker=True,
            )
            val_dir = trial_dir / "validation"
            validate = Step(
                f"{name}_trial{k:02d}_validation",
                bundle_command(
                    "evaluating", eval_cfg, {**overrides, "eval_split": "validation", "eval_dir": str(val_dir)}
                ),
                val_dir / "metrics.json",
            )
            steps += [train.name, validate.name]
            if runner.run(train) and runner.run(validate):
                summary = read_metrics(validate.done_file)
                record["validation"] = table_row(summary, "S_g")
                record["score"] = validation_dice(summary)
            else:
                runner.skip(validate.name, f"{train.name} failed")
            record["overrides"] = overrides
            result.trials.append(record)
        scored = [t for t in result.trials if "score" in t and not math.isnan(t["score"])]
        if not scored:
            runner.skip(f"{name}_test", "no trial finished with a validation Dice")
            continue
        best = max(scored, key=lambda t: (t["score"], -t["index"]))
        result.selected = best["index"]
        trial_dir = work_dir / name / f"trial_{best['index']:02d}"
        overrides = best["overrides"]
        if name == "glam":
            ok = True
            for stage_name in ("local", "joint"):
                step = Step(
                    f"glam_trial{best['index']:02d}_{stage_name}",
                    bundle_command("training", train_cfg, {**overrides, "stage": stage_name, "resume": True}),
                    trial_dir / f"{stage_name}_trained.json",
                    marker=True,
                )
                steps.append(step.name)
                ok = ok and runner.run(step)
            if ok:
                for stage_name, attr in (("local", "test_local"), ("joint", "test")):
                    eval_dir = trial_dir / f"test_{stage_name}"
                    step = Step(
                        f"glam_trial{best['index']:02d}_test_{stage_name}",
                        bundle_command(
                            "evaluating", eval_cfg, {**overrides, "stage": stage_name, "eval_dir": str(eval_dir)}
                        ),
                        eval_dir / "metrics.json",
                    )
                    steps.append(step.name)
                    if runner.run(step):
                        setattr(result, attr, read_metrics(step.done_file))
                        if stage_name == "joint":
                            result.test_csv = eval_dir / "metrics.csv"
        else:
            eval_dir = trial_dir / "test"
            step = Step(
                f"{name}_trial{best['index']:02d}_test",
                bundle_command("evaluating", eval_cfg, {**overrides, "eval_dir": str(eval_dir)}),
                eval_dir / "metrics.json",
            )
            steps.append(step.name)
            if runner.run(step):
                result.test = read_metrics(step.done_file)
                result.test_csv = eval_dir / "metrics.csv"
        timed = [runner.timings.get(s) for s in steps]
        result.wall_s = float(sum(t for t in timed if t is not None))
        result.wall_complete = all(t is not None for t in timed)

    figures = make_figures(results, work_dir, docs_dir, datalist, budget, preset, common, runner)
    total = time.monotonic() - start
    command = "python scripts/benchmark.py " + shlex.join(list(argv))
    out = write_results(
        results_path,
        docs_dir,
        results,
        command=command.strip(),
        preset=_display_path(preset),
        search_path=_display_path(search_path),
        space=space,
        budget=budget,
        datalist=datalist,
        threads=args.threads,
        total_wall_s=total,
        steps_wall_s=float(sum(runner.timings.values())),
        failures=runner.failures,
        figures=figures,
    )
    if not args.quiet:
        held = sum(c.holds for c in out["checks"])
        print(f"[benchmark] wrote {results_path}; {held} of {len(out['checks'])} acceptance checks hold", flush=True)
    if runner.failures:
        print("[benchmark] failed or skipped steps:\n" + "\n".join(f"  {k}: {v}" for k, v in runner.failures.items()))
        return 1
    return 0


def make_figures(
    results: Mapping[str, ModelResult],
    work_dir: Path,
    docs_dir: Path,
    datalist: Path,
    budget: Budget,
    preset: Path,
    common: Mapping[str, Any],
    runner: Runner,
) -> dict[str, Path | None]:
    """The scatter (GLAM's joint test CSV) and the qualitative examples (each model run on a few test images)."""
    import torch

    from scripts.data.datalist import load_datalist, resolve_paths

    figures: dict[str, Path | None] = {"scatter": None, "examples": None, "scales": None}
    images = docs_dir / "images"
    glam = results.get("glam")
    if glam is not None and glam.test_csv is not None and glam.test_csv.is_file():
        points = per_image_dice(glam.test_csv)
        figures["scatter"] = images / "benchmark_dice_scatter.png"
        _write_png(figures["scatter"], dice_scatter(points, "GLAM (joint), test split: per-image Dice"))
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
        configs = [TRAIN_CONFIG, preset, EVAL_CONFIG, *([spec.overlay] if spec.overlay else [])]
        overrides = dict(r.trials[r.selected]["overrides"])
        if key == "glam":
            ckpt, title, map_key = trial_dir / "models" / "joint" / "model.pt", "GLAM S_c", "S_c"
            overrides["stage"] = "joint"
        else:
            ckpt, title, map_key = trial_dir / "models" / key / "model.pt", spec.title, "S_g"
        models.append((configs, overrides, ckpt, {map_key: title}))
    torch.set_num_threads(max(1, runner.threads))
    figures["examples"] = images / "benchmark_examples.png"
    _write_png(figures["examples"], examples_figure(example_rows(items, models), _figure_titles(models)))
    if "glam" in ready:
        r = results["glam"]
        global_dir = work_dir / "glam" / f"trial_{r.selected:02d}" / "models" / "global"
        scale_models = global_scale_models(
            [TRAIN_CONFIG, preset, EVAL_CONFIG], dict(r.trials[r.selected]["overrides"]), global_dir
        )
        figures["scales"] = images / "benchmark_global_scales.png"
        _write_png(figures["scales"], examples_figure(example_rows(items, scale_models), _figure_titles(scale_models)))
    return figures


def _figure_titles(models: Sequence[FigureModel]) -> list[str]:
    return [title for *_, maps in models for title in maps.values()]


#: GLAM's global maps in the scales figure: output key -> title
GLOBAL_SCALE_MAPS = {"S_0": "S_0 (1/16)", "S_1": "S_1 (1/32)", "S_2": "S_2 (1/64)", "S_g": "S_g"}


def global_scale_models(configs: Sequence[Path], overrides: Mapping[str, Any], global_dir: Path) -> list[FigureModel]:
    """The :func:`example_rows` entries of GLAM's global module, every scale: the checkpoint the workflow selected
    (``model.pt``, the one the local stage started from) and the last epoch of the same run (``last.pt``)."""
    overrides = {**overrides, "stage": "global", "validate#postprocessing#scales": True}
    return [
        (
            list(configs),
            overrides,
            global_dir / ckpt,
            {key: f"{when} {title}" for key, title in GLOBAL_SCALE_MAPS.items()},
        )
        for when, ckpt in (("selected", "model.pt"), ("last", "last.pt"))
    ]


def _default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="GLAM's Table-1 benchmark: random search, training and test evaluation of GLAM, CAM, GMIC and "
        "a U-Net on a synthetic dataset, then docs/results.md and two figures.",
    )
    parser.add_argument("--preset", required=True, help="size preset, e.g. configs/benchmark_cpu.yaml")
    parser.add_argument("--search", default=str(DEFAULT_SEARCH), help="search space file (default %(default)s)")
    parser.add_argument("--work_dir", default="runs/benchmark", help="data, checkpoints, logs (default %(default)s)")
    parser.add_argument("--docs_dir", default="docs", help="folder of results.md and images/ (default %(default)s)")
    parser.add_argument("--results", default=None, help="results file (default <docs_dir>/results.md)")
    parser.add_argument("--datalist", default=None, help="use this datalist instead of the preset's synthetic data")
    parser.add_argument(
        "--models", nargs="+", default=list(MODELS), choices=list(MODELS), help="models to run (default: all)"
    )
    parser.add_argument("--trials", type=int, default=None, help="override the preset's number of trials")
    parser.add_argument(
        "--threads", type=int, default=_default_threads(), help="OMP_NUM_THREADS of each step (default: usable cores)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.trials is not None and args.trials < 1:
        parser.error(f"--trials must be >= 1, got {args.trials}")
    if not Path(args.preset).is_file():
        parser.error(f"--preset {args.preset}: file not found")
    if not Path(args.search).is_file():
        parser.error(f"--search {args.search}: file not found")
    args.models = list(dict.fromkeys(args.models))
    try:
        return run_benchmark(args, argv)
    except BenchmarkError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
