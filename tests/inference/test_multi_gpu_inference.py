"""Inference over several processes (bundle/configs/multi_gpu_inference.yaml, scripts/inference/ranks.py): torchrun
with 2 gloo processes on the CPU writes what one process writes (predictions.csv, errors.csv, breasts.csv and every
file, byte for byte), each rank running its own share; a SIGKILL of one rank, then of the whole job, then the same
command again finishes every input once; a rank whose run raises is named, the other finishes its share, the inputs
it did not reach are errors.csv rows, the exit status is 1, and the same command again finishes them. The pieces
(the shares, the merge of the ranks' tables, the combined timing) are checked in one process first."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import torchrun_job
from conftest import BUNDLE_ROOT, CPU_REFERENCE
from test_inference_workflow import INFERENCE_CONFIG, META, TINY, TINY_INFERENCE, _run

MULTI_GPU_INFERENCE = BUNDLE_ROOT / "configs" / "multi_gpu_inference.yaml"
TABLES = ("predictions.csv", "errors.csv", "breasts.csv")


# -- the pieces, in one process ----------------------------------------------------------------------------------------
def test_shares_are_disjoint_cover_every_input_and_do_not_depend_on_what_is_done():
    from monai.data import partition_dataset

    from scripts.inference.ranks import input_share

    paths = [f"/in/{name}.png" for name in "kcjabhdfegi"] + ["/in/a.png"]  # unsorted, one listed twice
    for n in (1, 2, 3, 4):
        shares = [input_share(paths, r, n) for r in range(n)]
        assert sorted(p for share in shares for p in share) == sorted(set(paths))  # every input once
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
        assert shares == [
            list(s) for s in partition_dataset(sorted(set(paths)), num_partitions=n, even_divisible=False)
        ]
        # the order the inputs are listed in changes nothing
        assert shares == [input_share(list(reversed(paths)), r, n) for r in range(n)]
    assert input_share(["/in/x.png", "/in/y.png"], 3, 4) == []  # more ranks than inputs: some run nothing
    with pytest.raises(ValueError, match="rank must be in"):
        input_share(paths, 2, 2)


def _write_csv(path: Path, columns: list[str], rows: list[dict], torn: bytes = b"") -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\r\n")
    writer.writeheader()
    writer.writerows([{c: row.get(c, "") for c in columns} for row in rows])
    path.write_bytes(buffer.getvalue().encode() + torn)


def _rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_the_ranks_tables_are_absorbed_once_even_when_absorbed_twice(tmp_path):
    from scripts.inference.tables import ERROR_COLUMNS, PREDICTION_COLUMNS, InferenceTables, rank_tables

    def row(image: str, prob: str) -> dict:
        return {"image": image, "output_stem": Path(image).stem, "prob_benign": prob, "prob_malignant": prob}

    _write_csv(tmp_path / "predictions.csv", PREDICTION_COLUMNS, [row("/in/b.png", "0.1"), row("/in/a.png", "0.2")])
    _write_csv(tmp_path / "errors.csv", ERROR_COLUMNS, [{"image": "/in/c.png", "error": "OSError: old"}])
    # rank 0 redid a.png (its input changed) and did d.png; killed while appending e.png: a torn last line
    _write_csv(
        tmp_path / "predictions.rank0.csv",
        PREDICTION_COLUMNS,
        [row("/in/a.png", "0.3"), row("/in/d.png", "0.4")],
        torn=b"/in/e.png,e,0.5",
    )
    _write_csv(tmp_path / "errors.rank1.csv", ERROR_COLUMNS, [{"image": "/in/c.png", "error": "OSError: new"}])
    left_by_a_kill = {p.name: p.read_bytes() for p in tmp_path.glob("*.rank*.csv")}
    assert sorted(rank_tables(tmp_path)) == [0, 1]

    tables = InferenceTables(tmp_path)
    tables.open()
    taken = tables.absorb()
    assert [len(taken[0][0]), len(taken[0][1]), len(taken[1][0]), len(taken[1][1])] == [2, 0, 0, 1]
    assert not list(tmp_path.glob("*.rank*.csv"))
    # a process killed after the tables were replaced and before the ranks' tables were removed: absorbed again
    for name, data in left_by_a_kill.items():
        (tmp_path / name).write_bytes(data)
    tables.absorb()
    tables.compact()
    tables.close()
    predictions = {r["image"]: r["prob_benign"] for r in _rows(tmp_path / "predictions.csv")}
    assert predictions == {"/in/a.png": "0.3", "/in/b.png": "0.1", "/in/d.png": "0.4"}  # each once, the newest
    assert [r["image"] for r in _rows(tmp_path / "predictions.csv")] == sorted(predictions)
    assert [(r["image"], r["error"]) for r in _rows(tmp_path / "errors.csv")] == [("/in/c.png", "OSError: new")]
    assert not list(tmp_path.glob("*.rank*.csv"))


def test_timing_of_the_ranks_adds_up_to_the_run(tmp_path):
    from scripts.handlers.throughput import WALL_PARTS, RankTimings

    def timing(images: int, wall: float, model: float, data: float) -> dict:
        other = wall - model - data
        return {
            "images": images,
            "failed": 1,
            "written": images,
            "skipped": 2,
            "wall_s": wall,
            "images_per_s": images / wall,
            "model_s": model,
            "waiting_for_data_s": data,
            "waiting_for_writers_s": 0.0,
            "other_s": other,
            "loading_s": 3.0,
            "writing_s": 4.0,
        }

    reports = [
        {"rank": 1, "host": "b", "device": "cuda:1", "inputs": 9, "error": "RuntimeError: x", "timing": None},
        {"rank": 0, "host": "a", "device": "cuda:0", "inputs": 10, "error": None, "timing": timing(6, 3.0, 2.0, 0.5)},
    ]
    reports[0]["timing"] = timing(4, 4.0, 1.0, 1.0)
    total = RankTimings(tmp_path).write(reports, merge_s=0.25)
    assert json.loads((tmp_path / "timing.json").read_text()) == total
    assert [r["rank"] for r in total["ranks"]] == [0, 1] and total["ranks"][1]["host"] == "b"
    assert (total["images"], total["failed"], total["written"], total["skipped"]) == (10, 2, 10, 4)
    assert total["wall_s"] == 4.0 and total["images_per_s"] == pytest.approx(10 / 4.0)  # the slowest rank's wall
    assert total["rank_seconds"] == 7.0
    assert total["model_s"] == 3.0 and total["model_share"] == pytest.approx(3.0 / 7.0)
    assert sum(total[f"{p}_share"] for p in WALL_PARTS) == pytest.approx(1.0)
    assert total["loading_s"] == 6.0 and total["writing_s"] == 8.0
    assert total["ranks_failed"] == [1] and total["merge_s"] == 0.25 and total["processes"] == 2


def test_auto_workers_and_writers_share_the_node_among_its_processes(monkeypatch):
    from scripts.inference.inputs import loader_workers
    from scripts.inference.writer import writer_threads

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert (loader_workers("auto", cpus=16), writer_threads("auto", cpus=16)) == (8, 8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun --nproc_per_node 4: 4 cores each
    assert (loader_workers("auto", cpus=16), writer_threads("auto", cpus=16)) == (2, 2)
    assert (loader_workers(3, cpus=16), writer_threads(5, cpus=16)) == (3, 5)


def test_the_overlay_refuses_to_run_without_torchrun(monkeypatch):
    from scripts.distributed import TORCHRUN_ENV
    from scripts.inference.ranks import InferenceRanks

    for key in TORCHRUN_ENV:
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match="must run under torchrun"):
        InferenceRanks()


# -- torchrun with 2 gloo processes ----------------------------------------------------------------------------------
class FailOnRank:
    """Test probe (added to the handlers by a config file): rank ``rank`` raises once it has run ``after`` batches,
    as a rank whose GPU or disk fails mid-run."""

    def __init__(self, rank: int, after: int = 1) -> None:
        self.rank, self.after = int(rank), int(after)

    def attach(self, engine) -> None:
        from ignite.engine import Events

        engine.add_event_handler(Events.ITERATION_COMPLETED, self)

    def __call__(self, engine) -> None:
        if int(os.environ["RANK"]) == self.rank and engine.state.iteration >= self.after:
            raise RuntimeError(f"probe: rank {self.rank} fails after {self.after} batch(es)")


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    """18 inputs: two patients' DICOM exams, PNGs 3x the tiny window each way (slow enough to be killed while
    running), one PNG named as another in a sub-folder (its stem is made unique over both ranks), a corrupt file;
    the tiny model, and one process's run of them (the reference)."""
    from glam_benchmark.synthetic import make_synthetic_dataset
    from scripts.networks import GLAMSaliencyNet

    root = tmp_path_factory.mktemp("multi_gpu_inference")
    folder = root / "in"
    (folder / "sub").mkdir(parents=True)
    make_synthetic_dataset(root / "dcm", 8, size=(256, 160), seed=2, fmt="dcm", facing="native")
    make_synthetic_dataset(root / "png", 8, size=(768, 480), seed=4, fmt="png")
    for f in sorted((root / "dcm" / "images").iterdir()):
        shutil.copy(f, folder / f.name)
    pngs = sorted((root / "png" / "images").iterdir())
    for f in pngs:
        shutil.copy(f, folder / f"png_{f.name}")
    shutil.copy(pngs[0], folder / "sub" / f"png_{pngs[0].name}")  # the same file name in a sub-folder
    (folder / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a png" * 4)
    torch.manual_seed(0)
    ckpt = root / "model.pt"
    torch.save(GLAMSaliencyNet(stage="joint", **TINY).state_dict(), ckpt)
    reference = root / "reference"
    _run(
        [INFERENCE_CONFIG, TINY_INFERENCE],
        {"input_dir": str(folder), "output_dir": str(reference), "ckpt_path": str(ckpt), **CPU_REFERENCE},
    )
    inputs = sorted(str(p) for p in folder.rglob("*") if p.is_file())
    assert len(inputs) == 18
    return {"root": root, "folder": folder, "ckpt": ckpt, "reference": reference, "inputs": inputs}


def _start(case: dict, out: Path, *extra: str | Path) -> subprocess.Popen:
    """The documented command on 2 gloo processes; ``extra``: config files (paths) layered last, and options."""
    configs = [str(INFERENCE_CONFIG), str(TINY_INFERENCE), str(MULTI_GPU_INFERENCE)]
    configs += [str(e) for e in extra if isinstance(e, Path)]
    args = ["inference", "--config_file", json.dumps(configs), "--meta_file", str(META)]
    args += ["--input_dir", str(case["folder"]), "--output_dir", str(out), "--ckpt_path", str(case["ckpt"])]
    args += [e for e in extra if isinstance(e, str)]
    return torchrun_job.start(args, import_dirs=[Path(__file__).parent])


def _table_rows(path: Path) -> list[dict]:
    """A table's rows; it is valid CSV with this version's header, every row whole, at any moment."""
    from scripts.inference.tables import ERROR_COLUMNS, PREDICTION_COLUMNS

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    columns = PREDICTION_COLUMNS if path.name.startswith("predictions") else ERROR_COLUMNS
    assert data.endswith(b"\n"), f"{path.name} ends inside a row"
    lines = list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))
    assert lines[0] == columns and all(len(line) == len(columns) for line in lines[1:]), path.name
    return [dict(zip(columns, line)) for line in lines[1:]]


