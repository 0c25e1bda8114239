"""Evaluation on several processes (bundle/configs/multi_gpu_evaluate.yaml): the real command under torchrun with 2
gloo processes on the CPU against one process's evaluation of the same model and split; the ranks' data check
against one process's; the blocks each rank evaluates; the overlay's steps against evaluate.yaml's.

The torchrun children import this module (this folder and tests/ on their PYTHONPATH) for :class:`BlockProbe`, a
handler a test overlay appends to the evaluation's handlers: each rank records the images it evaluated.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torchrun_job
from conftest import BUNDLE_ROOT, CPU_REFERENCE, TINY_CONFIG, TRAIN_CONFIG
from monai.bundle import ConfigParser, ConfigWorkflow

CONFIGS = BUNDLE_ROOT / "configs"
EVAL_CONFIG = CONFIGS / "evaluate.yaml"
MULTI_GPU_EVAL = CONFIGS / "multi_gpu_evaluate.yaml"
META = CONFIGS / "metadata.json"
CLASSES = ("benign", "malignant")
#: how far a number of the report of several processes may lie from one process's (docs/evaluation.md): each process
#: runs the network on its own images, and the same image's forward pass may round differently in another process
TOLERANCE = 1e-6


# -- the probe the torchrun children attach (runs in the children, not in pytest) --------------------------------
class BlockProbe:
    """Writes the images this rank evaluated, in order, to ``<out_dir>/rank<r>.json`` when the evaluator completes."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.images: list[str] = []

    def attach(self, engine) -> None:
        from ignite.engine import Events

        engine.add_event_handler(Events.ITERATION_COMPLETED, self.iteration)
        engine.add_event_handler(Events.COMPLETED, self.completed)

    def iteration(self, engine) -> None:
        for item in engine.state.batch:  # MONAI's evaluator decollates the batch: one dict per image
            path = item.get("image_path") or item["image"].meta["filename_or_obj"]
            self.images.append(os.path.basename(str(path)))

    def completed(self, engine) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        rank = torch.distributed.get_rank()
        (self.out_dir / f"rank{rank}.json").write_text(json.dumps({"pid": os.getpid(), "images": self.images}))


# -- helpers ------------------------------------------------------------------------------------------------------
def raw(path: Path) -> dict:
    return ConfigParser.load_config_file(str(path))


def target(entry) -> str:
    return entry.get("_target_", "") if isinstance(entry, dict) else entry


@pytest.fixture(scope="module")
def split_setup(tmp_path_factory, tiny_datalist):
    """A test split of 7 images (both classes positive and negative; blocks of 4 and 3): two annotated by boxes
    only, one without patient_id and laterality (a breast of its own); and a randomly initialised tiny GLAM (seed 1:
    image- and breast-level AUCs other than 0.5) as the joint stage's model.pt."""
    from scripts.data import load_datalist
    from scripts.data.datalist import resolve_paths
    from scripts.networks.weights import plain_state_dict, save_atomic

    root = tmp_path_factory.mktemp("multi_gpu_evaluate")
    content = resolve_paths(load_datalist(tiny_datalist), Path(tiny_datalist).parent)
    items = []
    for n, item in enumerate(content["training"][:7]):
        item = dict(item)
        if n in (1, 6):  # boxes only: BoxesToMasksd paints the masks
            assert item["boxes"], n
            del item["mask_benign"], item["mask_malignant"]
        if n == 5:
            del item["patient_id"], item["laterality"]
        items.append(item)
    labels = np.array([it["label"] for it in items])
    assert (labels.sum(0) > 0).all() and (labels.sum(0) < len(items)).all()
    datalist = root / "datalist.json"
    datalist.write_text(json.dumps({"test": items}))
    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(TINY_CONFIG)])
    parser["stage"] = "joint"
    parser["device"] = "$torch.device('cpu')"
    torch.manual_seed(1)
    save_atomic(plain_state_dict(parser.get_parsed_content("network_def")), root / "models" / "joint" / "model.pt")
    return root, datalist, items


