"""CBIS-DDSM as TCIA delivers it: a downloaded-tree factory and make_datalist run as the documented command line.

The tree is written the way the NBIA Data Retriever lays it out (``CBIS-DDSM/<case>/<date>-DDSM-<n>/<n>.000000-<series
description>-<n>/1-1.dcm``); the description CSVs use the official columns with UID paths that do not exist on disk,
end some cells with a newline and swap the ROI-mask and cropped-image paths on one row. ROI series come both as two
separate series and as the two files of one series.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _dicom_factory import make_dataset, save
from PIL import Image

from scripts.data.datalist import SPLITS, check_patient_splits, load_datalist, patient_key
from scripts.data.header_facts import cbis_patient_id, parse_case_folder
from scripts.data.readers import read_mammogram

REPO_ROOT = Path(__file__).resolve().parents[2]
SHAPE = (64, 48)  # (rows, cols) of every full mammogram
MASS_COLUMNS = [
    "patient_id",
    "breast_density",
    "left or right breast",
    "image view",
    "abnormality id",
    "abnormality type",
    "mass shape",
    "mass margins",
    "assessment",
    "pathology",
    "subtlety",
    "image file path",
    "cropped image file path",
    "ROI mask file path",
]
CALC_COLUMNS = [c if c not in ("mass shape", "mass margins") else c for c in MASS_COLUMNS]
CALC_COLUMNS[CALC_COLUMNS.index("mass shape")] = "calc type"
CALC_COLUMNS[CALC_COLUMNS.index("mass margins")] = "calc distribution"


def _write(path: Path, pixels: np.ndarray, case: str, study: str, series: str, description: str) -> Path:
    ds = make_dataset(pixels, patient_id=case, laterality=None, view_position=None, spacing=None)
    ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.SeriesDescription = study, series, description
    path.parent.mkdir(parents=True, exist_ok=True)
    return save(ds, path)


class TciaTree:
    """Writes cases under ``root/CBIS-DDSM`` and returns the CSV rows that describe them."""

    def __init__(self, root: Path):
        self.root = root / "CBIS-DDSM"
        self.n = 0
        self.full: dict[str, np.ndarray] = {}  # case -> full image pixels
        self.rois: dict[tuple[str, int], np.ndarray] = {}  # (case, abnormality) -> bool mask

    def _uid(self) -> str:
        self.n += 1
        return f"1.3.6.1.4.1.9590.100.1.2.{1000 + self.n}"

    def _series_folder(self, case: str, description: str) -> Path:
        self.n += 1
        return self.root / case / f"07-20-2016-DDSM-{10000 + self.n}" / f"1.000000-{description}-{20000 + self.n}"

    def full_image(self, case: str, seed: int) -> str:
        pixels = np.random.default_rng(seed).integers(100, 4000, SHAPE).astype(np.uint16)
        study, series = self._uid(), self._uid()
        _write(self._series_folder(case, "full mammogram images") / "1-1.dcm", pixels, case, study, series,
               "full mammogram images")  # fmt: skip
        self.full[case] = pixels
        return f"{case}/{study}/{series}/000000.dcm"

    def roi(self, case: str, abnormality: int, box: tuple[int, int, int, int], one_series: bool) -> tuple[str, str]:
        """Writes abnormality ``abnormality``'s ROI mask (0/255, the image's size) and cropped image; returns the
        CSV's (cropped image path, ROI mask path)."""
        r0, r1, c0, c1 = box
        mask = np.zeros(SHAPE, bool)
        mask[r0:r1, c0:c1] = True
        self.rois[(case, abnormality)] = mask
        crop = self.full[case][r0:r1, c0:c1]
        folder = f"{case}_{abnormality}"
        study = self._uid()
        if one_series:  # the mask and the crop are the two files of one series, in no fixed order
            series = self._uid()
            where = self._series_folder(folder, "ROI mask images")
            _write(where / "1-1.dcm", crop, folder, study, series, "ROI mask images")
            _write(where / "1-2.dcm", mask.astype(np.uint16) * 255, folder, study, series, "ROI mask images")
            return f"{folder}/{study}/{series}/000000.dcm", f"{folder}/{study}/{series}/000001.dcm"
        roi_series, crop_series = self._uid(), self._uid()
        _write(self._series_folder(folder, "ROI mask images") / "1-1.dcm", mask.astype(np.uint16) * 255, folder,
               study, roi_series, "ROI mask images")  # fmt: skip
        _write(self._series_folder(folder, "cropped images") / "1-1.dcm", crop, folder, study, crop_series,
               "cropped images")  # fmt: skip
        return f"{folder}/{study}/{crop_series}/000000.dcm", f"{folder}/{study}/{roi_series}/000000.dcm"


