"""Writing ``results.md``: the paper's Table 1 and Table 2 layouts filled from the workflows' test reports, the
relative gains over GMIC, the acceptance conditions, the findings written by hand beside the file, the figures,
the hardware and dataset the run used, wall times and every trial (:func:`write_results`, from one
:class:`ModelResult` per model)."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from scripts.enums import CLASS_NAMES, LesionClass, MapName

from .files import write_text
from .metrics import (
    CLASSES,
    METRIC_GROUPS,
    ORDERINGS,
    acceptance_checks,
    bootstrap_orderings,
    per_image_values,
    pooled_rate,
    relative_gain,
    row_value,
    table_row,
)
from .paths import display_path
from .presets import MODELS, Budget, ModelSpec
from .search import SearchSpace

#: the paper's Table 1 (NYU data, test set), shown for reference next to ours
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
#: notes a person wrote after looking at a run, kept beside results.md and included in it verbatim
FINDINGS_FILE = "results_findings.md"


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
            f"`{display_path(datalist)}`"
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


def _tuple_like(value: Any, reference: Any) -> Any:
    return tuple(value) if isinstance(reference, tuple) and isinstance(value, list) else value


def _short(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _at_rate(learning_rate: float | None) -> str:
    return "" if learning_rate is None else f" (learning rate {learning_rate:g})"


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    return f"{int(seconds // 60)} min {int(round(seconds % 60)):02d} s"


@dataclass
class Replicate:
    """A model trained again with its selected hyper-parameters on the data of another seed, and its test reports."""

    seed: int
    datalist: Path
    test: dict[str, Any] | None = None  # GLAM: the joint model's report
    test_local: dict[str, Any] | None = None
    test_csv: Path | None = None


@dataclass
class ModelResult:
    """What the driver learned about one model: its trials, the selected one, its test report(s), the replicates on
    other data seeds, wall time."""

    spec: ModelSpec
    trials: list[dict[str, Any]] = field(default_factory=list)
    selected: int | None = None
    test: dict[str, Any] | None = None  # GLAM: the joint model's report
    test_local: dict[str, Any] | None = None  # GLAM: the local-stage model's report (Table 2)
    test_csv: Path | None = None
    replicates: list[Replicate] = field(default_factory=list)
    wall_s: float = 0.0
    wall_complete: bool = True


#: the map of each model that Table 1 reports (GLAM: S_c of the jointly trained model)
TABLE1_MAPS = {"glam": MapName.COMBINED, "gmic": MapName.GLOBAL, "cam": MapName.GLOBAL, "unet": MapName.GLOBAL}


def table1_rows(results: Mapping[str, Any], pick: Any = lambda r: r) -> dict[str, Any]:
    """Table-1 rows by model title from each result's test report (``pick`` selects the report holder: the result
    itself or one of its replicates); "not run" / None (failed) where there is no report."""
    rows: dict[str, Any] = {}
    for key, map_key in TABLE1_MAPS.items():
        r = results.get(key)
        holder = pick(r) if r is not None else None
        if r is None:
            rows[MODELS[key].title] = "not run"
        else:
            rows[MODELS[key].title] = table_row(holder.test, map_key) if holder is not None and holder.test else None
    return rows


def _per_image(results: Mapping[str, Any], stat: str, pick: Any = lambda r: r) -> dict[str, Any]:
    """Per model title, ``{class: {image: value}}`` of a per-image statistic of its Table-1 map."""
    out = {}
    for key, map_key in TABLE1_MAPS.items():
        r = results.get(key)
        holder = pick(r) if r is not None else None
        if holder is not None and holder.test_csv is not None and Path(holder.test_csv).is_file():
            out[MODELS[key].title] = per_image_values(Path(holder.test_csv), map_key, stat)
    return out


def _bootstrap_lines(results: Mapping[str, Any], pick: Any = lambda r: r) -> list[str]:
    lines = [
        "| ordering | metric | class | difference (95 % bootstrap interval) | resamples where it holds |",
        "|---|---|---|---|---|",
    ]
    for stat, title in (("dice", "Dice"), ("pxap", "image-level PxAP")):
        boot = bootstrap_orderings(_per_image(results, stat, pick))
        for (better, worse, cls), b in boot.items():
            lines.append(
                f"| {better} > {worse} | {title} | {cls} | {b['difference']:+.3f} ({b['low']:+.3f}, {b['high']:+.3f}) "
                f"| {b['share_ahead']:.0%} |"
            )
    return lines


def _localisation_lines(results: Mapping[str, Any], trivial: Mapping[str, Any] | None) -> list[str]:
    lines = [
        "| model | map | pointing game malignant | pointing game benign | pooled | peak on the border (pooled) |",
        "|---|---|---|---|---|---|",
    ]
    for key, map_key in (
        ("glam", MapName.COMBINED),
        *((key, MapName.GLOBAL) for key in ("glam", "gmic", "cam", "unet")),
    ):
        r = results.get(key)
        if r is None or r.test is None:
            continue
        row = table_row(r.test, map_key)
        hits = [_fmt(row["pointing_game"][c]) for c in CLASSES]
        lines.append(
            f"| {r.spec.title} | {map_key} | {' | '.join(hits)} | {_fmt(pooled_rate(row, 'pointing_game'))} | "
            f"{_fmt(pooled_rate(row, 'peak_on_border'))} |"
        )
    if trivial:
        hits = trivial["brightest_cell_hit"]
        lines.append(
            f"| no learning: the brightest {trivial['cell']}-px cell | - | {_fmt(hits[LesionClass.MALIGNANT])} | "
            f"{_fmt(hits[LesionClass.BENIGN])} | {_fmt(trivial['brightest_cell_pooled'])} | - |"
        )
    return lines


@dataclass
class _Run:
    """What the sections of results.md are built from: :func:`write_results`'s arguments and what it derives."""

    path: Path
    docs_dir: Path
    results: Mapping[str, ModelResult]
    command: str
    preset: Path
    search_path: Path
    space: SearchSpace
    budget: Budget
    datalist: Path
    threads: int
    jobs: int
    total_wall_s: float
    run_wall_s: float
    steps_wall_s: float
    failures: Mapping[str, str]
    figures: Mapping[str, Path | None]
    trivial: Mapping[str, Any] | None
    table1: dict[str, Any]
    checks: list[Any]
    variation_checks: dict[int, list[Any]]

    def rel(self, target: Path) -> str:
        """``target`` relative to results.md, with forward slashes (a Markdown link)."""
        return os.path.relpath(target, self.path.parent).replace(os.sep, "/")


