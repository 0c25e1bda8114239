"""Ignite handlers for soft Dice and PxAP, and the documented bundle configuration (docs/metrics.md)."""

from __future__ import annotations

import logging
import math
import re

import pytest
import torch
from conftest import REPO_ROOT
from ignite.engine import Engine
from monai.bundle import ConfigParser
from monai.data import DataLoader
from monai.engines import SupervisedEvaluator
from monai.handlers import from_engine
from monai.metrics import ROCAUCMetric
from references import np_auc

from scripts.handlers import PxAP, SoftDice
from scripts.metrics import PxAPMetric, SoftDiceMetric


def make_batches(seed: int, n_batches: int = 3, batch: int = 2, c: int = 2, h: int = 16, w: int = 12):
    """Score maps in [0, 1], rectangle lesions (some image/class pairs without one), class probabilities/labels."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(n_batches):
        y = torch.zeros(batch, c, h, w)
        for i in range(batch):
            for j in range(c):
                if (k + i + j) % 3 != 2:
                    r, s = torch.randint(0, h - 5, (2,), generator=g).tolist()
                    y[i, j, r : r + 4, s : s + 3] = 1
        pred = (0.5 * torch.rand(y.shape, generator=g) + 0.5 * y * torch.rand(y.shape, generator=g)).clamp(0, 1)
        cls_label = (y.amax(dim=(2, 3)) > 0).float()
        cls_pred = (0.25 * cls_label + 0.75 * torch.rand(batch, c, generator=g)).clamp(0, 1)
        out.append((pred, y, cls_pred, cls_label))
    return out


def reference(batches, metric):
    for pred, y, *_ in batches:
        metric(pred, y)
    return metric


def run_engine(batches, handlers: dict, epochs: int = 1) -> Engine:
    engine = Engine(lambda e, b: (b[0], b[1]))
    for name, handler in handlers.items():
        handler.attach(engine, name)
    engine.run(batches, max_epochs=epochs)
    return engine


def test_handlers_equal_their_metrics_in_an_engine():
    batches = make_batches(0)
    dice = reference(batches, SoftDiceMetric())
    pxap = reference(batches, PxAPMetric())
    handlers = {
        "dice": SoftDice(),
        "dice_malignant": SoftDice(class_index=1),
        "dice_std_benign": SoftDice(class_index=0, reduction="std"),
        "pxap_img_benign": PxAP(level="image", class_index=0),
        "pxap_img_std_malignant": PxAP(level="image", class_index=1, reduction="std"),
        "pxap_ds": PxAP(level="dataset"),
        "pxap_ds_malignant": PxAP(level="dataset", class_index=1),
    }
    engine = run_engine(batches, handlers, epochs=2)  # the second epoch must start from a reset metric
    m = engine.state.metrics
    dice_mean, pxap_ds = dice.aggregate().tolist(), pxap.aggregate(level="dataset").tolist()
    assert m["dice"] == pytest.approx(sum(dice_mean) / 2, rel=1e-12)
    assert m["dice_malignant"] == dice_mean[1]
    assert m["dice_std_benign"] == dice.aggregate(reduction="std")[0].item()
    assert m["pxap_img_benign"] == pxap.aggregate(level="image")[0].item()
    assert m["pxap_img_std_malignant"] == pxap.aggregate(level="image", reduction="std")[1].item()
    assert m["pxap_ds"] == pytest.approx(sum(pxap_ds) / 2, rel=1e-12)
    assert m["pxap_ds_malignant"] == pxap_ds[1]
    assert all(isinstance(v, float) for v in m.values())
    details = engine.state.metric_details
    torch.testing.assert_close(details["dice"], dice.get_buffer(), equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(details["pxap_ds"], pxap.get_buffer(), equal_nan=True, rtol=0, atol=0)


class FakeNet(torch.nn.Module):
    """Maps an image to scores in [0, 1] with one learnable-looking parameter, so outputs depend on the input."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(3.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.scale * (x - 0.5))