def _row(columns, patient, side, view, abnormality, pathology, image, cropped, roi, kind="mass") -> list[str]:
    values = {
        "patient_id": patient,
        "breast_density": "2",
        "left or right breast": side,
        "image view": view,
        "abnormality id": str(abnormality),
        "abnormality type": kind,
        "assessment": "4",
        "pathology": pathology,
        "subtlety": "3",
        # as published: some path cells end with a newline
        "image file path": image + "\n",
        "cropped image file path": cropped + "\n",
        "ROI mask file path": roi,
    }
    return [values.get(c, "X") for c in columns]


def _write_csv(path: Path, columns: list[str], rows: list[list[str]]) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        writer.writerows(rows)
    return path


@pytest.fixture
def cbis(tmp_path):
    """A downloaded CBIS-DDSM: 5 women (P_00002 in the official test set; P_00001 in the Mass and Calc sets)."""
    tree = TciaTree(tmp_path / "download")
    mass, calc = [], []
    # P_00001 left CC: two malignant masses; ROI series of abnormality 1 = two files of one series, 2 = two series
    img = tree.full_image("Mass-Training_P_00001_LEFT_CC", 1)
    crop, roi = tree.roi("Mass-Training_P_00001_LEFT_CC", 1, (5, 15, 5, 12), one_series=True)
    mass.append(_row(MASS_COLUMNS, "P_00001", "LEFT", "CC", 1, "MALIGNANT", img, crop, roi))
    crop, roi = tree.roi("Mass-Training_P_00001_LEFT_CC", 2, (30, 40, 20, 30), one_series=False)
    mass.append(_row(MASS_COLUMNS, "P_00001", "LEFT", "CC", 2, "MALIGNANT", img, crop, roi))
    # P_00001 left MLO: benign without callback; the CSV swaps the ROI and cropped paths on this row
    img = tree.full_image("Mass-Training_P_00001_LEFT_MLO", 2)
    crop, roi = tree.roi("Mass-Training_P_00001_LEFT_MLO", 1, (10, 20, 10, 20), one_series=False)
    mass.append(_row(MASS_COLUMNS, "P_00001", "LEFT", "MLO", 1, "BENIGN_WITHOUT_CALLBACK", img, roi, crop))
    for k, (pid, pathology, seed) in enumerate([("P_00003", "BENIGN", 3), ("P_00004", "MALIGNANT", 4),
                                                ("P_00005", "BENIGN", 5), ("P_00006", "MALIGNANT", 6)]):  # fmt: skip
        case = f"Mass-Training_{pid}_RIGHT_CC"
        img = tree.full_image(case, seed)
        crop, roi = tree.roi(case, 1, (8 + k, 18 + k, 6, 16), one_series=bool(k % 2))
        mass.append(_row(MASS_COLUMNS, pid, "RIGHT", "CC", 1, pathology, img, crop, roi))
    img = tree.full_image("Mass-Test_P_00002_RIGHT_MLO", 7)
    crop, roi = tree.roi("Mass-Test_P_00002_RIGHT_MLO", 1, (40, 50, 30, 40), one_series=False)
    mass.append(_row(MASS_COLUMNS, "P_00002", "RIGHT", "MLO", 1, "MALIGNANT", img, crop, roi))
    # the same woman's left CC in the Calc collection: her own folder, the same P id
    img = tree.full_image("Calc-Training_P_00001_LEFT_CC", 8)
    crop, roi = tree.roi("Calc-Training_P_00001_LEFT_CC", 1, (50, 60, 2, 9), one_series=True)
    calc.append(_row(CALC_COLUMNS, "P_00001", "LEFT", "CC", 1, "BENIGN", img, crop, roi, kind="calcification"))
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    return {
        "tree": tree,
        "mass_rows": mass,
        "mass": _write_csv(csv_dir / "mass_case_description_train_set.csv", MASS_COLUMNS, mass),
        "calc": _write_csv(csv_dir / "calc_case_description_train_set.csv", CALC_COLUMNS, calc),
        "root": tmp_path / "download",
    }


def _make_datalist(*args: str) -> subprocess.CompletedProcess:
    """The documented command line, as a process started outside the repository (it works from any folder)."""
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "make_datalist.py"), *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT.parent,
    )


