"""Evaluation workflow (bundle/configs/evaluate.yaml + scripts.evaluation.report.MetricsReport) on tiny synthetic data.

An untrained tiny GLAM is saved as the joint and global stages' ``model.pt``; the workflow evaluates it on a split
of 8 images with both classes present and absent. A probe handler on the same evaluator records the maps,
masks and scores the report saw, and the report's files are checked against independent numpy computations:
soft Dice and wsolevaluation PxAP per image, their means and population stds, the PxAP of histograms pooled over
the lesion images, and a rank-based (Mann-Whitney) ROC AUC.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import BUNDLE_ROOT, TINY_CONFIG, TRAIN_CONFIG
from ignite.engine import Engine, Events
from monai.bundle import ConfigParser, ConfigWorkflow
from references import loop_pointing

EVAL_CONFIG = BUNDLE_ROOT / "configs" / "evaluate.yaml"
QUICKSTART = BUNDLE_ROOT.parent / "configs" / "quickstart.yaml"
META = str(BUNDLE_ROOT / "configs" / "metadata.json")
CLASSES = ("benign", "malignant")
MAPS = ("S_g", "S_l", "S_c")
EDGES = np.append(np.arange(0, 1, 0.001), [1.0, 2.0, 3.0])
TOLERANCE, BORDER = 6.0, 4.0  # pointing game: px between the peak and the lesion; px from the edge


# -- independent numpy references ------------------------------------------------------------------------------
def np_soft_dice(s: np.ndarray, g: np.ndarray) -> float:
    s, g = s.astype(np.float64), g.astype(np.float64)
    return float(2 * (s * g).sum() / ((s * s).sum() + (g * g).sum()))


def np_histograms(s: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = s.astype(np.float64)
    pos = np.histogram(s[g == 1], bins=EDGES)[0]
    neg = np.histogram(s[g == 0], bins=EDGES)[0]
    return pos, neg


def np_ap(pos: np.ndarray, neg: np.ndarray) -> float:
    """wsolevaluation's PxAP: tp/fp from the top threshold down, AP over thresholds with a positive prediction."""
    tp = np.cumsum(pos[::-1]).astype(np.float64)
    fp = np.cumsum(neg[::-1]).astype(np.float64)
    keep = (tp + fp) > 0
    precision = np.divide(tp, tp + fp, out=np.zeros_like(tp), where=keep)
    recall = tp / tp[-1]
    return float(sum(precision[i] * (recall[i] - recall[i - 1]) for i in range(1, len(tp)) if keep[i]))


def np_rank_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney U / (n_pos n_neg) with average ranks for ties."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    n_pos, n_neg = int(labels.sum()), int((1 - labels).sum())
    return float((ranks[labels == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


# -- fixtures ------------------------------------------------------------------------------------------------------
def eval_workflow(root: Path, datalist: Path, **overrides) -> ConfigWorkflow:
    return ConfigWorkflow(
        config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG), str(EVAL_CONFIG)],
        meta_file=META,
        workflow_type="infer",
        datalist=str(datalist),
        ckpt_root=str(root / "models"),
        output_root=str(root / "out"),
        pointing_tolerance=TOLERANCE,
        peak_border=BORDER,
        **overrides,
    )


class Probe:
    """Records, per evaluated image, what the report handler was given (a copy on the CPU)."""

    def __init__(self) -> None:
        self.items: list[dict] = []

    def __call__(self, engine) -> None:
        for out in engine.state.output:
            item = {k: out[k].detach().cpu().double().numpy() for k in (*MAPS, "lesion_mask", "y_global") if k in out}
            item["label"] = out["label"].cpu().numpy()
            self.items.append(item)


def run_evaluation(root: Path, datalist: Path, **overrides) -> tuple[dict, list[dict], Probe, str]:
    wf = eval_workflow(root, datalist, **overrides)
    wf.initialize()
    probe = Probe()
    wf.parser.get_parsed_content("validate#evaluator").add_event_handler(Events.ITERATION_COMPLETED, probe)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        result = wf.run()
    summary = result[-1]
    eval_dir = Path(overrides.get("eval_dir", root / "out" / "evaluate"))
    assert json.loads((eval_dir / "metrics.json").read_text()) == json.loads(json.dumps(summary))
    with open(eval_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return summary, rows, probe, stdout.getvalue()


@pytest.fixture(scope="module")
def eval_setup(tmp_path_factory, tiny_datalist):
    """A datalist whose 'test' split mixes labels of both classes, and an untrained tiny GLAM as joint/global."""
    from scripts.data import load_datalist
    from scripts.data.datalist import resolve_paths
    from scripts.networks.weights import plain_state_dict, save_atomic

    root = tmp_path_factory.mktemp("evaluate")
    content = resolve_paths(load_datalist(tiny_datalist), Path(tiny_datalist).parent)
    datalist = root / "datalist.json"
    datalist.write_text(json.dumps({"validation": content["validation"], "test": content["training"][:8]}))
    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(TINY_CONFIG)])
    parser["stage"] = "joint"
    parser["device"] = "$torch.device('cpu')"
    torch.manual_seed(0)
    state = plain_state_dict(parser.get_parsed_content("network_def"))
    for stage in ("joint", "global"):
        save_atomic(state, root / "models" / stage / "model.pt")
    return root, datalist, content


