"""Datalist layer: load/save, patient-level splitting, split checks, DICOM-folder and CSV builders, CLI."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
from _dicom_factory import make_dicom
from datalists.builders import detect_csv_flavour, items_from_csv, items_from_dicom_dir
from datalists.parsers import (
    CSV_FLAVOURS,
    DATALIST_PARSERS,
    ParsedRow,
    register_datalist_parser,
    unregister_datalist_parser,
)
from PIL import Image

from glam_benchmark.synthetic import make_synthetic_dataset, write_mask_png
from scripts.data.datalist import (
    SPLITS,
    DatalistError,
    check_patient_splits,
    check_split_sizes,
    load_datalist,
    resolve_paths,
    save_datalist,
    split_by_patient,
)
from scripts.data.errors import CsvRowError

REPO_ROOT = Path(__file__).resolve().parents[2]


def _items(n_patients: int, positive_every: int = 4) -> list[dict]:
    out = []
    for p in range(n_patients):
        for view in ("CC", "MLO"):
            lab = [0, 1] if p % positive_every == 0 else [0, 0]
            out.append({"image": f"img/{p}_{view}.png", "label": lab, "patient_id": f"P{p}", "view": view})
    return out


def test_save_and_load_round_trip_atomically(tmp_path):
    data = {"training": _items(2), "validation": [], "test": _items(1)}
    path = save_datalist(data, tmp_path / "sub" / "list.json")
    assert load_datalist(path) == data
    assert [p.name for p in path.parent.iterdir()] == ["list.json"], "no temporary file left behind"


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(DatalistError, match="nope.json.*not found"):
        load_datalist(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text('{"training": {"image": "x"}}')
    with pytest.raises(DatalistError, match="bad.json.*'training' must be a list"):
        load_datalist(tmp_path / "bad.json")
    (tmp_path / "broken.json").write_text("[1, 2")
    with pytest.raises(DatalistError, match="broken.json.*not valid JSON"):
        load_datalist(tmp_path / "broken.json")


def test_split_keeps_patients_together_and_follows_fractions():
    items = _items(200)
    out = split_by_patient(items, (0.7, 0.15, 0.15), seed=3)
    assert set(out) == set(SPLITS) and sum(len(v) for v in out.values()) == len(items)
    assert check_patient_splits(out) == []
    patients = {s: {it["patient_id"] for it in out[s]} for s in SPLITS}
    # proportional allocation within each label group: at most one patient off per group and split
    assert abs(len(patients["training"]) - 140) <= 2
    assert abs(len(patients["validation"]) - 30) <= 2 and abs(len(patients["test"]) - 30) <= 2
    for s in SPLITS:  # positives (every 4th patient) reach every split in proportion
        n_pos = sum(1 for p in patients[s] if int(p[1:]) % 4 == 0)
        assert abs(n_pos - {"training": 35, "validation": 7.5, "test": 7.5}[s]) <= 1.5
    # deterministic, seed-dependent, input order kept inside a split
    assert split_by_patient(items, (0.7, 0.15, 0.15), seed=3) == out
    assert split_by_patient(items, (0.7, 0.15, 0.15), seed=4) != out
    order = [items.index(it) for it in out["training"]]
    assert order == sorted(order)


def test_split_fraction_edge_cases():
    items = _items(10)
    only_test = split_by_patient(items, (0, 0, 1))
    assert len(only_test["test"]) == 20 and not only_test["training"] and not only_test["validation"]
    no_val = split_by_patient(items, {"training": 0.5, "test": 0.5})
    assert not no_val["validation"]
    for bad in ((0.5, 0.5), (0.7, 0.2, 0.2), (-0.1, 0.6, 0.5), {"train": 1.0}):
        with pytest.raises(ValueError, match="fractions"):
            split_by_patient(items, bad)
    # items without patient_id are their own patient; unknown labels form their own group
    loose = [{"image": f"{i}.png"} for i in range(20)]
    out = split_by_patient(loose, (0.5, 0.25, 0.25), seed=1)
    assert [len(out[s]) for s in SPLITS] == [10, 5, 5]


def test_check_patient_splits_reports_and_raises():
    data = {
        "training": [{"image": "a.png", "patient_id": "P1"}, {"image": "b.png", "patient_id": "P2"}],
        "validation": [{"image": "c.png", "patient_id": "P1"}],
        "test": [{"image": "b.png"}, {"image": "b.png"}],
    }
    problems = check_patient_splits(data)
    assert problems == ["patient 'P1' is in more than one split: training (1 item), validation (1 item)"]
    data["validation"].append({"image": "d.png"})
    data["training"].append({"image": "d.png"})
    problems = check_patient_splits(data)
    assert len(problems) == 2 and "image 'd.png'" in problems[1]
    with pytest.raises(DatalistError, match="P1"):
        check_patient_splits(data, raise_error=True)


def test_relative_paths_resolve_like_monai(tmp_path):
    from monai.data import load_decathlon_datalist

    make_synthetic_dataset(tmp_path, 4, size=(256, 160), seed=1, fractions=(1, 0, 0))
    ours = resolve_paths(load_datalist(tmp_path / "datalist.json"), tmp_path)["training"]
    monai_items = load_decathlon_datalist(str(tmp_path / "datalist.json"), data_list_key="training")
    for a, b in zip(ours, monai_items):
        for key in ("image", "mask_benign", "mask_malignant"):
            assert Path(a[key]) == Path(b[key]) and Path(a[key]).is_file()
        assert a["label"] == list(b["label"])


def test_items_from_dicom_dir_reads_headers_and_skips_junk(tmp_path):
    make_synthetic_dataset(tmp_path, 4, size=(256, 160), seed=2, fmt="dcm")
    (tmp_path / "images" / "notes.dcm").write_text("not dicom")
    items, skipped = items_from_dicom_dir(tmp_path / "images", relative_to=tmp_path)
    assert len(items) == 4 and len(skipped) == 1 and "notes.dcm" in skipped[0]
    truth = {it["image"]: it for s in SPLITS for it in json.loads((tmp_path / "datalist.json").read_text())[s]}
    for it in items:
        assert "label" not in it  # labels unknown
        ref = truth[it["image"]]
        assert (it["patient_id"], it["laterality"], it["view"]) == (ref["patient_id"], ref["laterality"], ref["view"])
    with pytest.raises(DatalistError, match="not found"):
        items_from_dicom_dir(tmp_path / "missing")


def _write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_cbis_ddsm_csv_merges_rows_and_masks(tmp_path):
    shape = (40, 30)
    a, b = np.zeros(shape, np.uint8), np.zeros(shape, np.uint8)
    a[2:6, 2:6], b[20:25, 10:12] = 1, 1
    write_mask_png(tmp_path / "roi_a.png", a)
    write_mask_png(tmp_path / "roi_b.png", b)
    write_mask_png(tmp_path / "roi_c.png", b)
    for name in ("P1_L_CC.dcm", "P1_L_MLO.dcm"):  # the images must exist: every path is checked
        make_dicom(tmp_path / name, np.full(shape, 100, np.uint16))
    header = [
        "patient_id",
        "breast_density",
        "left or right breast",
        "image view",
        "abnormality id",
        "abnormality type",
        "pathology",
        "image file path",
        "cropped image file path",
        "ROI mask file path",
    ]
    rows = [
        ["P_00001", 2, "LEFT", "CC", 1, "mass", "BENIGN", "P1_L_CC.dcm", "", "roi_a.png"],
        ["P_00001", 2, "LEFT", "CC", 2, "calcification", "BENIGN_WITHOUT_CALLBACK", "P1_L_CC.dcm", "", "roi_b.png"],
        ["P_00001", 2, "LEFT", "MLO", 1, "mass", "MALIGNANT", "P1_L_MLO.dcm", "", "roi_c.png"],
        ["P_00002", 3, "RIGHT", "CC", 1, "mass", "UNKNOWN", "P2_R_CC.dcm", "", ""],
    ]
    csv_path = _write_csv(tmp_path / "mass.csv", header, rows)
    assert detect_csv_flavour(header) == "cbis-ddsm"
    items, problems = items_from_csv(csv_path, relative_to=tmp_path, mask_dir=tmp_path / "merged")
    assert len(problems) == 1 and "mass.csv:5" in problems[0] and "pathology" in problems[0]
    by_image = {it["image"]: it for it in items}
    cc, mlo = by_image["P1_L_CC.dcm"], by_image["P1_L_MLO.dcm"]
    assert cc["label"] == [1, 0] and mlo["label"] == [0, 1]
    assert (cc["patient_id"], cc["laterality"], cc["view"]) == ("P_00001", "L", "CC")
    assert mlo["mask_malignant"] == "roi_c.png" and "mask_benign" not in mlo
    assert cc["pixel_spacing"] == 0.05 and cc["pixel_spacing_source"] == "preset:cbis-ddsm"
    merged = np.array(Image.open(tmp_path / cc["mask_benign"])) > 0
    assert np.array_equal(merged, (a | b) > 0)


def test_vindr_and_generic_csv(tmp_path):
    header = ["study_id", "series_id", "image_id", "laterality", "view_position", "breast_birads", "finding_birads"]
    rows = [
        ["s1", "x", "i1", "L", "CC", "BI-RADS 1", ""],
        ["s1", "x", "i2", "R", "MLO", "BI-RADS 3", "BI-RADS 3"],
        ["s2", "x", "i3", "L", "MLO", "BI-RADS 2", "BI-RADS 4"],
        ["s2", "x", "i4", "R", "CC", "", ""],
    ]
    for study, image in (("s1", "i1"), ("s1", "i2"), ("s2", "i3")):
        (tmp_path / "images" / study).mkdir(parents=True, exist_ok=True)
        (tmp_path / "images" / study / f"{image}.dicom").write_bytes(b"")  # only existence is checked here
    items, problems = items_from_csv(_write_csv(tmp_path / "vindr.csv", header, rows), relative_to=tmp_path)
    assert len(problems) == 1 and "BI-RADS" in problems[0]
    labels = {Path(it["image"]).stem: it["label"] for it in items}
    assert labels == {"i1": [0, 0], "i2": [1, 0], "i3": [0, 1]}
    assert items[0]["image"] == "images/s1/i1.dicom" and items[0]["patient_id"] == "s1"

    header = ["image", "patient_id", "laterality", "view", "label_benign", "label_malignant", "mask_benign"]
    rows = [["a.png", "p1", "R", "cc", 1, 0, "a_b.png"], ["b.png", "p2", "left", "MLO", "", "", ""]]
    for name in ("a.png", "b.png", "a_b.png"):
        (tmp_path / name).write_bytes(b"")
    items, problems = items_from_csv(_write_csv(tmp_path / "gen.csv", header, rows), relative_to=tmp_path)
    assert problems == []
    assert items[0] == {
        "image": "a.png",
        "label": [1, 0],
        "patient_id": "p1",
        "laterality": "R",
        "view": "CC",
        "mask_benign": "a_b.png",
    }
    assert "label" not in items[1] and items[1]["laterality"] == "L"
    with pytest.raises(DatalistError, match="accepted layouts"):
        detect_csv_flavour(["file", "diagnosis"])


def test_registry_lists_the_flavours():
    # registration order is the order users see them in; CSV_FLAVOURS is read from the registry
    assert list(DATALIST_PARSERS) == ["generic", "path-label", "cbis-ddsm", "vindr-mammo", "inbreast"]
    assert dict(CSV_FLAVOURS) == {name: parser.columns for name, parser in DATALIST_PARSERS.items()}
    for name, parser in DATALIST_PARSERS.items():
        assert parser.name == name and parser.parse.__doc__ and "Columns:" in parser.parse.__doc__
        assert detect_csv_flavour(parser.signature) == name
    # the most specific signature wins: a header with vindr's columns and an "image" column is vindr
    assert detect_csv_flavour(["Image", "Study_ID", "image id"]) == "vindr-mammo"


def test_unknown_csv_layout_names_file_columns_and_flavours(tmp_path):
    csv_path = _write_csv(tmp_path / "odd.csv", ["File", "Diagnosis"], [["x.png", "mass"]])
    with pytest.raises(DatalistError) as info:
        items_from_csv(csv_path)
    message = str(info.value)
    assert message.startswith(f"{csv_path}: unrecognised CSV columns ['diagnosis', 'file']; accepted layouts: ")
    for name, columns in CSV_FLAVOURS.items():
        assert f"{name}: {columns}" in message


@pytest.fixture
def scanner_layout():
    """A parser registered for the duration of one test, then unregistered."""

    @register_datalist_parser("test-scanner", signature=["scan file", "image"], columns="scan_file, image, finding")
    def parse_scanner_row(row, where, base):
        """Columns: ``scan_file`` (the image), ``image`` (ignored), ``finding`` (cancer or none)."""
        if row["finding"] not in ("cancer", "none"):
            raise CsvRowError(f"{where}: finding must be cancer or none")
        return ParsedRow(base / row["scan file"], [0, int(row["finding"] == "cancer")], {"patient_id": "P"})

    with pytest.raises(ValueError, match="already registered"):
        register_datalist_parser("test-scanner", signature=["x"], columns="x")(parse_scanner_row)
    yield "test-scanner"
    unregister_datalist_parser("test-scanner")
    assert "test-scanner" not in DATALIST_PARSERS and "test-scanner" not in CSV_FLAVOURS


def test_registered_parser_is_used_then_unregistered(tmp_path, scanner_layout):
    rows = [["a.dcm", "ignored", "cancer"], ["a.dcm", "ignored", "none"], ["b.dcm", "", "maybe"]]
    csv_path = _write_csv(tmp_path / "scanner.csv", ["Scan_File", "image", "finding"], rows)
    (tmp_path / "a.dcm").write_bytes(b"")
    # its signature ("scan file", "image") is more specific than generic's ("image"), so it wins
    assert detect_csv_flavour(["Scan_File", "image", "finding"]) == scanner_layout
    assert list(CSV_FLAVOURS)[-1] == scanner_layout
    items, problems = items_from_csv(csv_path, relative_to=tmp_path)
    assert items == [{"image": "a.dcm", "label": [0, 1], "patient_id": "P"}]
    assert problems == [f"{csv_path}:4: finding must be cancer or none"]
    with pytest.raises(DatalistError, match="test-scanner: scan_file, image, finding"):
        detect_csv_flavour(["nothing"])


def test_unregistered_parser_is_gone(tmp_path):
    # the fixture's parser must not outlive its test: generic reads that header again
    assert "test-scanner" not in DATALIST_PARSERS
    assert detect_csv_flavour(["Scan_File", "image", "finding"]) == "generic"
    with pytest.raises(KeyError):
        unregister_datalist_parser("test-scanner")


def _cli():
    spec = importlib.util.spec_from_file_location("make_datalist_cli", REPO_ROOT / "tools" / "make_datalist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_datalist_cli(tmp_path, capsys):
    cli = _cli()
    make_synthetic_dataset(tmp_path / "exam", 8, size=(256, 160), seed=5, fmt="dcm")
    out = tmp_path / "lists" / "dicom.json"
    assert (
        cli.main(["--dicom-dir", str(tmp_path / "exam" / "images"), "--out", str(out), "--fractions", "0", "0", "1"])
        == 0
    )
    data = load_datalist(out)
    assert len(data["test"]) == 8 and not data["training"]
    assert all((out.parent / it["image"]).is_file() and "label" not in it for it in data["test"])
    (tmp_path / "exam" / "images" / "junk.dcm").write_bytes(b"\x00" * 10)
    out.unlink()
    args = ["--dicom-dir", str(tmp_path / "exam" / "images"), "--out", str(out), "--fractions", "0", "0", "1"]
    assert cli.main(args) == 1  # a file that could not be used: listed, nothing written
    err = capsys.readouterr().err
    assert "junk.dcm" in err and "--allow-missing" in err and not out.exists()
    assert cli.main([*args, "--allow-missing"]) == 0  # still listed, the datalist written without it
    assert "junk.dcm" in capsys.readouterr().err and len(load_datalist(out)["test"]) == 8
    # a list without labels cannot train: refused unless it is inference-only
    assert cli.main(["--dicom-dir", str(tmp_path / "exam" / "images"), "--out", str(out), "--allow-missing"]) == 2
    assert "nothing to train on" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["--dicom-dir", str(empty), "--out", str(tmp_path / "none.json")]) == 2
    assert not (tmp_path / "none.json").exists()


def test_external_validation_list(tmp_path, capsys):
    img = np.full((16, 12), 700, np.uint16)
    rows = []
    (tmp_path / "main").mkdir()
    for p in range(4):
        make_dicom(tmp_path / "main" / f"{p}.dcm", img, patient_id=f"M{p}")
        rows.append([f"{p}.dcm", f"M{p}", p % 2, 1 - p % 2])
    csv_path = _write_csv(
        tmp_path / "main" / "list.csv", ["image", "patient_id", "label_benign", "label_malignant"], rows
    )
    (tmp_path / "other").mkdir()
    make_dicom(tmp_path / "other" / "v.dcm", img, patient_id="V1")
    save_datalist({"test": [{"image": "v.dcm", "patient_id": "V1", "label": [0, 1]}]}, tmp_path / "other" / "val.json")
    out = tmp_path / "lists" / "list.json"
    args = ["--csv", str(csv_path), "--out", str(out), "--fractions", "0.5", "0.25", "0.25"]
    assert _cli().main([*args, "--val-datalist", str(tmp_path / "other" / "val.json")]) == 0
    data = load_datalist(out)
    assert data["validation"] == [{"image": "../other/v.dcm", "patient_id": "V1", "label": [0, 1]}]
    assert len(data["training"]) + len(data["test"]) == 4 and data["test"]  # TRAIN:TEST share the main list
    # a patient of the external list already in the main list: refused (one woman, one split)
    save_datalist({"test": [{"image": "../main/0.dcm", "patient_id": "M0"}]}, tmp_path / "other" / "dup.json")
    assert _cli().main([*args, "--val-datalist", str(tmp_path / "other" / "dup.json")]) == 2
    assert "patient 'M0' is in more than one split" in capsys.readouterr().err


def test_small_strata_still_fill_every_requested_split():
    # 2 benign + 2 malignant women at 2/3 : 0 : 1/3: per label group the systematic draw can send both to training;
    # the top-up then moves one woman to test (whatever the seed), never empties a split, keeps women whole
    items = [
        {"image": f"{p}_{v}.png", "patient_id": f"P{p}", "label": [p % 2, 1 - p % 2]} for p in range(4) for v in "ab"
    ]
    for seed in range(20):
        out = split_by_patient(items, (2 / 3, 0, 1 / 3), seed=seed)
        patients = {s: {it["patient_id"] for it in out[s]} for s in SPLITS}
        assert patients["training"] and patients["test"] and not patients["validation"], seed
        assert check_patient_splits(out) == [] and sum(len(v) for v in out.values()) == 8
    # two women cannot fill three splits: one stays empty (make_datalist then refuses the list)
    two = split_by_patient(items[:4], (0.7, 0.15, 0.15), seed=0)
    assert sorted(len({it["patient_id"] for it in two[s]}) for s in SPLITS) == [0, 1, 1]
    assert check_split_sizes(two, (0.7, 0.15, 0.15))


@pytest.mark.parametrize("how", ["a_folder", "under_a_file", "read_only"])
def test_make_datalist_refuses_an_out_it_cannot_write_naming_the_flag(tmp_path, capsys, how):
    """--out a folder, under a file or in a read-only folder: one line naming --out, exit 2, before any file is read
    (the junk DICOM is not reported) and nothing written."""
    make_synthetic_dataset(tmp_path / "exam", 2, size=(64, 48), seed=1, fmt="dcm")
    (tmp_path / "exam" / "images" / "junk.dcm").write_bytes(b"\x00" * 10)
    if how == "a_folder":
        out = tmp_path / "lists"
        out.mkdir()
        expected = f"error: --out {out} is a folder: give the datalist's file name (e.g. --out {out / 'datalist.json'})"
    elif how == "under_a_file":
        (tmp_path / "afile").write_text("x")
        out = tmp_path / "afile" / "lists" / "list.json"
        expected = f"error: --out {out} cannot be written ({tmp_path / 'afile'} is a file, not a folder)"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only folders")
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(0o500)
        out = tmp_path / "ro" / "list.json"
        expected = f"error: --out {out} cannot be written (Permission denied)"
    args = ["--dicom-dir", str(tmp_path / "exam" / "images"), "--out", str(out), "--fractions", "0", "0", "1"]
    assert _cli().main(args) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(expected)
    assert not (tmp_path / "afile").is_dir() and not out.is_file()
    assert how != "a_folder" or not any(out.iterdir())


def test_generic_csv_box_columns_one_row_per_box(tmp_path):
    """The generic layout's box columns (box_y0, box_x0, box_y1, box_x1, box_label): one row per box, the rows of an
    image merged into its item's boxes; empty box columns: no box; a bad box is a problem naming the row."""
    for name in ("a.png", "b.png"):
        Image.fromarray(np.full((30, 20), 9, np.uint8)).save(tmp_path / name)
    header = ["image", "patient_id", "laterality", "label_benign", "label_malignant"]
    header += ["box_y0", "box_x0", "box_y1", "box_x1", "box_label"]
    rows = [
        ["a.png", "p1", "L", "1", "1", "1", "2", "10", "12", "benign"],
        ["a.png", "p1", "L", "1", "1", "5.5", "0", "30", "20", "Malignant"],
        ["b.png", "p2", "R", "0", "0", "", "", "", "", ""],
        ["b.png", "p2", "R", "0", "0", "3", "3", "2", "9", "benign"],  # y1 < y0
        ["b.png", "p2", "R", "0", "0", "1", "1", "2", "2", "cyst"],
    ]
    items, problems = items_from_csv(_write_csv(tmp_path / "boxes.csv", header, rows))
    by_image = {Path(it["image"]).name: it for it in items}
    assert by_image["a.png"]["boxes"] == [
        {"label": "benign", "box": [1.0, 2.0, 10.0, 12.0]},
        {"label": "malignant", "box": [5.5, 0.0, 30.0, 20.0]},
    ]
    assert "boxes" not in by_image["b.png"] and by_image["b.png"]["label"] == [0, 0]
    where = str(tmp_path / "boxes.csv")
    assert problems[0].startswith(f"{where}:5: box [y0, x0, y1, x1] needs 0 <= y0 < y1")
    assert problems[1] == f"{where}:6: label must be one of ['benign', 'malignant'], got 'cyst' " + (
        "(box y0, box x0, box y1, box x1)"
    )