def _in_process(script: str, *args: str) -> subprocess.CompletedProcess:
    """The same command's ``main`` in this process (no second MONAI start-up), with its exit status and output."""
    spec = importlib.util.spec_from_file_location(f"cli_{script}", REPO_ROOT / "tools" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = module.main(list(args))
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def test_case_folder_names_and_patient_ids():
    case = parse_case_folder("Mass-Test_P_00173_LEFT_CC")
    assert (case.collection, case.patient, case.laterality, case.view, case.abnormality) == (
        "Mass-Test", "P_00173", "L", "CC", None)  # fmt: skip
    assert case.official_split == "test"
    roi = parse_case_folder("Calc-Training_P_00038_RIGHT_MLO_2")
    assert (roi.patient, roi.abnormality, roi.official_split) == ("P_00038", 2, "training")
    assert parse_case_folder("1.000000-full mammogram images-24515") is None
    assert cbis_patient_id("Mass-Test_P_00173_LEFT_CC") == cbis_patient_id("Calc-Training_P_00173_RIGHT_MLO")
    assert cbis_patient_id("ANON-42") is None


def test_tcia_tree_to_datalist(tmp_path, cbis):
    out = tmp_path / "lists" / "cbis.json"
    args = ["--csv", str(cbis["mass"]), str(cbis["calc"]), "--root", str(cbis["root"]), "--out", str(out)]
    res = _in_process("make_datalist", *args, "--fractions", "0.5", "0.5", "0")
    assert res.returncode == 0, res.stderr
    assert "swaps" in res.stderr  # the swapped row is noted
    data = load_datalist(out)
    items = {it["image"]: it for s in SPLITS for it in data[s]}
    assert len(items) == 8  # 7 mass images + the calc image
    tree = cbis["tree"]
    for image, item in items.items():
        path = out.parent / image
        assert path.is_file() and path.name == "1-1.dcm" and "full mammogram images" in path.parent.name
        case = path.parts[-4]
        assert np.array_equal(read_mammogram(path, mask=True)[0], tree.full[case])  # the right image
        assert item["pixel_spacing"] == 0.05 and item["pixel_spacing_source"] == "preset:cbis-ddsm"
        # image-sized binary masks: the union of the row's abnormalities of each class, as written in the tree
        for cls in ("benign", "malignant"):
            expected = np.zeros(SHAPE, bool)
            for (roi_case, _), roi in tree.rois.items():
                if roi_case == case:
                    expected |= roi
            key = f"mask_{cls}"
            if item["label"][1 if cls == "malignant" else 0]:
                mask = np.asarray(read_mammogram(out.parent / item[key], mask=True)[0])
                assert mask.shape == SHAPE and set(np.unique(mask)) <= {0, 255}
                assert np.array_equal(mask > 0, expected), (case, cls)
            else:
                assert key not in item
    by_case = {Path(k).parts[-4]: v for k, v in items.items()}
    assert by_case["Mass-Training_P_00001_LEFT_CC"]["label"] == [0, 1]
    assert by_case["Mass-Training_P_00001_LEFT_MLO"]["label"] == [1, 0]  # BENIGN_WITHOUT_CALLBACK is benign
    assert by_case["Calc-Training_P_00001_LEFT_CC"]["label"] == [1, 0]
    assert by_case["Mass-Training_P_00004_RIGHT_CC"]["label"] == [0, 1]
    # one woman, one split: P_00001's Mass and Calc images together; the official test set kept
    assert check_patient_splits(data) == []
    splits_of: dict[str, set[str]] = {}
    for split in SPLITS:
        for it in data[split]:
            splits_of.setdefault(patient_key(it), set()).add(split)
    assert all(len(s) == 1 for s in splits_of.values())
    assert sum(1 for it in items.values() if it["patient_id"] == "P_00001") == 3
    assert [it["patient_id"] for it in data["test"]] == ["P_00002"]
    assert data["training"] and data["validation"] and "official_split" not in json.dumps(data)
    # the swapped row's mask is the ROI mask DICOM (not the crop), used as it is
    mlo = by_case["Mass-Training_P_00001_LEFT_MLO"]
    assert "ROI mask images" in (out.parent / mlo["mask_benign"]).parent.name
    # and check_data passes it: files readable, masks binary and of the image's size, labels agree, splits fine
    res = _in_process("check_data", str(out))
    assert res.returncode == 0, res.stdout
    assert (
        "0 of 8 image(s) state one" in res.stdout and "8 of those 8 have a pixel_spacing in the datalist" in res.stdout
    )


def test_unresolvable_row_is_listed_and_fails(tmp_path, cbis):
    rows = list(cbis["mass_rows"])
    rows.append(_row(MASS_COLUMNS, "P_00009", "LEFT", "CC", 1, "MALIGNANT",
                     "Mass-Training_P_00009_LEFT_CC/1.2.3/1.2.4/000000.dcm", "", ""))  # fmt: skip
    # a ROI folder holding only the crop: no binary file of the image's size
    tree = cbis["tree"]
    img = tree.full_image("Mass-Training_P_00010_LEFT_CC", 10)
    crop, _ = tree.roi("Mass-Training_P_00010_LEFT_CC", 1, (1, 5, 1, 5), one_series=False)
    for mask_file in (tree.root / "Mass-Training_P_00010_LEFT_CC_1").rglob("*ROI mask images*/1-1.dcm"):
        mask_file.unlink()
    rows.append(_row(MASS_COLUMNS, "P_00010", "LEFT", "CC", 1, "BENIGN", img, crop, crop))
    csv_path = _write_csv(tmp_path / "mass_case_description_train_set.csv", MASS_COLUMNS, rows)
    out = tmp_path / "cbis.json"
    args = ["--csv", str(csv_path), "--root", str(cbis["root"]), "--out", str(out), "--fractions", "0.5", "0.5", "0"]
    res = _make_datalist(*args)
    assert res.returncode == 1 and not out.exists()
    skipped = [line for line in res.stderr.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 2
    assert f"{csv_path}:{len(rows) + 1}:" in skipped[1] and "no binary file of the image's size 64x48" in skipped[1]
    assert f"{csv_path}:{len(rows) + 1}:" not in skipped[0] and "Mass-Training_P_00009_LEFT_CC" in skipped[0]
    assert "--allow-missing" in res.stderr
    res = _in_process("make_datalist", *args, "--allow-missing")
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("SKIPPED") == 2
    data = load_datalist(out)
    assert not any("P_00009" in it["patient_id"] or "P_00010" in it["image"] for s in SPLITS for it in data[s])


def test_two_patients_are_refused_by_make_datalist_and_check_data(tmp_path, cbis):
    rows = [r for r in cbis["mass_rows"] if r[0] in ("P_00001", "P_00003")]
    csv_path = _write_csv(tmp_path / "two.csv", MASS_COLUMNS, rows)
    out = tmp_path / "two.json"
    # two women cannot fill three splits: refused whatever the draw, in one line with the ways out
    res = _make_datalist("--csv", str(csv_path), "--root", str(cbis["root"]), "--out", str(out), "--no-official-split")
    assert res.returncode == 2 and not out.exists()
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert "received no patient" in line or "validation split is empty" in line
    assert "2 patients" not in line or "--fractions 0.5 0.5 0" in line
    assert "--fractions" in line and "--val-datalist" in line and "Traceback" not in res.stderr
    res = _in_process("make_datalist", "--csv", str(csv_path), "--root", str(cbis["root"]), "--out", str(out),
                      "--fractions", "0.5", "0.5", "0")  # fmt: skip
    assert res.returncode == 0, res.stderr
    # the same two women all in training, as a hand-made list would have them: check_data refuses it too
    data = load_datalist(out)
    everything = {"training": data["training"] + data["validation"], "validation": [], "test": []}
    bad = tmp_path / "all_training.json"
    bad.write_text(json.dumps(everything))
    res = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "check_data.py"), str(bad)],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 1 and "validation split is empty" in res.stdout


def test_mask_pngs_are_written_atomically_beside_the_list(tmp_path, cbis):
    out = tmp_path / "lists" / "cbis.json"
    res = _in_process("make_datalist", "--csv", str(cbis["mass"]), "--root", str(cbis["root"]), "--out", str(out),
                      "--fractions", "0.5", "0.5", "0", "--pixel_spacing", "0.0435")  # fmt: skip
    assert res.returncode == 0, res.stderr
    merged = sorted((out.parent / "merged_masks").iterdir())
    assert [p.name.split("_")[0:4] for p in merged] == [["Mass-Training", "P", "00001", "LEFT"]]
    assert not [p for p in merged if p.name.startswith(".")]
    assert np.asarray(Image.open(merged[0])).shape == SHAPE
    data = load_datalist(out)
    assert {it["pixel_spacing_source"] for s in SPLITS for it in data[s]} == {"user:--pixel_spacing"}
    assert {it["pixel_spacing"] for s in SPLITS for it in data[s]} == {0.0435}
    assert "pixel_spacing on 7 items from user:--pixel_spacing" in res.stdout