@pytest.fixture(scope="module")
def joint_report(eval_setup):
    root, datalist, content = eval_setup
    summary, rows, probe, stdout = run_evaluation(root, datalist)
    return summary, rows, probe, stdout, content["training"][:8]


# -- tests -----------------------------------------------------------------------------------------------------------
def test_report_files_have_one_row_per_image_and_the_columns(joint_report, eval_setup):
    summary, rows, probe, _, items = joint_report
    expected = ["image", "label_benign", "label_malignant", "y_global_benign", "y_global_malignant"]
    for m in MAPS:
        expected += [f"{m}_dice_benign", f"{m}_dice_malignant", f"{m}_pxap_benign", f"{m}_pxap_malignant"]
        expected += [f"{m}_hit_benign", f"{m}_hit_malignant"]
    assert list(rows[0]) == expected
    assert len(rows) == len(items) == len(probe.items) == summary["n_images"] == 8
    assert [r["image"] for r in rows] == [it["image"] for it in items]
    assert [[int(r["label_benign"]), int(r["label_malignant"])] for r in rows] == [it["label"] for it in items]
    assert summary["maps"] == list(MAPS) and summary["classes"] == list(CLASSES)
    assert summary["split"] == "test" and summary["stage"] == "joint"
    assert summary["checkpoint"] == str(eval_setup[0] / "models" / "joint" / "model.pt")


def test_per_image_values_equal_numpy(joint_report):
    _, rows, probe, _, _ = joint_report
    for row, item in zip(rows, probe.items):
        assert [float(row[f"y_global_{c}"]) for c in CLASSES] == pytest.approx(item["y_global"].tolist(), abs=1e-7)
        for ci, c in enumerate(CLASSES):
            mask = item["lesion_mask"][ci]
            for m in MAPS:
                if mask.sum() == 0:  # undefined for an image without that lesion: empty cell
                    assert row[f"{m}_dice_{c}"] == row[f"{m}_pxap_{c}"] == row[f"{m}_hit_{c}"] == ""
                    continue
                hit = loop_pointing(item[m][None], item["lesion_mask"][None], TOLERANCE, 0, "hit")[0, ci]
                assert row[f"{m}_hit_{c}"] == str(int(hit))
                pos, neg = np_histograms(item[m][ci], mask)
                assert float(row[f"{m}_dice_{c}"]) == pytest.approx(np_soft_dice(item[m][ci], mask), rel=1e-5)
                assert float(row[f"{m}_pxap_{c}"]) == pytest.approx(np_ap(pos, neg), rel=1e-9, abs=1e-12)


def test_summary_equals_numpy_from_the_csv(joint_report):
    summary, rows, probe, _, _ = joint_report

    def column(name: str) -> np.ndarray:
        return np.array([float(r[name]) if r[name] != "" else np.nan for r in rows])

    for ci, c in enumerate(CLASSES):
        n_lesion = sum(item["lesion_mask"][ci].sum() > 0 for item in probe.items)
        assert summary["n_lesion_images"][c] == n_lesion
        assert summary["n_positive_labels"][c] == int(column(f"label_{c}").sum())
        for m in MAPS:
            stats = summary["metrics"][m][c]
            dice, pxap = column(f"{m}_dice_{c}"), column(f"{m}_pxap_{c}")
            assert np.count_nonzero(~np.isnan(dice)) == n_lesion
            assert stats["dice_mean"] == pytest.approx(np.nanmean(dice), rel=1e-9)
            assert stats["dice_std"] == pytest.approx(np.nanstd(dice), rel=1e-7, abs=1e-12)
            assert stats["pxap_image_mean"] == pytest.approx(np.nanmean(pxap), rel=1e-9)
            assert stats["pxap_image_std"] == pytest.approx(np.nanstd(pxap), rel=1e-7, abs=1e-12)
            assert stats["pointing_game"] == pytest.approx(np.nanmean(column(f"{m}_hit_{c}")), rel=1e-12)
            borders = [
                loop_pointing(item[m][None], item["lesion_mask"][None], 0, BORDER, "border")[0, ci]
                for item in probe.items
                if item["lesion_mask"][ci].sum() > 0
            ]
            assert stats["peak_on_border"] == pytest.approx(np.mean(borders), rel=1e-12)
        labels = column(f"label_{c}")
        assert 0 < labels.sum() < len(labels), "the test split must hold positives and negatives of each class"
        assert summary["classification_auc"][c] == pytest.approx(np_rank_auc(column(f"y_global_{c}"), labels))


