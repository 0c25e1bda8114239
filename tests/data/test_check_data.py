"""check_datalist / tools/check_data.py: one run reports every bad item (naming file and problem), exits
non-zero, and reports the valid items as fine without touching them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from glam_benchmark.synthetic import make_synthetic_dataset, write_mask_png, write_png16
from scripts.data.checks import (
    SPACING_HINT,
    DataCheckError,
    assert_datalist_ok,
    check_datalist,
    run_data_checks,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def good_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("good")
    make_synthetic_dataset(root, 4, size=(256, 160), seed=8, lesion_prevalence=1.0, fractions=(0, 0, 1))
    return root


def _items(root: Path) -> list[dict]:
    data = json.loads((root / "datalist.json").read_text())
    return [it for split in ("training", "validation", "test") for it in data[split]]


def test_valid_synthetic_datalist_has_no_problems(good_root):
    assert check_datalist(good_root / "datalist.json") == []
    report = assert_datalist_ok(good_root / "datalist.json")
    assert report.n_items == 4 and len(report.ok_items) == 4


def _bad_dataset(root: Path, good_root: Path) -> tuple[dict, dict[str, tuple[str, str]]]:
    """A datalist mixing the valid synthetic items with one bad item per failure mode.

    Returns the datalist and {name: (file or key that must be named, words the message must contain)}.
    """
    import pydicom
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian

    good = [dict(it) for it in _items(good_root)]
    for it in good:  # absolute paths: the bad files live elsewhere
        for key in ("image", "mask_benign", "mask_malignant"):
            it[key] = str(good_root / it[key])
    img = np.array(Image.open(good[0]["image"]))
    shape = img.shape

    png_bytes = Path(good[0]["image"]).read_bytes()
    (root / "truncated.png").write_bytes(png_bytes[: len(png_bytes) // 2])
    (root / "text.dcm").write_text("this is not a DICOM file\n")
    Image.fromarray(np.zeros((*shape, 3), np.uint8) + 80).save(root / "rgb.png")
    write_png16(root / "zeros.png", np.zeros(shape, np.uint16))
    write_png16(root / "ok_image.png", img)
    write_mask_png(root / "small_mask.png", np.ones((10, 10), np.uint8))
    write_mask_png(
        root / "lesion_mask.png", np.pad(np.ones((8, 8), np.uint8), ((20, shape[0] - 28), (20, shape[1] - 28)))
    )

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.1.2"
    meta.MediaStorageSOPInstanceUID = "1.2.3.4.5.6"
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = meta.MediaStorageSOPClassUID
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.Modality = "MG"
    ds.PatientID = "NOPIX"
    if int(pydicom.__version__.split(".")[0]) >= 3:
        pydicom.dcmwrite(root / "nopixels.dcm", ds, enforce_file_format=True)
    else:
        ds.is_little_endian, ds.is_implicit_VR = True, False
        pydicom.dcmwrite(str(root / "nopixels.dcm"), ds, write_like_original=False)

    def item(name: str, **kw) -> dict:
        base = {"image": str(root / "ok_image.png"), "label": [0, 0], "patient_id": f"BAD-{name}"}
        base.update(kw)
        return base

    bad = [
        item("truncated", image=str(root / "truncated.png")),
        item("nopixels", image=str(root / "nopixels.dcm")),
        item("text", image=str(root / "text.dcm")),
        item("rgb", image=str(root / "rgb.png")),
        item("zeros", image=str(root / "zeros.png")),
        item("smallmask", mask_benign=str(root / "small_mask.png")),
        item("missing", image=str(root / "does_not_exist.png")),
        item("label", label=[2, 0]),
        item("inconsistent", mask_malignant=str(root / "lesion_mask.png")),
    ]
    dup = dict(good[0])
    datalist = {"training": good[:3] + bad[:5], "validation": bad[5:], "test": [good[3], dup]}
    expected = {
        "truncated": ("truncated.png", ""),
        "nopixels": ("nopixels.dcm", ""),
        "text": ("text.dcm", ""),
        "rgb": ("rgb.png", ""),
        "zeros": ("zeros.png", "zero"),
        "smallmask": ("small_mask.png", "10x10"),
        "missing": ("does_not_exist.png", "not found"),
        "label": ("label", "0 or 1"),
        "inconsistent": ("lesion_mask.png", "label malignant is 0"),
        "duplicate patient": (good[0]["patient_id"], "more than one split"),
    }
    return datalist, expected


def test_every_bad_item_is_reported_in_one_run(tmp_path, good_root):
    datalist, expected = _bad_dataset(tmp_path, good_root)
    before = {
        p: hashlib.sha1(Path(p).read_bytes()).hexdigest()
        for it in _items(good_root)
        for p in [str(good_root / it["image"])]
    }
    report = run_data_checks(datalist)
    lines = [str(p) for p in report.problems]
    text = "\n".join(lines)
    for name, (needle, words) in expected.items():
        hits = [line for line in lines if needle in line and words.lower() in line.lower()]
        assert hits, f"{name}: no problem naming {needle!r} with {words!r} in\n{text}"
    # each bad image file gets its own message naming the file (not a generic failure)
    for fname in ("truncated.png", "nopixels.dcm", "text.dcm", "rgb.png"):
        (line,) = [line for line in lines if fname in line]
        assert len(line.split(":", 1)[1].strip()) > 10
    # the valid items (one of them listed twice across splits) are fine themselves and reported as ok
    ok_images = {Path(image).name for _, _, image in report.ok_items}
    assert {Path(it["image"]).name for it in _items(good_root)} <= ok_images
    assert not any(p.split == "training" and p.index in (0, 1, 2) for p in report.problems)
    after = {p: hashlib.sha1(Path(p).read_bytes()).hexdigest() for p in before}
    assert before == after
    with pytest.raises(DataCheckError, match="truncated.png"):
        assert_datalist_ok(datalist)


def _load_cli():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_data_cli", REPO_ROOT / "tools" / "check_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_data_cli_report_and_exit_status(tmp_path, good_root, capsys):
    cli = _load_cli()
    datalist, _ = _bad_dataset(tmp_path, good_root)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text(json.dumps(datalist))
    assert cli.main([str(bad_json), "--json", str(tmp_path / "report.json")]) == 1
    out = capsys.readouterr().out
    errors = [line for line in out.splitlines() if line.startswith("ERROR")]
    assert len(errors) >= 10
    for fname in ("truncated.png", "nopixels.dcm", "text.dcm", "rgb.png", "zeros.png", "small_mask.png"):
        assert fname in out
    payload = json.loads((tmp_path / "report.json").read_text())
    assert len(payload["problems"]) == len(errors) and payload["n_items"] == 14
    # the images that were read, each with the spacing its file states (the synthetic PNGs' pHYs) or null
    stated = [v for v in payload["pixel_spacing"].values() if v is not None]
    assert stated and all(len(v) == 2 and min(v) > 0 for v in stated)
    assert cli.main([str(good_root / "datalist.json"), "--list-ok"]) == 0
    out = capsys.readouterr().out
    assert "4 ok" in out and out.count("\nok ") == 4


@pytest.mark.slow
def test_check_data_cli_as_a_process(tmp_path, good_root):
    datalist, _ = _bad_dataset(tmp_path, good_root)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text(json.dumps(datalist))
    res = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "check_data.py"), str(bad_json)], capture_output=True, text=True
    )
    assert res.returncode == 1, res.stderr
    assert "truncated.png" in res.stdout and "does_not_exist.png" in res.stdout


def test_label_mask_consistency_rules(tmp_path):
    img = np.full((40, 30), 500, np.uint16)
    write_png16(tmp_path / "img.png", img)
    write_mask_png(tmp_path / "empty.png", np.zeros((40, 30), np.uint8))
    grey = np.zeros((40, 30), np.uint8)
    grey[:5, :5], grey[10:12, 10:12] = 100, 200
    Image.fromarray(grey).save(tmp_path / "grey.png")
    base = {"image": "img.png", "patient_id": "p"}
    positive_empty = {**base, "label": [1, 0], "mask_benign": "empty.png"}
    problems = check_datalist({"test": [positive_empty]}, tmp_path)
    assert len(problems) == 1 and "mask is empty" in str(problems[0])
    assert check_datalist({"test": [positive_empty]}, tmp_path, strict_masks=False) == []
    unknown = {**base, "mask_benign": "empty.png"}  # label absent = unknown: nothing to compare
    assert check_datalist(
        {"validation": [unknown], "test": [{**base, "label": None, "image": "img.png"}]}, tmp_path
    ) == [p for p in check_datalist({"validation": [unknown], "test": [{**base, "label": None}]}, tmp_path)]
    not_binary = check_datalist({"test": [{**base, "label": [1, 0], "mask_benign": "grey.png"}]}, tmp_path)
    assert any("not binary" in str(p) for p in not_binary)
    wrong = check_datalist({"test": [{**base, "label": [1, 0, 0], "laterality": "left"}]}, tmp_path)
    assert {p.key for p in wrong} == {"label", "laterality"}


def test_boxes_are_checked_for_form_size_and_label(tmp_path):
    """Boxes: well formed (parse_boxes's rules), inside the image the file states (40x30), agreeing with the label;
    every problem of every item in one run; good boxes, touching the far edges, pass."""
    write_png16(tmp_path / "img.png", np.full((40, 30), 500, np.uint16))
    base = {"image": "img.png", "patient_id": "p", "label": [1, 1]}
    boxes = [{"label": "benign", "box": [0, 0, 40, 30]}, {"label": "malignant", "box": [1, 2, 3.5, 4]}]
    good = {**base, "boxes": boxes}
    assert check_datalist({"test": [good]}, tmp_path) == []
    items = [
        {**base, "boxes": [{"label": "malignant", "box": [10, 5, 41, 12]}]},  # one row too far
        {**base, "boxes": [{"label": "benign", "box": [0, 25, 5, 30.5]}]},  # half a column too far
        {**base, "label": [1, 0], "boxes": [{"label": "malignant", "box": [1, 1, 2, 2]}]},
        {**base, "boxes": [{"label": "cyst", "box": [1, 1, 2, 2]}]},
        {**base, "boxes": [{"label": "benign", "box": [5, 1, 2, 2]}]},
        {**base, "boxes": {"label": "benign", "box": [1, 1, 2, 2]}},
        {**base, "image": "missing.png", "boxes": [{"label": "benign", "box": [0, 0, 999, 999]}]},  # size unknown
    ]
    problems = check_datalist({"test": items}, tmp_path)
    by_item = {i: [str(p) for p in problems if p.index == i] for i in range(len(items))}
    assert all(p.key == "boxes" for p in problems if p.index not in (None, 6))  # None: the image listed 6 times
    assert by_item[0] == [
        "test[0] boxes: boxes[0]: box [y0, x0, y1, x1] = [10, 5, 41, 12] reaches beyond the image (40x30 pixels); "
        "boxes are in the image file's pixels"
    ]
    assert "[0, 25, 5, 30.5] reaches beyond the image (40x30 pixels)" in by_item[1][0]
    assert by_item[2] == ["test[2] boxes: boxes[0]: a malignant box but label malignant is 0"]
    assert "boxes[0]: label must be one of ['benign', 'malignant'], got 'cyst'" in by_item[3][0]
    assert "needs 0 <= y0 < y1" in by_item[4][0]
    assert by_item[5] == ["test[5] boxes: must be a list of {'label', 'box'} entries, got dict"]
    assert len(by_item[6]) == 1 and by_item[6][0].startswith("test[6] image")  # the file, not the box


def test_structural_problems(tmp_path):
    missing = check_datalist(tmp_path / "nope.json")
    assert len(missing) == 1 and "not found" in str(missing[0])
    (tmp_path / "broken.json").write_text("{not json")
    assert "not valid JSON" in str(check_datalist(tmp_path / "broken.json")[0])
    problems = check_datalist({"test": ["just a string", {"label": [0, 0]}]}, tmp_path)
    assert [p.index for p in problems] == [0, 1]
    assert "must be an object" in str(problems[0]) and "missing 'image'" in str(problems[1])


def test_deeply_nested_json_is_one_line(tmp_path):
    """100000 nested lists make Python's JSON parser recurse past its limit: one problem naming the file, exit 1."""
    deep = tmp_path / "deep.json"
    deep.write_text('{"training": ' + "[" * 100000 + "]" * 100000 + "}")
    (problem,) = check_datalist(deep)
    assert str(problem).startswith(f"{deep}: JSON nested too deeply to read")
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "check_data.py"), str(deep)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"ERROR {deep}: JSON nested too deeply to read" in result.stdout
    # a datalist nested less deeply than the limit is read, and its odd item reported as one
    shallow = tmp_path / "shallow.json"
    shallow.write_text('{"training": [' + "[" * 500 + "]" * 500 + "]}")
    assert any("must be an object" in str(p) for p in check_datalist(shallow))


