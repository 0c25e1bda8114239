"""The driver: prepares the dataset (:func:`prepare_data`), runs every model's trials, selection, GLAM's later
stages, the test evaluations and the replicates on other data seeds as workflow steps, ``jobs`` of them at a time
(:func:`run_benchmark`), then the figures and ``results.md``; and the command line (:func:`build_parser`,
:func:`main`).

Order of the work, per model (:func:`run_benchmark`'s ``model_chain``): (1) its trials (training + validation
evaluation), then the extra trials when none of them learnt to localise (validation pointing game above the
no-learning map's on the validation split, :func:`extra_trials`); a model that starts from another's selection (GMIC
from CAM's) starts once that model's trials and extra trials are done; (2) the trial with the best validation Dice
among those that learnt (among all when none did) is selected, then GLAM's local and joint stages and the test
evaluation(s); (3) per variation seed, the model retrained with its selected hyper-parameters on data generated with
that seed (no search), GLAM's later stages, and test evaluations. The models' chains, and the independent steps
inside each, run side by side; the runner starts at most ``--jobs`` steps at a time, each as soon as a slot is free,
so that no core waits for another model's retries. On 2 CPU cores two single-threaded steps do about 1.4x the work
of one two-threaded step (docs/performance.md), hence ``--jobs`` defaults to the usable cores and ``--threads`` to
the cores per job.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.atomic import disk_full
from scripts.enums import MapName, Stage
from scripts.errors import disk_full_message

from . import BUNDLE_ROOT, DEFAULT_SEARCH, TRAIN_CONFIG, display_path
from .figures import make_figures
from .files import write_json
from .metrics import beats_no_learning, read_metrics, table_row, validation_dice
from .presets import HELD_MODELS, MODELS, BenchmarkError, Budget, ModelSpec, flatten_preset, read_preset
from .report import ModelResult, Replicate, write_results
from .search import load_search_space, per_stage_values, sample_trials, trial_overrides
from .steps import Runner, Step, bundle_command

#: what to do after a full disk stopped the run: the finished steps are on disk and are skipped by the rerun
RESUME_HINT = "free space, then run the same command again (the finished steps are kept and skipped)"


class FullDisk(BenchmarkError):
    """A step found the disk full: the run stops (exit status 1, as for a failed step) and a rerun resumes it."""

    exit_status = 1


def prepare_data(preset: Path, work_dir: Path, datalist: str | None, seed: int | None = None) -> Path:
    """The preset's synthetic dataset under ``<work_dir>/data`` (generated once; ``seed`` replaces the preset's
    ``benchmark_data_seed``), or ``datalist``; checked once here so that the workflows can skip their own check."""
    from monai.bundle import ConfigParser

    from scripts.data import assert_datalist_ok

    if datalist is None:
        parser = ConfigParser()
        parser.read_config([str(TRAIN_CONFIG), str(preset)])
        if "benchmark_data_root" not in parser.get():
            raise BenchmarkError(f"{preset}: needs 'benchmark_data_root' (or pass --datalist)")
        parser["benchmark_data_root"] = str(work_dir / "data")
        if seed is not None:
            parser["benchmark_data_seed"] = int(seed)
        datalist = str(parser.get_parsed_content("datalist"))
    path = Path(datalist).resolve()
    if not path.is_file():
        raise BenchmarkError(f"--datalist {path}: file not found")
    assert_datalist_ok(str(path))
    return path


def split_baselines(
    preset: Path, datalist: Path, split: str = "test", log: Callable[[str], None] = print
) -> dict[str, Any] | None:
    """What needs no learning on a split of the datalist (:func:`~glam_benchmark.metrics.no_learning_baselines`):
    the cell of the brightest-cell map is that of GLAM's S_g under the preset (the stride of S_0, whose grid S_g
    has). On the validation split it is the threshold a trial must beat to have learnt to localise; on the test
    split, what the models' test maps must beat.

    Args:
        preset: the preset layered over train.yaml (the preprocessing, the backbone, the pointing tolerance).
        datalist: the datalist file.
        split: ``training``, ``validation`` or ``test``.
        log: where the line with the time taken goes.

    Returns:
        The figures, or None when the split is empty.
    """
    from monai.bundle import ConfigParser

    from scripts.networks import GlobalBackbone

    from .metrics import no_learning_baselines, preprocess_items, validation_transform

    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(preset)])
    parser["datalist"] = str(datalist)
    parser["bundle_root"] = str(BUNDLE_ROOT)
    items = parser.get_parsed_content("datalist_content").get(split, [])
    if not items:
        return None
    start = time.monotonic()
    batch = preprocess_items(items, validation_transform(parser))
    cell = GlobalBackbone(**dict(parser.get_parsed_content("global_backbone") or {})).tap_strides[0]
    out = no_learning_baselines(
        batch["image"], batch["mask"], batch["label"], cell, float(parser.get_parsed_content("pointing_tolerance"))
    )
    log(f"[benchmark] no-learning baselines on {len(items)} {split} images in {time.monotonic() - start:.0f} s")
    return out


@dataclass(frozen=True)
class ModelSteps:
    """How one model's workflow steps are built: its config files for training and for evaluation, and the
    overrides every one of its commands shares."""

    spec: ModelSpec
    train_cfg: list[Path]
    eval_cfg: list[Path]
    stage: dict[str, str]
    init: Path | None = None
    init_modules: tuple[str, ...] | Mapping[str, str] = ()

    @classmethod
    def of(
        cls,
        spec: ModelSpec,
        preset: Path,
        init: Path | None = None,
        init_modules: Sequence[str] | Mapping[str, str] = (),
    ) -> ModelSteps:
        """``init_modules``: train.yaml's ``previous_modules`` for the first stage (names, or {submodule: prefix})."""
        stage = {"stage": Stage.GLOBAL} if spec.overlay is None else {}
        modules = dict(init_modules) if isinstance(init_modules, Mapping) else tuple(init_modules)
        return cls(spec, spec.configs(preset), spec.configs(preset, evaluate=True), stage, init, modules)

    def train(self, name: str, overrides: Mapping[str, Any], done: Path, stage: str | None = None) -> Step:
        """The training step of ``stage`` (None: the model's first, which starts from ``init`` when there is one;
        the later stages start from the stage before, as the workflow does by itself)."""
        extra: dict[str, Any] = {"stage": stage} if stage else {}
        if stage is None and self.init is not None:
            extra["previous_model"] = str(self.init)
            if self.init_modules:
                modules = self.init_modules
                extra["previous_modules"] = dict(modules) if isinstance(modules, Mapping) else list(modules)
        return Step(
            name, bundle_command("training", self.train_cfg, {**overrides, **extra, "resume": True}), done, True
        )

    def evaluate(self, name: str, overrides: Mapping[str, Any], eval_dir: Path, **extra: Any) -> Step:
        command = bundle_command("evaluating", self.eval_cfg, {**overrides, **extra, "eval_dir": str(eval_dir)})
        return Step(name, command, eval_dir / "metrics.json")


