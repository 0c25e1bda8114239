"""The validation's AUC metrics as train.yaml builds them: val_auc_benign, val_auc_malignant and val_auc_mean are of
one prediction (the one the stage trains), so the mean printed beside the two is their mean. Checked against AUCs
computed by hand and by a pair-counting loop (no sklearn)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from conftest import TINY_CONFIG, TRAIN_CONFIG
from ignite.engine import Engine
from monai.bundle import ConfigParser

AUC_METRICS = ("val_auc_benign", "val_auc_malignant", "val_auc_mean")


def pair_auc(scores, labels) -> float:
    """ROC AUC as the share of (positive, negative) pairs ordered right, ties counting a half."""
    pos = [s for s, y in zip(scores, labels) if y == 1]
    neg = [s for s, y in zip(scores, labels) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def validation_auc(stage: str, outputs: list[dict]) -> dict[str, float]:
    """The three AUC metrics of train.yaml's validate#metrics for ``stage``, over ``outputs`` (decollated, one batch
    of two images per iteration)."""
    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(TINY_CONFIG)])
    parser["stage"] = stage
    metrics = parser.get_parsed_content("validate#metrics")
    engine = Engine(lambda _engine, batch: batch)
    for name in AUC_METRICS:
        metrics[name].attach(engine, name)
    engine.run([outputs[i : i + 2] for i in range(0, len(outputs), 2)], max_epochs=1)
    return {name: engine.state.metrics[name] for name in AUC_METRICS}


def image_outputs(scores: dict[str, np.ndarray], labels: np.ndarray) -> list[dict]:
    return [
        {**{k: torch.tensor(v[i], dtype=torch.float32) for k, v in scores.items()}, "label": torch.tensor(labels[i])}
        for i in range(len(labels))
    ]


def test_the_joint_stage_means_the_two_aucs_it_prints_by_hand():
    # y_fusion (what the joint stage trains): benign ranks both positives first (AUC 1), malignant 3 of 4 pairs
    labels = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=np.float32)
    y_fusion = np.array([[0.9, 0.3], [0.1, 0.7], [0.8, 0.4], [0.2, 0.6]])
    # y_global ranks the other way round: a mean of its AUCs would not be the mean of y_fusion's
    y_global = 1.0 - y_fusion
    got = validation_auc("joint", image_outputs({"y_fusion": y_fusion, "y_global": y_global}, labels))
    assert got["val_auc_benign"] == pytest.approx(1.0)
    assert got["val_auc_malignant"] == pytest.approx(0.75)
    assert got["val_auc_mean"] == pytest.approx(0.875)
    # the global stage: the same three of y_global (benign 0, malignant 1/4)
    got = validation_auc("global", image_outputs({"y_fusion": y_fusion, "y_global": y_global}, labels))
    assert (got["val_auc_benign"], got["val_auc_malignant"]) == (pytest.approx(0.0), pytest.approx(0.25))
    assert got["val_auc_mean"] == pytest.approx(0.125)


@pytest.mark.parametrize("stage, key", [("global", "y_global"), ("local", "y_local"), ("joint", "y_fusion")])
def test_every_stage_reports_the_aucs_of_its_own_prediction(stage, key):
    rng = np.random.default_rng(7)
    labels = np.stack([np.tile([1, 0, 1, 0, 0], 2), np.tile([0, 1, 1, 0, 1], 2)], axis=1).astype(np.float32)
    scores = {k: rng.uniform(0.01, 0.99, labels.shape) for k in ("y_global", "y_local", "y_fusion")}
    got = validation_auc(stage, image_outputs(scores, labels))
    expected = [pair_auc(scores[key][:, c], labels[:, c]) for c in range(2)]
    assert 0.0 < min(expected) and max(expected) < 1.0 and expected[0] != expected[1]
    assert got["val_auc_benign"] == pytest.approx(expected[0], abs=1e-12)
    assert got["val_auc_malignant"] == pytest.approx(expected[1], abs=1e-12)
    assert got["val_auc_mean"] == pytest.approx((expected[0] + expected[1]) / 2, abs=1e-12)
