"""glam_benchmark/report.py: ``write_results`` renders results.md from a template, and its text for a fixed
synthetic run (every section present: failures, trivial baselines, a variation seed, findings, every figure) is
compared with a stored rendering (tests/benchmark/data/benchmark_results.md, made by the function before it was split
into sections). The run's hardware line and clock are pinned, so the comparison is of every byte."""

from __future__ import annotations

import csv
import os
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from glam_benchmark import presets, report, search

REPO_ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "data" / "benchmark_results.md"

CLASSES = ("benign", "malignant")
MAPS = ("S_g", "S_l", "S_c")


def _summary(base: float, maps=MAPS, missing_auc: bool = False) -> dict:
    """A metrics.json of the evaluation report, with values derived from ``base``."""
    stats = {}
    for i, m in enumerate(maps):
        stats[m] = {
            c: {
                "dice_mean": round(base + 0.01 * i + 0.02 * j, 6),
                "dice_std": 0.05 + 0.001 * i,
                "pxap_image_mean": round(base + 0.05 + 0.01 * i, 6),
                "pxap_image_std": 0.07,
                "pxap_dataset": round(base + 0.03 * j, 6),
                "pointing_game": 0.5 + 0.1 * j,
                "peak_on_border": 0.125 * i,
                "froc": {"0.25": 0.1, "0.5": 0.2, "1": round(base + 0.1 * j + 0.05 * i, 6), "2": 0.6, "4": 0.7},
            }
            for j, c in enumerate(CLASSES)
        }
    return {
        "split": "test",
        "n_images": 6,
        "classes": list(CLASSES),
        "maps": list(maps),
        "n_lesion_images": {"benign": 3, "malignant": 2},
        "classification_auc": {"benign": None if missing_auc else 0.7, "malignant": base + 0.4},
        "breast_auc": {"benign": None if missing_auc else 0.75, "malignant": round(base + 0.45, 6)},
        "metrics": stats,
        "pointing_tolerance_px": 16.0,
    }


def _csv(path: Path, base: float, maps=MAPS) -> Path:
    """A metrics.csv: 6 images, some without a lesion of a class (empty cells); the pointing hits (0 / 1) last."""
    columns = ["image"] + [f"{m}_{s}_{c}" for m in maps for s in ("dice", "pxap") for c in CLASSES]
    hits = [f"{m}_hit_{c}" for m in maps for c in CLASSES]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(columns + hits)
        for n in range(6):
            cells = [f"/data/img{n}.png"]
            for k, _ in enumerate(columns[1:]):
                cells.append("" if (n + k) % 4 == 0 else repr(round(base + 0.01 * ((n * 7 + k * 3) % 11), 6)))
            for k, _ in enumerate(hits):
                cells.append("" if n == 0 else str(float((n + k + round(base * 10)) % 3 != 0)))
            writer.writerow(cells)
    return path


def _trial(index: int, lr: float, val: dict | None, learnt: bool | None = None, **params) -> dict:
    record = {"index": index, "params": {"learning_rate": lr, **params}, "score": 0.3 + 0.01 * index, "validation": val}
    return record if learnt is None else {**record, "learnt": learnt}


def _results(tmp_path: Path) -> dict:
    from glam_benchmark.metrics import table_row

    def result(key: str, base: float, maps, **extra) -> report.ModelResult:
        folder = tmp_path / key
        folder.mkdir()
        val = table_row(_summary(base - 0.05, maps), maps[-1])
        params = {"t_global": 0.01, "lambda_sparsity": 1e-5} if key == "glam" else {"cam_t": 0.1}
        trials = [_trial(0, 1e-3, val, key != "cam", **params), _trial(1, 3e-4, None, **params)]
        if key == "cam":  # no trial learnt to localise: one extra trial, which did not either
            trials.append(_trial(2, 2e-4, val, False, **params))
        return report.ModelResult(
            spec=presets.MODELS[key],
            trials=trials,
            selected=0,
            test=_summary(base, maps, missing_auc=key == "unet"),
            test_csv=_csv(folder / "metrics.csv", base, maps),
            replicates=[
                report.Replicate(
                    seed=2022,
                    datalist=tmp_path / "d2022.json",
                    test=_summary(base - 0.02, maps),
                    test_csv=_csv(folder / "metrics_2022.csv", base - 0.02, maps),
                )
            ],
            wall_s=3723.4 + 10 * base,
            **extra,
        )

    return {
        "glam": result("glam", 0.35, MAPS, test_local=_summary(0.3), test_local_csv=_csv(tmp_path / "local.csv", 0.3)),
        "gmic": result("gmic", 0.3, ("S_g",), wall_complete=False),
        "cam": result("cam", 0.2, ("S_g",)),
        "unet": result("unet", 0.5, ("S_g",)),
    }


