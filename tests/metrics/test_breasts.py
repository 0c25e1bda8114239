"""Breast-level AUC (scripts.metrics.breasts) against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from scripts.metrics.breasts import breast_auc, breast_key


def _auc_by_hand(pos: list[float], neg: list[float]) -> float:
    """Mann-Whitney: the share of (positive, negative) pairs ranked right, ties one half."""
    pairs = [(p > n) + 0.5 * (p == n) for p in pos for n in neg]
    return sum(pairs) / len(pairs)


def test_breast_scores_are_view_means_labels_maxima_and_ties_count_one_half():
    items = [
        {"patient_id": "p1", "laterality": "L"},  # CC
        {"patient_id": "p1", "laterality": "l"},  # MLO of the same breast (case of the side ignored)
        {"patient_id": "p1", "laterality": "R"},
        {"patient_id": "p2", "laterality": "L"},  # a breast missing a view: one image
        {"patient_id": "p3", "laterality": "R"},
        {"patient_id": "p3", "laterality": "R"},
        {"image": "x.png"},  # no patient: a breast of its own
    ]
    # one class: malignant scores and labels
    scores = torch.tensor([[0.25], [0.75], [0.375], [0.5], [0.125], [0.875], [0.875]])  # exact in binary
    labels = torch.tensor([[0], [1], [0], [1], [0], [0], [0]])
    out = breast_auc(scores, labels, [breast_key(i) for i in items])
    # breasts: p1-L 0.5 (label 1), p1-R 0.375 (0), p2-L 0.5 (1), p3-R 0.5 (0), x 0.875 (0)
    expected = _auc_by_hand([0.5, 0.5], [0.375, 0.5, 0.875])  # (1 + .5 + 0 + 1 + .5 + 0) / 6 = 0.5
    assert expected == pytest.approx(0.5)
    assert out["auc"][0].item() == pytest.approx(expected)
    assert out["breasts"] == 5 and out["images_without_breast"] == 1


def test_the_study_separates_breasts_and_a_class_with_one_label_is_nan():
    items = [
        {"patient_id": "p", "laterality": "L", "study": "2019"},
        {"patient_id": "p", "laterality": "L", "study": "2021"},
        {"patient_id": "q", "laterality": "L"},
    ]
    scores = torch.tensor([[0.9, 0.1], [0.2, 0.5], [0.4, 0.3]])
    labels = torch.tensor([[1, 0], [0, 0], [0, 0]])
    out = breast_auc(scores, labels, [breast_key(item) for item in items])
    assert out["breasts"] == 3
    assert out["auc"][0].item() == pytest.approx(_auc_by_hand([0.9], [0.2, 0.4]))  # = 1.0
    assert math.isnan(out["auc"][1].item())


def test_shape_mismatch_is_one_line():
    with pytest.raises(ValueError, match=r"scores and labels must be \(N, C\)"):
        breast_auc(torch.zeros(3, 2), torch.zeros(3, 2), [None, None])