def test_pixel_spacing_is_summarised_and_unknown_spacing_warned_against_the_model(tmp_path, caplog):
    img = np.full((40, 30), 500, np.uint16)
    write_png16(tmp_path / "at_04.png", img, spacing_mm=0.4)  # pHYs: 2500 px/m
    write_png16(tmp_path / "at_01.png", img, spacing_mm=0.1)
    write_png16(tmp_path / "none_a.png", img)  # no pHYs: unknown
    write_png16(tmp_path / "none_b.png", img)
    items = [{"image": name, "patient_id": f"p{i}"} for i, name in enumerate(["at_04.png", "at_01.png", "none_a.png"])]
    data = {"validation": items, "test": [{"image": "none_b.png", "patient_id": "p9"}]}

    report = run_data_checks(data, tmp_path)
    assert report.ok
    assert report.spacings[str(tmp_path / "at_04.png")] == pytest.approx((0.4, 0.4), rel=1e-3)
    assert report.unknown_spacing == [str(tmp_path / "none_a.png"), str(tmp_path / "none_b.png")]
    line = report.format().splitlines()[1]
    assert line.startswith("pixel spacing: 2 of 4 image(s) state one (0.1-0.4 mm); without: ")
    assert "none_a.png" in line and "none_b.png" in line and "at_01" not in line
    # the flags that state a spacing are named
    assert line.endswith("; " + SPACING_HINT) and "make_datalist.py --pixel_spacing MM" in line
    assert "--input_spacing MM" in line
    # nothing read, nothing to say; all stated and equal: one value, no list
    assert run_data_checks(data, tmp_path, read_files=False).spacing_summary() is None
    uniform = run_data_checks({"test": items[:1]}, tmp_path).spacing_summary()
    assert uniform == "pixel spacing: 1 of 1 image(s) state one (0.4 mm)"

    with caplog.at_level("WARNING", logger="scripts.data.checks"):
        assert_datalist_ok(data, tmp_path)  # the model's spacing unknown: nothing is assumed, nothing to warn
        assert not caplog.records
        assert_datalist_ok(data, tmp_path, pixel_spacing=0.4)
    (record,) = caplog.records
    assert "2 of 4 image(s) state no pixel spacing" in record.getMessage() and "0.4 mm" in record.getMessage()
    assert "none_a.png" in record.getMessage() and "at_04.png" not in record.getMessage()
    assert record.getMessage().endswith(SPACING_HINT)
    caplog.clear()
    with caplog.at_level("WARNING", logger="scripts.data.checks"):
        assert_datalist_ok({"test": items[:2]}, tmp_path, pixel_spacing=[0.4, 0.4])  # every image states one
    assert not caplog.records
    with pytest.raises(ValueError, match="pixel_spacing"):
        assert_datalist_ok(data, tmp_path, pixel_spacing=-0.4)
