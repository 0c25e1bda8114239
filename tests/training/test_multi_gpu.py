"""DistributedDataParallel overlay (bundle/configs/multi_gpu_train.yaml): 2 gloo processes on the CPU under torchrun,
checked against the sampler's split, a single-process evaluation of the written checkpoints, and the rank-0-only
outputs; plus the helpers of scripts.distributed and scripts.training.distributed.

The torchrun children import this module (this folder and tests/ on their PYTHONPATH) for :class:`DDPProbe`, a
handler that a test overlay appends to each stage's trainer: every rank records the images it trained and validated
on, its epoch length, the evaluator's metrics and every checkpoint file it wrote.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest
import torch
import torchrun_job
from conftest import CPU_REFERENCE, TINY_CONFIG, TRAIN_CONFIG, tiny_overrides

MULTI_GPU_CONFIG = TRAIN_CONFIG.parent / "multi_gpu_train.yaml"
META = TRAIN_CONFIG.parent / "metadata.json"
METRICS = ("val_soft_dice", "val_dice_benign", "val_dice_malignant", "val_auc_benign", "val_auc_malignant")


# -- the probe the torchrun children attach (runs in the children, not in pytest) --------------------------------
class DDPProbe:
    """Records, per rank, one JSON line per event into ``<out_dir>/rank<r>.jsonl``: the trained and validated image
    files of every iteration, the trainer's epoch length, the evaluator's metrics, and each checkpoint write (by
    wrapping ``scripts.training.checkpoints.save_atomic``, which StageCheckpointer calls)."""

    current: DDPProbe | None = None  # the running stage's probe (the checkpoint wrapper writes through it)

    def __init__(self, out_dir: str, stage: str, evaluator) -> None:
        self.out_dir = Path(out_dir)
        self.stage = stage
        self.evaluator = evaluator

    def _write(self, **record) -> None:
        rank = torch.distributed.get_rank()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / f"rank{rank}.jsonl", "a") as f:
            f.write(json.dumps({"rank": rank, "pid": os.getpid(), "stage": self.stage, **record}) + "\n")

    def attach(self, trainer) -> None:
        from ignite.engine import Events

        from scripts.training import checkpoints

        DDPProbe.current = self
        if not getattr(checkpoints.save_atomic, "_probed", False):
            original = checkpoints.save_atomic

            def save_atomic(obj, path):
                DDPProbe.current._write(event="save", path=str(path))
                return original(obj, path)

            save_atomic._probed = True
            checkpoints.save_atomic = save_atomic

        def files(engine) -> list[str]:
            # MONAI's engines decollate the batch into one dict per image
            return [os.path.basename(item["image_path"]) for item in engine.state.batch]

        trainer.add_event_handler(
            Events.ITERATION_COMPLETED, lambda e: self._write(event="train", epoch=e.state.epoch, files=files(e))
        )
        trainer.add_event_handler(
            Events.COMPLETED, lambda e: self._write(event="trainer", epoch_length=e.state.epoch_length)
        )
        self.evaluator.add_event_handler(Events.ITERATION_COMPLETED, lambda e: self._write(event="val", files=files(e)))
        self.evaluator.add_event_handler(
            Events.COMPLETED, lambda e: self._write(event="metrics", metrics=dict(e.state.metrics))
        )


# -- helpers of the test ------------------------------------------------------------------------------------------
def odd_validation_datalist(datalist: str, out: Path) -> Path:
    """The tiny datalist with 7 validation images (its validation patient and 3 images of its test patient, no
    test split), paths made absolute: an odd count, so the two ranks validate 4 and 3 images."""
    from scripts.data.datalist import resolve_paths

    data = resolve_paths(json.loads(Path(datalist).read_text()), Path(datalist).resolve().parent)
    out.write_text(json.dumps({"training": data["training"], "validation": data["validation"] + data["test"][:3]}))
    return out


def read_probe(probe_dir: Path) -> dict[int, list[dict]]:
    records: dict[int, list[dict]] = {}
    for path in sorted(probe_dir.glob("rank*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        records[lines[0]["rank"]] = lines
    return records


def single_process_metrics(tmp_path: Path, datalist: Path, stage: str, checkpoint: Path) -> dict[str, float]:
    """train.yaml's validation evaluator, in this process without DDP, on the whole validation list, on the CPU in
    float32 as the gloo processes."""
    from monai.bundle import ConfigWorkflow

    wf = ConfigWorkflow(
        config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG)],
        meta_file=str(META),
        workflow_type="train",
        **tiny_overrides(tmp_path / f"single_{stage}", str(datalist), stage=stage),
        **CPU_REFERENCE,
        channels_last=False,
    )
    wf.initialize()
    network = wf.parser.get_parsed_content("network")
    assert not isinstance(network, torch.nn.parallel.DistributedDataParallel)
    network.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True), strict=True)
    evaluator = wf.parser.get_parsed_content("validate#evaluator")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the torchrun workers (OMP_NUM_THREADS=1); more only oversubscribes 2 shared cores
    try:
        evaluator.run()
    finally:
        torch.set_num_threads(threads)
    return dict(evaluator.state.metrics)


# -- the 2-process run ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_gloo_processes_train_all_stages_like_one(tmp_path, tiny_datalist):
    datalist = odd_validation_datalist(tiny_datalist, tmp_path / "datalist.json")
    probe_dir = tmp_path / "probe"
    probe_config = tmp_path / "probe.yaml"
    probe_config.write_text(
        "+train#handlers:\n"
        "  - _target_: test_multi_gpu.DDPProbe\n"
        f"    out_dir: {json.dumps(str(probe_dir))}\n"
        '    stage: "@stage"\n'
        '    evaluator: "@validate#evaluator"\n'
    )
    configs = [str(TRAIN_CONFIG), str(TINY_CONFIG), str(MULTI_GPU_CONFIG), str(probe_config)]
    overrides = tiny_overrides(tmp_path, str(datalist), stage="all")
    args = ["training", "--config_file", repr(configs), "--meta_file", str(META)]
    for key, value in overrides.items():
        args += [f"--{key}", value]
    start = time.monotonic()
    torchrun_job.run(args, tmp_path, import_dirs=[Path(__file__).parent])
    print(f"torchrun run: {time.monotonic() - start:.1f} s")

    records = read_probe(probe_dir)
    assert sorted(records) == [0, 1]
    train_items = json.loads(datalist.read_text())["training"]
    val_files = [os.path.basename(v["image"]) for v in json.loads(datalist.read_text())["validation"]]
    positives = [os.path.basename(v["image"]) for v in train_items if any(v["label"])]
    negatives = [os.path.basename(v["image"]) for v in train_items if not any(v["label"])]
    epoch_size = len(positives) + min(len(negatives), len(positives))  # the paper's balancing
    per_rank = math.ceil(epoch_size / 2)
    batch_size = 2  # tiny.yaml, per process
    stages = ("global", "local", "joint")

    for stage in stages:
        seen = {}
        for r in (0, 1):
            seen[r] = [
                f for rec in records[r] if rec["stage"] == stage and rec["event"] == "train" for f in rec["files"]
            ]
            assert len(seen[r]) == per_rank, (stage, r)
            lengths = [rec["epoch_length"] for rec in records[r] if rec["stage"] == stage and rec["event"] == "trainer"]
            assert lengths == [math.ceil(per_rank / batch_size)], (stage, r)
        # disjoint halves of the epoch; together every positive and the balanced number of negatives
        padding = 2 * per_rank - epoch_size
        assert len(set(seen[0]) & set(seen[1])) == padding
        union = set(seen[0]) | set(seen[1])
        assert set(positives) <= union and len(union - set(positives)) == epoch_size - len(positives)
        # validation: each image once, 4 + 3 over the ranks
        val = {
            r: [f for rec in records[r] if rec["stage"] == stage and rec["event"] == "val" for f in rec["files"]]
            for r in (0, 1)
        }
        assert sorted(val[0] + val[1]) == sorted(val_files) and (len(val[0]), len(val[1])) == (4, 3)

        # checkpoints: written by rank 0 only, model.pt once (1 epoch), last.pt once
        ckpt_dir = tmp_path / "models" / stage
        saves = {
            r: [rec["path"] for rec in records[r] if rec["stage"] == stage and rec["event"] == "save"] for r in (0, 1)
        }
        assert sorted(saves[0]) == sorted([str(ckpt_dir / "last.pt"), str(ckpt_dir / "model.pt")]), saves
        assert saves[1] == []
        assert sorted(p.name for p in ckpt_dir.iterdir()) == [
            "last.pt",
            "model.pt",
            "selection.json",
        ]  # no temporary file left
        last = torch.load(ckpt_dir / "last.pt", weights_only=True)
        assert last["trainer"]["epoch_length"] == math.ceil(per_rank / batch_size)
        assert not any(k.startswith("module.") for k in last["network"])

        # metrics: gathered (both ranks agree) and equal to one process on the whole validation list
        metrics = {
            r: [rec["metrics"] for rec in records[r] if rec["stage"] == stage and rec["event"] == "metrics"]
            for r in (0, 1)
        }
        assert len(metrics[0]) == 1 and metrics[0] == metrics[1]
        reference = single_process_metrics(tmp_path, datalist, stage, ckpt_dir / "model.pt")
        for name in METRICS:
            assert math.isclose(metrics[0][0][name], reference[name], rel_tol=1e-5, abs_tol=1e-6), (
                stage,
                name,
                metrics[0][0][name],
                reference[name],
            )

    # TensorBoard: event files in every stage's folder, all from rank 0's process
    pids = {r: {rec["pid"] for rec in records[r]} for r in (0, 1)}
    assert len(pids[0]) == len(pids[1]) == 1 and pids[0] != pids[1]
    for stage in stages:
        events = list((tmp_path / "eval" / stage).glob("events.out.tfevents.*"))
        assert events, stage
        assert {int(p.name.split(".")[-2]) for p in events} == pids[0], [p.name for p in events]


# -- helpers, in this process -------------------------------------------------------------------------------------
def test_rank_share_is_monai_distributed_sampler_split_without_padding():
    from monai.data import DistributedSampler

    from scripts.training.distributed import rank_share

    items = [f"image{i}" for i in range(7)]
    shares = [rank_share(items, num_replicas=3, rank_=r) for r in range(3)]
    assert shares == [["image0", "image3", "image6"], ["image1", "image4"], ["image2", "image5"]]
    for r, share in enumerate(shares):
        sampler = DistributedSampler(items, even_divisible=False, shuffle=False, num_replicas=3, rank=r)
        assert share == [items[i] for i in sampler]
    assert rank_share(items) == items  # no process group: everything
    with pytest.raises(ValueError, match="2 item.*3 processes"):
        rank_share(items[:2], num_replicas=3, rank_=0)
    with pytest.raises(ValueError, match="rank must be in"):
        rank_share(items, num_replicas=2, rank_=2)


def test_balanced_sampler_splits_each_epoch_into_disjoint_equal_shares():
    from scripts.training.sampler import BalancedEpochSampler

    flags = [True] * 5 + [False] * 9  # epoch: 5 positives + 5 negatives
    whole = BalancedEpochSampler(flags, seed=4, num_replicas=1, rank=0)
    for replicas in (2, 3):
        shares = [BalancedEpochSampler(flags, seed=4, num_replicas=replicas, rank=r) for r in range(replicas)]
        for epoch in (0, 1):
            whole.set_epoch(epoch)
            for s in shares:
                s.set_epoch(epoch)
            lists = [list(s) for s in shares]
            expected = math.ceil(10 / replicas)
            assert all(len(x) == len(s) == expected for x, s in zip(lists, shares))
            merged = [i for x in lists for i in x]
            assert set(merged) == set(whole)  # the same epoch as one process
            assert len(merged) - len(set(merged)) == replicas * expected - 10  # only the padding repeats


def test_disable_on_other_ranks_keeps_what_every_rank_needs():
    from monai.bundle import ConfigParser

    from scripts.training.distributed import RANK_ZERO_ONLY, disable_on_other_ranks

    config = ConfigParser.load_config_files([str(TRAIN_CONFIG)])
    assert disable_on_other_ranks(config, rank_=0) == []
    disabled = disable_on_other_ranks(config, rank_=1)

    def names(entries, disabled: bool) -> set[str]:
        return {
            e["_target_"].rsplit(".", 1)[-1]
            for e in entries
            if isinstance(e, dict) and bool(e.get("_disabled_", False)) == disabled
        }

    train, val = config["train"]["handlers"], config["validate"]["base_handlers"]
    needed_everywhere = {"EpochSeeder", "LrScheduleHandler", "ValidationHandler", "StageCheckpointer"}
    assert needed_everywhere <= names(train, disabled=False)
    assert {"StatsHandler", "TensorBoardStatsHandler", "ProgressBar"} <= names(train, disabled=True)
    assert {"StatsHandler", "TensorBoardStatsHandler", "SaliencyPanelWriter"} <= names(val, disabled=True)
    assert names(train, True) | names(val, True) <= set(RANK_ZERO_ONLY)
    assert "@train#best_metric" in val  # the checkpointed best-metric record stays on every rank
    off = [f"train#handlers#{i}" for i, e in enumerate(train) if isinstance(e, dict) and e.get("_disabled_")]
    off += [f"validate#base_handlers#{i}" for i, e in enumerate(val) if isinstance(e, dict) and e.get("_disabled_")]
    assert sorted(disabled) == sorted(off)


@pytest.fixture
def torchrun_env(monkeypatch):
    """The environment torchrun gives a 1-process group on 127.0.0.1; the group is left again afterwards."""
    from scripts.distributed import destroy_distributed

    env = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(torchrun_job.free_port()),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield env
    destroy_distributed()


def test_init_distributed_needs_torchrun(monkeypatch):
    from scripts.distributed import init_distributed

    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match="torchrun.*RANK"):
        init_distributed()


def test_init_distributed_is_idempotent(torchrun_env):
    import torch.distributed as dist

    from scripts.distributed import destroy_distributed, init_distributed

    assert not dist.is_initialized()
    device = init_distributed(backend="gloo")
    group = dist.group.WORLD
    assert init_distributed(backend="gloo") == device and dist.group.WORLD is group  # joined once
    assert dist.get_backend() == "gloo" and dist.get_world_size() == 1
    destroy_distributed()
    assert not dist.is_initialized()
    destroy_distributed()  # a no-op without a group


def test_overlay_passes_monai_train_properties(tmp_path, tiny_datalist, torchrun_env):
    from monai.bundle import ConfigWorkflow

    from scripts.distributed import init_distributed

    wf = ConfigWorkflow(
        config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG), str(MULTI_GPU_CONFIG)],
        meta_file=str(META),
        workflow_type="train",
        **tiny_overrides(tmp_path, tiny_datalist, stage="global"),
    )
    wf.initialize()  # a plain ConfigWorkflow joins no group: GLAMWorkflow.initialize does
    assert wf.parser.get_parsed_content("distributed") is True
    init_distributed(backend="gloo")  # what GLAMWorkflow does first; checking the properties builds the DDP net
    assert wf.check_properties() == []
    assert isinstance(wf.parser.get_parsed_content("network"), torch.nn.parallel.DistributedDataParallel)


def test_rank_zero_first_evaluates_once_and_reuses_the_value(tmp_path):
    from monai.bundle import ConfigParser

    from scripts.training.distributed import rank_zero_first

    marker = tmp_path / "made.txt"
    parser = ConfigParser({"made": f"$open({str(marker)!r}, 'a').write('x')"})
    rank_zero_first(parser, ["made"])  # no process group: this process is rank 0
    assert parser.get_parsed_content("made") == 1 and marker.read_text() == "x"  # evaluated once, value kept


def _rank_zero_first_worker(rank: int, port: int, local_ranks: list[int], log: str) -> None:
    """One torchrun-like process: joins a gloo group through init_distributed, logs its turn, leaves."""
    import time

    from monai.bundle import ConfigParser

    from scripts.distributed import destroy_distributed, init_distributed
    from scripts.training.distributed import rank_zero_first

    env = {"RANK": str(rank), "LOCAL_RANK": str(local_ranks[rank]), "WORLD_SIZE": str(len(local_ranks))}
    os.environ.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    init_distributed(backend="gloo")
    # the later ranks would write first without the turns: rank r sleeps less the higher r is
    parser = ConfigParser(
        {
            "turn": f"$__import__('time').sleep({0.2 * (len(local_ranks) - rank)}) or "
            f"open({log!r}, 'a').write('{rank}\\n')"
        }
    )
    rank_zero_first(parser, ["turn"])
    time.sleep(0.01)
    destroy_distributed()


@pytest.mark.slow
def test_rank_zero_first_takes_global_rank_zero_then_each_nodes_first_process_then_the_rest(tmp_path, monkeypatch):
    """Three gloo processes posing as two nodes (local ranks 0, 1 and 0): rank 0 writes first, then rank 2 (the
    second node's first process), then rank 1, although the later ranks would be quicker (about a minute on 2 CPU
    cores: every process imports MONAI)."""
    import torch.multiprocessing as mp

    log = tmp_path / "turns.txt"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # gloo processes on the CPU: local rank 1 needs no second GPU
    mp.spawn(_rank_zero_first_worker, args=(torchrun_job.free_port(), [0, 1, 0], str(log)), nprocs=3, join=True)
    assert [int(line) for line in log.read_text().split()] == [0, 2, 1]