# -- the blocks ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_ranks", [1, 2, 3, 4])
def test_blocks_are_contiguous_and_cover_the_split_in_order(n_ranks):
    from scripts.evaluation.ranks import block_bounds

    for n_items in range(n_ranks, 12):
        items = [f"img{i}" for i in range(n_items)]
        blocks = [items[slice(*block_bounds(n_items, n_ranks, r))] for r in range(n_ranks)]
        expected = [list(a) for a in np.array_split(np.array(items), n_ranks)]
        assert blocks == expected, (n_items, n_ranks)
        assert sum(blocks, []) == items  # gathered rank by rank: the split's order


def test_a_rank_without_an_image_is_refused():
    from scripts.evaluation.ranks import block_bounds

    with pytest.raises(ValueError, match=r"2 image\(s\) to evaluate cannot be shared by 3 processes") as err:
        block_bounds(2, 3, 0)
    assert "\n" not in str(err.value) and "--nproc_per_node" in str(err.value)
    assert block_bounds(2) == (0, 2)  # no process group: every image


# -- the overlay against evaluate.yaml ----------------------------------------------------------------------------
def test_overlay_runs_evaluate_yaml_steps_with_the_group_joined_and_the_check_shared():
    """evaluating: evaluate.yaml's steps, in order, with the process group joined (and the datalist made by rank 0
    first) after the command line is checked, and the data check replaced by the shared one; the handlers it
    disables are evaluate.yaml's logging ones, the report stays on every rank."""
    from scripts.training.distributed import RANK_ZERO_ONLY

    single, multi = raw(EVAL_CONFIG), raw(MULTI_GPU_EVAL)
    steps = [target(s) for s in multi["evaluating"]]
    joined = [
        "$scripts.distributed.init_distributed(@dist_backend, @dist_timeout_s, 'multi_gpu_evaluate.yaml', "
        "'evaluating')",
        "$scripts.distributed.quiet_other_ranks(@log_level_other_ranks)",
        "$scripts.distributed.is_rank_zero() or scripts.distributed.barrier()",
        "$@datalist",
        "$scripts.distributed.is_rank_zero() and scripts.distributed.barrier()",
    ]
    expected = [target(s) for s in single["evaluating"]]
    assert expected[1] == (
        "$scripts.data.checks.check_data(@eval_datalist, @eval_pixel_spacing, @check_data, split=@eval_split)"
    )
    # the same arguments, each rank checking its own block
    expected[1] = (
        "$scripts.evaluation.ranks.check_data_on_ranks(@eval_datalist, @eval_split, @eval_pixel_spacing, @check_data)"
    )
    assert steps == joined + expected
    handlers = single["handlers"]
    assert [target(h).rsplit(".", 1)[-1] in RANK_ZERO_ONLY for h in handlers] == [True, True, False]
    assert handlers[2] == "@validate#report"
    assert multi["handlers#0#_disabled_"] == multi["handlers#1#_disabled_"] == "@is_not_rank0"


def test_overlay_outside_torchrun_names_the_command(split_setup, monkeypatch):
    root, datalist, _ = split_setup
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    wf = ConfigWorkflow(
        config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG), str(EVAL_CONFIG), str(MULTI_GPU_EVAL)],
        meta_file=str(META),
        run_id="evaluating",
        datalist=str(datalist),
        ckpt_root=str(root / "models"),
        output_root=str(root / "outside"),
    )
    wf.initialize()
    with pytest.raises(Exception) as err:
        wf.run()
    cause = err.value
    while cause.__cause__ is not None:
        cause = cause.__cause__
    assert str(cause).startswith("multi_gpu_evaluate.yaml must run under torchrun (missing environment variables")
    assert "torchrun --nproc_per_node=N -m monai.bundle run evaluating" in str(cause)
    assert not (root / "outside").exists()