def _done(out: Path) -> set[str]:
    """The inputs the folder's predictions tables hold (the folder's and the ranks'), each once per table, every file
    they list complete (as their manifests record them)."""
    from scripts.inference.files import files_are_complete

    done: set[str] = set()
    for path in [out / "predictions.csv", *sorted(out.glob("predictions.rank*.csv"))]:
        rows = _table_rows(path)
        assert len({r["image"] for r in rows}) == len(rows), f"{path.name} lists an input twice"
        for row in rows:
            assert files_are_complete(out, row["output_stem"], row["files"].split(";")), row["image"]
        done |= {r["image"] for r in rows}
    return done


def _wait_for_rows(proc: subprocess.Popen, tables: list[Path], rows: int, besides: set[str] = frozenset()) -> bool:
    """Wait until one of ``tables`` holds ``rows`` rows of inputs not in ``besides``; False when the run ended
    first."""
    while proc.poll() is None:
        for table in tables:
            try:
                lines = table.read_bytes().split(b"\n")[1:-1]  # whole rows
            except FileNotFoundError:
                continue
            if sum(1 for line in lines if line.split(b",", 1)[0].decode() not in besides) >= rows:
                return True
        time.sleep(0.002)
    return False


def _digests(out: Path) -> dict[str, str]:
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in out.rglob("*")
        if p.is_file() and (p.parent != out or p.name in TABLES)
    }