def render(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **budget_overrides) -> tuple[str, dict]:
    """results.md of a fixed synthetic run, with the hardware and the clock pinned."""
    monkeypatch.setattr(report, "_hardware", lambda threads: [f"- CPU: test; OMP_NUM_THREADS={threads}"])

    class FixedClock(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 11, 24, 12, 30, tzinfo=timezone.utc)

    monkeypatch.setattr(report, "datetime", FixedClock)
    monkeypatch.setenv("TZ", "UTC")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / report.FINDINGS_FILE).write_text(
        "  A finding, written by hand.\n\n### 1. A section\n\n```bash\n# a comment, not a section\n```\n"
        "## 2b. Another\n",
        encoding="utf-8",
    )
    data = tmp_path / "data"
    data.mkdir()
    datalist = data / "datalist.json"
    items = [{"patient_id": p, "label": [p % 2, int(p == 3)]} for p in range(5)]
    datalist.write_text(f'{{"training": {items}, "test": [{{"patient_id": 9}}]}}'.replace("'", '"'))
    (data / "generator.json").write_text(
        '{"seed": 7, "n": 6, "format": "png", "config": {"size": [736, 480], "lesion_prevalence": 0.6}}'
    )
    budget = presets.Budget(
        search_space="cpu",
        trials=2,
        epochs=10,
        local_epochs=4,
        joint_epochs=2,
        examples=4,
        variation_seeds=(2022,),
        wall_limit_h=3,
        local_learning_rate=1e-4,
        joint_learning_rate=1e-5,
        extra_trials=2,
        **{"patch_shift": 32, **budget_overrides},
    )
    space = search.SearchSpace(name="cpu", params={}, models={}, seed=11)
    figures = {name: tmp_path / "figures" / f"{name}.png" for name in ("scatter", "examples", "glam", "scales")}
    trivial = {
        "brightest_cell_hit": {"malignant": 0.25, "benign": 0.5},
        "n_lesion": {"malignant": 2, "benign": 3},
        "cell": 8,
        "brightest_cell_pooled": 0.4,
        "statistics": {"max": {"any": 0.87, "benign": 0.8, "malignant": 0.9}},
    }
    trivial_validation = {"brightest_cell_hit": {"malignant": 0.45, "benign": None}, "n_lesion": {"malignant": 4}}
    out = tmp_path / "docs" / "results.md"
    returned = report.write_results(
        out,
        docs,
        _results(tmp_path),
        command="python -m glam_benchmark --preset glam_benchmark/configs/benchmark_cpu.yaml",
        preset=Path("glam_benchmark/configs/benchmark_cpu.yaml"),
        search_path=Path("glam_benchmark/configs/benchmark_search.yaml"),
        space=space,
        budget=budget,
        datalist=datalist,
        threads=2,
        jobs=1,
        total_wall_s=1234.5,
        run_wall_s=7000.0,
        steps_wall_s=6900.0,
        failures={"unet/trial1": "exit status 1"},
        figures=figures,
        trivial=trivial,
        trivial_validation=trivial_validation,
    )
    # tmp_path differs between runs: the golden text has a placeholder where it appears
    return out.read_text(encoding="utf-8").replace(str(tmp_path), "<tmp>"), returned


def test_results_md_states_the_local_stage_s_patch_placement(tmp_path, monkeypatch):
    text, _ = render(tmp_path, monkeypatch, centre_patches=True)
    assert (
        "from the selected global module, on Algorithm 1's patches centred on the global map's peak inside each "
        "window (`centre_patches`), then moved by random offsets of up to 32 px (`patch_shift`) (the paper:"
    ) in text
    (tmp_path / "no_shift").mkdir()
    text, _ = render(tmp_path / "no_shift", monkeypatch, centre_patches=True, patch_shift=0)
    assert (
        "module, on Algorithm 1's patches centred on the global map's peak inside each window (`centre_patches`) ("
        in text
    )
    (tmp_path / "padding").mkdir()
    text, _ = render(tmp_path / "padding", monkeypatch, patch_shift=0, local_padding_mode="replicate")
    assert (
        "from the selected global module, its local module's convolutions padding each patch by repeating its border "
        "(`local_padding_mode`) (the paper:"
    ) in text