# -- the data check shared by 2 gloo processes ---------------------------------------------------------------------
def _check_worker(rank: int, world_size: int, port: int, datalists: dict, out: str) -> None:
    import torch.distributed as dist

    from scripts.data.checks import DataCheckError
    from scripts.evaluation.ranks import check_data_on_ranks

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        results = {}
        for name, items in datalists.items():
            try:
                report = check_data_on_ranks(items, "test", pixel_spacing=0.2)
                results[name] = {"ok_items": report.ok_items, "spacings": report.spacings, "n": report.n_items}
            except DataCheckError as err:
                results[name] = {"error": str(err)}
        Path(f"{out}.{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_data_check_of_two_ranks_equals_one_process(tmp_path, split_setup):
    """Each rank reads its block's files only; both raise the error one process's check raises (every problem, by
    its index in the whole split, an image listed in both blocks among them), or return its report."""
    import torch.multiprocessing as mp

    from scripts.data.checks import DataCheckError, check_data

    _, _, items = split_setup
    bad = [dict(it) for it in items[:5]]
    bad[1]["label"] = [2, 0]  # rank 0's block (items 0-2)
    bad[2]["image"] = str(tmp_path / "missing.png")  # rank 0
    bad[3]["mask_benign"] = str(tmp_path / "missing_mask.png")  # rank 1 (items 3-4)
    bad[4] = dict(bad[0])  # the same image in both blocks
    datalists = {"good": items, "bad": bad}
    expected = {}
    for name, data in datalists.items():
        try:
            report = check_data(data, pixel_spacing=0.2, split="test")
            expected[name] = {"ok_items": report.ok_items, "spacings": report.spacings, "n": report.n_items}
        except DataCheckError as err:
            expected[name] = {"error": str(err)}
    expected = json.loads(json.dumps(expected))  # tuples as the workers' JSON has them
    assert "error" in expected["bad"] and "error" not in expected["good"]
    for needle in ("test[1] label", "test[2] image", "test[3] mask_benign", "listed 2 times: test[0], test[4]"):
        assert needle in expected["bad"]["error"], needle

    mp.spawn(_check_worker, args=(2, torchrun_job.free_port(), datalists, str(tmp_path / "check")), nprocs=2, join=True)
    for rank in (0, 1):
        assert json.loads((tmp_path / f"check.{rank}.json").read_text()) == expected, rank


# -- the real command under torchrun -------------------------------------------------------------------------------
def _numbers(a, b, where: str) -> list[tuple[str, float, float]]:
    """Every pair of numbers of two JSON values of the same shape (asserted: the same keys, lengths, nulls, strings
    and integers), as (where, a, b)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        return [pair for k in a for pair in _numbers(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        return [pair for i, (x, y) in enumerate(zip(a, b)) for pair in _numbers(x, y, f"{where}[{i}]")]
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), where
        return [(where, float(a), float(b))]
    assert type(a) is type(b) and a == b, (where, a, b)
    return []


def report_numbers(one: Path, other: Path) -> list[tuple[str, float, float]]:
    """The numbers of two evaluation reports (metrics.json; metrics.csv, whose cells must be the same rows, columns,
    empty cells and integers such as labels and hits), pair by pair."""
    pairs = _numbers(*(json.loads((d / "metrics.json").read_text()) for d in (one, other)), "metrics.json")
    tables = []
    for d in (one, other):
        with open(d / "metrics.csv", newline="") as f:
            tables.append(list(csv.reader(f)))
    assert tables[0][0] == tables[1][0] and len(tables[0]) == len(tables[1])
    for n, (row, ref) in enumerate(zip(tables[0][1:], tables[1][1:])):
        for column, x, y in zip(tables[0][0], row, ref):
            if column != "image" and any(c in x + y for c in ".e"):  # a float (Python's repr) on either side
                pairs.append((f"metrics.csv[{n}].{column}", float(x), float(y)))
            else:  # the image, an integer (label, hit), an empty cell: the same text
                assert x == y, (n, column, x, y)
    return pairs


def single_process_evaluation(root: Path, datalist: Path) -> Path:
    """evaluate.yaml in this process, without the overlay, on the whole split, on the CPU as the gloo processes;
    returns the report's folder."""
    wf = ConfigWorkflow(
        config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG), str(EVAL_CONFIG)],
        meta_file=str(META),
        workflow_type="infer",
        datalist=str(datalist),
        ckpt_root=str(root / "models"),
        output_root=str(root / "single"),
        **CPU_REFERENCE,
    )
    wf.initialize()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the torchrun workers (OMP_NUM_THREADS=1)
    try:
        wf.run()
    finally:
        torch.set_num_threads(threads)
    return root / "single" / "evaluate"


