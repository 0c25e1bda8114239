"""MONAI's experiment tracking (``--tracking mlflow``) on every workflow, the loss terms it logs, and logging.conf.

Tiny three-stage training, evaluation and inference run with ``tracking="mlflow"`` and a SQLite store under
``tmp_path``; the runs, metric keys, steps and values are read back with the MLflow client. The loss-term handler
is checked against an independent float64 numpy computation of GLAMLoss's terms.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import BUNDLE_ROOT, REPO_ROOT, TINY_CONFIG, TRAIN_CONFIG, VALIDATION_METRICS, tiny_overrides
from ignite.engine import Events
from monai.bundle import ConfigWorkflow
from monai.engines.utils import IterationEvents

from scripts.training.workflow import GLAMWorkflow

mlflow = pytest.importorskip("mlflow")

META = str(BUNDLE_ROOT / "configs" / "metadata.json")
EVAL_CONFIG = BUNDLE_ROOT / "configs" / "evaluate.yaml"
INFERENCE_CONFIG = BUNDLE_ROOT / "configs" / "inference.yaml"
TINY_INFERENCE = REPO_ROOT / "tests" / "configs" / "tiny_inference.yaml"
EPOCHS = {"global": 2, "local": 1, "joint": 1}
ITERATIONS_PER_EPOCH = 8  # 16 balanced training images of the tiny datalist, batches of 2
TERMS = {
    "global": {"bce_global", "l1_global"},
    "local": {"bce_local", "l1_local"},
    "joint": {"bce_global", "l1_global", "bce_local", "l1_local", "bce_fusion"},
}
MISSING_LOGGING_CONF = "logging.conf does not exist"


def sqlite_uri(path: Path) -> str:
    return "sqlite:///" + str(path.resolve())


def runs_by_name(uri: str, experiment: str = "monai_experiment") -> dict:
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return {r.info.run_name: r for r in runs}


def history(uri: str, run, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in mlflow.MlflowClient(uri).get_metric_history(run.info.run_id, key)]


@pytest.fixture(scope="module")
def tracked_training(tmp_path_factory, tiny_datalist):
    """All three stages of the tiny training with ``--tracking mlflow``; the store and the log records."""
    root = tmp_path_factory.mktemp("tracking")
    uri = sqlite_uri(root / "mlruns.db")
    wf = GLAMWorkflow(  # from Python: train.yaml's `training` builds it from a `monai.bundle run` command line
        config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG)],
        meta_file=META,
        workflow_type="train",
        tracking="mlflow",
        **tiny_overrides(root, tiny_datalist, stage="all", epochs=EPOCHS, tracking_uri=uri),
    )
    wf.initialize()
    results = wf.run()[-1]
    return {"root": root, "uri": uri, "results": results}


def test_each_stage_is_one_finished_run_with_its_loss_terms_lr_and_validation_metrics(tracked_training):
    uri = tracked_training["uri"]
    runs = runs_by_name(uri)
    assert {f"train_{s}" for s in EPOCHS} <= set(runs)
    for stage, epochs in EPOCHS.items():
        run = runs[f"train_{stage}"]
        assert run.info.status == "FINISHED"
        assert run.data.params["max_epochs"] == str(epochs)
        # the validation metrics, and the two a split without masks selects by
        validation = set(VALIDATION_METRICS) | {"val_auc_mean", "val_neg_loss"}
        per_epoch = {f"train_{t}" for t in TERMS[stage]} | {"train_loss_epoch", "train_lr"} | validation
        assert set(run.data.metrics) == per_epoch | {"train_loss", "lr_group_0"}, stage
        for key in per_epoch:
            assert [step for step, _ in history(uri, run, key)] == list(range(1, epochs + 1)), (stage, key)
        steps = [step for step, _ in history(uri, run, "train_loss")]
        assert steps == list(range(1, epochs * ITERATIONS_PER_EPOCH + 1)), stage


def test_tracked_values_agree_with_the_iteration_losses_the_lr_and_the_selected_model(tracked_training):
    uri, results = tracked_training["uri"], tracked_training["results"]
    runs = runs_by_name(uri)
    for result in results:
        stage, run = result["stage"], runs[f"train_{result['stage']}"]
        losses = [v for _, v in history(uri, run, "train_loss")]
        epoch_means = dict(history(uri, run, "train_loss_epoch"))
        for epoch in range(1, EPOCHS[stage] + 1):
            chunk = losses[(epoch - 1) * ITERATIONS_PER_EPOCH : epoch * ITERATIONS_PER_EPOCH]
            assert epoch_means[epoch] == pytest.approx(sum(chunk) / len(chunk), rel=1e-9), (stage, epoch)
            terms = sum(dict(history(uri, run, f"train_{t}"))[epoch] for t in TERMS[stage])
            assert terms == pytest.approx(epoch_means[epoch], rel=1e-6), (stage, epoch)
        # the learning rate the epoch trained with: the configured one in epoch 1 (cosine schedule after it)
        assert dict(history(uri, run, "train_lr"))[1] == pytest.approx(1e-3, rel=1e-12)
        assert dict(history(uri, run, "lr_group_0"))[1] == pytest.approx(1e-3, rel=1e-12)
        # the validation metric that selected model.pt, as logged for its epoch
        assert dict(history(uri, run, "val_soft_dice"))[result["best_epoch"]] == pytest.approx(result["best_metric"])


def test_the_loss_terms_reach_tensorboard(tracked_training):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for stage in EPOCHS:
        tags = set()
        for events in (tracked_training["root"] / "eval" / stage).glob("events.out.tfevents.*"):
            acc = EventAccumulator(str(events))
            acc.Reload()
            tags |= set(acc.Tags()["scalars"])
        assert {f"train_{t}" for t in TERMS[stage]} | {"train_loss", "train_loss_epoch", "train_lr"} <= tags, stage
        assert "val_soft_dice" in tags


def test_a_bundle_command_applies_logging_conf_instead_of_warning(tmp_path):
    """`python -m monai.bundle run` (here: the id `seed`, which builds the workflow and evaluates one number)."""
    cmd = [sys.executable, "-m", "monai.bundle", "run", "seed", "--config_file", "bundle/configs/train.yaml"]
    cmd += ["--meta_file", "bundle/configs/metadata.json", "--bundle_root", "bundle"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr  # MONAI's own loggers print to stdout, logging.conf's handler to stderr
    assert MISSING_LOGGING_CONF not in log
    assert "Setting logging properties based on config: bundle/configs/logging.conf" in log


def test_evaluation_is_one_run_in_the_same_store(tracked_training, tiny_datalist):
    root, uri = tracked_training["root"], tracked_training["uri"]
    wf = ConfigWorkflow(
        config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG), str(EVAL_CONFIG)],
        meta_file=META,
        workflow_type="infer",
        tracking="mlflow",
        # from Python there is no command line to read the merged config from: MONAI's own copy, at a given path
        **tiny_overrides(
            root, tiny_datalist, eval_split="validation", tracking_uri=uri, save_execute_config=str(root / "ev.json")
        ),
    )
    wf.initialize()
    assert wf.check_properties() == []
    wf.run()
    evaluator = wf.parser.get_parsed_content("validate#evaluator")
    runs = runs_by_name(uri)
    assert [name for name in runs if name.startswith("evaluate")] == ["evaluate_joint"]
    run = runs["evaluate_joint"]
    assert run.info.status == "FINISHED"
    # evaluate.yaml: the key metric and the report's AUCs per image and per breast (the classes where they are
    # defined: this validation split has no malignant image), published before MLflow logs the epoch
    aucs = {f"{name}_auc_benign" for name in ("classification", "breast")}
    assert set(run.data.metrics) == {"val_soft_dice", *aucs}
    for name in ("val_soft_dice", *aucs):
        assert history(uri, run, name) == [(1, pytest.approx(evaluator.state.metrics[name]))]
    artifacts = [a.path for a in mlflow.MlflowClient(uri).list_artifacts(run.info.run_id)]
    assert artifacts == ["ev.json"]  # the merged config, MONAI's copy


def test_inference_is_one_finished_run(tmp_path, tiny_datalist):
    from scripts.networks import GLAMSaliencyNet

    torch.manual_seed(0)
    ckpt = tmp_path / "model.pt"
    net = GLAMSaliencyNet(stage="joint", patch_size=64, local_depth=18, local_width=4, image_size=(256, 160))
    torch.save(net.state_dict(), ckpt)
    uri = sqlite_uri(tmp_path / "mlruns.db")
    images = Path(tiny_datalist).parent / "images"
    wf = ConfigWorkflow(
        config_file=[str(INFERENCE_CONFIG), str(TINY_INFERENCE)],
        meta_file=META,
        workflow_type="infer",
        tracking="mlflow",
        input_dir=str(images),
        output_dir=str(tmp_path / "out"),
        ckpt_path=str(ckpt),
        tracking_uri=uri,
    )
    wf.initialize()
    wf.run()
    wf.finalize()
    (run,) = runs_by_name(uri).values()
    assert run.info.status == "FINISHED"
    assert run.data.params["max_epochs"] == "1"
    assert (tmp_path / "out" / "predictions.csv").is_file()


def _glam_outputs(batch: int, seed: int) -> dict[str, torch.Tensor]:
    """Outputs of a joint-stage GLAM for `batch` images (probabilities in (0, 1), non-negative maps)."""
    g = torch.Generator().manual_seed(seed)
    u = lambda *shape: torch.rand(*shape, generator=g) * 0.98 + 0.01  # noqa: E731
    return {
        "y_global": u(batch, 2),
        "y_scales": u(batch, 3, 2),
        "saliency_scale0": u(batch, 2, 8, 5),
        "saliency_scale1": u(batch, 2, 4, 3),
        "saliency_scale2": u(batch, 2, 2, 2),
        "y_local": u(batch, 2),
        "patch_maps": u(batch, 3, 2, 4, 4),
        "y_fusion": u(batch, 2),
    }


class FixedOutputs(torch.nn.Module):
    """A "network" that returns pre-drawn GLAM outputs scaled by one trainable weight (so the optimiser steps)."""

    def __init__(self, outputs: list[dict[str, torch.Tensor]]) -> None:
        super().__init__()
        self.outputs, self.scale, self.calls = outputs, torch.nn.Parameter(torch.tensor(1.0)), 0

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.outputs[self.calls % len(self.outputs)]
        self.calls += 1
        return {
            k: (v * self.scale).clamp(1e-4, 1 - 1e-4) if k.startswith("y_") else v * self.scale for k, v in out.items()
        }


def _np_bce(p: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(-(y * np.maximum(np.log(p), -100) + (1 - y) * np.maximum(np.log(1 - p), -100))))


def _np_terms(out: dict[str, np.ndarray], y: np.ndarray, lam: float) -> dict[str, float]:
    """GLAMLoss's joint-stage terms in float64 numpy: BCE averaged over batch and classes, L1 summed over the
    map's pixels and classes and averaged over the batch."""
    l1 = lambda m: float(np.abs(m).reshape(len(m), -1).sum(1).mean())  # noqa: E731
    return {
        "bce_global": sum(_np_bce(out["y_scales"][:, n], y) for n in range(3)),
        "l1_global": lam * sum(l1(out[f"saliency_scale{n}"]) for n in range(3)),
        "bce_local": _np_bce(out["y_local"], y),
        "l1_local": lam * l1(out["patch_maps"]),
        "bce_fusion": _np_bce(out["y_fusion"], y),
    }


