"""Images the evaluation cannot score are named, never dropped without a word: a tall breast whose lesion (a mask, or
a box) lies beyond the model's window, and an unreadable file (``--check_data false``), among four ordinary images of
the tiny evaluation of ``test_evaluate.py``. Without ``skip_unscored`` the run stops with one line naming the count and
``unscored.csv``, which lists each with its reason, and writes no report; with it, the report is that of the
ordinary images alone (compared with an evaluation of a datalist without the others) and says how many it skipped.
The expected lesion counts come from the plain preprocessing's masks and the datalist's, counted with SciPy."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_CONFIG, TRAIN_CONFIG
from monai.bundle import ConfigParser
from PIL import Image
from scipy import ndimage
from test_evaluate import eval_setup, eval_workflow

from scripts.evaluation.files import format_table
from scripts.evaluation.report import UnscoredImagesError
from scripts.evaluation.unscored import UNSCORED_KEY, ScoringDataset

__all__ = ["eval_setup"]  # the module-scoped fixture, shared with test_evaluate.py

EIGHT = np.ones((3, 3))  # 8-connected lesions, as the FROC counts them


def n_lesions(mask: np.ndarray) -> int:
    return int(ndimage.label(np.asarray(mask) > 0, structure=EIGHT)[1])


@pytest.fixture(scope="module")
def split(eval_setup, tmp_path_factory):
    """Four ordinary images; a 640-row breast (the window has 256 rows) with two benign lesions, one near its top and
    one near its bottom; the same breast with a malignant box near its bottom; a file that is not a picture."""
    root, _, content = eval_setup
    folder = tmp_path_factory.mktemp("unscored")
    ordinary = [dict(item) for item in content["training"][:4]]
    picture = np.asarray(Image.open(ordinary[0]["image"]))
    tall = np.concatenate([picture, picture, picture[:128]], axis=0)
    Image.fromarray(tall).save(folder / "tall.png")
    mask = np.zeros(tall.shape, np.uint8)
    mask[20:30, 40:60] = 255
    mask[600:615, 40:60] = 255
    Image.fromarray(mask).save(folder / "tall_benign.png")
    side = {"patient_id": "TALL", "laterality": "L", "view": "CC"}
    tall_mask = {"image": str(folder / "tall.png"), "label": [1, 0], "mask_benign": str(folder / "tall_benign.png")}
    tall_box = {
        "image": str(folder / "tall.png"),
        "label": [0, 1],
        "boxes": [{"label": "malignant", "box": [600, 40, 615, 60]}],
    }
    (folder / "broken.png").write_bytes(b"not a picture")
    broken = {**ordinary[1], "image": str(folder / "broken.png")}
    items = [ordinary[0], {**tall_mask, **side}, ordinary[1], broken, ordinary[2], {**tall_box, **side}, ordinary[3]]
    return root, folder, items, content


def write_datalist(path: Path, test: list, content: dict) -> Path:
    path.write_text(json.dumps({"test": test, "validation": content["validation"]}))
    return path


def read_unscored(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_dataset_names_what_it_cannot_score_and_changes_nothing_else(split):
    """Markers for the three images, each reason from an independent count; every other item exactly the plain
    preprocessing's."""
    _, _, items, _ = split
    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(TINY_CONFIG)])
    preprocessing = parser.get_parsed_content("validate#preprocessing")
    dataset = ScoringDataset(items, preprocessing)
    # the plain chain keeps one of the tall breast's two lesions: the other is beyond the window
    in_window = n_lesions(preprocessing(dict(items[1]))["mask"][0])
    in_file = n_lesions(np.asarray(Image.open(items[1]["mask_benign"])))
    assert (in_window, in_file) == (1, 2)
    assert n_lesions(preprocessing(dict(items[5]))["mask"][1]) == 0
    got = [dataset[i] for i in range(len(items))]
    assert got[1] == {
        UNSCORED_KEY: "1 of 2 benign lesion(s) (mask or box) lie wholly outside the model's 256 x 160 window",
        "image_path": items[1]["image"],
    }
    assert (
        got[5][UNSCORED_KEY]
        == "1 of 1 malignant lesion(s) (mask or box) lie wholly outside the model's 256 x 160 window"
    )
    assert got[3][UNSCORED_KEY].startswith("unreadable: ") and "\n" not in got[3][UNSCORED_KEY]
    assert got[3]["image_path"] == items[3]["image"]
    for i in (0, 2, 4, 6):
        expected = preprocessing(dict(items[i]))
        assert sorted(got[i]) == sorted(expected)
        for key in ("image", "mask", "label"):
            assert got[i][key].dtype == expected[key].dtype and torch.equal(got[i][key], expected[key]), (i, key)


