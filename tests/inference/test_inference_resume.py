"""An inference run loses nothing and can be resumed (bundle/scripts/inference/folder.py, the writer and the
tables): the documented command killed with SIGKILL at several points (before the first image, while an image's files
are being written, at random moments) leaves valid tables listing only complete images; the same command then
finishes the rest, every image once, every file readable and equal to an uninterrupted run's, no temporaries left.
A folder is reused only by the same run (resumed), or by a run of the same settings on other inputs (added beside);
another run's folder is refused, and so is a folder that cannot be written, before any image is read."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, workflow_command
from PIL import Image
from test_inference_workflow import INFERENCE_CONFIG, META, TINY, TINY_INFERENCE, _run

OUTPUTS = ["S_c", "S_g", "png", "panel"]
N_IMAGES = 12


def _tables_are_valid(out: Path) -> list[dict[str, str]]:
    """predictions.csv and errors.csv parse as CSV with this version's header, every row whole; each prediction row's
    files exist and read back completely. Returns the prediction rows."""
    from scripts.inference.tables import ERROR_COLUMNS, PREDICTION_COLUMNS, unescape_text

    tables = {}
    for name, columns in (("predictions.csv", PREDICTION_COLUMNS), ("errors.csv", ERROR_COLUMNS)):
        if not (out / name).exists():
            tables[name] = []
            continue
        data = (out / name).read_bytes()
        assert data.endswith(b"\n"), f"{name} ends inside a row"
        lines = list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))
        assert lines[0] == columns and all(len(line) == len(columns) for line in lines[1:]), name
        tables[name] = [dict(zip(columns, line)) for line in lines[1:]]
    for row in tables["predictions.csv"]:
        for relative in row["files"].split(";"):
            _read_fully(out / unescape_text(relative))
    return tables["predictions.csv"]


def _read_fully(path: Path) -> np.ndarray:
    if path.name.endswith(".nii.gz"):
        return np.asarray(nib.load(str(path)).get_fdata())
    with Image.open(path) as img:
        img.load()
        return np.asarray(img)


def _temporaries(out: Path) -> list[str]:
    from scripts.atomic import is_temporary

    return sorted(str(p) for p in out.rglob("*") if is_temporary(p.name))


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    from glam_benchmark.synthetic import make_synthetic_dataset
    from scripts.networks import GLAMSaliencyNet

    root = tmp_path_factory.mktemp("resume")
    # images 4x the tiny window each way: each image's files take long enough to be caught while being written
    make_synthetic_dataset(root / "png", N_IMAGES, size=(1024, 640), seed=8, fmt="png")
    folder = root / "in"
    shutil.copytree(root / "png" / "images", folder)
    (folder / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a png" * 4)
    torch.manual_seed(0)
    ckpt = root / "model.pt"
    torch.save(GLAMSaliencyNet(stage="joint", **TINY).state_dict(), ckpt)
    return {"root": root, "folder": folder, "ckpt": ckpt}


def _command(case: dict, out: Path) -> list[str]:
    configs = json.dumps([str(INFERENCE_CONFIG), str(TINY_INFERENCE)])
    cmd = [
        *workflow_command("inference"),
        "--config_file",
        configs,
        "--meta_file",
        str(META),
    ]
    cmd += ["--input_dir", str(case["folder"]), "--output_dir", str(out), "--ckpt_path", str(case["ckpt"])]
    return cmd + ["--outputs", json.dumps(OUTPUTS), "--writer_threads", "2"]


def _start(case: dict, out: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        _command(case, out), cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def _ended_by_the_kill(proc: subprocess.Popen) -> None:
    """The run was killed, or finished by itself before the kill: it never stopped on an error of its own."""
    log = proc.communicate(timeout=60)[0].decode(errors="replace")
    assert proc.returncode in (0, -signal.SIGKILL), log[-3000:]


def _kill_after(proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while proc.poll() is None and time.perf_counter() < deadline:
        time.sleep(0.01)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    _ended_by_the_kill(proc)


def _rows_written(out: Path) -> int:
    try:
        return max(0, (out / "predictions.csv").read_bytes().count(b"\n") - 1)
    except FileNotFoundError:
        return 0


def _kill_at_rows(proc: subprocess.Popen, out: Path, rows: int, then: float = 0.0) -> None:
    """SIGKILL ``then`` seconds after predictions.csv has ``rows`` rows (other images are then in flight)."""
    while proc.poll() is None and _rows_written(out) < rows:
        time.sleep(0.002)
    _kill_after(proc, then)


def _kill_while_writing(proc: subprocess.Popen, out: Path) -> bool:
    """SIGKILL as soon as an image's staged files exist (a write in progress); whether that moment was caught."""
    from scripts.atomic import is_temporary

    folders = [out / "maps", out / "panels"]
    while proc.poll() is None:
        for folder in folders:
            try:
                names = os.listdir(folder)
            except FileNotFoundError:
                continue
            if any(is_temporary(n) for n in names):
                proc.send_signal(signal.SIGKILL)
                _ended_by_the_kill(proc)
                return True
    _ended_by_the_kill(proc)
    return False


