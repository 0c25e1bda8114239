"""The pieces of ``results.md`` that are tables and lines of numbers: the paper's Table 1 for reference, the models'
results (:class:`ModelResult`, one :class:`Replicate` per trial), Table-1 rows, bootstrap orderings, localisation
lines, and the formatting of values, hardware, dataset and times (:mod:`.report` assembles the sections)."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.enums import LesionClass, MapName

from . import display_path
from .metrics import (
    CLASSES,
    METRIC_GROUPS,
    _fmt,
    bootstrap_orderings,
    per_image_values,
    pooled_rate,
    table_row,
)
from .presets import MODELS, ModelSpec

#: the paper's Table 1 (NYU data, test set), shown for reference next to ours; its AUC is per breast ("identifying
#: breasts with malignant / benign lesions"), so it stands in the breast-level column; it reports no FROC
PAPER_TABLE1 = {
    "GLAM": {
        "dice": (0.390, 0.335),
        "pxap_image": (0.461, 0.396),
        "pxap_dataset": (0.341, 0.215),
        "froc_1": (None, None),
        "auc": (None, None),
        "breast_auc": (0.882, 0.770),
    },
    "GMIC": {
        "dice": (0.325, 0.240),
        "pxap_image": (0.396, 0.283),
        "pxap_dataset": (0.295, 0.112),
        "froc_1": (None, None),
        "auc": (None, None),
        "breast_auc": (0.886, 0.780),
    },
    "CAM": {
        "dice": (0.250, 0.207),
        "pxap_image": (0.279, 0.222),
        "pxap_dataset": (0.226, 0.084),
        "froc_1": (None, None),
        "auc": (None, None),
        "breast_auc": (0.894, 0.770),
    },
    "U-Net": {
        "dice": (0.504, 0.412),
        "pxap_image": (0.589, 0.498),
        "pxap_dataset": (0.452, 0.265),
        "froc_1": (None, None),
        "auc": (None, None),
        "breast_auc": (None, None),
    },
}
#: notes a person wrote after looking at a run, kept beside results.md and included in it verbatim
FINDINGS_FILE = "results_findings.md"


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
                cells.append(_fmt(row[key][c], std))
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

    from glam_benchmark.synthetic import SyntheticConfig

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
            f"- generator `glam_benchmark.synthetic` (seed {desc.get('seed')}, {desc.get('n')} images, "
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


def _at_rate(learning_rate: float | None, lambda_sparsity: float | None = None, t_local: float | None = None) -> str:
    """A later stage's settings as the preset gives them, e.g. " (learning rate 3e-05, sparsity weight 0.001, local
    pooling share 0.05 (`t_local`))"."""
    parts = [f"learning rate {learning_rate:g}"] if learning_rate is not None else []
    parts += [f"sparsity weight {lambda_sparsity:g}"] if lambda_sparsity is not None else []
    parts += [f"local pooling share {t_local:g} (`t_local`)"] if t_local is not None else []
    return f" ({', '.join(parts)})" if parts else ""


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
    test_local_csv: Path | None = None


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
    test_local_csv: Path | None = None  # GLAM: the local-stage model's per-image metrics (Table 2's bootstrap)
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
        lines += [_bootstrap_row(better, worse, (title, cls), b) for (better, worse, cls), b in boot.items()]
    return lines


def _pointing_bootstrap_lines(
    hits: Mapping[str, Mapping[str, Mapping[str, float]]], better: str, worse: str
) -> list[str]:
    """Results-page lines: the paired bootstrap of ``better``'s pointing game minus ``worse``'s, and the classes
    where ``better`` falls below, each with its interval, so that a pointing shortfall is named with how sure it is,
    as the Dice orderings are.

    Args:
        hits: ``hits[map][class][image]``, 1 where the map's peak lies on a lesion of the class, else 0 (the
            ``<map>_hit_<class>`` columns of a metrics.csv).
        better: the map expected at or above (the page's S_c-joint).
        worse: the map it is compared with (the page's S_g).

    Returns:
        The lines, none when the reports hold no per-image hits (runs older than the ``*_hit_*`` columns).
    """
    boot = bootstrap_orderings(hits, ((better, worse),))
    if not boot:
        return []
    lines = [
        "",
        f"Bootstrap over the same images of {better}'s pointing game minus {worse}'s (per image: 1 where the map's "
        "peak lies on a lesion of the class, else 0):",
        "",
        "| condition | class | difference (95 % bootstrap interval) |",
        "|---|---|---|",
    ]
    lines += [f"| {better} >= {worse}: pointing game | {cls} | {_difference(b)} |" for (_, _, cls), b in boot.items()]
    below = [f"{cls} {_difference(b)}" for (_, _, cls), b in boot.items() if b["difference"] < 0]
    lines += [
        "",
        f"{better}'s pointing game below {worse}'s: " + "; ".join(below) + "."
        if below
        else f"{better}'s pointing game at or above {worse}'s on every class.",
    ]
    return lines


def _bootstrap_row(better: str, worse: str, cells: Sequence[str], b: Mapping[str, float]) -> str:
    """One row of a bootstrap table: the ordering, ``cells`` (metric, class...), the observed difference with its
    95 % interval and the share of resamples in which it holds."""
    return f"| {better} > {worse} | {' | '.join(cells)} | {_difference(b)} | {b['share_ahead']:.0%} |"


def _difference(b: Mapping[str, float]) -> str:
    """A bootstrap's observed difference with its 95 % interval: ``+0.012 (-0.003, +0.027)``."""
    return f"{b['difference']:+.3f} ({b['low']:+.3f}, {b['high']:+.3f})"


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