def test_a_refused_spacing_and_a_lesion_lost_in_the_resampling_are_named(split, tmp_path):
    """With a model pixel spacing of 0.2 mm: a datalist spacing of 5 mm is refused by the resampling step (named);
    at 0.05 mm the image shrinks four times (nearest-exact samples rows and columns 2, 6, 10 ...), so a one-pixel
    lesion at row and column 101 falls between the samples."""
    _, folder, items, _ = split
    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(TINY_CONFIG)])
    parser["pixel_spacing"] = 0.2
    preprocessing = parser.get_parsed_content("validate#preprocessing")
    picture = np.asarray(Image.open(items[0]["image"]))
    mask = np.zeros(picture.shape, np.uint8)
    mask[101, 101] = 255
    Image.fromarray(mask).save(tmp_path / "dot.png")
    dot = {"image": items[0]["image"], "label": [1, 0], "mask_benign": str(tmp_path / "dot.png"), "pixel_spacing": 0.05}
    assert n_lesions(preprocessing(dict(dot))["mask"][0]) == 0  # what the plain preprocessing leaves of it
    kept = {**dot, "mask_benign": str(tmp_path / "kept.png")}
    mask[101, 101], mask[102, 102] = 0, 255  # on a sampled row and column: kept
    Image.fromarray(mask).save(tmp_path / "kept.png")
    assert n_lesions(preprocessing(dict(kept))["mask"][0]) == 1
    dataset = ScoringDataset([{**items[0], "pixel_spacing": 5.0}, dot, kept], preprocessing)
    refused = dataset[0][UNSCORED_KEY]
    assert refused.startswith("preprocessing refused (ResampleToSpacingd): UsageError: ")
    assert "5 mm is outside the pixel sizes of mammograms" in refused and "\n" not in refused
    assert dataset[1][UNSCORED_KEY] == (
        "the benign lesion(s) (mask or box) vanished when resampled to the model's spacing"
    )
    assert UNSCORED_KEY not in dataset[2]


def test_evaluation_stops_naming_every_unscored_image(split, tmp_path):
    root, folder, items, content = split
    datalist = write_datalist(tmp_path / "datalist.json", items, content)
    eval_dir = tmp_path / "report"
    wf = eval_workflow(root, datalist, eval_dir=str(eval_dir), check_data=False)
    wf.initialize()
    with pytest.raises(Exception) as caught:
        wf.run()
    err = caught.value
    while not isinstance(err, UnscoredImagesError) and (err.__cause__ or err.__context__) is not None:
        err = err.__cause__ or err.__context__
    assert isinstance(err, UnscoredImagesError), caught.value
    message = str(err)
    assert "\n" not in message
    assert (
        message.startswith("3 image(s) of the test split could not be scored")
        and str(eval_dir / "unscored.csv") in message
    )
    assert "--skip_unscored true" in message
    rows = read_unscored(eval_dir / "unscored.csv")
    assert [r["image"] for r in rows] == [items[i]["image"] for i in (1, 3, 5)]
    assert "benign lesion(s) (mask or box) lie wholly outside" in rows[0]["reason"]
    assert rows[1]["reason"].startswith("unreadable: ")
    assert "malignant lesion(s) (mask or box) lie wholly outside" in rows[2]["reason"]
    assert not (eval_dir / "metrics.json").exists() and not (eval_dir / "metrics.csv").exists()


