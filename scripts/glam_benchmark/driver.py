"""The driver: prepares the dataset (:func:`prepare_data`), runs every model's trials, selection, GLAM's later
stages and the test evaluations as workflow steps in the order ``scripts/benchmark.py``'s docstring describes
(:func:`run_benchmark`), then the figures and ``results.md``; and the command line (:func:`build_parser`,
:func:`main`)."""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .figures import make_figures
from .files import write_json
from .metrics import read_metrics, table_row, validation_dice
from .paths import BUNDLE_ROOT, DEFAULT_SEARCH, EVAL_CONFIG, TRAIN_CONFIG, display_path
from .presets import MODELS, BenchmarkError, Budget, read_preset
from .report import ModelResult, write_results
from .search import load_search_space, sample_trials, trial_overrides
from .steps import Runner, Step, bundle_command


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
    """Run the benchmark that the parsed ``args`` describe (``argv``: the command line, quoted in results.md);
    the exit status: 0, or 1 when a step failed or did not run."""
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
                write_json(saved, record)
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
        preset=display_path(preset),
        search_path=display_path(search_path),
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