def test_loss_terms_handler_publishes_the_epoch_means_of_glam_loss_components():
    from monai.engines import SupervisedTrainer

    from scripts.handlers import LossTerms
    from scripts.losses import GLAMLoss

    lam, lr, batches = 0.01, 0.05, 3
    labels = [
        torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
        torch.tensor([[0.0, 0.0], [1.0, 1.0]]),
        torch.tensor([[1.0, 1.0]]),
    ]
    data = [(torch.zeros(len(y), 1, 4, 4), y) for y in labels]
    network = FixedOutputs([_glam_outputs(len(y), seed=i) for i, y in enumerate(labels)])
    optimizer = torch.optim.SGD(network.parameters(), lr=lr)
    seen: list[tuple[dict, np.ndarray]] = []
    published: list[dict] = []
    trainer = SupervisedTrainer(
        device=torch.device("cpu"),
        max_epochs=2,
        train_data_loader=data,
        network=network,
        optimizer=optimizer,
        loss_function=GLAMLoss(stage="joint", lambda_sparsity=lam),
        prepare_batch=lambda batch, device, non_blocking, **kw: batch,
        train_handlers=[LossTerms()],
        decollate=False,
    )
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)

    @trainer.on(IterationEvents.FORWARD_COMPLETED)
    def record(engine):
        pred = {k: v.detach().double().numpy() for k, v in engine.state.output["pred"].items()}
        seen.append((pred, engine.state.output["label"].double().numpy()))

    @trainer.on(Events.EPOCH_COMPLETED)
    def publish(engine):
        published.append(dict(engine.state.metrics))
        scheduler.step()

    trainer.run()
    assert network.scale.item() != 1.0  # the optimiser stepped: each epoch saw other outputs
    for epoch, metrics in enumerate(published):
        expected = [_np_terms(out, y, lam) for out, y in seen[epoch * batches : (epoch + 1) * batches]]
        names = {f"train_{t}" for t in expected[0]}
        assert set(metrics) == names | {"train_loss_epoch", "train_lr"}
        for term in expected[0]:
            mean = sum(e[term] for e in expected) / batches
            assert metrics[f"train_{term}"] == pytest.approx(mean, rel=1e-5, abs=1e-9), (epoch, term)
        total = sum(sum(e.values()) for e in expected) / batches
        assert metrics["train_loss_epoch"] == pytest.approx(total, rel=1e-5)
        assert metrics["train_lr"] == pytest.approx(lr * 0.5**epoch, rel=1e-12)


