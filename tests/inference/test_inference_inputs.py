"""Every entry of an inference input folder is accounted for (bundle/scripts/inference/inputs.py) and the
tables hold every path losslessly without running anything in a spreadsheet (inference_tables.py): odd entries
(a dangling link, a link loop, a folder named like an image, a FIFO, a corrupt file) each get an errors.csv row
with the reason while the good images, one with a file name that is not UTF-8 among them, finish."""

from __future__ import annotations

import csv
import io
import os
import shutil
from pathlib import Path

import pytest
import torch
from test_inference_workflow import ALL_OUTPUTS, INFERENCE_CONFIG, TINY, TINY_INFERENCE, _run

NOT_UTF8 = b"scan\xff\xfe.png"  # latin-1 bytes: not a valid UTF-8 file name
FORMULA = "=HYPERLINK(1).png"  # its stem would run in a spreadsheet


def _rows(path: Path) -> list[dict[str, str]]:
    text = path.read_bytes().decode("utf-8")  # strict: the tables are valid UTF-8
    return list(csv.DictReader(io.StringIO(text, newline="")))


@pytest.fixture(scope="module")
def odd_folder(tmp_path_factory) -> dict:
    from glam_benchmark.synthetic import make_synthetic_dataset
    from scripts.networks import GLAMSaliencyNet

    root = tmp_path_factory.mktemp("odd_inputs")
    make_synthetic_dataset(root / "png", 4, size=(256, 160), seed=5, fmt="png")
    images = sorted((root / "png" / "images").iterdir())
    folder = root / "in"
    folder.mkdir()
    shutil.copy(images[0], folder / "good.png")
    shutil.copy(images[1], folder / FORMULA)
    with open(os.path.join(os.fsencode(folder), NOT_UTF8), "wb") as f:
        f.write(images[2].read_bytes())
    (folder / "x.png").mkdir()  # a folder named like an image: reported, and searched
    shutil.copy(images[3], folder / "x.png" / "inner.png")
    os.symlink(folder / "nowhere.png", folder / "dangling.png")
    os.symlink(folder / "loop2.png", folder / "loop1.png")
    os.symlink(folder / "loop1.png", folder / "loop2.png")
    os.mkfifo(folder / "pipe.png")  # reading it would block the run forever
    (folder / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a png" * 4)
    (folder / "notes.txt").write_text("not an image")  # no image file: listed as skipped
    shutil.copy(images[0], folder / ".hidden.png")  # hidden: skipped
    torch.manual_seed(0)
    ckpt = root / "model.pt"
    torch.save(GLAMSaliencyNet(stage="joint", **TINY).state_dict(), ckpt)
    out = root / "out"
    overrides = {"input_dir": str(folder), "output_dir": str(out), "ckpt_path": str(ckpt), "num_workers": 1}
    _run([INFERENCE_CONFIG, TINY_INFERENCE], overrides)
    return {"folder": folder, "out": out, "ckpt": ckpt, "overrides": overrides}


def test_every_odd_entry_has_an_error_row_with_its_reason_and_the_good_images_finish(odd_folder):
    from scripts.inference.tables import unescape_text

    folder, out = odd_folder["folder"], odd_folder["out"]
    good = {
        os.fsencode(folder / "good.png"),
        os.fsencode(folder / FORMULA),
        os.path.join(os.fsencode(folder), NOT_UTF8),
        os.fsencode(folder / "x.png" / "inner.png"),
    }
    predictions = _rows(out / "predictions.csv")
    assert {os.fsencode(unescape_text(r["image"])) for r in predictions} == good
    assert len(predictions) == len(good)
    reasons = {Path(unescape_text(r["image"])).name: r["error"] for r in _rows(out / "errors.csv") if r["error"]}
    odd = ["corrupt.png", "dangling.png", "loop1.png", "loop2.png", "notes.txt", "pipe.png", "x.png"]
    assert sorted(reasons) == odd
    skipped = reasons.pop("notes.txt")
    assert skipped.startswith(f"NotAMammogram: {folder / 'notes.txt'}: skipped, not a mammogram: no image")
    assert "broken symbolic link" in reasons["dangling.png"] and "nowhere.png" in reasons["dangling.png"]
    assert "symbolic link loop" in reasons["loop1.png"] and "symbolic link loop" in reasons["loop2.png"]
    assert "a folder, not an image file" in reasons["x.png"]
    assert "not a regular file (a FIFO)" in reasons["pipe.png"]
    assert "not a readable image" in reasons["corrupt.png"]
    for name, reason in reasons.items():
        assert reason.startswith("MammogramReadError: ") and str(folder / name) in reason  # names the entry


def test_a_name_that_is_not_utf8_is_written_escaped_and_decodes_to_its_bytes(odd_folder):
    from scripts.inference.tables import unescape_text

    folder, out = odd_folder["folder"], odd_folder["out"]
    row = next(r for r in _rows(out / "predictions.csv") if "\\x" in r["image"])
    assert row["image"] == f"{folder}/scan\\xff\\xfe.png"
    assert os.fsencode(unescape_text(row["image"])) == os.path.join(os.fsencode(folder), NOT_UTF8)
    assert row["output_stem"] == "scan\\xff\\xfe"
    for relative in row["files"].split(";"):  # the files carry the name's own bytes
        path = os.path.join(os.fsencode(out), os.fsencode(unescape_text(relative)))
        assert os.path.isfile(path) and b"scan\xff\xfe" in path


def test_cells_a_spreadsheet_would_run_are_neutralised(odd_folder):
    from scripts.inference.tables import unescape_text

    raw = (odd_folder["out"] / "predictions.csv").read_text(encoding="utf-8")
    row = next(r for r in _rows(odd_folder["out"] / "predictions.csv") if "HYPERLINK" in r["image"])
    assert row["output_stem"] == "'=HYPERLINK(1)" and unescape_text(row["output_stem"]) == "=HYPERLINK(1)"
    cells = [cell for line in csv.reader(io.StringIO(raw)) for cell in line]
    assert not [c for c in cells if c[:1] in ("=", "+", "@")]  # no cell starts a formula


def test_a_rerun_retries_the_odd_entries_and_lists_each_once(odd_folder, caplog):
    """Rerunning the command: the good images are skipped, the odd entries are tried again, and after the run
    errors.csv still has one row per entry (the retried errors are not added twice)."""
    out = odd_folder["out"]
    before = (out / "predictions.csv").read_bytes(), _rows(out / "errors.csv")
    with caplog.at_level("INFO", logger="scripts"):
        _run([INFERENCE_CONFIG, TINY_INFERENCE], odd_folder["overrides"])
    assert any(
        "resuming: 4 of 11 inputs are done already (skipped), 7 to run" in r.getMessage() for r in caplog.records
    )
    assert (out / "predictions.csv").read_bytes() == before[0]
    assert _rows(out / "errors.csv") == before[1]


def test_scanning_reads_images_and_lists_other_files_as_skipped(tmp_path):
    from scripts.inference.inputs import NO_IMAGE_FILE, scan_input_folder

    (tmp_path / "a.DCM").write_bytes(b"x")
    (tmp_path / "b.nii.gz").write_bytes(b"x")
    (tmp_path / "IM0001").write_bytes(b"\0" * 128 + b"DICM")  # a DICOM export without a suffix: read
    (tmp_path / "readme.md").write_text("x")  # no image: listed as skipped
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.png").write_bytes(b"x")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "d.png").write_bytes(b"x")
    os.symlink(tmp_path / "sub", tmp_path / "linked")  # a linked folder is not searched: no c.png twice
    items = scan_input_folder(tmp_path)
    names = ["IM0001", "a.DCM", "b.nii.gz", "readme.md", "sub/c.png"]
    assert [Path(i["image"]).relative_to(tmp_path).as_posix() for i in items] == names
    assert [i.get("error", "")[:40] for i in items] == ["", "", "", "NotAMammogram: " + str(tmp_path)[:25], ""]
    assert items[3]["error"].endswith("skipped, not a mammogram: " + NO_IMAGE_FILE)
    out = tmp_path / "out"  # the output folder is the input folder: its tables are no inputs
    out.mkdir()
    (out / "c.png").write_bytes(b"x")
    for name in ("predictions.csv", "run.json"):
        (out / name).write_text("x")
    assert scan_input_folder(out, exclude=[out]) == [{"image": str(out / "c.png")}]


@pytest.mark.parametrize(
    "text",
    [
        "plain/path.png",
        "back\\slash",
        "=1+2",
        "-x",
        "+x",
        "@x",
        "'quoted",
        "tab\tand\nnewline",
        "\udcff\udcfe.png",
        "lone \ud800 surrogate",
        "ünïcødé ✓",
        "\\x41 literal",
    ],
)
def test_cells_decode_to_the_text_they_were_written_for(text):
    from scripts.inference.tables import csv_cell, unescape_text

    cell = csv_cell(text)
    assert unescape_text(cell) == text
    cell.encode("utf-8")  # valid UTF-8
    assert cell.isprintable() and cell[:1] not in ("=", "+", "-", "@", "\t", "\r")


def test_a_table_torn_by_a_crash_loses_only_its_partial_line(tmp_path, caplog):
    from scripts.inference.tables import ERROR_COLUMNS, AppendOnlyCsv

    table = AppendOnlyCsv(tmp_path / "errors.csv", ERROR_COLUMNS)
    assert table.open() == []
    table.append({"image": "a.png", "error": "E: 1", "note": ""})
    table.close()
    with open(tmp_path / "errors.csv", "ab") as f:
        f.write(b"b.png,E: half a ro")  # a power cut in the middle of a row
    with caplog.at_level("WARNING"):
        rows = AppendOnlyCsv(tmp_path / "errors.csv", ERROR_COLUMNS).open()
    assert rows == [{"image": "a.png", "error": "E: 1", "note": ""}]
    assert "dropped a torn last line" in caplog.text
    assert (tmp_path / "errors.csv").read_bytes().endswith(b"E: 1,\r\n")
    (tmp_path / "other.csv").write_text("image,score\r\n")
    with pytest.raises(ValueError, match=r"other.csv: its columns \['image', 'score'\] are not"):
        AppendOnlyCsv(tmp_path / "other.csv", ERROR_COLUMNS).open()


def test_an_output_folder_inside_the_input_folder_is_not_read_as_input(odd_folder, tmp_path):
    """Outputs written into the input folder (maps are .nii.gz and .png, named like inputs): a rerun lists the same
    inputs as the first run, none of its own files."""
    from scripts.inference.inputs import inference_items

    folder = tmp_path / "in"
    shutil.copytree(odd_folder["folder"] / "x.png", folder)  # one good image
    out = folder / "out"
    overrides = {**odd_folder["overrides"], "input_dir": str(folder), "output_dir": str(out)}
    _run([INFERENCE_CONFIG, TINY_INFERENCE], overrides)
    assert list((out / "maps").glob("*.nii.gz")) and list((out / "panels").glob("*.png"))
    assert inference_items(folder, output_dir=out) == [{"image": str(folder / "inner.png")}]
    assert inference_items(folder) == [{"image": str(folder / "inner.png")}]  # a folder with a run.json is skipped
    (out / "run.json").rename(tmp_path / "run.json")
    assert len(inference_items(folder)) > 1  # what it would read without the exclusions
    (tmp_path / "run.json").rename(out / "run.json")
    _run([INFERENCE_CONFIG, TINY_INFERENCE], overrides)
    assert len(_rows(out / "predictions.csv")) == 1 and [r["error"] for r in _rows(out / "errors.csv")] == [""]


# -- file names too long for their outputs ---------------------------------------------------------------------------
def test_a_250_byte_file_name_gets_its_outputs_under_a_shortened_stem(tmp_path):
    """A 250-byte input name (ASCII, and one of two-byte characters) would make its outputs' names pass NAME_MAX
    (255 bytes: OSError 36, "File name too long"): its stem is shortened, with a hash, and every output is written;
    the short name beside it keeps its own stem."""
    from glam_benchmark.synthetic import make_synthetic_dataset
    from scripts.inference.folder import stem_limit
    from scripts.inference.tables import unescape_text
    from scripts.networks import GLAMSaliencyNet

    make_synthetic_dataset(tmp_path / "png", 3, size=(256, 160), seed=6, fmt="png")
    images = sorted((tmp_path / "png" / "images").iterdir())
    folder = tmp_path / "in"
    folder.mkdir()
    long_ascii = "L" * 246 + ".png"
    long_accents = "é" * 123 + ".png"  # 250 bytes in UTF-8
    assert len(long_ascii.encode()) == 250 == len(long_accents.encode())
    for image, name in zip(images, ["short.png", long_ascii, long_accents]):
        shutil.copy(image, folder / name)
    torch.manual_seed(0)
    torch.save(GLAMSaliencyNet(stage="joint", **TINY).state_dict(), tmp_path / "model.pt")
    out = tmp_path / "out"
    overrides = {"input_dir": str(folder), "output_dir": str(out), "ckpt_path": str(tmp_path / "model.pt")}
    _run([INFERENCE_CONFIG, TINY_INFERENCE], {**overrides, "outputs": ALL_OUTPUTS, "num_workers": 1})

    assert not [r for r in _rows(out / "errors.csv") if r["error"]]
    rows = {Path(unescape_text(r["image"])).name: r for r in _rows(out / "predictions.csv")}
    assert set(rows) == {"short.png", long_ascii, long_accents}
    assert rows["short.png"]["output_stem"] == "short"
    limit = stem_limit(out)
    assert limit == 200  # NAME_MAX 255 here
    stems = [unescape_text(rows[name]["output_stem"]) for name in (long_ascii, long_accents)]
    for stem, name in zip(stems, (long_ascii, long_accents)):
        assert len(stem.encode()) <= limit and name.startswith(stem.split("~")[0]) and len(stem.split("~")[1]) == 8
        files = unescape_text(rows[name]["files"]).split(";")
        assert (
            len(files) == 10 and all
        )  # 3 maps x (NIfTI + 2 PNGs) + the panel((out / f).is_file() and Path(f).name.startswith(stem) for f in files)
        assert all(len(Path(f).name.encode()) < 255 for f in files)


def test_long_names_with_one_beginning_get_distinct_stems_and_short_ones_stay():
    from scripts.inference.folder import assign_stems

    a, b = "/in/" + "x" * 240 + "a.png", "/in/" + "x" * 240 + "b.png"
    stems = assign_stems([a, b, "/in/short.dcm"], {}, limit=100)
    assert stems["/in/short.dcm"] == "short"
    assert stems[a] != stems[b] and all(len(stems[p].encode()) <= 100 for p in (a, b))
    assert stems[a].startswith("x" * 91 + "~") and len(stems[a]) == 100
    # a character is never cut in two: the stem stays valid UTF-8
    accents = assign_stems(["/in/" + "é" * 100 + ".png"], {}, limit=100)["/in/" + "é" * 100 + ".png"]
    assert accents.startswith("é" * 45 + "~") and len(accents.encode()) == 99
    # the stem a folder already has for an input is kept, whatever its length
    assert assign_stems([a], {a: "kept"}, limit=100) == {a: "kept"}