def _replicate_picker(seed: int) -> Any:
    """``pick`` for :func:`table1_rows`: a result's replicate on the data of ``seed`` (None without one)."""

    def pick(r: ModelResult) -> Replicate | None:
        return next((x for x in r.replicates if x.seed == seed), None)

    return pick


def _check_rows(checks: list[Any]) -> list[str]:
    return [f"| {c.condition} | {c.detail} | {'yes' if c.holds else '**no**'} |" for c in checks]


def _header(run: _Run) -> list[str]:
    now = datetime.now(timezone.utc).astimezone()
    return [
        "# Benchmark: the GLAM paper's Table 1 on synthetic mammograms",
        "",
        f"Generated by `scripts/benchmark.py` on {now:%Y-%m-%d %H:%M %Z}. Wall time of the run: "
        f"{_minutes(run.run_wall_s)} (this invocation of the driver: {_minutes(run.total_wall_s)}; the workflow steps "
        f"added up, {run.jobs} at a time: {_minutes(run.steps_wall_s)}). Every number below is read from the "
        "workflows' own reports (`metrics.json` / `metrics.csv`).",
        "",
        "```bash",
        run.command,
        "```",
        "",
    ]


def _setup(run: _Run) -> list[str]:
    budget = run.budget
    shift = (
        f", on Algorithm 1's patches moved by random offsets of up to {budget.patch_shift} px (`patch_shift`)"
        if budget.patch_shift
        else ""
    )
    variation = (
        f" Variation: every model trained again with its selected hyper-parameters on the data of seed(s) "
        f"{', '.join(str(x) for x in budget.variation_seeds)} (same settings, other images), no new search."
        if budget.variation_seeds
        else ""
    )
    return [
        "## Setup",
        "",
        *_hardware(run.threads),
        f"- {run.jobs} workflow step(s) at a time, each with OMP_NUM_THREADS={run.threads}",
        f"- preset `{run.preset}`, search space `{run.space.name}` of `{run.search_path}` (seed {run.space.seed})",
        "",
        "Data:",
        "",
        *_dataset_lines(run.datalist),
        "",
        "Budget, the same for every model: "
        f"{budget.trials} random-search trial(s) of {budget.epochs} epoch(s) of the model's one stage (GLAM: its "
        "global stage; each epoch is every training image with a lesion plus as many lesion-free ones), the "
        "epoch of each stage selected by the workflow's `selection_metric` (the preset's; train.yaml's default is the "
        "validation soft Dice), the trial with the best validation "
        f"Dice kept. GLAM then trains its local stage for {budget.local_epochs}{_at_rate(budget.local_learning_rate)} "
        f"and its joint stage for {budget.joint_epochs} epoch(s){_at_rate(budget.joint_learning_rate)} from the "
        f"selected global module{shift} (the paper: 30 trials of 50 epochs, then 20 local and < 5 joint epochs)."
        f"{variation}",
        "",
    ]


