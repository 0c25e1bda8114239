"""python -m glam_benchmark: the Table-1 benchmark driver (the package glam_benchmark behind its command line).

Fast tests check the search sampling (reproducible, within the configured ranges, log-uniform), the
acceptance-condition logic and the selection score on hand-made metrics, the resume rule of a step, the per-image
Dice reader and the argument errors. One slow test runs the driver end to end at the tiny size of
tests/benchmark/benchmark_tiny.yaml into a temporary folder and checks results.md against the workflows' own
metrics.json files, the two figures, and that a second run skips every finished step.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import sys
from pathlib import Path

import fire.parser
import numpy as np
import pytest
import torch
from monai.bundle import ConfigParser

from glam_benchmark import TRAIN_CONFIG, figures, metrics, presets, report, search, steps
from scripts.networks.settings import checkpoint_setting

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS = REPO_ROOT / "glam_benchmark" / "configs"
SEARCH = CONFIGS / "benchmark_search.yaml"
TINY_PRESET = Path(__file__).parent / "benchmark_tiny.yaml"

# the command-line tests go through the real entry point, ``python -m glam_benchmark``
cli = importlib.import_module("glam_benchmark.__main__")


# -- search ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("space_name", ["cpu", "paper"])
def test_search_sampling_is_reproducible_in_range_and_log_uniform(space_name):
    space = search.load_search_space(SEARCH, space_name)
    for model in presets.MODELS:
        many = search.sample_trials(space, model, 400)
        assert search.sample_trials(space, model, 400) == many  # same seed, same draws
        assert search.sample_trials(space, model, 3) == many[:3]  # trial k does not depend on the number of trials
        assert set(many[0]) == set(space.models[model])
        for config_id, param in space.models[model].items():
            kind, bounds = space.params[param]
            values = np.array([t[config_id] for t in many])
            if kind == "choice":
                assert set(values) <= set(bounds)
                assert len(set(values)) == len(bounds)  # 400 draws reach every value
                continue
            lo, hi = bounds
            logs = np.log10(values)
            assert logs.min() >= lo - 1e-12 and logs.max() <= hi + 1e-12
            # log-uniform: the exponent is uniform (mean at the middle, half the draws below 10^middle); a
            # linear-uniform draw would put only (10^mid - 10^lo) / (10^hi - 10^lo) < 25 % below 10^middle
            mid = (lo + hi) / 2
            assert abs(logs.mean() - mid) < 0.1 * (hi - lo)
            assert 0.4 < np.mean(logs < mid) < 0.6
    a, b = search.sample_trials(space, "cam", 2), search.sample_trials(space, "gmic", 2)
    assert a[0]["learning_rate"] != b[0]["learning_rate"]  # each model has its own random search


def test_other_search_seed_gives_other_draws(tmp_path):
    text = SEARCH.read_text().replace("seed: 0", "seed: 1")
    path = tmp_path / "search.yaml"
    path.write_text(text)
    one, two = search.load_search_space(SEARCH, "cpu"), search.load_search_space(path, "cpu")
    assert search.sample_trials(one, "glam", 2) != search.sample_trials(two, "glam", 2)


def test_trial_overrides_replace_only_the_global_stage_of_per_stage_values():
    per_stage = {
        "learning_rate": {"global": 1e-3, "local": 5e-4, "joint": 5e-5},
        "lambda_sparsity": {"global": 1e-5, "local": 1e-3, "joint": 1e-5},
    }
    out = search.trial_overrides({"learning_rate": 2e-3, "lambda_sparsity": 3e-6, "cam_t": 1.0}, per_stage, seed=3)
    assert out == {
        "seed": 3,
        "learning_rate": {"global": 2e-3, "local": 5e-4, "joint": 5e-5},
        "lambda_sparsity": {"global": 3e-6, "local": 1e-3, "joint": 1e-5},
        "cam_t": 1.0,
    }
    # a preset that gives one sparsity weight for every stage: the drawn one replaces it everywhere
    out = search.trial_overrides({"lambda_sparsity": 3e-6}, {"learning_rate": per_stage["learning_rate"]}, seed=0)
    assert out == {"seed": 0, "lambda_sparsity": 3e-6}


def test_per_stage_values_are_the_numeric_per_stage_ids_of_a_preset():
    config = {
        "learning_rate": {"global": 1e-3, "local": 3e-5, "joint": 1e-5},
        "lambda_sparsity": 1e-5,
        "epochs": {"global": 10, "local": 1, "joint": 2},
        "t_local": 0.2,
        "global_backbone": {"stem_pool": False},
        "partial": {"global": 1.0, "local": 2.0},
        "flags": {"global": True, "local": False, "joint": True},
    }
    assert search.per_stage_values(config) == {
        "learning_rate": {"global": 1e-3, "local": 3e-5, "joint": 1e-5},
        "epochs": {"global": 10.0, "local": 1.0, "joint": 2.0},
    }
    cpu = presets.read_preset(CONFIGS / "benchmark_cpu.yaml")[0]
    drawn = search.sample_trials(search.load_search_space(SEARCH, "cpu"), "glam", 1)[0]
    out = search.trial_overrides(drawn, search.per_stage_values(cpu), seed=0)
    # GLAM's local and joint stages keep the preset's values; the global stage trains with the drawn ones
    assert out["learning_rate"]["global"] == drawn["learning_rate"]
    assert out["learning_rate"]["local"] == cpu["learning_rate"]["local"]
    assert out["lambda_sparsity"]["global"] == drawn["lambda_sparsity"]
    assert out["lambda_sparsity"]["local"] == cpu["lambda_sparsity"]["local"]


def test_bundle_command_round_trips_values_through_the_cli_parser():
    cmd = steps.bundle_command(
        "training", [Path("a.yaml"), Path("b.yaml")], {"learning_rate": {"global": 1e-3}, "x": 0.5}
    )
    assert cmd[3:7] == ["run_workflow", "scripts.GLAMWorkflow", "--run_id", "training"]
    values = dict(zip(cmd[7::2], cmd[8::2]))
    assert fire.parser.DefaultParseValue(values["--config_file"]) == ["a.yaml", "b.yaml"]
    assert fire.parser.DefaultParseValue(values["--learning_rate"]) == {"global": 1e-3}
    assert fire.parser.DefaultParseValue(values["--x"]) == 0.5


def test_bad_search_and_preset_files_are_named(tmp_path):
    with pytest.raises(presets.BenchmarkError, match="no search space 'gpu'"):
        search.load_search_space(SEARCH, "gpu")
    bad = tmp_path / "search.yaml"
    bad.write_text("spaces: {s: {learning_rate: {uniform: [0, 1]}}}\nmodels: {}\n")
    with pytest.raises(presets.BenchmarkError, match=r"search.yaml: spaces#s#learning_rate: unknown kind 'uniform'"):
        search.load_search_space(bad, "s")
    preset = tmp_path / "preset.yaml"
    preset.write_text("image_size: [368, 240]\n")
    with pytest.raises(presets.BenchmarkError, match=r"preset.yaml: a benchmark preset needs a 'benchmark' section"):
        presets.read_preset(preset)
    preset.write_text("benchmark: {search_space: cpu, trials: 0, examples: 1}\n")
    with pytest.raises(presets.BenchmarkError, match=r"benchmark#trials must be an integer >= 1"):
        presets.read_preset(preset)
    preset.write_text("benchmark: {search_space: cpu, trials: 1, examples: 1}\npatch_shift: -4\n")
    with pytest.raises(presets.BenchmarkError, match=r"preset.yaml: patch_shift must be an integer >= 0, got -4"):
        presets.read_preset(preset)
    preset.write_text("benchmark: {search_space: cpu, trials: 1, examples: 1}\ncentre_patches: 'yes'\n")
    with pytest.raises(presets.BenchmarkError, match=r"preset.yaml: centre_patches must be true or false, got 'yes'"):
        presets.read_preset(preset)
    preset.write_text("benchmark: {search_space: cpu, trials: 1, examples: 1}\ncentre_patches: true\n")
    assert presets.read_preset(preset)[1].centre_patches is True
    assert presets.read_preset(preset)[1].local_padding_mode == "zeros"  # train.yaml's
    preset.write_text("benchmark: {search_space: cpu, trials: 1, examples: 1}\nlocal_padding_mode: reflect\n")
    with pytest.raises(presets.BenchmarkError, match=r"local_padding_mode must be one of zeros, replicate, got 'refl"):
        presets.read_preset(preset)
    preset.write_text("benchmark: {search_space: cpu, trials: 1, examples: 1}\nlocal_padding_mode: replicate\n")
    assert presets.read_preset(preset)[1].local_padding_mode == "replicate"


def test_command_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--preset", str(tmp_path / "missing.yaml")])
    assert info.value.code == 2
    assert "missing.yaml: file not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--preset", str(TINY_PRESET), "--threads", "0"])
    assert "--threads must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--preset", str(TINY_PRESET), "--models", "resnet"])
    assert "invalid choice: 'resnet'" in capsys.readouterr().err


def test_a_preset_on_a_base_is_layered_like_monai_config_files(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("benchmark: {search_space: cpu, trials: 2, examples: 1}\nimage_size: [368, 240]\nx: {a: 1, b: 2}\n")
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(f"benchmark: {{base: {base}, search_space: transfer, trials: 1, examples: 0}}\nx: {{a: 3}}\n")
    merged, chain = presets.flatten_preset(overlay, tmp_path / "run" / "preset.json")
    assert chain == [base, overlay] and merged == tmp_path / "run" / "preset.json"
    # every top-level key of the overlay replaces the base's whole (MONAI's layering); the rest is the base's
    content = json.loads(merged.read_text())
    assert content["x"] == {"a": 3} and content["image_size"] == [368, 240]
    assert content["benchmark"] == {"base": str(base), "search_space": "transfer", "trials": 1, "examples": 0}
    assert presets.read_preset(merged)[1].trials == 1
    # a preset without a base is used as it is; a missing base and a loop are named
    assert presets.flatten_preset(base, tmp_path / "unused.json") == (base, [base])
    assert not (tmp_path / "unused.json").exists()
    overlay.write_text("benchmark: {base: configs/no_such_preset.yaml, search_space: cpu, trials: 1, examples: 0}\n")
    with pytest.raises(presets.BenchmarkError, match=r"overlay.yaml: benchmark#base configs/no_such_preset.yaml: file"):
        presets.flatten_preset(overlay, tmp_path / "x.json")
    base.write_text(f"benchmark: {{base: {overlay}, search_space: cpu, trials: 1, examples: 0}}\n")
    overlay.write_text(f"benchmark: {{base: {base}, search_space: cpu, trials: 1, examples: 0}}\n")
    with pytest.raises(presets.BenchmarkError, match="benchmark#base leads back to"):
        presets.flatten_preset(overlay, tmp_path / "x.json")


def test_the_calibrated_preset_fine_tunes_the_cpu_presets_selected_models(tmp_path):
    merged, chain = presets.flatten_preset(CONFIGS / "benchmark_calibrated.yaml", tmp_path / "p.json")
    assert [p.name for p in chain] == ["benchmark_cpu.yaml", "benchmark_calibrated.yaml"]
    config, budget = presets.read_preset(merged)
    assert budget.init_from == "runs/benchmark" and budget.search_space == "transfer" and budget.trials == 1
    # GLAM's trials take the selected model's global module under a fresh local module; the baselines all of theirs
    assert budget.init_modules == {"glam": ("global_network",)}
    # the generator's defaults; the rest is the CPU preset's
    assert config["benchmark_data"] == {"_target_": "glam_benchmark.synthetic.SyntheticConfig"}
    assert config["benchmark_size"] == [736, 480] and budget.patch_shift == 32
    cpu_budget = presets.read_preset(CONFIGS / "benchmark_cpu.yaml")[1]
    assert budget.model_overrides == cpu_budget.model_overrides
    # GLAM's local stage takes Algorithm 1's patches for lesion-free images too (random ones let the local module learn
    # the patch choice on calibrated lesions); the conspicuous preset keeps the paper's random ones
    for preset, random_negatives in ((merged, False), (CONFIGS / "benchmark_cpu.yaml", True)):
        parser = ConfigParser()
        parser.read_config([str(TRAIN_CONFIG), str(preset)])
        parser.update({"stage": "local", "datalist": str(tmp_path / "unused.json")})
        assert parser.get_parsed_content("train#prepare_batch#random_negatives") is random_negatives
    space = search.load_search_space(SEARCH, "transfer")
    for model in ("glam", "cam", "gmic", "unet"):
        for trial in search.sample_trials(space, model, 20):
            assert 10**-4.1 <= trial["learning_rate"] <= 10**-3.9


def test_fine_tuning_trials_keep_the_selected_hyper_parameters_and_draw_the_learning_rate(tmp_path, capsys):
    from glam_benchmark import driver

    run = tmp_path / "run"
    with pytest.raises(presets.BenchmarkError, match=r"init_from .*run: no trial of cam finished its validation"):
        driver.selected_models(run, ["cam"])
    preset = tmp_path / "p.yaml"
    preset.write_text(f"benchmark: {{search_space: transfer, trials: 1, examples: 0, init_from: {run}}}\n")
    with pytest.raises(SystemExit) as info:
        driver.main(["--preset", str(preset), "--work_dir", str(run)])
    assert info.value.code == 2 and "is the run the trials start from (init_from)" in capsys.readouterr().err
    scores = {0: 0.2, 1: 0.3}  # trial 1 has the better validation Dice
    for k, dice in scores.items():
        trial = run / "cam" / f"trial_{k:02d}"
        (trial / "validation").mkdir(parents=True)
        (trial / "trial.json").write_text(json.dumps({"params": {"learning_rate": 1e-3, "cam_t": 0.01 * (k + 1)}}))
        per_class = {c: {"dice_mean": dice} for c in ("malignant", "benign")}
        (trial / "validation" / "metrics.json").write_text(
            json.dumps({"split": "validation", "classes": ["malignant", "benign"], "metrics": {"S_g": per_class}})
        )
    assert metrics.validation_dice(json.loads((run / "cam/trial_01/validation/metrics.json").read_text())) == 0.3
    with pytest.raises(presets.BenchmarkError, match=r"trial_01/models/cam/model.pt not found"):
        driver.selected_models(run, ["cam"])
    (run / "cam/trial_01/models/cam").mkdir(parents=True)
    (run / "cam/trial_01/models/cam/model.pt").write_bytes(b"")
    selected = driver.selected_models(run, ["cam"])["cam"]
    assert selected.checkpoint == run / "cam/trial_01/models/cam/model.pt" and selected.params["cam_t"] == 0.02
    trials = driver.fine_tuning_trials([{"learning_rate": 1e-4, "cam_t": 1.0}], selected)
    assert trials == [{"learning_rate": 1e-4, "cam_t": 0.02}]


def test_presets_declare_a_budget_and_an_existing_search_space():
    for name in ("benchmark_cpu.yaml", "benchmark_full.yaml"):
        config, budget = presets.read_preset(CONFIGS / name)
        search.load_search_space(SEARCH, budget.search_space)
        assert budget.trials >= 1 and budget.epochs >= 1
    assert presets.read_preset(CONFIGS / "benchmark_full.yaml")[0]["benchmark_size"] == [2944, 1920]
    # the U-Net overlay comes after the preset and sets its widths: the CPU preset's go on the command line
    cpu_budget = presets.read_preset(CONFIGS / "benchmark_cpu.yaml")[1]
    assert set(cpu_budget.model_overrides) == {"unet"} and len(cpu_budget.model_overrides["unet"]["unet_features"]) == 6
    assert cpu_budget.wall_limit_h == 3
    # GLAM's later stages as the results state them
    assert (cpu_budget.local_learning_rate, cpu_budget.joint_learning_rate, cpu_budget.patch_shift) == (3e-5, 1e-5, 32)
    # the local stage's own sparsity weight (glam_benchmark/docs/results_findings.md, section 7); the joint stage
    # keeps the global's
    assert (cpu_budget.local_lambda_sparsity, cpu_budget.joint_lambda_sparsity) == (1e-3, 1e-5)
    assert (cpu_budget.local_t_local, cpu_budget.joint_t_local) == (None, None)  # train.yaml's one value
    # the calibrated preset's local pooling share, per stage (results_findings.md, section 32)
    calibrated = presets.read_preset(CONFIGS / "benchmark_calibrated.yaml")[1]
    assert (calibrated.local_t_local, calibrated.joint_t_local) == (0.05, 0.2)
    full_budget = presets.read_preset(CONFIGS / "benchmark_full.yaml")[1]
    assert full_budget.patch_shift == 0  # the paper's patches
    assert presets.read_preset(CONFIGS / "benchmark_cpu.yaml")[0]["benchmark_size"] == [736, 480]


# -- metrics and acceptance --------------------------------------------------------------------------------------
def _row(dice, pxap_image, pxap_dataset, auc):
    """A Table-1 row from (malignant, benign) pairs."""
    pair = lambda v: dict(zip(("malignant", "benign"), v))  # noqa: E731
    return {"dice": pair(dice), "pxap_image": pair(pxap_image), "pxap_dataset": pair(pxap_dataset), "auc": pair(auc)}


def test_acceptance_checks_on_hand_made_rows():
    rows = {
        "GLAM": _row((0.40, 0.30), (0.45, 0.35), (0.30, 0.20), (0.85, 0.75)),
        "GMIC": _row((0.30, 0.30), (0.40, 0.30), (0.25, 0.10), (0.88, 0.80)),  # benign Dice tied: GLAM does not beat it
        "CAM": _row((0.20, 0.20), (0.30, 0.20), (0.20, 0.05), (0.86, 0.70)),
        "U-Net": _row((0.50, 0.40), (0.60, 0.30), (0.40, 0.25), (None, None)),  # benign Dice under 0.5
    }
    # pointing game pooled over lesions: (0.9 * 10 + 0.7 * 30) / 40 = 0.75; S_g peaks on the border 3 / 40
    rows["GLAM"]["pointing_game"] = {"malignant": 0.9, "benign": 0.7}
    rows["GLAM"]["n_lesion"] = {"malignant": 10, "benign": 30}
    glam_global = {"peak_on_border": {"malignant": 0.0, "benign": 0.1}, "n_lesion": {"malignant": 10, "benign": 30}}
    checks = {c.condition: c for c in metrics.acceptance_checks(rows, glam_global, 2.5 * 3600, 3 * 3600)}
    # 2 metrics x 2 orderings x 2 classes, AUC and U-Net per class, pointing game, border, wall time
    assert len(checks) == 8 + 2 + 2 + 3
    failing = {name for name, c in checks.items() if not c.holds}
    assert failing == {
        "GLAM beats GMIC: Dice benign",
        "U-Net above GLAM, Dice >= 0.5: benign",
        "GLAM pointing game (S_c) >= 0.8",
    }
    # the best baseline's AUC is GMIC's (0.88 / 0.80): 0.85 and 0.75 are within 0.05
    assert checks["GLAM AUC within 0.05 of the best baseline: benign"].detail == "0.750 vs GMIC 0.800"
    assert checks["GLAM pointing game (S_c) >= 0.8"].detail == "0.750"
    assert checks["GLAM's S_g peaks on the border for < 10% of lesions"].detail == "0.075"
    assert checks["whole run within 3 h"].detail == "150 min"
    # a missing model or value fails its checks instead of passing them
    checks = {c.condition: c for c in metrics.acceptance_checks({k: v for k, v in rows.items() if k != "CAM"})}
    assert not checks["GMIC beats CAM: Dice malignant"].holds
    assert checks["GMIC beats CAM: Dice malignant"].detail == "0.300 vs n/a"
    assert not checks["GLAM's S_g peaks on the border for < 10% of lesions"].holds
    assert "whole run within 3 h" not in checks
    assert not metrics.acceptance_checks(rows, glam_global, 3.5 * 3600, 3 * 3600)[-1].holds


def test_selection_score_table_row_and_relative_gain():
    summary = {
        "classes": ["benign", "malignant"],
        "classification_auc": {"benign": 0.7, "malignant": 0.8},
        "metrics": {
            "S_g": {
                "benign": {"dice_mean": 0.2, "dice_std": 0.1, "pxap_image_mean": 0.3, "pxap_image_std": 0.2,
                           "pxap_dataset": 0.25},
                "malignant": {"dice_mean": 0.4, "dice_std": 0.1, "pxap_image_mean": 0.5, "pxap_image_std": 0.2,
                              "pxap_dataset": 0.45},
            }
        },
    }  # fmt: skip
    assert metrics.validation_dice(summary) == pytest.approx(0.3)
    summary["metrics"]["S_g"]["benign"]["dice_mean"] = None  # no benign lesion in the split
    assert metrics.validation_dice(summary) == pytest.approx(0.4)
    row = metrics.table_row(summary, "S_g")
    assert row["dice"]["malignant"] == 0.4 and row["pxap_dataset"]["benign"] == 0.25 and row["auc"]["benign"] == 0.7
    assert row["pointing_game"]["benign"] is None and row["n_lesion"] == {"benign": 0, "malignant": 0}
    summary["metrics"]["S_g"]["benign"]["pointing_game"] = 0.5
    summary["metrics"]["S_g"]["malignant"]["pointing_game"] = 1.0
    summary["n_lesion_images"] = {"benign": 3, "malignant": 1}
    row = metrics.table_row(summary, "S_g")
    assert metrics.pooled_rate(row, "pointing_game") == pytest.approx((0.5 * 3 + 1.0) / 4)
    assert metrics.relative_gain(0.390, 0.325) == pytest.approx(0.2)  # the paper's +20 % malignant
    assert metrics.relative_gain(0.335, 0.240) == pytest.approx(0.3958, abs=1e-4)  # and +40 % benign
    assert metrics.relative_gain(0.3, 0.0) is None and metrics.relative_gain(None, 0.3) is None


def test_per_image_dice_reads_only_images_with_the_lesion(tmp_path):
    csv_path = tmp_path / "metrics.csv"
    csv_path.write_text(
        "image,S_g_dice_benign,S_g_dice_malignant,S_l_dice_benign,S_l_dice_malignant\n"
        "a.png,0.1,,0.2,\n"
        "b.png,,0.3,,0.5\n"
        "c.png,,,,\n"
    )
    points = figures.per_image_dice(csv_path)
    assert points == {"benign": [(0.1, 0.2)], "malignant": [(0.3, 0.5)]}
    image = figures.dice_scatter(points, "test")
    assert image.shape == (520, 520, 3) and image.dtype == np.uint8
    from scripts.visualize import CLASS_COLOURS

    for colour in CLASS_COLOURS:  # one dot per class drawn in its colour
        assert np.all(image == np.array(colour, np.uint8), axis=-1).sum() >= 9


def test_pick_examples_alternates_classes_and_needs_a_lesion():
    items = [{"label": [0, 0]}, {"label": [1, 0], "i": 1}, {"label": [0, 1], "i": 2}, {"label": [1, 1], "i": 3}]
    assert [it["i"] for it in figures.pick_examples(items, 3)] == [2, 1, 3]
    assert figures.pick_examples([{"label": [0, 0]}], 2) == []


# -- resume ------------------------------------------------------------------------------------------------------
def test_a_step_whose_output_exists_is_skipped_and_a_failed_one_is_reported(tmp_path):
    runner = steps.Runner(tmp_path, threads=1, quiet=True)
    out = tmp_path / "out.txt"
    write = [sys.executable, "-c", f"open({str(out)!r}, 'a').write('x')"]
    assert runner.run(steps.Step("write", write, out))
    assert runner.run(steps.Step("write", write, out))  # done already: not run again
    assert out.read_text() == "x"
    assert set(json.loads((tmp_path / "timings.json").read_text())) == {"write"}
    marker = tmp_path / "trained.json"
    assert runner.run(steps.Step("train", [sys.executable, "-c", "pass"], marker, marker=True))
    assert json.loads(marker.read_text())["step"] == "train"
    assert not runner.run(steps.Step("bad", [sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "never"))
    assert "exit status 3" in runner.failures["bad"]
    assert not runner.run(steps.Step("silent", [sys.executable, "-c", "pass"], tmp_path / "never"))
    assert "finished without writing" in runner.failures["silent"]
    assert steps.Runner(tmp_path, threads=1).timings.keys() == {"write", "train"}  # times survive a restart


def test_a_step_killed_midway_is_run_again_in_the_same_invocation_and_resumes(tmp_path):
    """The first attempt writes its progress (as training writes last.pt) and is killed by SIGKILL; the runner runs
    it again, the second attempt continues from the progress file and finishes."""
    progress, out = tmp_path / "progress.txt", tmp_path / "metrics.json"
    script = (
        "import os, pathlib, signal\n"
        f"p, out = pathlib.Path({str(progress)!r}), pathlib.Path({str(out)!r})\n"
        "done = int(p.read_text()) if p.exists() else 0\n"
        "for epoch in range(done, 4):\n"
        "    p.write_text(str(epoch + 1))\n"
        "    if epoch == 1 and done == 0:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "print('resumed at', done)\n"
        "out.write_text('{}')\n"
    )
    runner = steps.Runner(tmp_path, threads=1, quiet=True, retries=1)
    assert runner.run(steps.Step("train", [sys.executable, "-c", script], out))
    assert progress.read_text() == "4" and out.is_file() and not runner.failures
    log = (tmp_path / "logs" / "train.log").read_text()
    assert "attempt 2 of 2" in log and "resumed at 2" in log  # both attempts logged; the second resumed
    # with no retry left the failure is reported as before
    never = tmp_path / "never"
    fail = steps.Runner(tmp_path / "b", threads=1, quiet=True, retries=0)
    (tmp_path / "b").mkdir()
    assert not fail.run(steps.Step("bad", [sys.executable, "-c", "raise SystemExit(3)"], never))
    assert "exit status 3" in fail.failures["bad"]
    runner.close()
    fail.close()


def test_invocation_wall_times_are_kept_by_a_heartbeat_until_the_runner_closes(tmp_path):
    import time

    import scripts.atomic  # noqa: F401  (the first write imports the bundle package, torch included: not timed here)

    record = tmp_path / "invocations.json"
    first = steps.Runner(tmp_path, threads=1, quiet=True, heartbeat_s=0.05)
    time.sleep(0.3)  # no step finished: only the heartbeat has written
    walls = [i["wall_s"] for i in json.loads(record.read_text())]
    assert len(walls) == 1 and walls[0] >= 0.05
    first.close()
    second = steps.Runner(tmp_path, threads=1, quiet=True, heartbeat_s=0.05)
    time.sleep(0.3)
    kept = json.loads(record.read_text())
    # the closed runner no longer writes: the file holds both invocations, the first as it was at close (about
    # 0.3 s; a heartbeat still running would have raised it to about 0.6 s and dropped the second entry)
    assert len(kept) == 2 and kept[0]["wall_s"] < 0.45
    assert second.run_wall_s() == pytest.approx(sum(i["wall_s"] for i in json.loads(record.read_text())))
    second.close()


def test_a_full_disk_stops_the_run_without_retrying_and_starts_no_later_step(tmp_path, monkeypatch):
    """A step whose log says the disk is full (cut mid-line, as a log on that disk is) is not run again and no
    later step starts; the heartbeat that finds no room for invocations.json stops the run the same way, without a
    traceback from its thread."""
    import errno
    import threading

    attempts = tmp_path / "attempts.txt"
    full = (
        f"open({str(attempts)!r}, 'a').write('x'); import sys; "
        "print(\"WARNING - cannot write the cache entry ([Errno 28] No space left on device: '/x/cache/1.pt'): it is "
        "recomputed\\nerror: no space left on devi\", end=''); sys.exit(1)"
    )
    runner = steps.Runner(tmp_path, threads=1, quiet=True, retries=2)
    try:
        assert not runner.run(steps.Step("train", [sys.executable, "-c", full], tmp_path / "never"))
        assert attempts.read_text() == "x"  # one attempt of three: another would find no more room
        assert runner.full_disk is not None and "train stopped: no space left on device" in runner.full_disk
        later = tmp_path / "later.txt"
        assert not runner.run(steps.Step("test", [sys.executable, "-c", f"open({str(later)!r}, 'w')"], later))
        assert not later.exists() and runner.failures["test"].startswith("not run: the disk is full (train stopped")
        # a step that fails for another reason is still run again
        other = steps.Runner(tmp_path / "b", threads=1, quiet=True, retries=1)
        (tmp_path / "b").mkdir()
        crash = f"open({str(tmp_path / 'crashes.txt')!r}, 'a').write('x'); raise SystemExit(3)"
        assert not other.run(steps.Step("bad", [sys.executable, "-c", crash], tmp_path / "never"))
        assert (tmp_path / "crashes.txt").read_text() == "xx" and other.full_disk is None
        other.close()
    finally:
        runner.close()

    def no_room(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "c" / "invocations.json"))

    raised = []
    monkeypatch.setattr(threading, "excepthook", raised.append)
    (tmp_path / "c").mkdir()
    beating = steps.Runner(tmp_path / "c", threads=1, quiet=True, heartbeat_s=0.02)
    monkeypatch.setattr(steps, "write_json", no_room)
    try:
        for _ in range(200):
            if beating.full_disk is not None:
                break
            threading.Event().wait(0.01)
        assert beating.full_disk is not None and "no space left on device writing" in beating.full_disk
        assert "invocations.json" in beating.full_disk and raised == []
    finally:
        beating.close()


def test_the_driver_stops_on_a_full_disk_with_one_line_and_keeps_the_finished_steps(tmp_path, monkeypatch, capsys):
    """The driver whose runner found the disk full writes no page and exits with one line saying what to do."""
    from glam_benchmark import driver

    class FullDisk(steps.Runner):
        def run(self, step):
            self._stop_for_full_disk(f"{step.name} stopped: no space left on device")
            return False

    _driver_without_data(monkeypatch, tmp_path, FullDisk)
    results = tmp_path / "results.md"
    argv = ["--preset", str(TINY_PRESET), "--work_dir", str(tmp_path / "work"), "--docs_dir", str(tmp_path)]
    argv += ["--results", str(results), "--jobs", "2", "--threads", "1", "--quiet"]
    with pytest.raises(SystemExit) as stop:
        driver.main(argv)
    assert stop.value.code == 1 and not results.exists()  # as a failed step's run
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error: stopped, the disk is full: " in err[0] and "no space left on device" in err[0]
    assert err[0].endswith("run the same command again (the finished steps are kept and skipped)")

    def no_room(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "data" / "datalist.json"))

    monkeypatch.setattr(driver, "prepare_data", no_room)  # a write outside any step: the same one line, status 1
    with pytest.raises(SystemExit) as stop:
        driver.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 1 and len(err) == 1
    assert f"error: no space left on device writing {tmp_path / 'data' / 'datalist.json'}" in err[0]
    assert err[0].endswith("(the finished steps are kept and skipped)")


# -- the retry rule: learnt to localise, extra trials, selection -------------------------------------------------
def test_cpu_and_transfer_spaces_take_the_papers_pooling_thresholds_and_sparsity_range():
    paper = search.load_search_space(SEARCH, "paper")
    for name in ("cpu", "transfer"):
        space = search.load_search_space(SEARCH, name)
        for param in ("t", "cam_t", "lambda_sparsity"):
            assert space.params[param] == paper.params[param], (name, param)
    assert paper.params["lambda_sparsity"] == ("log10_uniform", (-5.5, -3.5))
    assert paper.params["cam_t"] == ("choice", (0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 1.0))


def test_learnt_to_localise_against_a_hand_computed_no_learning_map():
    # three 64x64 images, 16-px cells: the brightest cell of image 0 lies on its malignant lesion (its centre, the
    # peak, within 1 px of a lesion pixel), that of image 1
    # does not; image 2 has no lesion, and no image has a benign one
    images = torch.zeros(3, 1, 64, 64)
    masks = torch.zeros(3, 2, 64, 64, dtype=torch.uint8)
    images[0, 0, :16, :16] = images[1, 0, 32:48, 32:48] = images[2, 0, 16:32, :16] = 1.0
    masks[0, 1, :16, :16] = masks[1, 1, :16, 48:] = 1
    labels = torch.tensor([[0.0, 1.0], [0.0, 1.0], [0.0, 0.0]])
    figures = metrics.no_learning_baselines(images, masks, labels, cell=16, tolerance=1.0)
    assert figures["brightest_cell_hit"] == {"benign": None, "malignant": 0.5}  # 1 hit of 2 malignant images
    assert figures["n_lesion"] == {"benign": 0, "malignant": 2}

    def row(malignant, benign):
        return {"pointing_game": {"malignant": malignant, "benign": benign}}

    # strictly above 0.5 on the malignant class; the benign class has no lesion image here and is not counted
    assert metrics.beats_no_learning(row(0.75, None), figures) == (True, "malignant 0.750 vs 0.500")
    assert metrics.beats_no_learning(row(0.5, 1.0), figures) == (
        False,
        "not above on malignant: malignant 0.500 vs 0.500",
    )
    assert not metrics.beats_no_learning(row(None, 1.0), figures)[0]
    assert not metrics.beats_no_learning(None, figures)[0]  # a trial without a validation row
    # with benign lesions in the split, both classes count
    both = {"brightest_cell_hit": {"malignant": 0.5, "benign": 0.4}, "n_lesion": {"malignant": 2, "benign": 3}}
    assert metrics.beats_no_learning(row(0.75, 0.3), both) == (
        False,
        "not above on benign: malignant 0.750 vs 0.500; benign 0.300 vs 0.400",
    )
    assert metrics.beats_no_learning(row(0.75, 0.5), both)[0]
    assert metrics.beats_no_learning(row(0.75, 0.5), {"brightest_cell_hit": {}, "n_lesion": {}}) == (
        False,
        "no lesion image in the split",
    )


def test_selection_prefers_the_trials_that_learnt_to_localise():
    from glam_benchmark.driver import best_trial

    trials = [
        {"index": 0, "score": 0.50, "learnt": False},  # the best Dice, but its map did not learn to localise
        {"index": 1, "score": 0.30, "learnt": True},
        {"index": 2, "score": 0.30, "learnt": True},
        {"index": 3, "score": float("nan"), "learnt": True},
        {"index": 4, "learnt": False},  # failed: no score
    ]
    assert best_trial(trials)["index"] == 1  # the lower index on a tie
    # when none learnt: the best Dice among all
    assert best_trial([{**t, "learnt": False} for t in trials])["index"] == 0
    assert best_trial([trials[3], trials[4]]) is None


def test_extra_trials_run_one_after_another_until_one_learns():
    from glam_benchmark.driver import extra_trials

    def runner(learns):
        ran = []

        def run(k):
            ran.append(k)
            return {"index": k, "learnt": k in learns}, [f"t{k}_train", f"t{k}_validation"]

        return ran, run

    ran, run = runner(learns={3})
    records, names = extra_trials([{"index": 0, "learnt": False}, {"index": 1}], 2, 5, run)
    assert ran == [2, 3] and [r["index"] for r in records] == [2, 3]  # stops at the first that learns
    assert names == ["t2_train", "t2_validation", "t3_train", "t3_validation"]
    ran, run = runner(learns=set())
    assert len(extra_trials([{"index": 0, "learnt": False}], 1, 2, run)[0]) == 2 and ran == [1, 2]  # never beyond
    ran, run = runner(learns=set())
    assert extra_trials([{"index": 0, "learnt": False}, {"index": 1, "learnt": True}], 2, 5, run) == ([], [])
    assert extra_trials([{"index": 0, "learnt": False}], 1, 0, run) == ([], []) and ran == []


def test_the_extra_trials_preset_key_and_its_command_line_override(tmp_path, capsys):
    base = "epochs: {global: 1, local: 1, joint: 1}\nlearning_rate: {global: 1.0e-3, local: 1.0e-4, joint: 1.0e-5}\n"
    preset = tmp_path / "p.yaml"
    preset.write_text(f"benchmark: {{search_space: cpu, trials: 1, examples: 0}}\n{base}")
    assert presets.read_preset(preset)[1].extra_trials == 0  # absent: no extra trial
    for value in ("-1", "1.5", "two", "true"):
        preset.write_text(f"benchmark: {{search_space: cpu, trials: 1, examples: 0, extra_trials: {value}}}\n{base}")
        with pytest.raises(presets.BenchmarkError) as err:
            presets.read_preset(preset)
        message = str(err.value)
        assert f"{preset}: benchmark#extra_trials must be an integer >= 0" in message and "\n" not in message, value
    for name in ("benchmark_cpu.yaml", "benchmark_full.yaml"):
        assert presets.read_preset(CONFIGS / name)[1].extra_trials == 2
    merged, _ = presets.flatten_preset(CONFIGS / "benchmark_calibrated.yaml", tmp_path / "calibrated.json")
    assert presets.read_preset(merged)[1].extra_trials == 2
    with pytest.raises(SystemExit):
        cli.main(["--preset", str(TINY_PRESET), "--extra_trials", "-1"])
    assert "--extra_trials must be >= 0, got -1" in capsys.readouterr().err


def _metrics_json(split, pointing, dice):
    """A metrics.json of the evaluation report: every map with these pointing games ({class: rate}) and Dice."""
    stats = {
        c: {"dice_mean": dice, "dice_std": 0.0, "pxap_image_mean": dice, "pxap_image_std": 0.0, "pxap_dataset": dice,
            "pointing_game": pointing[c], "peak_on_border": 0.0}
        for c in ("malignant", "benign")
    }  # fmt: skip
    return {
        "split": split,
        "classes": ["malignant", "benign"],
        "n_lesion_images": {"malignant": 4, "benign": 4},
        "classification_auc": {"malignant": 0.5, "benign": 0.5},
        "metrics": {m: stats for m in ("S_g", "S_l", "S_c")},
    }


def _driver_without_data(monkeypatch, tmp_path, runner):
    """The driver with ``runner`` as its Runner, an empty datalist, a no-learning map of 0.5 / 0.4 (malignant /
    benign) on the validation split, and no figures."""
    from glam_benchmark import driver

    no_learning = {"brightest_cell_hit": {"malignant": 0.5, "benign": 0.4}, "n_lesion": {"malignant": 4, "benign": 4}}
    no_learning.update(cell=16, tolerance=16.0, brightest_cell_pooled=0.45)
    datalist = tmp_path / "datalist.json"
    datalist.write_text('{"training": [], "validation": [], "test": []}')
    monkeypatch.setattr(driver, "Runner", runner)
    monkeypatch.setattr(driver, "prepare_data", lambda *args, **kwargs: datalist)
    monkeypatch.setattr(driver, "split_baselines", lambda *args, **kwargs: {**no_learning, "statistics": {}})
    monkeypatch.setattr(driver, "make_figures", lambda *args, **kwargs: {})


def test_the_driver_retries_each_model_that_did_not_learn_and_selects_among_those_that_did(
    tmp_path, monkeypatch, capsys
):
    """The driver with steps that train nothing: each validation step writes a metrics.json with the pointing games
    and Dice set below per (model, trial), against a no-learning map of 0.5 / 0.4 (malignant / benign)."""
    from glam_benchmark import driver

    # per model, per trial: (validation pointing game malignant, benign), validation Dice
    plan = {
        "glam": [((0.9, 0.8), 0.3)],  # learnt at once: no extra trial
        # trial 0 has the best Dice but misses benign lesions; trial 1 ties the threshold (not above); 2 learns; 3
        # would learn too but is never run
        "cam": [((0.9, 0.3), 0.5), ((0.5, 0.9), 0.4), ((0.6, 0.5), 0.1), ((1.0, 1.0), 0.9)],
        "unet": [((0.1, 0.1), d) for d in (0.2, 0.4, 0.3, 0.1)],  # never learns: every extra trial, the best Dice
        "gmic": [((0.0, 0.0), 0.6), ((1.0, 1.0), 0.2), ((1.0, 1.0), 0.3)],  # learns at its first extra trial
    }
    ran, commands = [], {}

    class Steps(steps.Runner):
        def run(self, step):
            if step.done_file.is_file():
                return True
            ran.append(step.name)
            commands[step.name] = step.command
            model, rest = step.name.split("_trial")
            pointing, dice = plan[model][int(rest[:2])] if rest.endswith("validation") else ((0.7, 0.6), 0.3)
            split = "validation" if rest.endswith("validation") else "test"
            content = {} if step.marker else _metrics_json(split, dict(zip(("malignant", "benign"), pointing)), dice)
            step.done_file.parent.mkdir(parents=True, exist_ok=True)
            step.done_file.write_text(json.dumps(content))
            self.timings[step.name] = 1.0
            return True

    _driver_without_data(monkeypatch, tmp_path, Steps)
    work, results = tmp_path / "work", tmp_path / "results.md"
    argv = ["--preset", str(TINY_PRESET), "--work_dir", str(work), "--docs_dir", str(tmp_path), "--results"]
    argv += [str(results), "--extra_trials", "3", "--jobs", "2", "--threads", "1", "--quiet"]
    assert driver.main(argv) == 0, capsys.readouterr().out
    trials = {m: sorted(int(p.name[6:]) for p in (work / m).glob("trial_*")) for m in plan}
    assert trials == {"glam": [0], "cam": [0, 1, 2], "unet": [0, 1, 2, 3], "gmic": [0, 1]}
    # trial k: the search's k-th draw (the same whatever the number drawn) from torch seed k
    cpu, transfer = search.load_search_space(SEARCH, "cpu"), search.load_search_space(SEARCH, "transfer")
    for model in ("cam", "unet"):
        draws = search.sample_trials(cpu, model, 40)
        for k in trials[model]:
            record = json.loads((work / model / f"trial_{k:02d}" / "trial.json").read_text())
            assert record["params"] == draws[k] and record["seed"] == k
            command = commands[f"{model}_trial{k:02d}_train"]
            assert command[command.index("--seed") + 1] == str(k)
    # GMIC started from CAM's selected trial, the one that learnt (after CAM's extra trials), with its next rates
    cam_params = json.loads((work / "cam" / "trial_02" / "trial.json").read_text())["params"]
    for k in (0, 1):
        gmic = json.loads((work / "gmic" / f"trial_{k:02d}" / "trial.json").read_text())
        assert gmic["params"] == {
            "t_global": cam_params["cam_t"],
            "lambda_sparsity": cam_params["lambda_sparsity"],
            "learning_rate": search.sample_trials(transfer, "gmic", 40)[k]["learning_rate"],
        }
        assert gmic["seed"] == k
    # the test evaluations are of the selected trials: CAM's that learnt, the U-Net's best Dice among all
    tested = sorted(name for name in ran if name.endswith(("_test", "_test_joint")))
    assert tested == ["cam_trial02_test", "glam_trial00_test_joint", "gmic_trial01_test", "unet_trial01_test"]
    text = " ".join(results.read_text().split())
    assert "strictly above the no-learning map's (the brightest cell of S_g's grid) on the validation split" in text
    assert "(its pointing game there: 0.500 malignant, 0.400 benign)" in text
    assert "a model none of whose 1 trial(s) learnt gets up to 3 extra trial(s)" in text
    for row in ("| GLAM | 1 | 0 | 0 | yes |", "| CAM | 3 (2 extra) | 2 | 2 | yes |",
                "| U-Net | 4 (3 extra) | none | 1 | **no** |", "| GMIC | 2 (1 extra) | 1 | 1 | yes |"):  # fmt: skip
        assert row in text, row
    assert "Not learnt to localise (the selected trial is not above the no-learning map): U-Net." in text
    # each trial.json keeps the verdict, and a run that starts from this one takes the same trials
    learnt = {k: json.loads((work / "cam" / f"trial_{k:02d}" / "trial.json").read_text())["learnt"] for k in range(3)}
    assert learnt == {0: False, 1: False, 2: True}
    for model, k in (("cam", 2), ("unet", 1)):
        (work / model / f"trial_{k:02d}" / "models" / model).mkdir(parents=True)
        (work / model / f"trial_{k:02d}" / "models" / model / "model.pt").write_bytes(b"")
    chosen = driver.selected_models(work, ["cam", "unet"])
    assert chosen["cam"].checkpoint.parts[-4] == "trial_02" and chosen["unet"].checkpoint.parts[-4] == "trial_01"
    # a second run: every trial and every extra trial is done already, the same selection
    ran.clear()
    assert driver.main(argv) == 0 and ran == []
    assert "| CAM | 3 (2 extra) | 2 | 2 | yes |" in " ".join(results.read_text().split())


def test_each_model_goes_on_when_its_own_step_ends_in_at_most_jobs_slots(tmp_path, monkeypatch, capsys):
    """The runner's real slots (only the subprocess is faked: each step sleeps, then writes its output): never more
    than --jobs steps at once; GLAM's local stage does not wait for CAM's extra trials; GMIC's trials wait for CAM's
    selection, extra trials included."""
    import threading
    import time

    from glam_benchmark import driver

    validation = {"glam": [(0.9, 0.8)], "unet": [(0.9, 0.8)], "gmic": [(0.9, 0.8)]}
    validation["cam"] = [(0.1, 0.1), (0.1, 0.1), (0.9, 0.8)]  # learns at its second extra trial
    events, lock, running = [], threading.Lock(), [0, 0]  # (event, step), [now, most]

    class Steps(steps.Runner):
        def _run(self, step):
            with lock:
                running[0] += 1
                running[1] = max(running)
                events.append(("start", step.name))
            time.sleep(0.05)
            model, rest = step.name.split("_trial")
            pointing = validation[model][int(rest[:2])] if rest.endswith("validation") else (0.7, 0.6)
            split = "validation" if rest.endswith("validation") else "test"
            content = {} if step.marker else _metrics_json(split, dict(zip(("malignant", "benign"), pointing)), 0.3)
            step.done_file.parent.mkdir(parents=True, exist_ok=True)
            step.done_file.write_text(json.dumps(content))
            with lock:
                self.timings[step.name] = 0.05
                running[0] -= 1
                events.append(("end", step.name))
            return True

    _driver_without_data(monkeypatch, tmp_path, Steps)
    argv = ["--preset", str(TINY_PRESET), "--work_dir", str(tmp_path / "work"), "--docs_dir", str(tmp_path)]
    argv += ["--results", str(tmp_path / "results.md"), "--extra_trials", "2", "--jobs", "2", "--threads", "1"]
    assert driver.main([*argv, "--quiet"]) == 0, capsys.readouterr().out
    at = {event: i for i, event in enumerate(events)}
    assert running[1] == 2 and len(events) == 2 * 19, events  # 4 x (train, validation), CAM's 2 extra, 7 later
    assert at[("start", "glam_trial00_local")] < at[("end", "cam_trial02_validation")]
    assert at[("start", "gmic_trial00_train")] > at[("end", "cam_trial02_validation")]
    assert at[("start", "glam_trial00_test_joint")] > at[("end", "glam_trial00_joint")]


def test_progress_lines_of_steps_running_at_once_stay_whole(tmp_path, monkeypatch):
    """Two chains log at the same moment (print writes a line and its newline apart): each line comes out whole."""
    import sys
    import threading
    import time

    class SlowStdout:
        def __init__(self):
            self.parts = []

        def write(self, text):
            time.sleep(0.002)  # widens the gap between print's two writes
            self.parts.append(text)
            return len(text)

        def flush(self):
            pass

    out = SlowStdout()
    monkeypatch.setattr(sys, "stdout", out)
    runner = steps.Runner(tmp_path, threads=1, jobs=2)
    try:
        chains = [threading.Thread(target=lambda m=m: [runner._log(f"{m} step {i}") for i in range(10)]) for m in "ab"]
        for chain in chains:
            chain.start()
        for chain in chains:
            chain.join()
    finally:
        runner.close()
    lines = "".join(out.parts).splitlines()
    assert len(lines) == 20 and all(line.count("[benchmark ") == 1 for line in lines), lines


def test_no_learning_checks_on_hand_made_test_rows():
    rows = {
        "GLAM": {"pointing_game": {"malignant": 0.9, "benign": 0.7}},
        "GMIC": {"pointing_game": {"malignant": 0.6, "benign": 0.42}},  # ties the benign figure: not above
        "CAM": {"pointing_game": {"malignant": 0.0, "benign": 0.0}},
        "U-Net": None,  # failed
    }
    glam_global = {"pointing_game": {"malignant": 0.8, "benign": 0.5}}
    no_learning = {"brightest_cell_hit": {"malignant": 0.55, "benign": 0.42}, "n_lesion": {"malignant": 9, "benign": 7}}
    checks = {c.condition: c for c in metrics.acceptance_checks(rows, glam_global, no_learning=no_learning)}
    title = "{} beats the no-learning map's pointing game on the test split, both classes"
    assert {m: checks[title.format(m)].holds for m in ("GLAM S_c", "GLAM S_g", "GMIC", "CAM", "U-Net")} == {
        "GLAM S_c": True,
        "GLAM S_g": True,
        "GMIC": False,
        "CAM": False,
        "U-Net": False,
    }
    assert checks[title.format("GLAM S_g")].detail == "malignant 0.800 vs 0.550; benign 0.500 vs 0.420"
    assert checks[title.format("GMIC")].detail == "not above on benign: malignant 0.600 vs 0.550; benign 0.420 vs 0.420"
    assert checks[title.format("CAM")].detail.startswith("not above on malignant and benign: ")
    assert (
        checks[title.format("U-Net")].detail
        == "not above on malignant and benign: malignant n/a vs 0.550; benign n/a vs 0.420"
    )
    # only the models present are checked; without the figures (a replicate on other data) there is no such check
    present = metrics.acceptance_checks({"CAM": rows["CAM"]}, no_learning=no_learning)
    assert [c.condition for c in present if "no-learning" in c.condition] == [title.format("CAM")]
    assert not any("no-learning" in c.condition for c in metrics.acceptance_checks(rows, glam_global))


# -- end to end --------------------------------------------------------------------------------------------------
def _cell(value, std=None):
    return "n/a" if value is None else (f"{value:.3f}" if std is None else f"{value:.3f} ± {std:.3f}")


@pytest.mark.slow
def test_driver_end_to_end_at_tiny_size_then_resumes_without_rerunning(tmp_path, capsys):
    from PIL import Image

    work, docs = tmp_path / "work", tmp_path / "docs"
    results = tmp_path / "out" / "results.md"
    argv = ["--preset", str(TINY_PRESET), "--work_dir", str(work), "--docs_dir", str(docs), "--results", str(results)]
    argv += ["--threads", "1", "--jobs", "2"]
    assert cli.main(argv) == 0, capsys.readouterr().out
    first_out = capsys.readouterr().out
    splits = json.loads(next(work.glob("data/*/datalist.json")).read_text())
    for split in ("validation", "test"):  # the progress line names the split and its size
        assert f"[benchmark] no-learning baselines on {len(splits[split])} {split} images in " in first_out
    text = results.read_text()
    assert (
        "GLAM then trains its local stage for 1 epoch(s) (learning rate 0.001, sparsity weight 0.01, local pooling "
        "share 0.1 (`t_local`)) and its joint stage for 1 epoch(s) (learning rate 0.0001, sparsity weight 0.006, "
        "local pooling share 0.3 (`t_local`)) from the selected global module, on Algorithm 1's patches moved by "
        "random offsets of up to 8 px"
    ) in " ".join(text.split())
    # each stage's checkpoint records the share it trained with (the evaluations read it back)
    trial = next(work.glob("glam/trial_*"))
    shares = {s: checkpoint_setting(trial / "models" / s / "model.pt", "t_local") for s in ("local", "joint")}
    assert shares == {"local": 0.1, "joint": 0.3}

    # Table 1: every model row, every column, values as in each model's test metrics.json
    header = "| model | " + " | ".join(
        f"{t} {c}"
        for t in (
            "Dice",
            "image-level PxAP",
            "dataset-level PxAP",
            "FROC at 1 FP/image",
            "classification AUC",
            "breast-level AUC",
        )  # fmt: skip
        for c in ("malignant", "benign")
    )
    assert header + " |" in text  # fmt: skip
    test_reports = {
        "GLAM": (next(work.glob("glam/trial_*/test_joint/metrics.json")), "S_c"),
        "GMIC": (next(work.glob("gmic/trial_*/test/metrics.json")), "S_g"),
        "CAM": (next(work.glob("cam/trial_*/test/metrics.json")), "S_g"),
        "U-Net": (next(work.glob("unet/trial_*/test/metrics.json")), "S_g"),
    }
    for name, (path, map_key) in test_reports.items():
        summary = json.loads(path.read_text())
        assert summary["split"] == "test"
        stats = summary["metrics"][map_key]
        cells = []
        for c in ("malignant", "benign"):
            cells.append(_cell(stats[c]["dice_mean"], stats[c]["dice_std"]))
        for c in ("malignant", "benign"):
            cells.append(_cell(stats[c]["pxap_image_mean"], stats[c]["pxap_image_std"]))
        cells += [_cell(stats[c]["pxap_dataset"]) for c in ("malignant", "benign")]
        cells += [_cell(stats[c]["froc"]["1"]) for c in ("malignant", "benign")]
        cells += [_cell(summary["classification_auc"][c]) for c in ("malignant", "benign")]
        cells += [_cell(summary["breast_auc"][c]) for c in ("malignant", "benign")]
        assert f"| {name} | " + " | ".join(cells) + " |" in text, name
    # Table 2 rows, gains, acceptance, trials, setup
    for row in ("S_g (global alone)", "S_l (local, global frozen)", "S_c-sep", "**S_c-joint (GLAM)**"):
        assert f"| {row} | " in text
    local = json.loads(next(work.glob("glam/trial_*/test_local/metrics.json")).read_text())
    assert local["stage"] == "local"
    d = local["metrics"]["S_l"]["malignant"]
    assert f"| S_l (local, global frozen) | {_cell(d['dice_mean'], d['dice_std'])} |" in text
    assert "## Relative Dice gain of GLAM over GMIC" in text and "| malignant |" in text
    # no wall-time limit in the tiny preset; every model's test map against the no-learning map (GLAM: S_c and S_g)
    assert re.search(r"(\d+) of 19 hold", text)
    assert "| CAM beats the no-learning map's pointing game on the test split, both classes | " in text
    # each trial judged against the no-learning map of the validation split, its trial.json keeping the verdict
    assert "## Selection: the retry rule" in text
    for model in ("glam", "cam", "gmic", "unet"):
        learnt = json.loads((work / model / "trial_00" / "trial.json").read_text())["learnt"]
        assert (
            isinstance(learnt, bool)
            and f"| {presets.MODELS[model].title} | 1 | {'0' if learnt else 'none'} | 0 |" in text
        )
    # localisation: every model's pointing game, and what needs no learning on the test split
    for name, map_key in (("GLAM", "S_c"), ("GLAM", "S_g"), ("GMIC", "S_g"), ("CAM", "S_g"), ("U-Net", "S_g")):
        path, _ = test_reports[name] if name != "GLAM" or map_key == "S_c" else test_reports["GLAM"]
        hit = json.loads(path.read_text())["metrics"][map_key]["malignant"]["pointing_game"]
        assert re.search(rf"^\| {re.escape(name)} \| {map_key} \| {re.escape(_cell(hit))} \|", text, flags=re.M), name
    assert "| no learning: the brightest 16-px cell |" in text and "| max | " in text
    assert len(re.findall(r"^\| (GLAM|CAM|GMIC|U-Net) \| 0 \| ", text, flags=re.M)) == 4  # one trial each
    for model in ("glam", "cam", "gmic", "unet"):
        val = json.loads((work / model / "trial_00" / "validation" / "metrics.json").read_text())
        assert val["split"] == "validation"
        # the trial table: validation Dice, then the pointing game pooled over the classes by their lesion counts
        pairs = [
            (val["metrics"]["S_g"][c]["pointing_game"], val["n_lesion_images"][c])
            for c in ("malignant", "benign")
            if val["n_lesion_images"][c] > 0
        ]
        pooled = sum(rate * n for rate, n in pairs) / sum(n for _, n in pairs)
        assert f"| {metrics.validation_dice(val):.3f} | {pooled:.3f} |" in text, model
        # trial k trains from torch seed k
        command = (work / "logs" / f"{model}_trial00_train.log").read_text().splitlines()[0]
        assert " --seed 0 " in command, model
    # GMIC's trial started from CAM's selected model, taken whole into its global module, with CAM's pooling
    # threshold and sparsity weight and a learning rate of the transfer space
    cam_model = work / "cam" / "trial_00" / "models" / "cam" / "model.pt"
    gmic_log = (work / "logs" / "gmic_trial00_train.log").read_text()
    assert f" --previous_model {cam_model} " in gmic_log.splitlines()[0]
    words = shlex.split(gmic_log.splitlines()[0])
    assert fire.parser.DefaultParseValue(words[words.index("--previous_modules") + 1]) == {"global_network": ""}
    assert f"loaded the previous stage's model {cam_model} (global_network only)" in gmic_log
    cam_params = json.loads((work / "cam" / "trial_00" / "trial.json").read_text())["params"]
    gmic_params = json.loads((work / "gmic" / "trial_00" / "trial.json").read_text())["params"]
    assert gmic_params["t_global"] == cam_params["cam_t"]
    assert gmic_params["lambda_sparsity"] == cam_params["lambda_sparsity"]
    assert 10**-4.1 <= gmic_params["learning_rate"] <= 10**-3.9
    assert "GMIC does not train from scratch: its 1 trial(s) of 1 epoch(s) start from the model CAM's" in " ".join(
        text.split()
    )
    assert "torch " in text and "OMP_NUM_THREADS=1" in text and "## Wall time per model" in text
    assert "python -m glam_benchmark --preset " in text
    assert "- test: " in text and "differ from the generator's calibrated defaults" in text
    # figures, linked relative to results.md
    for name in ("benchmark_dice_scatter.png", "benchmark_examples.png", "benchmark_glam_maps.png"):
        png = docs / "images" / name
        assert Image.open(png).size[0] > 100
        assert f"(../docs/images/{name})" in text
    # the preset's U-Net widths reached the trained model (the overlay alone would give MONAI's 32-wide default)
    unet = torch.load(next(work.glob("unet/trial_*/models/unet/model.pt")), weights_only=True)
    assert any(tuple(v.shape) == (4, 1, 3, 3) for v in unet.values())
    assert not any(v.ndim == 4 and v.shape[0] == 32 for v in unet.values())
    examples = np.asarray(Image.open(docs / "images" / "benchmark_examples.png"))
    assert examples.shape[1] == 5 * 160 + 4 * 4  # input, ground truth, CAM, GMIC, GLAM S_c
    glam_maps = np.asarray(Image.open(docs / "images" / "benchmark_glam_maps.png"))
    assert glam_maps.shape == examples.shape  # input, ground truth, S_g, S_l, S_c
    # the patches are outlined on S_l and S_c (the last two panels) and not on S_g
    from scripts.visualize import PATCH_COLOUR

    is_patch = np.all(glam_maps == np.array(PATCH_COLOUR, np.uint8), axis=-1)
    assert is_patch[:, 3 * 164 :].sum() > 0 and is_patch[:, : 3 * 164].sum() == 0
    # GLAM's global module per scale, from the selected checkpoint and from the last epoch (a last.pt is loaded)
    scales = np.asarray(Image.open(docs / "images" / "benchmark_global_scales.png"))
    assert scales.shape[0] == examples.shape[0] and scales.shape[1] == 10 * 160 + 9 * 4
    assert "(../docs/images/benchmark_global_scales.png)" in text
    glam_global = next(work.glob("glam/trial_*/models/global"))
    entries = figures.global_scale_models([Path("a.yaml")], {"t_global": 0.5}, glam_global)
    assert [e[2].name for e in entries] == ["model.pt", "last.pt"] and all(e[2].is_file() for e in entries)
    assert entries[0][3] == {
        "S_0": "selected S_0 (finest)",
        "S_1": "selected S_1",
        "S_2": "selected S_2 (coarsest)",
        "S_g": "selected S_g",
    }
    assert list(entries[1][3].values())[0] == "last S_0 (finest)"
    assert entries[0][1] == {"t_global": 0.5, "stage": "global", "validate#postprocessing#scales": True}

    # a second run finds every step done: nothing re-runs (logs untouched), the same tables come out
    logs = {p: p.stat().st_mtime_ns for p in (work / "logs").iterdir()}
    timings = (work / "timings.json").read_text()
    capsys.readouterr()
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "running" not in out and out.count("done already") == len(logs)
    assert {p: p.stat().st_mtime_ns for p in (work / "logs").iterdir()} == logs
    assert (work / "timings.json").read_text() == timings
    second = results.read_text()
    strip = lambda s: re.sub(  # noqa: E731
        r"(Generated by .*?\. |Wall time of the run: [^(]*|this invocation of the driver: [^;]*)", "", s
    )
    invocations = json.loads((work / "invocations.json").read_text())
    assert len(invocations) == 2 and all(i["wall_s"] > 0 for i in invocations)
    assert strip(second) == strip(text)
    steps_total = sum(json.loads(timings).values())
    assert f"the workflow steps added up, 2 at a time: {report._minutes(steps_total)})" in second
    assert f"Wall time of the run: {report._minutes(sum(i['wall_s'] for i in invocations))}" in second

    # an interrupted run (here: one test evaluation lost) re-runs that step only; findings written by hand beside
    # the results are carried into them
    (work / "cam" / "trial_00" / "test" / "metrics.json").unlink()
    (docs / report.FINDINGS_FILE).write_text("The benchmark is too easy for a **tiny** test.\n", encoding="utf-8")
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert re.findall(r"(\w+): running", out) == ["cam_trial00_test"]
    assert "## Findings\n" in results.read_text() and f"[{report.FINDINGS_FILE}](" in results.read_text()
    assert (
        f"| CAM | {_cell(json.loads(test_reports['CAM'][0].read_text())['metrics']['S_g']['malignant']['dice_mean'])}"
        in (results.read_text())
    )

    # a replicate on another data seed: CAM trained again with its selected hyper-parameters on new data
    assert cli.main([*argv, "--models", "cam", "--variation_seeds", "4"]) == 0
    out = capsys.readouterr().out
    assert re.findall(r"(\w+): running", out) == ["cam_seed4_train", "cam_seed4_test"]
    replicate = json.loads((work / "seed_4" / "cam" / "test" / "metrics.json").read_text())
    assert "_seed4_" in replicate["datalist"]
    assert "### The same models trained on the data of seed 4" in results.read_text()

    # fine-tuning what this run selected (glam_benchmark/configs/benchmark_calibrated.yaml at tiny size): each
    # model's trial starts from its selected model (GLAM: the jointly trained one) with that trial's
    # hyper-parameters and a learning rate from the transfer space; GLAM's later stages start from the stage
    # before, as in any run
    transfer = tmp_path / "transfer"
    transfer_argv = ["--preset", str(Path(__file__).parent / "benchmark_tiny_transfer.yaml")]
    transfer_argv += ["--init_from", str(work), "--work_dir", str(transfer), "--results", str(tmp_path / "transfer.md")]
    transfer_argv += ["--models", "glam", "cam"]
    assert cli.main([*transfer_argv, "--threads", "1", "--jobs", "2", "--docs_dir", str(tmp_path)]) == 0
    for model, stage_dir in (("glam", "joint"), ("cam", "cam")):
        start = work / model / "trial_00" / "models" / stage_dir / "model.pt"
        log = (transfer / "logs" / f"{model}_trial00_train.log").read_text()
        assert f" --previous_model {start} " in log.splitlines()[0] + " "
        assert f"loaded the previous stage's model {start}" in log
        before = json.loads((work / model / "trial_00" / "trial.json").read_text())["params"]
        after = json.loads((transfer / model / "trial_00" / "trial.json").read_text())["params"]
        assert {k: v for k, v in after.items() if k != "learning_rate"} == {
            k: v for k, v in before.items() if k != "learning_rate"
        }
        assert 10**-4.1 <= after["learning_rate"] <= 10**-3.9
    local_log = (transfer / "logs" / "glam_trial00_local.log").read_text()
    assert "--previous_model" not in local_log.splitlines()[0]
    # GLAM's trial took the selected model's global module only: its local module starts fresh (init_modules)
    glam_log = (transfer / "logs" / "glam_trial00_train.log").read_text()
    assert "--previous_modules" in glam_log.splitlines()[0] and "(global_network only)" in glam_log
    start = torch.load(work / "glam/trial_00/models/joint/model.pt", weights_only=True)
    fine_tuned = torch.load(transfer / "glam/trial_00/models/global/model.pt", weights_only=True)
    local_keys = [k for k in start if k.startswith("local_network.") and start[k].is_floating_point()]
    assert local_keys and not any(torch.equal(start[k], fine_tuned[k]) for k in local_keys)
    # the local stage kept the preset's own sparsity weight beside the drawn global one
    words = shlex.split(local_log.splitlines()[0])
    lambdas = fire.parser.DefaultParseValue(words[words.index("--lambda_sparsity") + 1])
    glam_params = json.loads((transfer / "glam" / "trial_00" / "trial.json").read_text())["params"]
    assert lambdas == {"global": glam_params["lambda_sparsity"], "local": 1e-2, "joint": 6e-3}
    assert f"loaded the previous stage's model {transfer / 'glam/trial_00/models/global/model.pt'}" in local_log
    transfer_text = " ".join((tmp_path / "transfer.md").read_text().split())
    assert f"start from the model it selected in the earlier benchmark run in `{work}`" in transfer_text
    assert "tests/benchmark/benchmark_tiny.yaml + tests/benchmark/benchmark_tiny_transfer.yaml" in transfer_text
    assert "_seed4_" in json.loads(next(transfer.glob("cam/trial_00/test/metrics.json")).read_text())["datalist"]
    # its figures are named after its results file, beside the first run's
    assert "(images/benchmark_transfer_dice_scatter.png)" in transfer_text
    assert Image.open(tmp_path / "images" / "benchmark_transfer_dice_scatter.png").size[0] > 100

    # a work folder whose trials ran with other hyper-parameters is refused, naming the trial
    trial = work / "gmic" / "trial_00" / "trial.json"
    record = json.loads(trial.read_text())
    record["params"]["learning_rate"] *= 2
    trial.write_text(json.dumps(record))
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert f"{trial}: this trial ran with" in capsys.readouterr().err


def test_bad_init_modules_are_named(tmp_path):
    for value, message in (
        ("{glam: global_network}", "must map a model to a list of submodule names"),
        ("{glam: []}", "must map a model to a list of submodule names"),
        ("{resnet: [global_network]}", r"unknown model\(s\) \['resnet'\]"),
    ):
        preset = tmp_path / "p.yaml"
        preset.write_text(
            f"benchmark: {{search_space: cpu, trials: 1, examples: 0, init_modules: {value}}}\n"
            "epochs: {global: 1, local: 1, joint: 1}\nlearning_rate: {global: 1.0e-3, local: 1.0e-4, joint: 1.0e-5}\n"
        )
        with pytest.raises(presets.BenchmarkError, match=message) as err:
            presets.read_preset(preset)
        assert "benchmark#init_modules" in str(err.value) and str(preset) in str(err.value)


def test_bad_start_from_is_named(tmp_path, capsys):
    base = "epochs: {global: 1, local: 1, joint: 1}\nlearning_rate: {global: 1.0e-3, local: 1.0e-4, joint: 1.0e-5}\n"
    for value, message in (
        ("{gmic: cam}", "must map a model to"),
        ("{gmic: {model: unet, epochs: 1, search_space: cpu}}", "gmic cannot start from 'unet' .known: gmic from cam"),
        ("{gmic: {model: cam, epochs: 0, search_space: cpu}}", "epochs must be an integer >= 1"),
        ("{gmic: {model: cam, epochs: 1}}", "needs a search_space"),
    ):
        preset = tmp_path / "p.yaml"
        preset.write_text(f"benchmark: {{search_space: cpu, trials: 1, examples: 0, start_from: {value}}}\n{base}")
        with pytest.raises(presets.BenchmarkError, match=message) as err:
            presets.read_preset(preset)
        assert "benchmark#start_from" in str(err.value) and str(preset) in str(err.value)
    # GMIC without the model it starts from, and a start from an earlier run besides
    for extra, message in (
        (["--models", "gmic"], "gmic .starts from cam. needs the model it starts from"),
        (["--init_from", str(tmp_path)], "exclude each other"),
    ):
        with pytest.raises(SystemExit) as info:
            cli.main(["--preset", str(TINY_PRESET), "--work_dir", str(tmp_path / "w"), *extra])
        assert info.value.code == 2
        assert re.search(message, capsys.readouterr().err)


def test_a_trial_folder_remembers_its_torch_seed(tmp_path, capsys):
    from glam_benchmark.driver import _check_trial_record

    record = {"model": "cam", "index": 1, "params": {"learning_rate": 1e-3}, "seed": 101}
    saved = tmp_path / "trial.json"
    _check_trial_record(saved, record)  # written
    _check_trial_record(saved, record)  # the same: accepted
    with pytest.raises(presets.BenchmarkError, match=r"ran from torch seed 101, now 1 \(another --seed_base\?\)"):
        _check_trial_record(saved, {**record, "seed": 1})
    # a record of an earlier version holds no seed: trial k ran from seed k
    saved.write_text(json.dumps({"model": "cam", "index": 1, "params": {"learning_rate": 1e-3}}))
    _check_trial_record(saved, {**record, "seed": 1})
    with pytest.raises(presets.BenchmarkError, match=str(saved)):
        _check_trial_record(saved, record)
    # the preset's base, and the command line's
    preset = tmp_path / "p.yaml"
    preset.write_text(
        "benchmark: {search_space: cpu, trials: 1, examples: 0, seed_base: 100}\n"
        "epochs: {global: 1, local: 1, joint: 1}\nlearning_rate: {global: 1.0e-3, local: 1.0e-4, joint: 1.0e-5}\n"
    )
    assert presets.read_preset(preset)[1].seed_base == 100
    with pytest.raises(SystemExit):
        cli.main(["--preset", str(TINY_PRESET), "--seed_base", "-1"])
    assert "--seed_base must be >= 0" in capsys.readouterr().err
