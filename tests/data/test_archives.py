"""VinDr-Mammo, INbreast and hospital-folder datalists: the data sets' own layouts, labels and masks."""

from __future__ import annotations

import csv
import importlib.util
import os
import plistlib
from pathlib import Path

import numpy as np
import pytest
from _dicom_factory import make_dicom
from datalists.builders import items_from_csv, items_from_folder
from datalists.parsers import INBREAST_BIRADS, PolygonMask, read_inbreast_rois
from PIL import Image

from glam_benchmark.synthetic import write_png16
from scripts.data.datalist import SPLITS, load_datalist
from scripts.data.readers import read_mammogram

REPO_ROOT = Path(__file__).resolve().parents[2]


def _dicom(path: Path, pixels: np.ndarray, **kwargs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return make_dicom(path, pixels, **kwargs)


def _cli():
    spec = importlib.util.spec_from_file_location("make_datalist_cli", REPO_ROOT / "tools" / "make_datalist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _csv(path: Path, header: list[str], rows: list[list], delimiter: str = ",") -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_vindr_keeps_the_data_sets_own_paths_through_a_symlink(tmp_path):
    store = tmp_path / "big_disk" / "vindr_pixels"  # where the images really are
    root = tmp_path / "vindr"
    root.mkdir()
    os.symlink(store, root / "images", target_is_directory=True)
    header = ["study_id", "series_id", "image_id", "laterality", "view_position", "breast_birads", "split"]
    rows = []
    for k in range(8):
        study = f"st{k}"
        for side, view in (("L", "CC"), ("R", "MLO")):
            image = f"im{k}{side}"
            (store / study).mkdir(parents=True, exist_ok=True)
            _dicom(store / study / f"{image}.dicom", np.full((8, 6), 50, np.uint16))
            birads = "BI-RADS 4" if k % 3 == 0 and side == "L" else "BI-RADS 1"
            rows.append([study, "se", image, side, view, birads, "test" if k >= 6 else "training"])
    csv_path = _csv(root / "breast-level_annotations.csv", header, rows)
    out = root / "datalist.json"
    args = ["--csv", str(csv_path), "--root", str(root), "--fractions", "0.5", "0.5", "0"]
    assert _cli().main([*args, "--out", str(out)]) == 0
    data = load_datalist(out)
    every = [it for s in SPLITS for it in data[s]]
    assert len(every) == 16
    for item in every:  # images/<study_id>/<image_id>.dicom, relative to the list: not the link's target
        study = item["patient_id"]
        assert item["image"] == f"images/{study}/{Path(item['image']).name}" and (out.parent / item["image"]).is_file()
    assert {it["patient_id"] for it in data["test"]} == {"st6", "st7"}  # the CSV's split column
    labels = {Path(it["image"]).stem: it["label"] for it in every}
    assert labels["im0L"] == [0, 1] and labels["im0R"] == [0, 0] and labels["im1L"] == [0, 0]
    # the finding CSV names the same images: one item per image, labels OR-ed across the two CSVs
    findings = _csv(root / "finding_annotations.csv", [*header[:5], "breast_birads", "finding_birads", "split"],
                    [["st1", "se", "im1L", "L", "CC", "BI-RADS 1", "BI-RADS 3", "training"]])  # fmt: skip
    both = ["--csv", str(csv_path), str(findings), *args[2:]]
    assert _cli().main([*both, "--out", str(out)]) == 0
    every = [it for s in SPLITS for it in load_datalist(out)[s]]
    assert len(every) == 16 and {Path(it["image"]).stem: it["label"] for it in every}["im1L"] == [1, 0]
    # absolute paths also keep the link
    assert _cli().main([*args, "--out", str(out), "--absolute"]) == 0
    images = [it["image"] for s in SPLITS for it in load_datalist(out)[s]]
    assert all(p.startswith(str(root / "images")) and "big_disk" not in p for p in images)


def _inbreast_xml(path: Path, rois: list[tuple[str, list[tuple[float, float]]]]) -> Path:
    """An OsiriX ROI plist as INbreast publishes it (Images[0].ROIs[].Point_px as "(x, y)" strings)."""
    plist = {
        "Images": [
            {
                "ImageIndex": 0,
                "NumberOfROIs": len(rois),
                "ROIs": [
                    {
                        "Name": name,
                        "NumberOfPoints": len(points),
                        "Point_mm": [f"({x * 0.07:.6f}, {y * 0.07:.6f}, 0.000000)" for x, y in points],
                        "Point_px": [f"({x:.6f}, {y:.6f})" for x, y in points],
                    }
                    for name, points in rois
                ],
            }
        ]
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(plistlib.dumps(plist, fmt=plistlib.FMT_XML))
    return path


def _inside_triangle(shape, tri, margin):
    """Pixels whose centre is at least ``margin`` px inside (margin > 0) or beyond -margin outside a triangle."""
    rows, cols = np.mgrid[0 : shape[0], 0 : shape[1]]
    pts = np.asarray(tri, float)
    dist = np.full(shape, np.inf)
    for i in range(3):
        (x0, y0), (x1, y1) = pts[i], pts[(i + 1) % 3]
        other = pts[(i + 2) % 3]
        nx, ny = y1 - y0, -(x1 - x0)
        norm = np.hypot(nx, ny)
        sign = np.sign(nx * (other[0] - x0) + ny * (other[1] - y0))
        dist = np.minimum(dist, sign * (nx * (cols - x0) + ny * (rows - y0)) / norm)
    return dist >= margin


def test_inbreast_csv_and_xml_to_labels_and_polygon_masks(tmp_path):
    root = tmp_path / "INbreast"
    shape = (60, 40)
    files = {  # File Name -> (woman's hash, laterality, view, Bi-Rads)
        "20586908": ("6c613a14b80a8591", "R", "CC", "4a"),
        "20586934": ("6c613a14b80a8591", "R", "MLO", "2"),
        "22678622": ("61b13c59bcba149e", "L", "CC", "1"),
        "22678646": ("61b13c59bcba149e", "L", "MLO", "5"),
    }
    for name, (woman, side, view, _) in files.items():
        _dicom(root / "AllDICOMs" / f"{name}_{woman}_MG_{side}_{view}_ANON.dcm", np.full(shape, 300, np.uint16))
    rect = [(10, 5), (20, 5), (20, 15), (10, 15)]
    tri = [(5, 30), (30, 35), (12, 55)]
    _inbreast_xml(root / "AllXML" / "20586908.xml", [("Mass", rect), ("Calcification", [(33.0, 44.0)])])
    _inbreast_xml(root / "AllXML" / "22678646.xml", [("Mass", tri)])
    header = ["Patient ID", "Patient age", "Laterality", "View", "Acquisition date", "File Name", "ACR", "Bi-Rads"]
    rows = [["removed", "removed", s, v, "201001", name, "2", birads] for name, (_, s, v, birads) in files.items()]
    csv_path = _csv(root / "INbreast.csv", header, rows, delimiter=";")
    notes: list[str] = []
    items, problems = items_from_csv(csv_path, root, relative_to=root, mask_dir=tmp_path / "masks", notes=notes)
    assert problems == [] and notes == []
    by_name = {Path(it["image"]).name.split("_")[0]: it for it in items}
    for name, (woman, side, view, birads) in files.items():
        item = by_name[name]
        assert item["label"] == INBREAST_BIRADS[int(birads[0])]
        assert (item["patient_id"], item["laterality"], item["view"]) == (woman, side, view)
    assert by_name["22678622"]["label"] == [0, 0] and by_name["20586934"]["label"] == [1, 0]
    assert not any(k.startswith("mask_") for k in by_name["20586934"])  # no XML: not annotated

    # the rectangle (outline included) and the one-point calcification, in the malignant mask of a BI-RADS 4a image
    mask = np.asarray(read_mammogram(root / by_name["20586908"]["mask_malignant"], mask=True)[0]) > 0
    expected = np.zeros(shape, bool)
    expected[5:16, 10:21] = True
    expected[44, 33] = True
    assert mask.shape == shape and np.array_equal(mask, expected)
    assert "mask_benign" not in by_name["20586908"]
    # the triangle against an independent half-plane test: every pixel a px inside is set, none a px outside
    tri_mask = np.asarray(Image.open(root / by_name["22678646"]["mask_malignant"])) > 0
    assert np.all(tri_mask[_inside_triangle(shape, tri, 1.0)])
    assert not np.any(tri_mask[~_inside_triangle(shape, tri, -1.0)])
    assert abs(int(tri_mask.sum()) - 0.5 * abs(25 * 25 - 7 * 5)) < 40  # close to the triangle's area (300 px)


def test_inbreast_reader_errors_name_the_file(tmp_path):
    bad = tmp_path / "x.xml"
    bad.write_text("<html>not a plist</html>")
    with pytest.raises(ValueError, match="x.xml"):
        read_inbreast_rois(bad)
    rois = read_inbreast_rois(_inbreast_xml(tmp_path / "ok.xml", [("Cluster", [(1, 2), (3, 4)])]))
    assert rois == [("Cluster", ((1.0, 2.0), (3.0, 4.0)))]
    line = PolygonMask(tmp_path / "ok.xml", (6, 6), (((0, 0), (5, 0)),)).rasterise()
    assert np.array_equal(np.flatnonzero(line.any(axis=1)), [0]) and line[0].all()


def test_hospital_folder_names_give_labels(tmp_path):
    root = tmp_path / "hospital"
    img = np.full((16, 12), 700, np.uint16)
    _dicom(root / "Benign" / "case1" / "a.dcm", img, patient_id="H-001", laterality="L", view_position="CC")
    _dicom(root / "Benign" / "case1" / "b.dcm", img, patient_id="H-001", laterality="L", view_position="MLO")
    (root / "malignant" / "H-002").mkdir(parents=True)
    write_png16(root / "malignant" / "H-002" / "c.png", img)
    (root / "normal").mkdir()
    write_png16(root / "normal" / "d.png", img)
    (root / "README.txt").write_text("scanner notes")
    (root / "normal" / "notes.txt").write_text("not an image")
    items, skipped = items_from_folder(root, relative_to=root)
    labels = {it["image"]: (it["label"], it["patient_id"]) for it in items}
    assert labels == {
        "Benign/case1/a.dcm": ([1, 0], "H-001"),
        "Benign/case1/b.dcm": ([1, 0], "H-001"),
        "malignant/H-002/c.png": ([0, 1], "H-002"),
        "normal/d.png": ([0, 0], f"file:{root / 'normal' / 'd.png'}"),
    }
    assert [Path(s.split(":")[0]).name for s in skipped] == ["README.txt", "notes.txt"]
    assert items[0]["laterality"] == "L" and items[1]["view"] == "MLO"


def test_path_label_csv(tmp_path):
    img = np.full((16, 12), 700, np.uint16)
    _dicom(tmp_path / "x" / "1.dcm", img, patient_id="Mass-Test_P_00007_LEFT_CC")
    write_png16(tmp_path / "x" / "2.png", img)
    rows = [["x/1.dcm", "Malignant"], ["x/2.png", "normal"], ["x/3.png", "benign"], ["x/2.png", "maybe"]]
    csv_path = _csv(tmp_path / "labels.csv", ["path", "label"], rows)
    items, problems = items_from_csv(csv_path, relative_to=tmp_path)
    assert [(it["image"], it["label"]) for it in items] == [("x/1.dcm", [0, 1]), ("x/2.png", [0, 0])]
    assert items[0]["patient_id"] == "P_00007"  # CBIS-DDSM's per-view PatientID becomes the woman
    assert len(problems) == 2 and "x/3.png" in problems[0] and "not found" in problems[0]
    assert "labels.csv:5" in problems[1] and "maybe" in problems[1]


def test_vindr_finding_boxes_take_their_findings_class_and_the_label_follows(tmp_path):
    """finding_annotations.csv: a box per finding row in [y0, x0, y1, x1] (the CSV's ymin, xmin, ymax, xmax), its
    class from the finding's BI-RADS (2-3 benign, 4-5 malignant; the breast's when the finding states none), the
    label including it; rows of one image merged, a box given twice kept once; 'No Finding' rows (NaN) add none; a
    BI-RADS 1 box is left out with a note; a box missing a coordinate is a problem naming the row."""
    root = tmp_path / "vindr"
    for image in ("a", "b", "c"):
        _dicom(root / "images" / "st" / f"{image}.dicom", np.full((50, 40), 50, np.uint16))
    header = ["study_id", "series_id", "image_id", "laterality", "view_position", "height", "width"]
    header += ["breast_birads", "breast_density", "finding_categories", "finding_birads", "xmin", "ymin", "xmax"]
    header += ["ymax", "split"]
    common = ["st", "se"]
    rows = [
        [*common, "a", "L", "CC", 50, 40, "BI-RADS 4", "B", "['Mass']", "BI-RADS 4", "10.5", "3", "20", "9.25", "test"],
        [*common, "a", "L", "CC", 50, 40, "BI-RADS 4", "B", "['Mass']", "BI-RADS 3", "1", "2", "5", "6", "test"],
        [*common, "a", "L", "CC", 50, 40, "BI-RADS 4", "B", "['Mass']", "BI-RADS 3", "1", "2", "5", "6", "test"],
        [*common, "b", "L", "MLO", 50, 40, "BI-RADS 5", "B", "['Asymmetry']", "", "0", "0", "40", "50", "test"],
        [*common, "b", "L", "MLO", 50, 40, "BI-RADS 5", "B", "['Other']", "BI-RADS 1", "1", "1", "2", "2", "test"],
        [*common, "c", "R", "CC", 50, 40, "BI-RADS 1", "A", "['No Finding']", "", "nan", "nan", "nan", "nan", "test"],
        [*common, "c", "R", "CC", 50, 40, "BI-RADS 1", "A", "['Mass']", "BI-RADS 4", "1", "", "3", "4", "test"],
    ]
    notes: list[str] = []
    items, problems = items_from_csv(_csv(root / "finding_annotations.csv", header, rows), root, notes=notes)
    by_image = {Path(it["image"]).stem: it for it in items}
    assert by_image["a"]["boxes"] == [
        {"label": "malignant", "box": [3.0, 10.5, 9.25, 20.0]},
        {"label": "benign", "box": [2.0, 1.0, 6.0, 5.0]},  # a BI-RADS 3 finding in a BI-RADS 4 breast: benign
    ]
    assert by_image["a"]["label"] == [1, 1]
    assert by_image["b"]["boxes"] == [{"label": "malignant", "box": [0.0, 0.0, 50.0, 40.0]}]  # the breast's BI-RADS
    assert by_image["b"]["label"] == [0, 1]
    assert len(notes) == 1 and ":6: box left out: its finding's BI-RADS (1)" in notes[0]
    assert "boxes" not in by_image["c"] and by_image["c"]["label"] == [0, 0]
    assert len(problems) == 1 and problems[0].startswith(f"{root / 'finding_annotations.csv'}:8: a box needs all of")


def test_birads_outside_the_scale_or_unreadable_is_a_problem_per_row(tmp_path):
    """A BI-RADS cell that is not a category of the data set's scale (VinDr-Mammo 1-5, INbreast 1-6; 4A/4B/4C) nor
    empty leaves its row out with a problem naming the file, the line, the column and the value; the other rows are
    built. Before, "BI-RADS 7" and "4D" became malignant boxes and labels (the first digit was taken)."""
    root = tmp_path / "vindr"
    for image in ("a", "b", "c", "d", "e", "f", "g"):
        _dicom(root / "images" / "st" / f"{image}.dicom", np.full((50, 40), 50, np.uint16))
    header = ["study_id", "series_id", "image_id", "laterality", "view_position", "breast_birads", "finding_birads"]
    header += ["xmin", "ymin", "xmax", "ymax"]
    box = ["1", "2", "5", "6"]
    rows = [
        ["st", "se", "a", "L", "CC", "BI-RADS 2", "BI-RADS 7", *box],
        ["st", "se", "b", "L", "CC", "BI-RADS x", "", *box],
        ["st", "se", "c", "L", "CC", "BI-RADS 2", "4D", *box],
        ["st", "se", "d", "L", "CC", "BI-RADS 0", "BI-RADS 3", *box],
        ["st", "se", "e", "L", "CC", "BI-RADS 3", "", *box],  # empty finding: the breast's category (3, benign)
        ["st", "se", "f", "L", "CC", "bi-rads 4c", "BI-RADS 4A", *box],
        ["st", "se", "g", "L", "CC", "BI-RADS 1", "nan", "nan", "nan", "nan", "nan"],
    ]
    csv_path = _csv(root / "finding_annotations.csv", header, rows)
    items, problems = items_from_csv(csv_path, root)
    assert problems == [
        f"{csv_path}:2: finding_birads must be a BI-RADS category 1-5 (4A/4B/4C too), got 'BI-RADS 7'",
        f"{csv_path}:3: breast_birads must be a BI-RADS category 1-5 (4A/4B/4C too), got 'BI-RADS x'",
        f"{csv_path}:4: finding_birads must be a BI-RADS category 1-5 (4A/4B/4C too), got '4D'",
        f"{csv_path}:5: breast_birads must be a BI-RADS category 1-5 (4A/4B/4C too), got 'BI-RADS 0'",
    ]
    by_image = {Path(it["image"]).stem: it for it in items}
    assert sorted(by_image) == ["e", "f", "g"]
    assert by_image["e"]["label"] == [1, 0] and by_image["e"]["boxes"] == [{"label": "benign", "box": [2, 1, 6, 5]}]
    assert by_image["f"]["label"] == [0, 1] and by_image["f"]["boxes"][0]["label"] == "malignant"
    assert by_image["g"]["label"] == [0, 0] and "boxes" not in by_image["g"]

    inbreast = tmp_path / "INbreast"
    values = {"1001": "4D", "1002": "7", "1003": "x", "1004": "", "1005": "46", "1006": "4c", "1007": "6"}
    for name in values:
        _dicom(inbreast / "AllDICOMs" / f"{name}_ab12_MG_R_CC_ANON.dcm", np.full((8, 6), 300, np.uint16))
    header = ["Patient ID", "Patient age", "Laterality", "View", "Acquisition date", "File Name", "ACR", "Bi-Rads"]
    rows = [["removed", "removed", "R", "CC", "201001", name, "2", value] for name, value in values.items()]
    csv_path = _csv(inbreast / "INbreast.csv", header, rows, delimiter=";")
    items, problems = items_from_csv(csv_path, inbreast)
    assert [(p.split(": ")[0], p.split("got ")[-1]) for p in problems if "got" in p] == [
        (f"{csv_path}:2", "'4D'"),
        (f"{csv_path}:3", "'7'"),
        (f"{csv_path}:4", "'x'"),
        (f"{csv_path}:6", "'46'"),
    ]
    assert f"{csv_path}:5: empty Bi-Rads" in problems and len(problems) == 5
    assert all("bi-rads must be a BI-RADS category 1-6" in p for p in problems if "got" in p)
    assert sorted((Path(it["image"]).name[:4], it["label"]) for it in items) == [("1006", [0, 1]), ("1007", [0, 1])]