def _failures(run: _Run) -> list[str]:
    if not run.failures:
        return []
    lines = ["**Steps that failed or did not run** (their rows are marked failed):", ""]
    return [*lines, *(f"- `{name}`: {why}" for name, why in run.failures.items()), ""]


def _table1(run: _Run) -> list[str]:
    paper_rows = {name: {k: dict(zip(CLASSES, v)) for k, v in values.items()} for name, values in PAPER_TABLE1.items()}
    return [
        "## Table 1: GLAM and the baselines (test split)",
        "",
        "GLAM's map is S_c of the jointly trained model; each baseline's is its only map (the `S_g` row of its "
        "report). Dice and PxAP: mean ± population std over the test images with a lesion of the class; AUC of "
        "each model's classification output (GLAM: y_global; CAM: its pooled map; GMIC: y_fusion; U-Net: its "
        "top-t% pooled map, reported for completeness: the paper gives none).",
        "",
        *_table1_lines(run.table1, "model"),
        "",
        "The paper's Table 1 (NYU screening data, test set), for reference:",
        "",
        *_table1_lines(paper_rows, "model (paper)"),
    ]


def _dice_gain(run: _Run) -> list[str]:
    lines = ["", "## Relative Dice gain of GLAM over GMIC", ""]
    lines += ["| class | GLAM S_c | GMIC | gain (ours) | gain (paper) |", "|---|---|---|---|---|"]
    for i, cls in enumerate(CLASSES):
        ours = row_value(run.table1, "GLAM", "dice", cls)
        theirs = row_value(run.table1, "GMIC", "dice", cls)
        gain = relative_gain(ours, theirs)
        paper = relative_gain(PAPER_TABLE1["GLAM"]["dice"][i], PAPER_TABLE1["GMIC"]["dice"][i])
        lines.append(
            f"| {cls} | {_fmt(ours)} | {_fmt(theirs)} | {'n/a' if gain is None else f'{gain:+.0%}'} | {paper:+.0%} |"
        )
    return lines


def _pointing(run: _Run) -> list[str]:
    tolerance = next((r.test.get("pointing_tolerance_px") for r in run.results.values() if r.test), None)
    lines = [
        "",
        "## Where the maps point (test split)",
        "",
        "Pointing game: the share of test images with a lesion of the class whose map peaks within "
        f"{_fmt(tolerance) if tolerance is not None else 'the configured'} px of a lesion pixel of that class "
        "(pooled: over both classes); peak on the border: the share whose peak lies in the map's outermost cells "
        "(the failure of a module that reads image-wide statistics off the padded border). The last row needs no "
        "learning: a map that points at the brightest cell of S_g's grid.",
        "",
        *_localisation_lines(run.results, run.trivial),
    ]
    if run.trivial:
        lines += [
            "",
            "What image-wide statistics of the breast give away without looking at any lesion (classification AUC on "
            "the test split; any lesion / benign / malignant):",
            "",
            "| statistic | any lesion | benign | malignant |",
            "|---|---|---|---|",
        ]
        for name, values in run.trivial["statistics"].items():
            lines.append(f"| {name} | " + " | ".join(_fmt(values[k]) for k in ("any", *CLASS_NAMES)) + " |")
    return lines


def _acceptance(run: _Run) -> list[str]:
    n_hold = sum(c.holds for c in run.checks)
    return [
        "",
        "## Acceptance conditions",
        "",
        f"{n_hold} of {len(run.checks)} hold.",
        "",
        "| condition | values | holds |",
        "|---|---|---|",
        *_check_rows(run.checks),
    ]


def _variation(run: _Run) -> list[str]:
    lines = [
        "",
        "## Variation",
        "",
        "Bootstrap over the test images (2,000 resamples of the images with a lesion of the class, the same resample "
        "for every model) of the differences in mean per-image Dice and image-level PxAP, for the orderings "
        f"{', '.join(f'{a} > {b}' for a, b in ORDERINGS)}:",
        "",
        *_bootstrap_lines(run.results),
    ]
    for seed, seed_checks in run.variation_checks.items():
        pick = _replicate_picker(seed)
        ordering = [c for c in seed_checks if " beats " in c.condition or c.condition.startswith("U-Net")]
        lines += [
            "",
            f"### The same models trained on the data of seed {seed}",
            "",
            *_table1_lines(table1_rows(run.results, pick), "model"),
            "",
            f"Orderings on this data set: {sum(c.holds for c in ordering)} of {len(ordering)} hold.",
            "",
            "| condition | values | holds |",
            "|---|---|---|",
            *_check_rows(seed_checks),
            "",
            *_bootstrap_lines(run.results, pick),
        ]
    return lines


