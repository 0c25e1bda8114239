"""breasts.csv (scripts.inference.tables.breast_rows, written when a run compacts its tables): one row per
(patient, laterality), scores the mean of its views', a missing view and an image without a patient stated; kept
right when the run is repeated and when images are added."""

from __future__ import annotations

import csv
import shutil

import numpy as np
import pytest
import torch
from _dicom_factory import make_dicom
from test_inference_workflow import INFERENCE_CONFIG, TINY, TINY_INFERENCE, _run


def _breast(rows: int = 320, cols: int = 200, seed: int = 0) -> np.ndarray:
    """A 12-bit breast facing right (chest wall on the left) with a little texture."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:rows, 0:cols]
    inside = ((yy - rows / 2) / (rows * 0.45)) ** 2 + (xx / (cols * 0.8)) ** 2 < 1
    return np.where(inside, 1500 + rng.integers(0, 400, (rows, cols)), 0).astype(np.uint16)


def _read(path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from scripts.networks import GLAMSaliencyNet

    root = tmp_path_factory.mktemp("breasts")
    folder = root / "in"
    folder.mkdir()
    # CBIS-DDSM-like per-view PatientIDs: one woman (P_00001) with both views of her left breast and a CC of her right
    # breast; a second woman with both views of her right breast; a DICOM without a PatientID
    views = [
        ("Mass-Test_P_00001_LEFT_CC", "L", "CC"),
        ("Mass-Test_P_00001_LEFT_MLO", "L", "MLO"),
        ("Mass-Test_P_00001_RIGHT_CC", "R", "CC"),
        ("W2", "R", "CC"),
        ("W2", "R", "MLO"),
    ]
    for i, (pid, side, view) in enumerate(views):
        make_dicom(
            folder / f"img{i}.dcm",
            _breast(seed=i),
            patient_id=pid,
            laterality=side,
            view_position=view,
            spacing=(0.5, 0.5),
        )
    make_dicom(
        folder / "nopatient.dcm",
        _breast(seed=9),
        patient_id=None,
        laterality="L",
        view_position="CC",
        spacing=(0.5, 0.5),
    )
    torch.manual_seed(0)
    ckpt = root / "model.pt"
    torch.save(GLAMSaliencyNet(stage="joint", **TINY).state_dict(), ckpt)
    out = root / "out"
    overrides = {"input_dir": str(folder), "output_dir": str(out), "ckpt_path": str(ckpt), "outputs": ["S_c"]}
    _run([INFERENCE_CONFIG, TINY_INFERENCE], overrides)
    return {"root": root, "folder": folder, "out": out, "overrides": overrides}


def _expected(predictions: list[dict[str, str]]) -> dict[tuple[str, str], dict]:
    """The breasts by hand from predictions.csv: group, mean the scores, list the views."""
    groups: dict[tuple[str, str], list[dict[str, str]]] = {}
    for i, row in enumerate(predictions):
        key = (row["patient_id"], row["laterality"]) if row["patient_id"] and row["laterality"] else ("", str(i))
        groups.setdefault(key, []).append(row)
    return {
        key: {
            "images": len(rows),
            "views": ";".join(sorted({r["view"] for r in rows})),
            "prob_benign": np.mean([float(r["prob_benign"]) for r in rows]),
            "prob_malignant": np.mean([float(r["prob_malignant"]) for r in rows]),
        }
        for key, rows in groups.items()
    }


def test_one_row_per_breast_with_the_mean_of_its_views(run):
    predictions = _read(run["out"] / "predictions.csv")
    assert len(predictions) == 6
    # the CBIS per-view ids become the woman's id; the file without one has an empty cell
    assert sorted(r["patient_id"] for r in predictions) == ["", "P_00001", "P_00001", "P_00001", "W2", "W2"]
    breasts = _read(run["out"] / "breasts.csv")
    assert [(b["patient_id"], b["laterality"]) for b in breasts] == [
        ("P_00001", "L"),
        ("P_00001", "R"),
        ("W2", "R"),
        ("", ""),
    ]
    expected = _expected(predictions)
    for b in breasts[:3]:
        want = expected[(b["patient_id"], b["laterality"])]
        assert int(b["images"]) == want["images"] and b["views"] == want["views"]
        assert float(b["prob_benign"]) == pytest.approx(want["prob_benign"], abs=1e-6)
        assert float(b["prob_malignant"]) == pytest.approx(want["prob_malignant"], abs=1e-6)
    notes = {(b["patient_id"], b["laterality"]): b["note"] for b in breasts}
    assert notes[("P_00001", "L")] == "" and notes[("W2", "R")] == ""
    assert notes[("P_00001", "R")] == "no MLO view"  # a breast missing a view is stated
    assert notes[("", "")].startswith("no patient ID or no laterality")
    assert breasts[3]["inputs"].endswith("nopatient.dcm")


def test_a_repeated_run_keeps_it_and_an_added_image_joins_its_breast(run):
    before = (run["out"] / "breasts.csv").read_bytes()
    _run([INFERENCE_CONFIG, TINY_INFERENCE], run["overrides"])  # everything done: nothing redone
    assert (run["out"] / "breasts.csv").read_bytes() == before
    make_dicom(
        run["folder"] / "img9.dcm",
        _breast(seed=5),
        patient_id="Mass-Test_P_00001_RIGHT_MLO",
        laterality="R",
        view_position="MLO",
        spacing=(0.5, 0.5),
    )
    _run([INFERENCE_CONFIG, TINY_INFERENCE], run["overrides"])
    breasts = {(b["patient_id"], b["laterality"]): b for b in _read(run["out"] / "breasts.csv")}
    right = breasts[("P_00001", "R")]
    assert right["images"] == "2" and right["views"] == "CC;MLO" and right["note"] == ""
    want = _expected(_read(run["out"] / "predictions.csv"))[("P_00001", "R")]
    assert float(right["prob_malignant"]) == pytest.approx(want["prob_malignant"], abs=1e-6)
    shutil.rmtree(run["out"])