def _assert_as_one_process(case: dict, out: Path) -> None:
    """Every table and file byte for byte as the reference (one process), no rank table or temporary left."""
    assert _digests(out) == _digests(case["reference"])
    assert not list(out.glob("*.rank*.csv"))
    assert not [p for p in out.rglob(".*") if p.is_file()]


@pytest.mark.slow
def test_two_processes_write_what_one_process_writes(case, tmp_path):
    from scripts.inference.ranks import input_share

    out = tmp_path / "out"
    proc = _start(case, out)
    log = torchrun_job.finish(proc)
    assert proc.returncode == 0, log[-4000:]
    _assert_as_one_process(case, out)
    timing = json.loads((out / "timing.json").read_text())
    shares = [input_share(case["inputs"], r, 2) for r in range(2)]
    assert [r["inputs"] for r in timing["ranks"]] == [len(s) for s in shares] == [9, 9]
    assert sum(r["images"] + r["failed"] for r in timing["ranks"]) == 18 == timing["images"] + timing["failed"]
    assert timing["processes"] == 2 and timing["ranks_failed"] == [] and timing["skipped"] == 0
    # the corrupt input was read by the rank whose share holds it, and by it alone
    corrupt = str(case["folder"] / "corrupt.png")
    owner = next(r for r in range(2) if corrupt in shares[r])
    assert [r["failed"] for r in timing["ranks"]] == [int(r == owner) for r in range(2)]
    assert f"[rank {owner}/2] MammogramReadError: {corrupt}" in log
    assert "18 inputs over 2 processes (9 / 9), 0 done already (skipped), 18 to run" in log

    # another run's settings into this folder: rank 0 refuses, every rank stops with its line, nothing is changed
    before = {**_digests(out), "run.json": (out / "run.json").read_bytes()}
    proc = _start(case, out, "--gamma_c", "0.8")
    log = torchrun_job.finish(proc)
    assert proc.returncode != 0
    refusal = "holds the outputs of another run (run.json), which this run would mix with its own: model.gamma_c"
    assert log.count(refusal) >= 2, log[-4000:]  # printed by both ranks
    assert {**_digests(out), "run.json": (out / "run.json").read_bytes()} == before
    assert not list(out.glob("*.rank*.csv"))


