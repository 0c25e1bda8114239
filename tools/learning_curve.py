#!/usr/bin/env python
"""Learning curves of weak supervision: a plan of localisation-probe runs, resumable, with one table of results.

    python tools/learning_curve.py --plan configs/learning_curve_calibrated.yaml --work_dir runs/learning_curve
    python tools/learning_curve.py --plan ... --work_dir ... --report     # the table only, from finished runs

The plan (YAML) names a preset, synthetic data sets and the runs. Each run is one ``tools/probe_localisation.py``
(its global module trained on one data set for some epochs, optionally from another run's best module or a
model.pt, on a subset of the training images), whose per-epoch validation figures, best epoch and test figures go
to ``<work_dir>/<run>.json`` and its best module to ``<work_dir>/<run>.pt``. A run whose JSON exists is skipped, so
an interrupted plan continues where it stopped; a run that fails is reported and the others go on. The report
(``<work_dir>/report.md``, also printed) has one row per run: its data, training images, start, epochs, best
epoch, validation and test pointing game and AUC, the brightest cell's pointing game on the same test images, the
seconds per epoch.

Plan keys: ``preset`` (layered over bundle/configs/train.yaml), ``probe_args`` (added to every probe, e.g.
``[--bf16]``), ``data_root``, ``datasets`` (name -> ``{n, seed, config}``: ``config`` overrides
``scripts.data.synthetic.SyntheticConfig``'s defaults, the generator's calibrated lesions; generated on first use at
the preset's image size), ``runs`` (a list of ``{name, data, epochs, train_images?, init?, set?, seed?}``; ``init``
is a model.pt or ``run:<name>``, that run's best module).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "bundle"))
PROBE = REPO_ROOT / "scripts" / "probe_localisation.py"
RUN_KEYS = {"name", "data", "epochs", "train_images", "init", "set", "seed"}


from scripts.enums import CLASS_NAMES  # noqa: E402


def load_plan(path: Path) -> dict[str, Any]:
    """The plan, checked: every run names a data set of the plan, an ``init`` of an earlier run or an existing file,
    and a unique name; errors name the plan and the run."""
    plan = yaml.safe_load(Path(path).read_text())
    if not isinstance(plan, Mapping) or not plan.get("runs") or not plan.get("datasets"):
        raise ValueError(f"{path}: a plan needs 'datasets' and 'runs'")
    seen: set[str] = set()
    for i, run in enumerate(plan["runs"]):
        where = f"{path}: run {i} ({run.get('name', '?') if isinstance(run, Mapping) else run!r})"
        if not isinstance(run, Mapping) or not {"name", "data", "epochs"} <= set(run):
            raise ValueError(f"{where}: needs name, data and epochs")
        if set(run) - RUN_KEYS:
            raise ValueError(f"{where}: unknown keys {sorted(set(run) - RUN_KEYS)} (known: {sorted(RUN_KEYS)})")
        if run["name"] in seen or not str(run["name"]).replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"{where}: names must be unique and made of letters, digits, '_' and '-'")
        if run["data"] not in plan["datasets"]:
            raise ValueError(
                f"{where}: data {run['data']!r} is not one of the plan's datasets {sorted(plan['datasets'])}"
            )
        init = run.get("init")
        if isinstance(init, str) and init.startswith("run:") and init[4:] not in seen:
            raise ValueError(f"{where}: init {init!r} names no earlier run")
        if isinstance(init, str) and not init.startswith("run:") and not (REPO_ROOT / init).is_file():
            raise ValueError(f"{where}: init {init!r} is not a file")
        seen.add(run["name"])
    return dict(plan)


def dataset_datalist(plan: Mapping[str, Any], name: str, image_size: Sequence[int]) -> Path:
    """The data set's datalist, generated on first use (``ensure_synthetic_dataset``: a folder per size, seed and
    settings)."""
    from scripts.data.synthetic import SyntheticConfig, ensure_synthetic_dataset

    spec = plan["datasets"][name]
    config = SyntheticConfig(**dict(spec.get("config") or {}))
    root = REPO_ROOT / plan.get("data_root", "data")
    return Path(
        ensure_synthetic_dataset(str(root), n=int(spec["n"]), size=image_size, seed=int(spec["seed"]), config=config)
    )


def subset_datalist(datalist: Path, train_images: int | None, work_dir: Path, run: str) -> Path:
    """The datalist with only the first ``train_images`` training items (views of the same patient stay together:
    the items come patient by patient); validation and test unchanged."""
    if not train_images:
        return datalist
    content = json.loads(datalist.read_text())
    if train_images > len(content["training"]):
        raise ValueError(f"run {run}: train_images {train_images} > the {len(content['training'])} training images")
    base = datalist.parent
    absolute = {
        split: [
            {k: str(base / v) if k.startswith(("image", "mask")) and v else v for k, v in item.items()}
            for item in items
        ]
        for split, items in content.items()
    }
    absolute["training"] = absolute["training"][:train_images]
    out = work_dir / f"{run}_datalist.json"
    out.write_text(json.dumps(absolute, indent=1))
    return out


def probe_command(plan: Mapping[str, Any], run: Mapping[str, Any], datalist: Path, work_dir: Path) -> list[str]:
    cmd = [sys.executable, str(PROBE), "--preset", str(REPO_ROOT / plan["preset"]), "--epochs", str(run["epochs"])]
    cmd += ["--set", f"datalist={datalist}"]
    for key, value in dict(run.get("set") or {}).items():
        cmd += ["--set", f"{key}={value!r}" if not isinstance(value, str) else f"{key}={value}"]
    init = run.get("init")
    if init:
        cmd += ["--init", str(work_dir / f"{init[4:]}.pt") if init.startswith("run:") else str(REPO_ROOT / init)]
    cmd += ["--seed", str(run.get("seed", 0)), "--cache", str(work_dir / "cache"), "--test"]
    cmd += ["--json", str(work_dir / f"{run['name']}.json"), "--save", str(work_dir / f"{run['name']}.pt")]
    return cmd + [str(a) for a in plan.get("probe_args") or []]


def run_plan(plan: Mapping[str, Any], work_dir: Path, log: Any = print) -> list[str]:
    """Run every unfinished run in order; returns the names of the runs that failed."""
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config([str(REPO_ROOT / "bundle" / "configs" / "train.yaml"), str(REPO_ROOT / plan["preset"])])
    image_size = parser.get_parsed_content("image_size")
    work_dir.mkdir(parents=True, exist_ok=True)
    failed = []
    for run in plan["runs"]:
        name = run["name"]
        if (work_dir / f"{name}.json").is_file():
            log(f"[learning curve] {name}: done before, skipped")
            continue
        init = run.get("init")
        if isinstance(init, str) and init.startswith("run:") and not (work_dir / f"{init[4:]}.pt").is_file():
            log(f"[learning curve] {name}: not run, its start {init} has no module (it failed)")
            failed.append(name)
            continue
        datalist = subset_datalist(
            dataset_datalist(plan, run["data"], image_size), run.get("train_images"), work_dir, name
        )
        cmd = probe_command(plan, run, datalist, work_dir)
        (work_dir / f"{name}.cmd").write_text(" ".join(cmd) + "\n")
        log(f"[learning curve] {name}: {' '.join(cmd[1:])}")
        start = time.monotonic()
        with open(work_dir / f"{name}.log", "w") as out:
            code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT).returncode
        if code != 0:
            log(f"[learning curve] {name}: FAILED (exit {code}), see {work_dir / f'{name}.log'}")
            failed.append(name)
        else:
            log(f"[learning curve] {name}: done in {time.monotonic() - start:.0f} s")
    return failed


def _pair(values: Sequence[float] | None) -> str:
    if not values:
        return "-"
    return " / ".join("n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}" for v in values)


def report(plan: Mapping[str, Any], work_dir: Path) -> str:
    """The Markdown table of the finished runs (unfinished ones as such)."""
    head = (
        "| run | data | training images | start | epochs | best epoch | val pointing b / m | test pointing b / m "
        "| test AUC b / m | brightest cell (test) b / m | s / epoch |"
    )
    lines = [head, "|" + "---|" * 11]
    for run in plan["runs"]:
        path = work_dir / f"{run['name']}.json"
        if not path.is_file():
            lines.append(f"| {run['name']} | {run['data']} | | | {run['epochs']} | not finished | | | | | |")
            continue
        r = json.loads(path.read_text())
        best = next((e for e in r["epochs"] if e["epoch"] == r["best_epoch"]), {})
        trained = [e["seconds"] for e in r["epochs"] if e["epoch"] > 0]
        cell = r.get("test_baselines", {}).get("brightest_cell_hit", {})
        test = r.get("test", {})
        images = r.get("images", {}).get("training", run.get("train_images", "?"))
        cells = [
            run["name"],
            run["data"],
            str(images),
            str(run.get("init") or "fresh"),
            str(run["epochs"]),
            str(r["best_epoch"]),
            _pair(best.get("hit")),
            _pair(test.get("hit")),
            _pair(test.get("auc")),
            _pair([cell.get(c) for c in CLASS_NAMES]) if cell else "-",
            f"{sum(trained) / len(trained):.0f}" if trained else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", type=Path, required=True, help="the plan (YAML)")
    ap.add_argument("--work_dir", type=Path, required=True, help="runs' JSON, modules, logs and the report")
    ap.add_argument("--report", action="store_true", help="only write the report from the finished runs")
    args = ap.parse_args(argv)
    if not args.plan.is_file():
        ap.error(f"--plan {args.plan}: file not found")
    plan = load_plan(args.plan)
    failed = [] if args.report else run_plan(plan, args.work_dir)
    text = report(plan, args.work_dir)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    (args.work_dir / "report.md").write_text(text + "\n")
    print(text)
    if failed:
        print(f"[learning curve] failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