def test_results_md_equals_the_stored_rendering(tmp_path, monkeypatch):
    text, returned = render(tmp_path, monkeypatch)
    if os.environ.get("GLAM_UPDATE_GOLDEN"):  # regenerate after an intended change of results.md's text
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8")
    assert set(returned) == {"table1", "checks", "variation_checks"}
    assert list(returned["variation_checks"]) == [2022]
    # every section is present, so that the comparison covers every branch of the template
    for title in ("## Setup", "## Selection: the retry rule", "**Steps that failed", "## Table 1",
                  "## Relative Dice gain", "## Where the maps point", "## Acceptance conditions",
                  "## Variation", "### The same models trained on the data of seed 2022", "## Findings",
                  "## Table 2", "## Figures", "## Wall time per model", "## Every trial", "## Reproduce"):  # fmt: skip
        assert title in text, title


def test_results_md_without_optional_sections(tmp_path, monkeypatch):
    """No failures, trivial baselines, variation seeds, findings nor figures: their sections are left out."""
    monkeypatch.setattr(report, "_hardware", lambda threads: ["- CPU: test"])
    datalist = tmp_path / "datalist.json"
    datalist.write_text('{"test": []}')
    out = tmp_path / "results.md"
    results = {"cam": _results(tmp_path)["cam"]}
    report.write_results(
        out,
        tmp_path,
        results,
        command="x",
        preset=Path("p.yaml"),
        search_path=Path("s.yaml"),
        space=search.SearchSpace(name="cpu", params={}, models={}, seed=0),
        budget=presets.Budget(search_space="cpu", trials=1, epochs=1, local_epochs=1, joint_epochs=1, examples=1),
        datalist=datalist,
        threads=1,
        total_wall_s=60.0,
        steps_wall_s=50.0,
        failures={},
        figures={},
    )
    text = out.read_text(encoding="utf-8")
    for title in ("**Steps that failed", "### The same models", "## Findings", "![", "What image-wide statistics"):
        assert title not in text, title
    assert "| GLAM | not run |" in text and "| GLAM | not run | not run |" in text
    assert text.endswith("`<work_dir>/logs/`.\n")


