"""tools/learning_curve.py: a plan of probe runs on tiny synthetic data, resumed, chained and reported."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import yaml
from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "tools" / "learning_curve.py"
_spec = importlib.util.spec_from_file_location("learning_curve", SCRIPT)
lc = importlib.util.module_from_spec(_spec)
sys.modules["learning_curve"] = lc
_spec.loader.exec_module(lc)


def _plan(tmp_path, runs: list[dict]) -> dict:
    plan = {
        "preset": "tests/configs/tiny.yaml",
        "data_root": str(tmp_path / "data"),
        "datasets": {"tiny": {"n": 24, "seed": 3, "config": {"lesion_prevalence": 0.6}}},
        "runs": runs,
    }
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


def test_a_plan_runs_chains_resumes_and_reports(tmp_path):
    plan = _plan(
        tmp_path,
        [
            {"name": "first", "data": "tiny", "epochs": 2},
            {"name": "second", "data": "tiny", "epochs": 1, "init": "run:first", "train_images": 8},
            {"name": "broken", "data": "tiny", "epochs": 1, "set": {"lambda_sparsity": -1.0}},
            {"name": "after_broken", "data": "tiny", "epochs": 1, "init": "run:broken"},
        ],
    )
    work = tmp_path / "work"
    assert lc.main(["--plan", str(plan), "--work_dir", str(work)]) == 1  # one run failed, the others finished
    first, second = (json.loads((work / f"{n}.json").read_text()) for n in ("first", "second"))
    assert [e["epoch"] for e in first["epochs"]] == [1, 2] and (work / "first.pt").is_file()
    assert [e["epoch"] for e in second["epochs"]] == [0, 1]  # epoch 0: first's best module, as loaded
    assert second["images"]["training"] == 8 and first["images"]["training"] > 8
    assert f"--init {work / 'first.pt'}" in (work / "second.cmd").read_text()
    assert not (work / "broken.json").exists() and not (work / "after_broken.log").exists()
    rows = {line.split(" | ")[0][2:]: line for line in (work / "report.md").read_text().splitlines()[2:]}
    assert "not finished" in rows["broken"] and "not finished" in rows["after_broken"]
    cells = rows["second"].split(" | ")
    assert cells[2] == "8" and cells[3] == "run:first" and cells[5] == str(second["best_epoch"])
    test_hits = second["test"]["hit"]
    assert cells[7] == " / ".join("n/a" if h != h else f"{h:.2f}" for h in test_hits)
    # resumed: the finished runs are not run again
    before = {n: (work / f"{n}.json").stat().st_mtime_ns for n in ("first", "second")}
    lc.main(["--plan", str(plan), "--work_dir", str(work)])
    assert before == {n: (work / f"{n}.json").stat().st_mtime_ns for n in ("first", "second")}


@pytest.mark.parametrize(
    "runs, message",
    [
        ([{"name": "a", "data": "other", "epochs": 1}], "not one of the plan's datasets"),
        ([{"name": "a", "data": "tiny"}], "needs name, data and epochs"),
        ([{"name": "a", "data": "tiny", "epochs": 1, "init": "run:b"}], "names no earlier run"),
        ([{"name": "a", "data": "tiny", "epochs": 1, "lr": 1}], "unknown keys"),
        ([{"name": "a", "data": "tiny", "epochs": 1}, {"name": "a", "data": "tiny", "epochs": 1}], "unique"),
        ([{"name": "a", "data": "tiny", "epochs": 1, "init": "no/such.pt"}], "is not a file"),
    ],
)
def test_bad_plans_are_refused_naming_the_run(tmp_path, runs, message):
    with pytest.raises(ValueError, match=message):
        lc.load_plan(_plan(tmp_path, runs))