def test_loss_terms_handler_needs_a_loss_with_components():
    from monai.engines import SupervisedTrainer

    from scripts.handlers import LossTerms

    network = torch.nn.Linear(2, 2)
    trainer = SupervisedTrainer(
        device=torch.device("cpu"),
        max_epochs=1,
        train_data_loader=[(torch.zeros(1, 2), torch.zeros(1, 2))],
        network=network,
        optimizer=torch.optim.SGD(network.parameters(), lr=0.1),
        loss_function=torch.nn.MSELoss(),
        prepare_batch=lambda batch, device, non_blocking, **kw: batch,
        train_handlers=[LossTerms()],
    )
    with pytest.raises(TypeError, match="components"):
        trainer.run()


def test_the_curves_script_draws_the_logged_scalars(tracked_training, tmp_path):
    import importlib.util

    from PIL import Image

    spec = importlib.util.spec_from_file_location(
        "plot_training_curves", REPO_ROOT / "tools" / "plot_training_curves.py"
    )
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    uri, runs = tracked_training["uri"], runs_by_name(tracked_training["uri"])
    for stage in EPOCHS:
        scalars = plot.read_scalars(tracked_training["root"] / "eval" / stage)
        for key in ("train_loss_epoch", "val_soft_dice", *(f"train_{t}" for t in TERMS[stage])):
            tracked = history(uri, runs[f"train_{stage}"], key)
            assert [s for s, _ in scalars[key]] == [s for s, _ in tracked], (stage, key)
            assert [v for _, v in scalars[key]] == pytest.approx([v for _, v in tracked], rel=1e-6), (stage, key)
    png = tmp_path / "curves.png"
    assert plot.main([str(tracked_training["root"] / "eval"), str(png)]) == 0
    assert Image.open(png).size == (1160, 900)  # 2 panels of 580 x 300 per stage