class _CountedLabel(str):
    """A box label that counts how often it is compared: a list search compares every pair of boxes, a hashed
    de-duplication only the repeats (equal keys)."""

    comparisons = 0

    def __eq__(self, other):
        type(self).comparisons += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_repeated_boxes_are_kept_once_in_order_by_hashing_not_pairwise(tmp_path, monkeypatch):
    """Rows of one image (and the same image in two CSVs) list their boxes once each, in the order they first
    appear; the de-duplication is linear: with n distinct boxes and r repeats it compares labels r times (a list
    search compared about n * n / 2 times: a million boxes of one image did not finish in ten minutes)."""
    import datalists.parsers as parsers

    n, repeats = 400, [0, 7, 399, 7]
    parse = parsers.parse_boxes

    def counted(boxes, where):  # the boxes the generic parser makes, each with its own label object
        return [(_CountedLabel(label), box) for label, box in parse(boxes, where)]

    monkeypatch.setattr(parsers, "parse_boxes", counted)
    Image.fromarray(np.full((900, 20), 9, np.uint8)).save(tmp_path / "a.png")
    header = ["image", "label_benign", "label_malignant", "box_y0", "box_x0", "box_y1", "box_x1", "box_label"]
    boxes = [[k, 1, k + 2, 5, "benign" if k % 3 else "malignant"] for k in range(n)]
    rows = [["a.png", 1, 1, *box] for box in [*boxes, *(boxes[k] for k in repeats)]]
    _CountedLabel.comparisons = 0
    items, problems = items_from_csv(_write_csv(tmp_path / "boxes.csv", header, rows))
    compared = _CountedLabel.comparisons
    assert problems == [] and len(items) == 1
    expected = [
        {"label": label, "box": [float(y0), float(x0), float(y1), float(x1)]} for y0, x0, y1, x1, label in boxes
    ]
    assert items[0]["boxes"] == expected  # n boxes, first-appearance order, the repeats gone
    assert compared == len(repeats), compared

    # the same image from two CSVs (make_datalist's merge across CSVs): the second CSV's boxes join, repeats once
    cli = _cli()
    first = {"image": "a.png", "label": [1, 0], "boxes": [{"label": _CountedLabel("benign"), "box": [0, 0, 1, 1]}]}
    again = [*expected, *(expected[k] for k in repeats), first["boxes"][0]]  # each entry with its own label object
    second = {"image": "a.png", "label": [0, 1], "boxes": [dict(b, label=_CountedLabel(b["label"])) for b in again]}
    _CountedLabel.comparisons = 0
    (merged,) = cli._merge_duplicates([first, second], [])
    compared = _CountedLabel.comparisons
    assert merged["label"] == [1, 1]
    assert merged["boxes"] == [{"label": "benign", "box": [0, 0, 1, 1]}, *expected]
    assert compared == len(repeats) + 1, compared