def test_dataset_level_pxap_equals_numpy_pooled_histograms(joint_report):
    summary, _, probe, _, _ = joint_report
    for ci, c in enumerate(CLASSES):
        for m in MAPS:
            pos = np.zeros(len(EDGES) - 1, np.int64)
            neg = np.zeros(len(EDGES) - 1, np.int64)
            for item in probe.items:
                mask = item["lesion_mask"][ci]
                if mask.sum() > 0:  # only the images with a lesion of the class
                    p, n = np_histograms(item[m][ci], mask)
                    pos, neg = pos + p, neg + n
            assert summary["metrics"][m][c]["pxap_dataset"] == pytest.approx(np_ap(pos, neg), rel=1e-9)


def test_printed_table_holds_every_number(joint_report):
    summary, _, _, stdout, _ = joint_report
    lines = stdout.splitlines()
    assert any("Dice" in ln and "image-level PxAP" in ln and "dataset-level PxAP" in ln for ln in lines)
    for m in MAPS:
        row = next(ln for ln in lines if ln.startswith(m + " "))
        for c in CLASSES:
            s = summary["metrics"][m][c]
            assert f"{s['dice_mean']:.3f} +/- {s['dice_std']:.3f}" in row
            assert f"{s['pxap_image_mean']:.3f} +/- {s['pxap_image_std']:.3f}" in row
            assert f"{s['pxap_dataset']:.3f}" in row
            assert f"{summary['classification_auc'][c]:.3f}" in row
    counts = f"malignant {summary['n_lesion_images']['malignant']}, benign {summary['n_lesion_images']['benign']}"
    assert counts in stdout


def test_global_checkpoint_reports_s_g_only(eval_setup):
    root, datalist, content = eval_setup
    eval_dir = root / "global_eval"
    summary, rows, probe, stdout = run_evaluation(
        root, datalist, stage="global", eval_split="validation", eval_dir=str(eval_dir)
    )
    assert summary["maps"] == ["S_g"] and list(summary["metrics"]) == ["S_g"]
    assert summary["checkpoint"] == str(root / "models" / "global" / "model.pt")
    assert [c for c in rows[0] if c.startswith("S_")] == [
        f"S_g_{stat}_{c}" for stat in ("dice", "pxap", "hit") for c in ("benign", "malignant")
    ]
    assert [r["image"] for r in rows] == [it["image"] for it in content["validation"]]
    assert all(set(item) == {"S_g", "lesion_mask", "y_global", "label"} for item in probe.items)
    # the validation split's labels: AUC is undefined (null, "n/a") for a class that is all 0 or all 1
    for ci, c in enumerate(CLASSES):
        labels = [it["label"][ci] for it in content["validation"]]
        if len(set(labels)) == 1:
            assert summary["classification_auc"][c] is None
    assert any(line.startswith("S_g ") for line in stdout.splitlines())
    assert not any(line.startswith(("S_l ", "S_c ")) for line in stdout.splitlines())


def _root_cause(err: BaseException) -> BaseException:
    while err.__cause__ is not None:  # MONAI wraps errors of config expressions
        err = err.__cause__
    return err


def test_missing_checkpoint_names_the_path(eval_setup, tmp_path):
    root, datalist, _ = eval_setup
    missing = tmp_path / "nowhere" / "model.pt"
    wf = eval_workflow(root, datalist, ckpt_path=str(missing), eval_dir=str(tmp_path / "out"))
    wf.initialize()
    with pytest.raises(RuntimeError) as err:
        wf.run()
    cause = _root_cause(err.value)
    assert isinstance(cause, FileNotFoundError) and str(missing) in str(cause)
    assert not (tmp_path / "out").exists()


