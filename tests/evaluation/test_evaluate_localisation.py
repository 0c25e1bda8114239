"""Screening's measures in the evaluation report: the breast-level AUC from the datalist's patients and sides, and the
lesion-level FROC of each map, on the tiny evaluation of ``test_evaluate.py`` (an untrained tiny GLAM, synthetic
images), each against an independent computation: breasts grouped by hand from metrics.csv's per-image scores and
the datalist, ranks for the AUC (no sklearn); the FROC's candidates, lesions and sweep in numpy from the maps and
masks the evaluator produced."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from ignite.engine import Events
from scipy import ndimage
from test_evaluate import BORDER, CLASSES, EDGES, MAPS, Probe, eval_setup, eval_workflow, np_rank_auc

__all__ = ["eval_setup"]  # the module-scoped fixture, shared with test_evaluate.py

RATES = (0.25, 0.5, 1.0, 2.0, 4.0)


def run(root: Path, datalist: Path, **overrides) -> tuple[dict, list[dict], Probe, str, dict]:
    """The evaluation with a probe: metrics.json, metrics.csv's rows, the probe, the printed text and the
    evaluator's ``state.metrics`` (what MLflow logs)."""
    wf = eval_workflow(root, datalist, **overrides)
    wf.initialize()
    probe = Probe()
    evaluator = wf.parser.get_parsed_content("validate#evaluator")
    evaluator.add_event_handler(Events.ITERATION_COMPLETED, probe)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        summary = wf.run()[-1]
    eval_dir = Path(overrides["eval_dir"])
    assert json.loads((eval_dir / "metrics.json").read_text()) == json.loads(json.dumps(summary))
    with open(eval_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return summary, rows, probe, stdout.getvalue(), dict(evaluator.state.metrics)


# -- the FROC in numpy -----------------------------------------------------------------------------------------------
def np_candidates(m: np.ndarray, radius: int, k: int) -> list[tuple[float, int, int]]:
    """(score, row, col) of the map's local maxima (the maximum of their square, above 0), one per plateau within a
    square (two local maxima within a square of each other are equal: the first in row-major order is kept), the k
    highest. SciPy's filters, where the metric has its own in torch."""
    size = 2 * radius + 1
    is_max = (m == ndimage.maximum_filter(m, size=size, mode="constant", cval=-np.inf)) & (m > 0)
    index = np.where(is_max, np.arange(m.size).reshape(m.shape), m.size)
    first = is_max & (ndimage.minimum_filter(index, size=size, mode="constant", cval=m.size) == index)
    rows, cols = np.nonzero(first)
    return sorted(((float(m[r, c]), int(r), int(c)) for r, c in zip(rows, cols)), key=lambda t: -t[0])[:k]


def np_froc(maps: list[np.ndarray], masks: list[np.ndarray], radius: int, tolerance: float, k: int = 20) -> list:
    """Sensitivity at each rate: lesions are 8-connected components; a candidate finds the lesion of its nearest
    lesion pixel within ``tolerance``; thresholds at PxAP's 0.001 bins (a score counts from its bin down)."""
    fp_bins, found_bins, total = [], [], 0
    for m, g in zip(maps, masks):
        labels, n = ndimage.label(g > 0, structure=np.ones((3, 3)))
        total += n
        lesion_rows, lesion_cols = np.nonzero(labels)
        best: dict[int, float] = {}
        for score, r, c in np_candidates(m, radius, k):
            lesion = 0
            if n:
                d = np.hypot(lesion_rows - r, lesion_cols - c)
                if d.min() <= tolerance:
                    lesion = int(labels[lesion_rows[d.argmin()], lesion_cols[d.argmin()]])
            if lesion:
                best[lesion] = max(best.get(lesion, -1.0), score)
            else:
                fp_bins.append(np.searchsorted(EDGES, score, "right") - 1)
        found_bins += [np.searchsorted(EDGES, s, "right") - 1 for s in best.values()]
    if total == 0:
        return [None] * len(RATES)
    fp_bins, found_bins = np.array(fp_bins), np.array(found_bins)
    out = []
    for rate in RATES:
        allowed = [t for t in range(len(EDGES) - 1) if (fp_bins >= t).sum() <= rate * len(maps)]
        out.append(0.0 if not allowed else float((found_bins >= min(allowed)).sum() / total))
    return out


# -- tests -------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def breast_report(eval_setup):
    """Twelve views of three women, made awkward: a breast seen in one view only, an image without its patient, and
    a breast whose two views belong to two studies (two breasts)."""
    root, _, content = eval_setup
    items = [dict(it) for it in content["training"][:12]]
    del items[5]  # SYN00002 L MLO: the left breast of SYN00002 has its CC view only
    items[8].pop("patient_id")  # SYN00004 L MLO: no patient, a breast of its own
    items[9]["study"] = "second"  # SYN00004 R CC: another study than its MLO view
    datalist = root / "breasts.json"
    datalist.write_text(json.dumps({"validation": content["validation"], "test": items}))
    # a generous FROC tolerance, so that the untrained maps' candidates find lesions at several rates
    summary, rows, probe, stdout, state = run(root, datalist, eval_dir=str(root / "breasts_eval"), froc_tolerance=30)
    return summary, rows, probe, stdout, state, items


def test_breast_auc_equals_the_breasts_grouped_by_hand_from_the_csv(breast_report):
    summary, rows, _, stdout, state, items = breast_report
    by_image = {it["image"]: it for it in items}
    assert [r["image"] for r in rows] == [it["image"] for it in items]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for n, row in enumerate(rows):
        item = by_image[row["image"]]
        key = (item["patient_id"], item["laterality"], item.get("study", "")) if "patient_id" in item else ("alone", n)
        groups[key].append(row)
    assert len(groups) == 8 and summary["n_breasts"] == 8 and summary["images_without_breast"] == 1
    for c in CLASSES:
        scores = np.array([np.mean([float(r[f"y_global_{c}"]) for r in g]) for g in groups.values()])
        labels = np.array([max(int(r[f"label_{c}"]) for r in g) for g in groups.values()])
        assert 0 < labels.sum() < len(labels)
        assert summary["breast_auc"][c] == pytest.approx(np_rank_auc(scores, labels), abs=1e-12)
        # the epoch's metrics, which MLflow logs after the report
        assert state[f"breast_auc_{c}"] == pytest.approx(summary["breast_auc"][c], abs=1e-12)
        assert state[f"classification_auc_{c}"] == pytest.approx(summary["classification_auc"][c], abs=1e-12)
        row = next(ln for ln in stdout.splitlines() if ln.startswith("S_c "))
        assert f"{summary['breast_auc'][c]:.3f}" in row
    assert "breasts: 8 (1 image(s) without a patient_id or laterality, each its own breast)" in stdout


def test_froc_settings_default_to_the_pointing_games():
    """train.yaml: candidates one per (2 peak_border + 1) square (froc_radius: one S_g cell), a hit within
    pointing_tolerance px (froc_tolerance); a preset that changes those changes the FROC's with them."""
    from conftest import TRAIN_CONFIG
    from monai.bundle import ConfigParser
    from test_evaluate import EVAL_CONFIG

    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(EVAL_CONFIG)])
    parser["peak_border"], parser["pointing_tolerance"] = 8, 16
    assert parser.get_parsed_content("froc_radius") == 8 and parser.get_parsed_content("froc_tolerance") == 16
    report = parser["validate#report"]
    assert report["froc_radius"] == "@froc_radius" and report["froc_tolerance"] == "@froc_tolerance"


def test_froc_of_every_map_and_class_equals_numpy(breast_report):
    summary, _, probe, stdout, _, _ = breast_report
    assert summary["froc_radius_px"] == BORDER and summary["froc_tolerance_px"] == 30
    found = []
    for ci, c in enumerate(CLASSES):
        masks = [item["lesion_mask"][ci] for item in probe.items]
        lesions = sum(ndimage.label(g > 0, structure=np.ones((3, 3)))[1] for g in masks)
        assert summary["n_lesions"][c] == lesions > 0
        for m in MAPS:
            froc = summary["metrics"][m][c]["froc"]
            assert list(froc) == ["0.25", "0.5", "1", "2", "4"]
            expected = np_froc([item[m][ci] for item in probe.items], masks, int(BORDER), 30.0)
            assert list(froc.values()) == pytest.approx(expected, abs=1e-12), (m, c)
            found += expected
            row = next(ln for ln in stdout.splitlines() if ln.startswith(m + " "))
            assert f"{froc['1']:.3f}" in row
    assert len(set(found)) > 2  # the case is not trivial: sensitivities other than 0 and 1