def test_table2_orderings_against_a_hand_computation(tmp_path, monkeypatch):
    from glam_benchmark.metrics import ablation_checks, pointing_checks

    # S_c-joint's pointing game against the global module's: a tie holds, lower or missing fails
    assert {
        c.condition: (c.detail, c.holds)
        for c in pointing_checks({"S_g": {"benign": 0.75, "malignant": 0.5}, "S_c-joint": {"benign": 0.75}})
    } == {
        "S_c-joint >= S_g: pointing game benign": ("0.750 vs 0.750", True),
        "S_c-joint >= S_g: pointing game malignant": ("n/a", False),
    }
    assert not pointing_checks({"S_g": {"malignant": 0.5}, "S_c-joint": {"malignant": 0.49}})[0].holds

    # S_c-joint >= S_c-sep holds on a tie, S_c-sep > S_g and S_l > S_g do not; a missing value fails
    checks = ablation_checks(
        {
            "S_g": {"benign": 0.2, "malignant": 0.3},
            "S_l": {"benign": 0.2, "malignant": 0.31},
            "S_c-sep": {"benign": 0.25, "malignant": 0.3},
            "S_c-joint": {"benign": 0.25, "malignant": None},
        }
    )
    assert {c.condition: c.holds for c in checks} == {
        "S_c-joint >= S_c-sep: Dice benign": True,
        "S_c-joint >= S_c-sep: Dice malignant": False,
        "S_c-sep > S_g: Dice benign": True,
        "S_c-sep > S_g: Dice malignant": False,
        "S_l > S_g: Dice benign": False,
        "S_l > S_g: Dice malignant": True,
    }
    text, _ = render(tmp_path, monkeypatch)
    table2 = text[text.index("## Table 2") :]
    # the observed difference of S_c-sep over S_g: both from the local-stage model's metrics.csv, image by image
    with open(tmp_path / "local.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for cls in CLASSES:
        for better, column in (("S_c-sep", "S_c"), ("S_l", "S_l")):
            pairs = [(r[f"{column}_dice_{cls}"], r[f"S_g_dice_{cls}"]) for r in rows]
            diffs = [float(a) - float(b) for a, b in pairs if a != "" and b != ""]
            expected = sum(diffs) / len(diffs)
            assert f"| {better} > S_g | {cls} | {expected:+.3f} (" in table2, (better, cls)
    assert "The paper's ordering, S_c-joint >= S_c-sep > S_g and S_l > S_g in Dice for both classes:" in table2
    # the fixture's pointing games are the same for every map (0.6 malignant, 0.5 benign): ties, which hold
    assert "pointing game at or above S_g's (the global module trained alone), both classes: 2 of 2" in table2
    assert "| S_c-joint >= S_g: pointing game malignant | 0.600 vs 0.600 | yes |" in table2
    # the line under the bootstrap names exactly the orderings (S_c-joint > S_g aside) whose interval reaches zero
    rows = re.findall(r"^\| (S_[^|]+) > (S_[^|]+) \| (\w+) \| [+-][\d.]+ \(([+-][\d.]+), ([+-][\d.]+)\)", table2, re.M)
    implied = ("S_c-joint", "S_g")
    weak = [f"{a} > {b} {c} ({lo}, {hi})" for a, b, c, lo, hi in rows if float(lo) <= 0 and (a, b) != implied]
    assert len(rows) == 8 and weak
    assert "Orderings whose 95 % interval does not lie above zero: " + "; ".join(weak) + "." in table2
    # the pointing game's paired bootstrap: S_c of the joint model against S_g of the local-stage model, image by image
    with open(tmp_path / "glam" / "metrics.csv", newline="") as f:
        joint = {r["image"]: r for r in csv.DictReader(f)}
    with open(tmp_path / "local.csv", newline="") as f:
        local = list(csv.DictReader(f))
    below = []
    for cls in CLASSES:
        pairs = [(joint[r["image"]][f"S_c_hit_{cls}"], r[f"S_g_hit_{cls}"]) for r in local]
        diffs = [float(a) - float(b) for a, b in pairs if a != "" and b != ""]
        expected = sum(diffs) / len(diffs)
        row = rf"^\| S_c-joint >= S_g: pointing game \| {cls} \| ([+-][\d.]+) (\([^)]*\)) \|$"
        match = re.search(row, table2, re.M)
        assert match and match.group(1) == f"{expected:+.3f}", cls
        if expected < 0:
            below.append(f"{cls} {match.group(1)} {match.group(2)}")
    assert below, "the fixture has S_c-joint below S_g on a class"
    assert "S_c-joint's pointing game below S_g's: " + "; ".join(below) + "." in table2


def test_pointing_bootstrap_by_hand():
    """Identical hits give a zero interval and no shortfall; hits lost on every image give -1 with a zero-width
    interval, named; reports without per-image hits give no lines."""
    from glam_benchmark.report_tables import _pointing_bootstrap_lines

    s_g = {"benign": {"a": 1.0, "b": 0.0, "c": 1.0}, "malignant": {"a": 1.0, "d": 1.0}}
    s_c = {"benign": {"a": 1.0, "b": 0.0, "c": 1.0}, "malignant": {"a": 0.0, "d": 0.0}}
    lines = _pointing_bootstrap_lines({"S_g": s_g, "S_c-joint": s_c}, "S_c-joint", "S_g")
    assert "| S_c-joint >= S_g: pointing game | benign | +0.000 (+0.000, +0.000) |" in lines
    assert "| S_c-joint >= S_g: pointing game | malignant | -1.000 (-1.000, -1.000) |" in lines
    assert lines[-1] == "S_c-joint's pointing game below S_g's: malignant -1.000 (-1.000, -1.000)."
    same = _pointing_bootstrap_lines({"S_g": s_g, "S_c-joint": s_g}, "S_c-joint", "S_g")
    assert same[-1] == "S_c-joint's pointing game at or above S_g's on every class."
    empty = {"benign": {}, "malignant": {}}
    assert _pointing_bootstrap_lines({"S_g": empty, "S_c-joint": empty}, "S_c-joint", "S_g") == []