def test_bad_split_is_named_and_properties_pass(eval_setup):
    root, datalist, _ = eval_setup
    wf = eval_workflow(root, datalist)
    wf.initialize()
    assert wf.check_properties() == []
    wf = eval_workflow(root, datalist, eval_split="training")
    wf.initialize()
    with pytest.raises(RuntimeError) as err:
        wf.parser.get_parsed_content("eval_datalist")
    cause = _root_cause(err.value)
    assert isinstance(cause, ValueError) and "eval_split" in str(cause) and "'training'" in str(cause)


def test_quickstart_layering_keeps_the_preset(tmp_path):
    """evaluate.yaml after configs/quickstart.yaml: the preset's folders stay, the model's settings come from the
    checkpoint (the sentinel ``checkpoint``), the stage is joint."""
    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(BUNDLE_ROOT.parent / "configs" / "quickstart.yaml"), str(EVAL_CONFIG)])
    quick = ConfigParser()
    quick.read_config([str(TRAIN_CONFIG), str(BUNDLE_ROOT.parent / "configs" / "quickstart.yaml")])
    for key in ("ckpt_root", "output_root", "num_workers", "datalist"):
        assert parser[key] == quick[key], key
    for key in ("image_size", "patch_size", "local_width"):
        assert quick[key] != "checkpoint" and parser[key] == "checkpoint", key
    assert parser.get_parsed_content("ckpt_path") == str(Path(quick["ckpt_root"]) / "joint" / "model.pt")
    assert parser.get_parsed_content("eval_dir") == str(Path(quick["output_root"]) / "evaluate")


def _quickstart_parser(stage: str, **overrides) -> ConfigParser:
    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(QUICKSTART)])
    parser["stage"] = stage
    parser["ckpt_root"] = "ckpts"
    for key, value in overrides.items():
        parser[key] = value
    return parser


def test_quickstart_global_stage_starts_from_the_shipped_global_module():
    """The quick start's global stage takes the shipped model's global module (strictly: the architectures match) and
    nothing else; the later stages start from the stage before; `--quickstart_global_init None` trains from scratch."""
    from scripts.networks.settings import read_checkpoint_settings

    shipped = BUNDLE_ROOT / "models" / "model.pt"
    chain = {
        stage: (
            _quickstart_parser(stage).get_parsed_content("previous_model"),
            _quickstart_parser(stage).get_parsed_content("previous_modules"),
        )
        for stage in ("global", "local", "joint")
    }
    assert chain == {
        "global": (str(Path("bundle") / "models" / "model.pt"), ["global_network"]),
        "local": (str(Path("ckpts") / "global" / "model.pt"), None),
        "joint": (str(Path("ckpts") / "local" / "model.pt"), None),
    }
    scratch = _quickstart_parser("global", quickstart_global_init=None)
    assert scratch.get_parsed_content("previous_model") is None
    assert scratch.get_parsed_content("previous_modules") is None

    parser = _quickstart_parser("global", device="cpu")
    network = parser.get_parsed_content("network_def")
    state = torch.load(shipped, map_location="cpu", weights_only=True)
    prefix = "global_network."
    own = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    network.global_network.load_state_dict(own, strict=True)  # raises on any missing, extra or reshaped weight
    record = read_checkpoint_settings(shipped)
    for key in ("image_size", "t_global", "pool_in_breast", "global_backbone", "pixel_spacing"):
        preset = parser.get_parsed_content(key)
        preset = [preset, preset] if key == "pixel_spacing" and not isinstance(preset, list) else preset
        assert record[key] == preset, key


def test_quickstart_local_stage_has_its_own_sparsity():
    """The local stage's lambda is its own (1e-3, the CPU benchmark's), the global and joint stages keep 1e-5; every
    stage runs at its own learning rate and epoch count."""
    parser = _quickstart_parser("local")
    assert parser.get_parsed_content("lambda_sparsity") == {"global": 1.0e-5, "local": 1.0e-3, "joint": 1.0e-5}
    stage_values = {
        stage: (
            _quickstart_parser(stage).get_parsed_content("stage_learning_rate"),
            _quickstart_parser(stage).get_parsed_content("max_epochs"),
        )
        for stage in ("global", "local", "joint")
    }
    assert stage_values == {"global": (1.0e-4, 2), "local": (5.0e-5, 2), "joint": (1.0e-5, 1)}