@pytest.mark.slow
def test_a_killed_rank_then_a_killed_job_then_the_same_command_or_one_process_finishes_every_input_once(case, tmp_path):
    out = tmp_path / "out"
    # 1. rank 1 killed once it has finished an image: torchrun stops rank 0 too
    proc = _start(case, out)
    assert _wait_for_rows(proc, [out / "predictions.rank1.csv"], 1), torchrun_job.finish(proc)[-4000:]
    os.kill(torchrun_job.workers(proc)[1], signal.SIGKILL)
    log = torchrun_job.finish(proc)
    assert proc.returncode != 0, log[-3000:]
    kept = _done(out)
    assert kept and len(kept) < 18
    assert not _table_rows(out / "predictions.csv")  # nothing merged: the rows wait in the ranks' tables

    # 2. the same command, the whole job killed once a rank has finished an image of this run
    proc = _start(case, out)
    caught = _wait_for_rows(proc, [out / f"predictions.rank{r}.csv" for r in range(2)], 1, besides=kept)
    if proc.poll() is None:
        torchrun_job.kill_job(proc)
    log = torchrun_job.finish(proc)
    assert caught, log[-4000:]
    done = _done(out)
    assert kept < done < set(case["inputs"])  # nothing finished was lost, something new was added
    one_process = tmp_path / "one_process"
    shutil.copytree(out, one_process, symlinks=True)

    # 3. the same command again: resumes, each input once, as one process would have written it
    proc = _start(case, out)
    log = torchrun_job.finish(proc)
    assert proc.returncode == 0, log[-4000:]
    assert f"18 inputs over 2 processes (9 / 9), {len(done)} done already (skipped), {18 - len(done)} to run" in log
    assert "took up the rows of an interrupted run's processes" in log, log
    assert json.loads((out / "timing.json").read_text())["skipped"] == len(done)
    _assert_as_one_process(case, out)

    # or inference.yaml in one process: it takes up the ranks' rows too, and finishes the same way
    overrides = {"input_dir": str(case["folder"]), "output_dir": str(one_process), "ckpt_path": str(case["ckpt"])}
    _run([INFERENCE_CONFIG, TINY_INFERENCE], {**overrides, **CPU_REFERENCE})
    assert json.loads((one_process / "timing.json").read_text())["skipped"] == len(done)
    _assert_as_one_process(case, one_process)