@pytest.mark.slow
def test_two_gloo_processes_evaluate_like_one(tmp_path, split_setup):
    """`torchrun --nproc_per_node 2 -m monai.bundle run evaluating` with the overlay: metrics.json and metrics.csv
    those of one process (the same rows in the split's order, images, labels, counts and undefined cells; every
    number within TOLERANCE, the rounding of the network's forward pass in another process); each rank evaluated its
    block once; only rank 0 wrote files (each rank's eval_dir
    is its own folder here), printed the table and, with MLflow installed, made the one MLflow run."""
    root, datalist, items = split_setup
    try:
        import mlflow
    except ImportError:
        mlflow = None
    probe_dir = tmp_path / "probe"
    probe_config = tmp_path / "probe.yaml"
    probe_config.write_text(
        f"+handlers:\n  - _target_: test_multi_gpu_evaluate.BlockProbe\n    out_dir: {json.dumps(str(probe_dir))}\n"
    )
    configs = [str(TRAIN_CONFIG), str(TINY_CONFIG), str(EVAL_CONFIG), str(MULTI_GPU_EVAL), str(probe_config)]
    out = tmp_path / "ddp"
    args = ["evaluating", "--config_file", repr(configs), "--meta_file", str(META), "--datalist", str(datalist)]
    args += ["--ckpt_root", str(root / "models"), "--output_root", str(out)]
    args += ["--eval_dir", f"$os.path.join({str(out)!r}, 'rank' + os.environ['RANK'])"]
    if mlflow is not None:
        args += ["--tracking", "mlflow"]
    start = time.monotonic()
    log = torchrun_job.run(args, tmp_path, import_dirs=[Path(__file__).parent])
    print(f"torchrun evaluation: {time.monotonic() - start:.1f} s")

    # each rank its contiguous block, once (4 and 3 images), in different processes
    probes = {r: json.loads((probe_dir / f"rank{r}.json").read_text()) for r in (0, 1)}
    names = [os.path.basename(it["image"]) for it in items]
    assert probes[0]["images"] == names[:4] and probes[1]["images"] == names[4:]
    assert probes[0]["pid"] != probes[1]["pid"]

    # only rank 0 wrote the report (and the config artifact), and printed the table
    assert not (out / "rank1").exists()
    assert log.count("GLAM evaluation: test split, 7 images") == 1

    # the files of one process: the same rows, images, labels, counts and empty cells; numbers within TOLERANCE
    single = single_process_evaluation(root, datalist)
    pairs = report_numbers(out / "rank0", single)
    differ = [(where, a, b) for where, a, b in pairs if a != b]
    worst = max((abs(a - b) for _, a, b in differ), default=0.0)
    print(f"{len(differ)} of {len(pairs)} numbers differ from one process's, by at most {worst:.3g}: {differ[:20]}")
    assert len(pairs) > 100 and all(math.isfinite(a) for _, a, _ in pairs)
    assert worst <= TOLERANCE, differ
    summary = json.loads((single / "metrics.json").read_text())
    assert summary["n_images"] == 7 and summary["n_breasts"] == 5 and summary["images_without_breast"] == 1
    for c in CLASSES:  # the compared numbers are defined, and not all trivial
        assert summary["classification_auc"][c] is not None and summary["breast_auc"][c] is not None
        assert all(v is not None for v in summary["metrics"]["S_c"][c]["froc"].values())
    assert {summary["classification_auc"][c] for c in CLASSES} != {0.5}

    if mlflow is not None:  # one run, rank 0's, with the metrics of the whole split
        uri = "sqlite:///" + str((out / "mlruns.db").resolve())
        client = mlflow.MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name("monai_experiment").experiment_id])
        assert [r.info.run_name for r in runs] == ["evaluate_joint"] and runs[0].info.status == "FINISHED"
        for name in ("classification_auc", "breast_auc"):
            for c in CLASSES:
                assert runs[0].data.metrics[f"{name}_{c}"] == pytest.approx(summary[name][c], abs=1e-12)
        assert [a.path for a in client.list_artifacts(runs[0].info.run_id)] == ["config.json"]