def evaluator_for(batches, key_metric: dict, additional: dict | None = None) -> SupervisedEvaluator:
    items = [{"image": p[i], "label": y[i]} for p, y, *_ in batches for i in range(len(p))]
    return SupervisedEvaluator(
        device=torch.device("cpu"),
        val_data_loader=DataLoader(items, batch_size=2),
        network=FakeNet(),
        key_val_metric=key_metric,
        additional_metrics=additional,
    )


def test_handlers_in_a_supervised_evaluator():
    batches = make_batches(1)
    to_pair = from_engine(["pred", "label"])
    evaluator = evaluator_for(
        batches,
        {"val_dice": SoftDice(output_transform=to_pair)},
        {"val_pxap_ds_benign": PxAP(level="dataset", class_index=0, output_transform=to_pair)},
    )
    evaluator.run()
    net = FakeNet()
    with torch.no_grad():
        outputs = [(net(p), y) for p, y, *_ in batches]
    dice = reference(outputs, SoftDiceMetric()).aggregate().tolist()
    pxap = reference(outputs, PxAPMetric(level="dataset")).aggregate().tolist()
    assert evaluator.state.metrics["val_dice"] == pytest.approx(sum(dice) / 2, rel=1e-12)
    assert evaluator.state.metrics["val_pxap_ds_benign"] == pxap[0]
    assert evaluator.state.best_metric == evaluator.state.metrics["val_dice"]
    assert evaluator.state.metric_details["val_dice"].shape == (6, 2)


def test_epoch_without_lesions_of_a_class_keeps_model_selection_working(caplog):
    batches = make_batches(2)
    for _, y, *_ in batches:
        y[:, 1] = 0  # no malignant lesion anywhere
    to_pair = from_engine(["pred", "label"])
    evaluator = evaluator_for(
        batches,
        {"val_dice_malignant": SoftDice(class_index=1, output_transform=to_pair)},
        {
            "val_dice": SoftDice(output_transform=to_pair),
            "val_pxap_ds_malignant_nan": PxAP(
                level="dataset", class_index=1, empty_value=float("nan"), output_transform=to_pair
            ),
        },
    )
    with caplog.at_level(logging.WARNING):
        evaluator.run()
    m = evaluator.state.metrics
    assert m["val_dice_malignant"] == 0.0
    assert evaluator.state.best_metric == 0.0 and evaluator.state.best_metric_epoch == 1
    assert math.isnan(m["val_pxap_ds_malignant_nan"])
    # the warning says what the evaluation report shows (n/a), and what the logs and model selection see instead
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and ": n/a (" in r.getMessage()]
    assert sorted(warned) == [
        "val_dice_malignant: n/a (no image of this epoch has a lesion of class 1); engine.state.metrics holds "
        "empty_value=0.0 in its place, which the logs and model selection see",
        "val_pxap_ds_malignant_nan: n/a (no image of this epoch has a lesion of class 1); engine.state.metrics holds "
        "empty_value=nan in its place, which the logs and model selection see",
    ]
    assert "reporting" not in caplog.text
    with torch.no_grad():
        outputs = [(FakeNet()(p), y) for p, y, *_ in batches]
    dice = reference(outputs, SoftDiceMetric()).aggregate()
    assert torch.isnan(dice[1])
    assert m["val_dice"] == dice[0].item()  # the mean over classes skips the undefined class


def test_bad_handler_arguments():
    for bad in (-1, 1.0, True, "0"):
        with pytest.raises(ValueError, match="class_index"):
            SoftDice(class_index=bad)
    with pytest.raises(ValueError, match="reduction"):
        SoftDice(reduction="median")
    with pytest.raises(ValueError, match="only defined for level='image'"):
        PxAP(level="dataset", reduction="std")
    with pytest.raises(ValueError, match="level"):
        PxAP(level="pixel")
    with pytest.raises(ValueError, match="class_index=5 but the predictions have 2 classes"):
        run_engine(make_batches(3, n_batches=1), {"dice": SoftDice(class_index=5)})