@pytest.mark.slow
def test_sigkill_at_any_point_then_the_same_command_finishes_every_image_once(case):
    reference = case["root"] / "reference"
    proc = _start(case, reference)
    log = proc.communicate(timeout=600)[0].decode(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    expected = {r["image"]: r for r in _tables_are_valid(reference)}
    assert len(expected) == N_IMAGES

    out = case["root"] / "out"
    rng = random.Random(28)
    # kill points: before the first image, while files are staged, a random moment after the first finished image
    # of a run (others in flight), after a random number of finished images, and while files are staged again
    kills = [("startup", 1.0, 0.0), ("writing", 0, 0.0), ("after_a_row", 1, rng.uniform(0.0, 0.2))]
    kills += [("rows_in_table", rng.randint(3, 5), rng.uniform(0.0, 0.05)), ("writing", 0, 0.0)]
    caught_writing, kept = 0, set()
    for kind, count, delay in kills:
        proc = _start(case, out)
        if kind == "startup":
            _kill_after(proc, count)  # seconds: before the model is built
        elif kind == "writing":
            caught_writing += _kill_while_writing(proc, out)
        elif kind == "after_a_row":
            _kill_at_rows(proc, out, _rows_written(out) + count, delay)  # this run's first finished image
        else:
            _kill_at_rows(proc, out, count, delay)  # the table holds `count` images
        rows = _tables_are_valid(out)  # valid at the moment of the kill, complete images only
        assert len({r["image"] for r in rows}) == len(rows) <= N_IMAGES
        assert kept <= {r["image"] for r in rows}  # what an earlier run finished is never lost
        kept = {r["image"] for r in rows}
    assert caught_writing >= 1, "no kill landed while an image's files were being written"

    done_before = len(_tables_are_valid(out))
    assert done_before > 0  # the killed runs kept their finished images
    proc = _start(case, out)
    log = proc.communicate(timeout=600)[0].decode(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    assert f"resuming: {done_before} of {N_IMAGES + 1} inputs are done already (skipped)" in log
    assert json.loads((out / "timing.json").read_text())["skipped"] == done_before

    rows = _tables_are_valid(out)
    assert sorted(r["image"] for r in rows) == sorted(expected)  # every image exactly once
    errors = list(csv.DictReader(open(out / "errors.csv", newline="", encoding="utf-8")))
    # once, though tried by every run (the other rows are notes: views unknown, lateralities inferred)
    assert [Path(e["image"]).name for e in errors if e["error"]] == ["corrupt.png"]
    assert _temporaries(out) == []
    listed = {f for r in rows for f in r["files"].split(";")} | {f"manifests/{r['output_stem']}.json" for r in rows}
    on_disk = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.parent != out}
    assert on_disk == listed  # no orphan files (nor manifests) of an interrupted image
    for row in rows:
        ref = expected[row["image"]]
        assert {k: v for k, v in row.items() if k not in ("files",)} == {k: v for k, v in ref.items() if k != "files"}
        for relative in row["files"].split(";"):
            np.testing.assert_array_equal(_read_fully(out / relative), _read_fully(reference / relative))


@pytest.fixture
def tiny_run(case, tmp_path):
    """A run of the tiny model on 3 small images into a fresh folder, and a function that runs again."""
    from glam_benchmark.synthetic import make_synthetic_dataset

    make_synthetic_dataset(tmp_path / "a", 3, size=(256, 160), seed=11, fmt="png")
    make_synthetic_dataset(tmp_path / "b", 3, size=(256, 160), seed=12, fmt="png")  # the same file names

    def run(images: str = "a", **overrides) -> Path:
        out = tmp_path / "out"
        common = {
            "input_dir": str(tmp_path / images / "images"),
            "output_dir": str(out),
            "ckpt_path": str(case["ckpt"]),
        }
        _run([INFERENCE_CONFIG, TINY_INFERENCE], {**common, **overrides})
        return out

    return run


def _snapshot(out: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}


def test_the_same_command_again_skips_everything_and_changes_nothing(tiny_run, caplog):
    out = tiny_run()
    before = _snapshot(out)
    with caplog.at_level("INFO", logger="scripts"):
        tiny_run()
    assert "resuming: 3 of 3 inputs are done already (skipped), 0 to run" in caplog.text
    after = _snapshot(out)
    assert after == before  # not one file rewritten (timing.json too: nothing ran)


def test_other_inputs_with_the_same_settings_are_added_beside_under_their_own_stems(tiny_run):
    out = tiny_run("a")
    first = _snapshot(out)
    tiny_run("b")
    rows = list(csv.DictReader(open(out / "predictions.csv", newline="", encoding="utf-8")))
    assert len(rows) == 6 and len({r["output_stem"] for r in rows}) == 6
    stems_b = sorted(r["output_stem"] for r in rows if "/b/" in r["image"])
    stems_a = sorted(r["output_stem"] for r in rows if "/a/" in r["image"])
    assert stems_b == [f"{s}_2" for s in stems_a]  # the same file names: distinct stems
    after = _snapshot(out)
    for name, (data, _) in first.items():
        if name.startswith(("maps/", "panels/")):
            assert after[name][0] == data  # the first run's maps are not replaced


def test_another_runs_folder_is_refused_naming_what_differs(tiny_run, case, tmp_path):
    from scripts.inference.folder import OutputFolderRefused
    from scripts.networks import GLAMSaliencyNet

    out = tiny_run()
    before = _snapshot(out)
    with pytest.raises(
        OutputFolderRefused, match=r"holds the outputs of another run .*model\.gamma_c: 0\.5 there, 0\.8 now"
    ):
        tiny_run(gamma_c=0.8)
    with pytest.raises(OutputFolderRefused, match=r'outputs: \["S_c", "panel"\] there, \["S_g", "S_c", "panel"\] now'):
        tiny_run(outputs=["S_g", "S_c", "panel"])
    torch.manual_seed(1)
    other = tmp_path / "other.pt"
    torch.save(GLAMSaliencyNet(stage="joint", **TINY).state_dict(), other)
    with pytest.raises(OutputFolderRefused, match="checkpoint_sha256"):
        tiny_run(ckpt_path=str(other))
    assert _snapshot(out) == before  # nothing there was changed

    (out / "run.json").unlink()  # outputs without a record (an earlier version)
    with pytest.raises(
        OutputFolderRefused, match="holds predictions.csv, errors.csv, maps, panels, manifests but no run.json"
    ):
        tiny_run()


def test_a_damaged_file_makes_its_image_run_again(tiny_run, caplog):
    out = tiny_run()
    rows = list(csv.DictReader(open(out / "predictions.csv", newline="", encoding="utf-8")))
    damaged = out / "maps" / f"{rows[1]['output_stem']}_S_c.nii.gz"
    data = damaged.read_bytes()
    damaged.write_bytes(data[: len(data) // 2])  # e.g. a power cut after the rename
    with caplog.at_level("INFO", logger="scripts"):
        tiny_run()
    assert "1 images in predictions.csv have missing or damaged files: they are run again" in caplog.text
    assert "resuming: 2 of 3 inputs are done already (skipped), 1 to run" in caplog.text
    again = list(csv.DictReader(open(out / "predictions.csv", newline="", encoding="utf-8")))
    assert sorted(r["image"] for r in again) == sorted(r["image"] for r in rows)  # once each
    assert damaged.read_bytes() != data[: len(data) // 2] and nib.load(str(damaged)).get_fdata().shape[-1] == 2


def test_a_folder_another_run_is_writing_into_is_refused(tiny_run, tmp_path):
    from scripts.inference.files import OutputSelection
    from scripts.inference.folder import InferenceOutputFolder, OutputFolderRefused

    holder = InferenceOutputFolder(tmp_path / "busy", {"x": 1}, OutputSelection())
    holder.open([])
    try:
        with pytest.raises(OutputFolderRefused, match="another inference run is writing into it"):
            InferenceOutputFolder(tmp_path / "busy", {"x": 1}, OutputSelection()).open([])
    finally:
        holder.finish()
    InferenceOutputFolder(tmp_path / "busy", {"x": 1}, OutputSelection()).open([])  # free again


def _make_read_only(folder: Path) -> None:
    """chmod 555, and for root (whom permissions do not stop) the immutable attribute; skips when neither works."""
    folder.chmod(0o555)
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False)
    try:
        (folder / "probe").write_bytes(b"")
    except OSError:
        return
    (folder / "probe").unlink()
    pytest.skip("cannot make a read-only folder on this machine")


def test_a_read_only_output_folder_stops_the_run_before_any_image_is_read(tiny_run, tmp_path, monkeypatch):
    from scripts.data import readers
    from scripts.inference.folder import OutputFolderRefused

    out = tmp_path / "out"
    out.mkdir()
    reads = []
    original = readers._load
    monkeypatch.setattr(readers, "_load", lambda *a, **k: reads.append(a[0]) or original(*a, **k))
    _make_read_only(out)
    try:
        with pytest.raises(OutputFolderRefused, match=rf"error: output_dir {out}: not writable \({out}: "):
            tiny_run()
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(out)], capture_output=True, check=False)
        out.chmod(0o755)
    assert reads == [] and list(out.iterdir()) == []  # no image read, nothing written


def test_weights_that_do_not_load_stop_the_run_before_the_output_folder_is_touched(tiny_run, case, tmp_path):
    state = torch.load(case["ckpt"], weights_only=True)
    del state[next(k for k in state if k.endswith(".weight"))]  # its settings record reads, strict loading fails
    broken = tmp_path / "broken.pt"
    torch.save(state, broken)
    with pytest.raises(Exception) as raised:
        tiny_run(ckpt_path=str(broken))
    assert "broken.pt" in repr(raised.value) + repr(raised.value.__cause__)
    assert not (tmp_path / "out").exists()
    out = tiny_run()
    assert len(list(csv.DictReader(open(out / "predictions.csv", newline="", encoding="utf-8")))) == 3


@pytest.mark.parametrize("name", [".tmp4242-a_map.nii.gz", ".a_map.nii.gz.k2x9q_ab.tmp"])
def test_a_run_stopped_while_checking_the_folder_leaves_it_usable(tiny_run, tmp_path, name):
    """Killed between creating the output folders and writing run.json, a run leaves at most temporaries: the folder
    is this program's, not another's, and the next run takes it (the temporary removed)."""
    probe = tmp_path / "out" / "maps" / name
    probe.parent.mkdir(parents=True)
    probe.write_bytes(b"probe")
    out = tiny_run()
    assert len(list(csv.DictReader(open(out / "predictions.csv", newline="", encoding="utf-8")))) == 3
    assert not probe.exists() and _temporaries(out) == []


def test_the_record_of_a_run_that_wrote_nothing_gives_way(tmp_path):
    """A run that opened the folder and stopped before its first image protects nothing: another run may use the
    folder (its record replaces the first); once an image is written, the record holds."""
    from scripts.inference.files import OutputSelection
    from scripts.inference.folder import InferenceOutputFolder, OutputFolderRefused

    first = InferenceOutputFolder(tmp_path / "out", {"checkpoint_sha256": "a"}, OutputSelection())
    first.open([])
    first.finish()
    second = InferenceOutputFolder(tmp_path / "out", {"checkpoint_sha256": "b"}, OutputSelection())
    second.open([])
    second.tables.add_error({"image": "x.png", "error": "E: x"})
    second.finish()
    assert json.loads((tmp_path / "out" / "run.json").read_text())["settings"]["checkpoint_sha256"] == "b"
    with pytest.raises(OutputFolderRefused, match='checkpoint_sha256: "b" there, "a" now'):
        InferenceOutputFolder(tmp_path / "out", {"checkpoint_sha256": "a"}, OutputSelection()).open([])


def test_a_file_of_the_recorded_size_with_another_end_makes_its_image_run_again(tiny_run, caplog):
    # the manifest, not the format: a panel whose last block was zeroed (a crash before the data reached the disk)
    # keeps its size, and only its manifest's hash of the last bytes tells it apart
    out = tiny_run()
    rows = list(csv.DictReader(open(out / "predictions.csv", newline="", encoding="utf-8")))
    panel = out / "panels" / f"{rows[0]['output_stem']}_panel.png"
    data = panel.read_bytes()
    panel.write_bytes(data[:-100] + bytes(100))
    with caplog.at_level("INFO", logger="scripts"):
        tiny_run()
    assert "1 images in predictions.csv have missing or damaged files: they are run again" in caplog.text
    assert "resuming: 2 of 3 inputs are done already (skipped), 1 to run" in caplog.text
    assert panel.read_bytes() == data  # the same image again, the same bytes


def test_a_folder_without_manifests_is_run_again_once(tiny_run, caplog):
    # images without a manifest (a folder of an earlier version) are damaged ones: each is run again (one inference
    # each), its files are replaced by the same bytes, and from then on the folder resumes as any other
    out = tiny_run()
    before = {k: data for k, (data, _) in _snapshot(out).items() if k != "timing.json"}
    shutil.rmtree(out / "manifests")
    with caplog.at_level("INFO", logger="scripts"):
        tiny_run()
    assert "3 images in predictions.csv have missing or damaged files: they are run again" in caplog.text
    after = {k: data for k, (data, _) in _snapshot(out).items() if k != "timing.json"}
    assert after == before  # every file (tables, maps, panels, manifests) as the first run wrote it
    caplog.clear()
    with caplog.at_level("INFO", logger="scripts"):
        tiny_run()
    assert "resuming: 3 of 3 inputs are done already (skipped), 0 to run" in caplog.text


def test_files_are_complete_only_as_their_manifest_records_them(tmp_path):
    from scripts.inference.files import TAIL_BYTES, StagedFiles, files_are_complete

    staged = StagedFiles(tmp_path, "manifests/a.json")
    big = bytes(range(256)) * (TAIL_BYTES // 128)  # two tail lengths long
    staged.path("maps/a.bin").write_bytes(big)
    staged.path("panels/a.png").write_bytes(b"small")
    files = staged.commit()
    assert files == ["maps/a.bin", "panels/a.png"] and not _temporaries(tmp_path)
    record = json.loads((tmp_path / "manifests" / "a.json").read_text())["files"]
    # independent of the code: the sizes, and the SHA-256 of the last TAIL_BYTES (all of a smaller file)
    assert record["maps/a.bin"] == {"size": len(big), "tail_sha256": hashlib.sha256(big[-TAIL_BYTES:]).hexdigest()}
    assert record["panels/a.png"] == {"size": 5, "tail_sha256": hashlib.sha256(b"small").hexdigest()}
    assert files_are_complete(tmp_path, "a", files)
    assert files_are_complete(tmp_path, "a", list(reversed(files)))  # the order the row lists them in is free
    assert files_are_complete(tmp_path, "none", [])  # nothing written, nothing to check
    assert not files_are_complete(tmp_path, "a", files[:1])  # the row and the manifest disagree
    assert not files_are_complete(tmp_path, "b", files)  # no manifest
    (tmp_path / "maps" / "a.bin").write_bytes(b"\xff" + big[1:])  # same size and end: a change at the start is
    assert files_are_complete(tmp_path, "a", files)  # not looked for (the check reads one block per file)
    (tmp_path / "panels" / "a.png").write_bytes(b"smalL")
    assert not files_are_complete(tmp_path, "a", files)
    (tmp_path / "panels" / "a.png").unlink()
    assert not files_are_complete(tmp_path, "a", files)
    (tmp_path / "manifests" / "a.json").write_text("{not json")
    assert not files_are_complete(tmp_path, "a", [files[0]])
    # nothing staged: no manifest
    empty = StagedFiles(tmp_path, "manifests/c.json")
    assert empty.commit() == [] and not (tmp_path / "manifests" / "c.json").exists()