@pytest.mark.slow
def test_a_rank_that_fails_is_named_the_other_finishes_and_the_same_command_completes(case, tmp_path):
    from scripts.inference.ranks import input_share

    probe = tmp_path / "probe.yaml"
    probe.write_text("+handlers:\n  - _target_: test_multi_gpu_inference.FailOnRank\n    rank: 1\n    after: 1\n")
    out = tmp_path / "out"
    proc = _start(case, out, probe)
    log = torchrun_job.finish(proc)
    assert proc.returncode != 0
    shares = [input_share(case["inputs"], r, 2) for r in range(2)]
    predictions = {r["image"] for r in _table_rows(out / "predictions.csv")}
    errors = {r["image"]: r["error"] for r in _table_rows(out / "errors.csv") if r["error"]}
    assert not predictions & set(errors) and predictions | set(errors) == set(case["inputs"])  # each input once
    assert set(shares[0]) <= predictions | {str(case["folder"] / "corrupt.png")}  # rank 0 finished its share
    not_run = sorted(image for image, error in errors.items() if error.startswith("NotRun: rank 1 failed"))
    # rank 1 ran its first batch (2 inputs, in the order of its share) and failed: the rest is not run
    assert set(shares[1][:2]) <= predictions | set(errors) and not_run == shares[1][2:]
    assert "rank 1 (on " in log and "probe: rank 1 fails after 1 batch(es)" in log
    assert f"{len(not_run)} of its 9 inputs not run" in log
    timing = json.loads((out / "timing.json").read_text())
    assert timing["ranks_failed"] == [1] and timing["ranks"][1]["error"].startswith("RuntimeError: probe")
    assert not list(out.glob("*.rank*.csv"))

    proc = _start(case, out)  # without the probe: the inputs not run are run
    log = torchrun_job.finish(proc)
    assert proc.returncode == 0, log[-4000:]
    _assert_as_one_process(case, out)