def _findings(run: _Run) -> list[str]:
    # what a person found when looking at a run (why a condition fails, what the benchmark needs): kept beside the
    # generated file and included verbatim, so a re-run does not lose it
    findings = run.docs_dir / FINDINGS_FILE
    if not findings.is_file():
        return []
    return [
        *("", "## Findings", "", f"(from `{FINDINGS_FILE}`, written after looking at this run)", ""),
        findings.read_text(encoding="utf-8").strip(),
        "",
    ]


def _table2(run: _Run) -> list[str]:
    glam = run.results.get("glam")
    ablation: dict[str, dict[str, Any] | None] = {}
    if glam is not None:
        local, joint = glam.test_local, glam.test
        ablation["S_g (global alone)"] = table_row(local, MapName.GLOBAL) if local else None
        ablation["S_l (local, global frozen)"] = table_row(local, MapName.LOCAL) if local else None
        ablation["S_c-sep"] = table_row(local, MapName.COMBINED) if local else None
        ablation["S_g after joint training"] = table_row(joint, MapName.GLOBAL) if joint else None
        ablation["S_l after joint training"] = table_row(joint, MapName.LOCAL) if joint else None
        ablation["**S_c-joint (GLAM)**"] = table_row(joint, MapName.COMBINED) if joint else None
    else:
        ablation["GLAM"] = "not run"
    return [
        *("", "## Table 2: GLAM's maps (ablation, test split)", ""),
        "S_g: the global module trained alone; S_l: the local module trained on its patches with the global "
        "module frozen; S_c-sep: their average before joint training (these three from the local-stage model); "
        "S_g, S_l, S_c-joint of the jointly trained model (S_c-joint is GLAM's row of Table 1).",
        "",
        *_table1_lines(ablation, "map"),
    ]


#: the figures of results.md, in order: the key in ``figures``, the image's alt text and its caption
_FIGURES = (
    (
        "scatter",
        "per-image Dice of S_g vs S_l",
        "Per-image soft Dice of S_g (x) and S_l (y) of the jointly trained GLAM on the test images with a "
        "lesion of the class (the paper's Figure 4; from the `S_g_dice_*` and `S_l_dice_*` columns of its "
        "test `metrics.csv`). Points above the diagonal: the local map is better.",
    ),
    (
        "examples",
        "examples",
        "Test images with lesions: the input, the ground truth (benign green, malignant red), and each "
        "model's map in the same colours (CAM's and GMIC's maps are coarse: one cell per stride of the backbone's "
        "last layer, upsampled by nearest neighbour).",
    ),
    (
        "glam",
        "GLAM's maps and patches",
        "The jointly trained GLAM on the same test images: its global map S_g, its local map S_l (the local "
        "module's segmentation of the patches, zero elsewhere) and the combined map S_c, with the patches it "
        "cropped from S_g outlined in yellow on S_l and S_c.",
    ),
    (
        "scales",
        "GLAM's global module per scale",
        "GLAM's global module on the same test images, scale by scale: S_0, S_1 and S_2 (from the finest to the "
        "coarsest grid, nearest-upsampled) and their weighted sum S_g, first from the checkpoint its workflow "
        "selected (by its `selection_metric`; the one the local and joint stages started from), then from the last "
        "epoch of the same training run. Where a scale lights up away from the lesion, at the image border, "
        "its units answer for the whole image rather than for the place they sit at.",
    ),
)


def _figures(run: _Run) -> list[str]:
    lines = ["", "## Figures", ""]
    for key, alt, caption in _FIGURES:
        figure = run.figures.get(key)
        if figure is not None:
            lines += [f"![{alt}]({run.rel(figure)})", "", caption, ""]
    return lines


def _wall_times(run: _Run) -> list[str]:
    lines = ["## Wall time per model", "", "| model | wall time | what it covers |", "|---|---|---|"]
    for key, r in run.results.items():
        what = f"{len(r.trials)} trial(s): training + validation evaluation; test evaluation"
        if key == "glam":
            what += "; local and joint stages; test evaluation of the local-stage model"
        note = "" if r.wall_complete else " (some steps have no recorded time)"
        lines.append(f"| {r.spec.title} | {_minutes(r.wall_s)}{note} | {what} |")
    return lines