def test_a_box_beside_its_class_mask_file_is_noted_per_row(tmp_path, capsys):
    """The preprocessing paints boxes only into the classes without a mask file (BoxesToMasksd mask_files="keep"),
    so make_datalist notes every row whose box it will not use, naming the row, the class and the mask; boxes of a
    class without a mask file are used, silently. Before, such boxes were ignored without a word."""
    for name in ("a.png", "b.png", "a_b.png", "b_m.png"):
        Image.fromarray(np.full((30, 20), 9, np.uint8)).save(tmp_path / name)
    header = ["image", "label_benign", "label_malignant", "mask_benign", "mask_malignant"]
    header += ["box_y0", "box_x0", "box_y1", "box_x1", "box_label"]
    rows = [
        ["a.png", 1, 1, "a_b.png", "", 1, 2, 10, 12, "benign"],  # the mask and the box on one row
        ["a.png", 1, 1, "", "", 3, 3, 9, 9, "malignant"],  # no malignant mask: the box is used
        ["b.png", 0, 1, "", "", 5, 5, 8, 8, "malignant"],  # the mask comes on a later row
        ["b.png", 0, 1, "", "b_m.png", "", "", "", "", ""],
    ]
    csv_path = _write_csv(tmp_path / "both.csv", header, rows)
    notes: list[str] = []
    items, problems = items_from_csv(csv_path, relative_to=tmp_path, notes=notes)
    assert problems == [] and len(items) == 2 and len(items[0]["boxes"]) == 2  # the datalist keeps every box
    assert notes == [
        f"{csv_path}:2: this row's benign box is not used: a.png has a benign mask file (a_b.png), which the "
        "preprocessing keeps over the class's boxes (leave mask_benign empty to use the boxes)",
        f"{csv_path}:4: this row's malignant box is not used: b.png has a malignant mask file (b_m.png), which the "
        "preprocessing keeps over the class's boxes (leave mask_malignant empty to use the boxes)",
    ]
    out = tmp_path / "list.json"
    assert _cli().main(["--csv", str(csv_path), "--out", str(out), "--fractions", "0", "0", "1"]) == 0
    printed = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
    assert printed == [f"note: {n}" for n in notes]