def test_skipping_reports_the_other_images_and_says_how_many_it_skipped(split, tmp_path, caplog):
    root, folder, items, content = split
    eval_dir = tmp_path / "skipped"
    wf = eval_workflow(
        root,
        write_datalist(tmp_path / "all.json", items, content),
        eval_dir=str(eval_dir),
        check_data=False,
        skip_unscored=True,
    )
    wf.initialize()
    summary = wf.run()[-1]
    table = wf.parser.get_parsed_content("validate#report").table
    ordinary = [items[i] for i in (0, 2, 4, 6)]
    alone = tmp_path / "alone"
    wf = eval_workflow(root, write_datalist(tmp_path / "ordinary.json", ordinary, content), eval_dir=str(alone))
    wf.initialize()
    reference = wf.run()[-1]
    assert summary["n_unscored"] == 3 and reference["n_unscored"] == 0
    assert summary["n_images"] == 4 and summary["skip_unscored"] is True
    different = {"n_unscored", "skip_unscored", "datalist"}
    assert {k: v for k, v in summary.items() if k not in different} == {
        k: v for k, v in reference.items() if k not in different
    }
    assert (eval_dir / "metrics.csv").read_text() == (alone / "metrics.csv").read_text()
    assert [r["image"] for r in read_unscored(eval_dir / "unscored.csv")] == [items[i]["image"] for i in (1, 3, 5)]
    assert read_unscored(alone / "unscored.csv") == []  # the header alone: no earlier list left beside a report
    assert table.splitlines()[0] == (
        "GLAM evaluation: test split, 4 images scored (3 unscored image(s) skipped, in no number below: "
        "unscored.csv), stage joint"
    )
    assert format_table(reference).splitlines()[0] == "GLAM evaluation: test split, 4 images, stage joint"
    logged = [r.getMessage() for r in caplog.records if r.name == "scripts.evaluation.report"]
    assert sum(m.startswith("unscored image ") for m in logged) == 3
    assert any(m.startswith("3 unscored image(s) skipped (skip_unscored)") for m in logged)


def test_a_split_with_no_scorable_image_is_refused_in_one_line(split, tmp_path):
    root, _, items, content = split
    eval_dir = tmp_path / "none"
    wf = eval_workflow(
        root,
        write_datalist(tmp_path / "none.json", [items[1], items[3]], content),
        eval_dir=str(eval_dir),
        check_data=False,
        skip_unscored=True,
    )
    wf.initialize()
    with pytest.raises(Exception) as caught:
        wf.run()
    chain, err = [], caught.value
    while err is not None:
        chain.append(str(err))
        err = err.__cause__ or err.__context__
    assert any(m.startswith("no image of the test split could be scored (2 unscored, in ") for m in chain), chain
    assert len(read_unscored(eval_dir / "unscored.csv")) == 2


def test_a_film_without_a_breast_is_named_as_inference_refuses_it(split, tmp_path):
    """A digitised film of lettering, a ruler and noise (no breast) with a benign label: the preprocessing succeeds,
    but the window holds no breast, so the image is unscored with the line inference's errors.csv gives it
    (``breast_refusal``); an ordinary image beside it is scored, its item without the breast's keys."""
    from _film_factory import film

    _, _, items, _ = split
    picture, _ = film(512, 320, "CC", "L", breast=False)
    Image.fromarray(picture).save(tmp_path / "no_breast.png")
    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(TINY_CONFIG)])
    preprocessing = parser.get_parsed_content("validate#preprocessing")
    empty = {"image": str(tmp_path / "no_breast.png"), "label": [1, 0], "laterality": "L", "view": "CC"}
    dataset = ScoringDataset([empty, items[0]], preprocessing)
    assert dataset[0][UNSCORED_KEY].startswith("BreastNotFound: no tissue region large enough to be a breast")
    scored = dataset[1]
    assert UNSCORED_KEY not in scored and sorted(scored) == sorted(preprocessing(dict(items[0])))