def best_trial(trials: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The trial the benchmark keeps: the best validation Dice (``score``) among the trials that learnt to localise
    (``learnt``), among all when none did; the lower index on a tie; None when no trial has a score."""
    scored = [t for t in trials if "score" in t and not math.isnan(t["score"])]
    scored = [t for t in scored if t.get("learnt")] or scored
    return max(scored, key=lambda t: (t["score"], -t["index"])) if scored else None


def extra_trials(
    trials: Sequence[Mapping[str, Any]],
    first: int,
    extra: int,
    run: Callable[[int], tuple[dict[str, Any], list[str]]],
) -> tuple[list[dict[str, Any]], list[str]]:
    """The retry rule: when none of a model's ``trials`` learnt to localise, trials ``first``, ``first + 1``, ...
    one after another until one learns or ``extra`` have run.

    Args:
        trials: the model's trial records so far.
        first: the index of the first extra trial (the number of the search's trials).
        extra: the most extra trials.
        run: runs trial k, returning its record and step names (as :func:`run_trial`).

    Returns:
        The extra trials' records and their step names.
    """
    records: list[dict[str, Any]] = []
    names: list[str] = []
    if any(t.get("learnt") for t in trials):
        return records, names
    for k in range(first, first + extra):
        record, step_names = run(k)
        records.append(record)
        names += step_names
        if record.get("learnt"):
            break
    return records, names


@dataclass(frozen=True)
class SelectedModel:
    """What an earlier benchmark run selected for one model: the checkpoint (GLAM: its jointly trained model, a
    baseline: its one stage) and the hyper-parameters of its trial."""

    checkpoint: Path
    params: dict[str, float]


def selected_models(run_dir: Path, models: Sequence[str]) -> dict[str, SelectedModel]:
    """Per model, what an earlier benchmark run in ``run_dir`` selected (its trials scored and judged as that run
    did: :func:`best_trial` on their validation Dice and the ``learnt`` of their trial.json). A model without a
    finished trial or checkpoint there is a :class:`BenchmarkError` naming what is missing."""
    out: dict[str, SelectedModel] = {}
    for name in models:
        trials = []
        for trial_dir in sorted((run_dir / name).glob("trial_*")):
            metrics = trial_dir / "validation" / "metrics.json"
            index = trial_dir.name[len("trial_") :]
            saved = trial_dir / "trial.json"
            if metrics.is_file() and index.isdigit():
                learnt = json.loads(saved.read_text()).get("learnt") if saved.is_file() else None
                trials.append({"index": int(index), "score": validation_dice(read_metrics(metrics)), "learnt": learnt})
        best = best_trial(trials)
        if best is None:
            raise BenchmarkError(f"init_from {run_dir}: no trial of {name} finished its validation there")
        trial_dir = run_dir / name / f"trial_{best['index']:02d}"
        ckpt = trial_dir / "models" / (Stage.JOINT if name == "glam" else name) / "model.pt"
        if not ckpt.is_file():
            raise BenchmarkError(f"init_from {run_dir}: {ckpt} not found (the selected trial of {name} did not finish)")
        record = json.loads((trial_dir / "trial.json").read_text())
        out[name] = SelectedModel(ckpt, {str(k): float(v) for k, v in record["params"].items()})
    return out


def fine_tuning_trials(sampled: Sequence[Mapping[str, float]], start: SelectedModel) -> list[dict[str, float]]:
    """Trials that fine-tune a selected model: its trial's hyper-parameters (pooling threshold, sparsity weight:
    what the model was trained to), with only the learning rate from the search."""
    return [{**start.params, "learning_rate": float(trial["learning_rate"])} for trial in sampled]


def _check_trial_record(saved: Path, record: Mapping[str, Any]) -> None:
    if saved.is_file():
        previous = json.loads(saved.read_text())
        if previous.get("params") != record["params"]:
            raise BenchmarkError(
                f"{saved}: this trial ran with {previous.get('params')}, the search now draws {record['params']} "
                "(another preset or search file?): use another --work_dir"
            )
        ran = previous.get("seed", previous.get("index"))  # records before seed_base hold none: trial k ran from k
        if ran != record["seed"]:
            raise BenchmarkError(
                f"{saved}: this trial ran from torch seed {ran}, now {record['seed']} "
                "(another --seed_base?): use another --work_dir"
            )
    else:
        write_json(saved, record)


def run_trial(
    runner: Runner,
    steps: ModelSteps,
    k: int,
    params: Mapping[str, Any],
    trial_dir: Path,
    overrides: dict[str, Any],
    no_learning: Mapping[str, Any],
) -> tuple[dict[str, Any], list[str]]:
    """Train one trial and evaluate its selected checkpoint on the validation split; returns the trial record
    (params, overrides, validation row and score when it finished, and ``learnt``: whether its validation map beats
    ``no_learning``, the no-learning figures of the validation split, also kept in its trial.json) and the names of
    its steps."""
    name = steps.spec.name
    record: dict[str, Any] = {"model": name, "index": k, "params": dict(params), "seed": int(overrides["seed"])}
    _check_trial_record(trial_dir / "trial.json", record)
    train = steps.train(f"{name}_trial{k:02d}_train", overrides, trial_dir / "global_trained.json")
    val_dir = trial_dir / "validation"
    validate = steps.evaluate(f"{name}_trial{k:02d}_validation", overrides, val_dir, eval_split="validation")
    if runner.run(train) and runner.run(validate):
        summary = read_metrics(validate.done_file)
        record["validation"] = table_row(summary, MapName.GLOBAL)
        record["score"] = validation_dice(summary)
        record["learnt"] = beats_no_learning(record["validation"], no_learning)[0]
        saved = json.loads((trial_dir / "trial.json").read_text())
        write_json(trial_dir / "trial.json", {**saved, "learnt": record["learnt"]})
    else:
        runner.skip(validate.name, f"{train.name} failed")
    record["overrides"] = overrides
    return record, [train.name, validate.name]


def finish_model(
    runner: Runner, steps: ModelSteps, tag: str, model_dir: Path, overrides: Mapping[str, Any], target: Any
) -> list[str]:
    """After selection (or for a replicate): GLAM's local and joint stages, then the test evaluation(s); the
    reports go to ``target`` (a :class:`ModelResult` or :class:`Replicate`). Returns the step names."""
    names: list[str] = []
    if steps.spec.name != "glam":
        eval_dir = model_dir / "test"
        step = steps.evaluate(f"{tag}_test", overrides, eval_dir)
        names.append(step.name)
        if runner.run(step):
            target.test = read_metrics(step.done_file)
            target.test_csv = eval_dir / "metrics.csv"
        return names
    for stage_name in (Stage.LOCAL, Stage.JOINT):
        step = steps.train(f"{tag}_{stage_name}", overrides, model_dir / f"{stage_name}_trained.json", stage_name)
        names.append(step.name)
        if not runner.run(step):
            runner.skip(f"{tag}_test", f"{step.name} failed")
            return names
    for stage_name, attr in ((Stage.LOCAL, "test_local"), (Stage.JOINT, "test")):
        eval_dir = model_dir / f"test_{stage_name}"
        step = steps.evaluate(f"{tag}_test_{stage_name}", overrides, eval_dir, stage=stage_name)
        names.append(step.name)
        if runner.run(step):
            setattr(target, attr, read_metrics(step.done_file))
            setattr(target, f"{attr}_csv", eval_dir / "metrics.csv")
    return names


def replicate_model(
    runner: Runner, steps: ModelSteps, seed: int, datalist: Path, seed_dir: Path, selected: Mapping[str, Any]
) -> tuple[Replicate, list[str]]:
    """The selected trial's hyper-parameters trained again on the data of another seed, then its later stages and
    test evaluation(s): the variation of Table 1 across data sets."""
    name = steps.spec.name
    model_dir = seed_dir / name
    overrides = {
        **selected["overrides"],
        "datalist": str(datalist),
        "ckpt_root": str(model_dir / "models"),
        "output_root": str(model_dir / "eval"),
    }
    replicate = Replicate(seed=seed, datalist=datalist)
    tag = f"{name}_seed{seed}"
    train = steps.train(f"{tag}_train", overrides, model_dir / "global_trained.json")
    names = [train.name]
    if runner.run(train):
        names += finish_model(runner, steps, tag, model_dir, overrides, replicate)
    else:
        runner.skip(f"{tag}_test", f"{train.name} failed")
    return replicate, names


def _side_by_side(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run the calls each on its own thread (their workflow steps wait for the runner's slots); results in order,
    the first exception raised again."""
    if len(calls) <= 1:
        return [call() for call in calls]
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return [f.result() for f in [pool.submit(call) for call in calls]]


def run_benchmark(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the benchmark that the parsed ``args`` describe (``argv``: the command line, quoted in results.md);
    the exit status: 0, or 1 when a step failed or did not run."""
    start = time.monotonic()
    work_dir = Path(args.work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    preset, chain = flatten_preset(Path(args.preset), work_dir / "preset.json")
    config, budget = read_preset(preset)
    if args.trials is not None:
        budget = Budget(**{**budget.__dict__, "trials": args.trials})
    if args.variation_seeds is not None:
        budget = Budget(**{**budget.__dict__, "variation_seeds": tuple(args.variation_seeds)})
    if args.init_from is not None:
        budget = Budget(**{**budget.__dict__, "init_from": args.init_from})
    if args.seed_base is not None:
        budget = Budget(**{**budget.__dict__, "seed_base": args.seed_base})
    if args.extra_trials is not None:
        budget = Budget(**{**budget.__dict__, "extra_trials": args.extra_trials})
    if budget.init_from and Path(budget.init_from).resolve() == work_dir:
        raise BenchmarkError(f"--work_dir {work_dir} is the run the trials start from (init_from): use another")
    if budget.init_from and budget.start_from:
        raise BenchmarkError(f"--init_from and {args.preset}'s benchmark#start_from exclude each other")
    missing = sorted(
        f"{n} (starts from {w.model})"
        for n, w in budget.start_from.items()
        if n in args.models and w.model not in args.models
    )
    if missing:
        raise BenchmarkError(f"--models: {', '.join(missing)} needs the model it starts from")
    starts = selected_models(Path(budget.init_from).resolve(), args.models) if budget.init_from else {}
    search_path = Path(args.search).resolve()
    space = load_search_space(search_path, budget.search_space)
    docs_dir = Path(args.docs_dir).resolve()
    results_path = Path(args.results).resolve() if args.results else docs_dir / "results.md"
    runner = Runner(work_dir, args.threads, jobs=args.jobs, quiet=args.quiet, retries=args.retries)
    try:
        datalist = prepare_data(preset, work_dir, args.datalist)
        common = {"datalist": str(datalist), "check_data": False, "bundle_root": str(BUNDLE_ROOT)}
        per_stage = per_stage_values(config)
        inits = {name: start.checkpoint for name, start in starts.items()}
        model_steps = {
            name: ModelSteps.of(MODELS[name], preset, inits.get(name), budget.init_modules.get(name, ()))
            for name in args.models
        }
        results = {name: ModelResult(MODELS[name]) for name in args.models}
        step_names: dict[str, list[str]] = {name: [] for name in args.models}

        # the threshold of the retry rule and of the selection: a trial learnt to localise when its validation map
        # beats the no-learning map of the validation split
        log = (lambda _: None) if args.quiet else print
        no_learning = split_baselines(preset, datalist, "validation", log)
        if no_learning is None:
            raise BenchmarkError(f"{datalist}: no validation images (the trials are judged and selected on them)")

        def trial_call(steps: ModelSteps, k: int, params: Mapping[str, float], extra: Mapping[str, Any]) -> Callable:
            name = steps.spec.name
            trial_dir = work_dir / name / f"trial_{k:02d}"
            folders = {"ckpt_root": str(trial_dir / "models"), "output_root": str(trial_dir / "eval")}
            overrides = {
                **common,
                **folders,
                **budget.model_overrides.get(name, {}),
                **trial_overrides(params, per_stage, seed=budget.seed_base + k),
                **extra,
                **steps.stage,
            }
            return lambda: run_trial(runner, steps, k, params, trial_dir, overrides, no_learning)

        def run_trials(name: str, plan: Callable[[int], Callable]) -> None:
            """The search's trials of model ``name`` side by side ({trial k -> its call}), then the retry rule's
            extra trials when none of them learnt to localise (one after another)."""
            for record, names in _side_by_side([plan(k) for k in range(budget.trials)]):
                results[name].trials.append(record)
                step_names[name] += names
            records, names = extra_trials(results[name].trials, budget.trials, budget.extra_trials, lambda k: plan(k)())
            results[name].trials += records
            step_names[name] += names

        def warm_plan(name: str, warm_start: Any) -> Callable[[int], Callable] | None:
            """The trials of a model that starts from another model's selection (GMIC from CAM's: its global module
            trained first on the same budget as GLAM's, then the whole network); None when that model selected
            none."""
            source = best_trial(results[warm_start.model].trials)
            if source is None:
                runner.skip(f"{name}_trials", f"{warm_start.model}, which its trials start from, selected no trial")
                return None
            source_dir = work_dir / warm_start.model / f"trial_{source['index']:02d}"
            ckpt = source_dir / "models" / warm_start.model / "model.pt"
            held, taken = HELD_MODELS[(name, warm_start.model)]
            model_steps[name] = ModelSteps.of(MODELS[name], preset, ckpt, held)
            epochs = {**{k: int(v) for k, v in per_stage.get("epochs", {}).items()}, Stage.GLOBAL: warm_start.epochs}
            rates = sample_trials(load_search_space(search_path, warm_start.search_space), name, draws)
            held_params = {key: float(source["params"][other]) for key, other in taken.items()}
            params = [{**held_params, "learning_rate": float(drawn["learning_rate"])} for drawn in rates]
            return lambda k, s=model_steps[name], p=params, e={"epochs": epochs}: trial_call(s, k, p[k], e)

        def finish(name: str) -> None:
            """Selection, GLAM's later stages and the test evaluations, and the replicates on other data seeds."""
            result = results[name]
            best = best_trial(result.trials)
            if best is None:
                runner.skip(f"{name}_test", "no trial finished with a validation Dice")
                return
            result.selected = best["index"]
            trial_dir = work_dir / name / f"trial_{best['index']:02d}"
            tag = f"{name}_trial{best['index']:02d}"

            def selected_trial() -> tuple[None, list[str]]:
                return None, finish_model(runner, model_steps[name], tag, trial_dir, best["overrides"], result)

            calls: list[Callable[[], tuple[Replicate | None, list[str]]]] = [selected_trial]
            calls += [
                lambda seed=seed, data=data: replicate_model(
                    runner, model_steps[name], seed, data, work_dir / f"seed_{seed}", best
                )
                for seed, data in seed_data.items()
            ]
            for replicate, names in _side_by_side(calls):
                step_names[name] += names
                if replicate is not None:
                    result.replicates.append(replicate)

        def model_chain(name: str) -> None:
            """One model's work in order: (1) its trials (after the selection of the model it starts from, if
            any), (2) selection, later stages, test evaluations, (3) replicates; the models' chains run side by
            side, each step waiting only for a free slot of the runner."""
            try:
                if name in warm:
                    selected[warm[name].model].wait()
                    plan = warm_plan(name, warm[name])
                else:
                    drawn = sample_trials(space, name, draws)
                    drawn = fine_tuning_trials(drawn, starts[name]) if name in starts else drawn

                    def plan(k: int, s: ModelSteps = model_steps[name], d: list = drawn) -> Callable:
                        return trial_call(s, k, d[k], {})

                if plan is not None:
                    run_trials(name, plan)
            finally:
                selected[name].set()  # a model that starts from this one goes on, also when this one failed
            finish(name)

        # the draws beyond the search's trials are the extra trials' (trial k's draw does not depend on how many
        # are drawn)
        draws = budget.trials + budget.extra_trials
        warm = {name: w for name, w in budget.start_from.items() if name in args.models}
        selected = {name: threading.Event() for name in args.models}
        seed_data = {seed: prepare_data(preset, work_dir, None, seed) for seed in budget.variation_seeds}
        _side_by_side([lambda n=name: model_chain(n) for name in args.models])
        if runner.full_disk is not None:  # a page of skipped steps would say less than this line
            raise FullDisk(f"stopped, the disk is full: {runner.full_disk}; {RESUME_HINT}")
        for name, result in results.items():
            result.trials.sort(key=lambda t: t["index"])
            result.replicates.sort(key=lambda r: r.seed)
            timed = [runner.timings.get(s) for s in step_names[name]]
            result.wall_s = float(sum(t for t in timed if t is not None))
            result.wall_complete = all(t is not None for t in timed)

        figures = make_figures(
            results, work_dir, docs_dir, datalist, budget, preset, common, runner, figure_prefix(results_path)
        )
        try:
            trivial = split_baselines(preset, datalist, "test", log)
        except Exception as err:  # a report without this section beats no report after hours of training
            runner.skip("no_learning_baselines", f"{type(err).__name__}: {err}")
            trivial = None
        total = time.monotonic() - start
        command = "python -m glam_benchmark " + shlex.join(list(argv))
        out = write_results(
            results_path,
            docs_dir,
            results,
            command=command.strip(),
            preset=" + ".join(str(display_path(p)) for p in chain),
            search_path=display_path(search_path),
            space=space,
            budget=budget,
            datalist=datalist,
            threads=args.threads,
            jobs=args.jobs,
            total_wall_s=total,
            run_wall_s=runner.run_wall_s(),
            steps_wall_s=float(sum(runner.timings.values())),
            failures=runner.failures,
            figures=figures,
            trivial=trivial,
            trivial_validation=no_learning,
        )
        if not args.quiet:
            held = sum(c.holds for c in out["checks"])
            print(
                f"[benchmark] wrote {results_path}; {held} of {len(out['checks'])} acceptance checks hold", flush=True
            )
        if runner.failures:
            print(
                "[benchmark] failed or skipped steps:\n" + "\n".join(f"  {k}: {v}" for k, v in runner.failures.items())
            )
            return 1
        return 0
    finally:
        runner.close()


def figure_prefix(results_path: Path) -> str:
    """The figures' file-name prefix: ``benchmark`` beside results.md, ``benchmark_<name>`` beside
    results_<name>.md (or <name>.md), so that two runs' figures can share one images folder."""
    stem = results_path.stem
    return "benchmark" if stem == "results" else "benchmark_" + stem.removeprefix("results_")


def _usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _default_jobs() -> int:
    """Workflow steps side by side: one on a GPU machine (each step trains on the GPU, which one step keeps busy; the
    cores go to its loader), else one per usable core (two one-thread steps beat one two-thread step on CPUs)."""
    import torch

    return 1 if torch.cuda.is_available() else _usable_cores()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="GLAM's Table-1 benchmark: random search, training and test evaluation of GLAM, CAM, GMIC and "
        "a U-Net on a synthetic dataset (and replicates on other data seeds), then results.md and its figures.",
    )
    parser.add_argument("--preset", required=True, help="size preset, e.g. glam_benchmark/configs/benchmark_cpu.yaml")
    parser.add_argument("--search", default=str(DEFAULT_SEARCH), help="search space file (default %(default)s)")
    parser.add_argument("--work_dir", default="runs/benchmark", help="data, checkpoints, logs (default %(default)s)")
    parser.add_argument(
        "--docs_dir", default="glam_benchmark/docs", help="folder of results.md and images/ (default %(default)s)"
    )
    parser.add_argument("--results", default=None, help="results file (default <docs_dir>/results.md)")
    parser.add_argument("--datalist", default=None, help="use this datalist instead of the preset's synthetic data")
    parser.add_argument(
        "--models", nargs="+", default=list(MODELS), choices=list(MODELS), help="models to run (default: all)"
    )
    parser.add_argument("--trials", type=int, default=None, help="override the preset's number of trials")
    parser.add_argument(
        "--extra_trials",
        type=int,
        default=None,
        help="trials a model none of whose trials learnt to localise gets, one after another until one does "
        "(default: the preset's benchmark#extra_trials, else 0)",
    )
    parser.add_argument(
        "--variation_seeds",
        type=int,
        nargs="*",
        default=None,
        help="data seeds of the replicates (default: the preset's benchmark#variation_seeds; none to skip them)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=_default_jobs(),
        help="workflow steps run side by side (default: 1 with a GPU, else the usable cores)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="OMP_NUM_THREADS of each step (default: usable cores / jobs)"
    )
    parser.add_argument(
        "--init_from",
        default=None,
        help="work folder of an earlier benchmark run: every model's trials start from the model that run selected "
        "(GLAM: its jointly trained model), e.g. on harder lesions (default: the preset's benchmark#init_from)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=2,
        help="run a failed step again this many times in the same invocation; training resumes from its last.pt "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--seed_base",
        type=int,
        default=None,
        help="trial k trains from torch seed SEED_BASE + k: the same recipe and draws on other initialisations "
        "(default: the preset's benchmark#seed_base, else 0)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.threads is None:
        args.threads = max(1, _usable_cores() // args.jobs)
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.retries < 0:
        parser.error(f"--retries must be >= 0, got {args.retries}")
    if args.seed_base is not None and args.seed_base < 0:
        parser.error(f"--seed_base must be >= 0, got {args.seed_base}")
    if args.trials is not None and args.trials < 1:
        parser.error(f"--trials must be >= 1, got {args.trials}")
    if args.extra_trials is not None and args.extra_trials < 0:
        parser.error(f"--extra_trials must be >= 0, got {args.extra_trials}")
    if not Path(args.preset).is_file():
        parser.error(f"--preset {args.preset}: file not found")
    if not Path(args.search).is_file():
        parser.error(f"--search {args.search}: file not found")
    args.models = list(dict.fromkeys(args.models))
    if args.datalist and args.variation_seeds:
        parser.error("--variation_seeds needs the preset's synthetic data (not --datalist)")
    try:
        return run_benchmark(args, argv)
    except BenchmarkError as err:
        parser.exit(err.exit_status, f"{parser.prog}: error: {err}\n")
    except OSError as err:
        full = disk_full(err)
        if full is None:
            raise
        parser.exit(1, f"{parser.prog}: error: {disk_full_message(full)}; {RESUME_HINT}\n")
    return 2