def docs_yaml_block() -> str:
    text = (REPO_ROOT / "docs" / "metrics.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1, "docs/metrics.md should hold exactly one yaml block, the bundle configuration"
    return blocks[0]


def test_documented_bundle_configuration_runs_and_gives_per_class_values(tmp_path):
    config_file = tmp_path / "metrics.yaml"
    config_file.write_text(docs_yaml_block())
    parser = ConfigParser()
    parser.read_config(str(config_file))
    key_metric = parser.get_parsed_content("validate#key_metric")
    additional = parser.get_parsed_content("validate#additional_metrics")
    assert isinstance(key_metric["val_soft_dice"], SoftDice)

    batches = make_batches(4, n_batches=4)

    def decollated(engine, batch):  # what a MONAI evaluator's output looks like after decollation
        pred, y, cls_pred, cls_label = batch
        return [
            {"pred": pred[i], "label": y[i], "cls_pred": cls_pred[i], "cls_label": cls_label[i]}
            for i in range(len(pred))
        ]

    engine = Engine(decollated)
    for name, handler in {**key_metric, **additional}.items():
        handler.attach(engine, name)
    engine.run(batches)
    m = engine.state.metrics

    dice = reference(batches, SoftDiceMetric())
    pxap = reference(batches, PxAPMetric())
    assert m["val_soft_dice"] == pytest.approx(dice.aggregate().mean().item(), rel=1e-12)
    assert m["val_dice_benign"] == dice.aggregate()[0].item()
    assert m["val_dice_std_benign"] == dice.aggregate(reduction="std")[0].item()
    assert m["val_pxap_image_malignant"] == pxap.aggregate(level="image")[1].item()
    assert m["val_pxap_dataset_malignant"] == pxap.aggregate(level="dataset")[1].item()

    cls_pred = torch.cat([b[2] for b in batches]).numpy()
    cls_label = torch.cat([b[3] for b in batches]).numpy()
    auc = ROCAUCMetric(average="none")
    auc(torch.from_numpy(cls_pred), torch.from_numpy(cls_label))
    per_class = auc.aggregate()
    for c, name in enumerate(("val_auc_benign", "val_auc_malignant")):
        expected = np_auc(cls_pred[:, c], cls_label[:, c])
        assert 0.0 < expected < 1.0
        assert m[name] == pytest.approx(expected, abs=1e-12)
        assert per_class[c] == pytest.approx(expected, abs=1e-12)
    assert m["val_auc_benign"] != m["val_auc_malignant"]


def test_froc_handler_publishes_the_metrics_sensitivity_at_its_rate():
    """FROC (the handler) over two epochs equals FROCMetric on the same batches: one class or the mean at its rate,
    the per-image lesion counts as details; a rate the metric does not report is refused."""
    from scripts.handlers import FROC
    from scripts.metrics import FROCMetric

    batches = make_batches(2)
    froc = reference(batches, FROCMetric(radius=2, tolerance=1.0)).aggregate()  # (C, 5): 0.25, 0.5, 1, 2, 4
    handlers = {
        "froc": FROC(radius=2, tolerance=1.0),
        "froc2_malignant": FROC(rate=2, radius=2, tolerance=1.0, class_index=1),
    }
    engine = run_engine(batches, handlers, epochs=2)
    assert engine.state.metrics["froc"] == pytest.approx(froc[:, 2].mean().item(), rel=1e-12)
    assert engine.state.metrics["froc2_malignant"] == froc[1, 3].item()
    lesions = torch.stack([y.flatten(2).amax(-1) for _, y, *_ in batches]).reshape(-1, 2)  # one rectangle or none
    torch.testing.assert_close(engine.state.metric_details["froc"], lesions.double(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="rate must be one of"):
        FROC(rate=3)