def _trial_row(r: ModelResult, t: Mapping[str, Any]) -> str:
    p = t["params"]
    t_value = p.get("t_global", p.get("cam_t"))
    val = t.get("validation")
    lambda_cell = f"{p['lambda_sparsity']:.2e}" if "lambda_sparsity" in p else "-"
    if val:
        scores = " | ".join(_fmt(val["dice"][c]) for c in CLASSES)
        scores += f" | {_fmt(t['score'])} | {_fmt(pooled_rate(val, 'pointing_game'))}"
    else:
        scores = "failed | failed | failed | failed"
    return (
        f"| {r.spec.title} | {t['index']} | {p['learning_rate']:.2e} | {lambda_cell} | "
        f"{'-' if t_value is None else f'{t_value:g}'} | {scores} | {'**yes**' if r.selected == t['index'] else ''} |"
    )


def _trials(run: _Run) -> list[str]:
    return [
        *("", "## Every trial", ""),
        "Hyper-parameters drawn by random search (log-uniform learning rate and lambda, t from the paper's set; "
        "see the search file; trial k trains from torch seed k) and the validation soft Dice and pointing game "
        "(both classes) of the trial's selected checkpoint.",
        "",
        "| model | trial | learning rate | lambda | t | val Dice malignant | val Dice benign | val Dice (mean) "
        "| val pointing game | selected |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(_trial_row(r, t) for r in run.results.values() for t in r.trials),
    ]


def _reproduce(run: _Run) -> list[str]:
    return [
        *("", "## Reproduce", ""),
        "The command above re-runs everything into its `--work_dir` (steps already done there are skipped). "
        "Each step's exact `python -m monai.bundle run ...` command is the first line of its log under "
        "`<work_dir>/logs/`.",
        "",
    ]


#: results.md, section by section: each builds its lines from the run, the file is their lines joined
RESULTS_TEMPLATE = (
    _header,
    _setup,
    _failures,
    _table1,
    _dice_gain,
    _pointing,
    _acceptance,
    _variation,
    _findings,
    _table2,
    _figures,
    _wall_times,
    _trials,
    _reproduce,
)


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
    jobs: int = 1,
    total_wall_s: float,
    run_wall_s: float | None = None,
    steps_wall_s: float,
    failures: Mapping[str, str],
    figures: Mapping[str, Path | None],
    trivial: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write results.md (the sections of :data:`RESULTS_TEMPLATE`, in order); returns the Table-1 rows and the
    checks (for the console and the tests).

    ``total_wall_s``: this invocation of the driver; ``run_wall_s``: every invocation on the work folder added up
    (the run's wall time when it was resumed); ``trivial``: what needs no learning on the test split (image-wide
    statistics' AUC, the brightest cell's pointing game)."""
    table1 = table1_rows(results)
    glam = results.get("glam")
    glam_global = table_row(glam.test, MapName.GLOBAL) if glam is not None and glam.test else None
    wall_limit = budget.wall_limit_h * 3600 if budget.wall_limit_h else None
    run_wall = run_wall_s if run_wall_s is not None else total_wall_s
    checks = acceptance_checks(
        {k: v for k, v in table1.items() if isinstance(v, Mapping)}, glam_global, run_wall, wall_limit
    )
    variation_checks: dict[int, list[Any]] = {}
    for seed in budget.variation_seeds:
        pick = _replicate_picker(seed)
        rows = {k: v for k, v in table1_rows(results, pick).items() if isinstance(v, Mapping)}
        g = pick(glam) if glam is not None else None
        variation_checks[seed] = acceptance_checks(rows, table_row(g.test, MapName.GLOBAL) if g and g.test else None)
    run = _Run(
        path=path,
        docs_dir=docs_dir,
        results=results,
        command=command,
        preset=preset,
        search_path=search_path,
        space=space,
        budget=budget,
        datalist=datalist,
        threads=threads,
        jobs=jobs,
        total_wall_s=total_wall_s,
        run_wall_s=run_wall,
        steps_wall_s=steps_wall_s,
        failures=failures,
        figures=figures,
        trivial=trivial,
        table1=table1,
        checks=checks,
        variation_checks=variation_checks,
    )
    write_text(path, "\n".join(line for section in RESULTS_TEMPLATE for line in section(run)))
    return {"table1": table1, "checks": checks, "variation_checks": variation_checks}