# -- DDP: the report gathers through the metrics; only rank 0 writes ----------------------------------------------
def _synthetic_outputs(n: int, seed: int = 0) -> list[dict]:
    """Decollated GLAMOutputsd-like items: S_g/S_c maps, masks (some classes empty), y_global, label, image meta."""
    from monai.data import MetaTensor

    g = torch.Generator().manual_seed(seed)
    items = []
    for i in range(n):
        mask = torch.zeros(2, 12, 10)
        for c in range(2):
            if (i + c) % 3:  # every class is absent from some images
                r, k = int(torch.randint(0, 8, (1,), generator=g)), int(torch.randint(0, 6, (1,), generator=g))
                mask[c, r : r + 4, k : k + 4] = 1
        label = (mask.flatten(1).amax(1) > 0).float()
        if i == 5:
            label[1] = 1.0 - label[1]  # a label that disagrees with the mask: classification ignores masks
        items.append(
            {
                "image": MetaTensor(torch.zeros(1, 12, 10), meta={"filename_or_obj": f"/data/img{i:02d}.png"}),
                "S_g": torch.rand(2, 12, 10, generator=g),
                "S_c": torch.rand(2, 12, 10, generator=g),
                "lesion_mask": mask,
                "y_global": torch.rand(2, generator=g),
                "label": label,
            }
        )
    return items


def _report_files(batches: list[list[dict]], out_dir: str) -> None:
    from scripts.evaluation.report import MetricsReport

    engine = Engine(lambda e, batch: batch)
    MetricsReport(out_dir, info={"split": "test"}, print_table=False).attach(engine)
    engine.run(batches)


def _report_ddp_worker(rank: int, world_size: int, port: int, shards: list, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        _report_files(shards[rank], f"{out_dir}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_report_under_two_gloo_processes_equals_one_process(tmp_path):
    import socket

    import torch.multiprocessing as mp

    items = _synthetic_outputs(7)
    # uneven shards (4 and 3 images, batches of different sizes), rank order = the single run's order
    shards = [[items[0:3], items[3:4]], [items[4:7]]]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_report_ddp_worker, args=(2, port, shards, str(tmp_path / "ddp")), nprocs=2, join=True)
    _report_files([items[0:3], items[3:7]], str(tmp_path / "single"))
    assert not (tmp_path / "ddp.1").exists()  # only rank 0 writes
    for name in ("metrics.json", "metrics.csv"):
        assert (tmp_path / "ddp.0" / name).read_text() == (tmp_path / "single" / name).read_text()
    summary = json.loads((tmp_path / "single" / "metrics.json").read_text())
    assert summary["n_images"] == 7 and summary["maps"] == ["S_g", "S_c"]


def test_report_reads_the_validation_handlers_details_and_a_rerun_attaches_afresh(tmp_path):
    """The report's per-image values are the metric handlers' ``engine.state.metric_details`` (the validation's
    path, what MetricsSaver reads); a second run of the engine detaches the first run's handlers."""
    from scripts.evaluation.report import MetricsReport
    from scripts.handlers import PointingGame, PxAP, SoftDice

    items = _synthetic_outputs(5)
    engine = Engine(lambda e, batch: batch)
    report = MetricsReport(tmp_path, print_table=False)
    report.attach(engine)
    engine.run([items[0:2], items[2:5]])
    kinds = {"dice": SoftDice, "pxap": PxAP, "hit": PointingGame, "border": PointingGame}
    for m in ("S_g", "S_c"):
        for suffix, kind in kinds.items():
            assert isinstance(report.metrics.handlers[m][suffix], kind)
            assert engine.state.metric_details[f"{m}_{suffix}"].shape == (5, 2)
            assert f"{m}_{suffix}" in engine.state.metrics
        dice = engine.state.metric_details[f"{m}_dice"]
        for row, values in zip(report.rows, dice.tolist()):
            assert [row[f"{m}_dice_{c}"] for c in CLASSES] == ["" if np.isnan(v) else repr(v) for v in values]
    first = (tmp_path / "metrics.csv").read_text()
    old = [h for handlers in report.metrics.handlers.values() for h in handlers.values()]
    engine.run([items[0:2], items[2:5]])
    assert not any(h.is_attached(engine) for h in old)  # else every run would add a set of handlers
    assert all(h.is_attached(engine) for handlers in report.metrics.handlers.values() for h in handlers.values())
    assert engine.state.metric_details["S_g_dice"].shape == (5, 2)
    assert (tmp_path / "metrics.csv").read_text() == first
