"""Pointing game metric and handler against a plain Python loop and hand-made cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from ignite.engine import Engine
from references import loop_pointing

from scripts.handlers import PointingGame
from scripts.metrics import PointingGameMetric, compute_pointing_game, map_peaks


def test_peak_of_an_upsampled_map_is_the_cell_centre() -> None:
    cells = torch.zeros(1, 1, 4, 3)
    cells[0, 0, 2, 1] = 0.9
    full = cells.repeat_interleave(8, dim=2).repeat_interleave(8, dim=3)  # 32 x 24, cells of 8 px
    rows, cols, valid = map_peaks(full)
    assert rows.item() == pytest.approx(16 + 3.5) and cols.item() == pytest.approx(8 + 3.5) and valid.item()


def test_hand_made_cases() -> None:
    pred = torch.zeros(3, 2, 10, 10)
    mask = torch.zeros(3, 2, 10, 10)
    pred[0, 0, 2, 2] = 1.0  # peak on the lesion
    mask[0, 0, 2, 2] = 1
    pred[0, 1, 9, 0] = 1.0  # peak 5 px below a malignant lesion
    mask[0, 1, 4, 0] = 1
    pred[1, 0] = 0.5  # constant map: no peak, a miss and "on the border"
    mask[1, 0, 5, 5] = 1
    # image 2 has no lesion: NaN everywhere
    hits = compute_pointing_game(pred, mask)
    assert hits[0].tolist() == [1.0, 0.0]
    assert hits[1, 0].item() == 0.0 and math.isnan(hits[1, 1].item()) and torch.isnan(hits[2]).all()
    assert compute_pointing_game(pred, mask, tolerance=5)[0].tolist() == [1.0, 1.0]
    assert compute_pointing_game(pred, mask, tolerance=4.9)[0].tolist() == [1.0, 0.0]
    border = compute_pointing_game(pred, mask, measure="border")
    assert border[0].tolist() == [0.0, 1.0] and border[1, 0].item() == 1.0
    assert compute_pointing_game(pred, mask, border=2, measure="border")[0].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("tolerance,border", [(0.0, 0.0), (3.0, 1.0), (7.5, 4.0)])
def test_against_the_loop_on_random_block_maps(tolerance: float, border: float) -> None:
    g = torch.Generator().manual_seed(int(tolerance * 10))
    # maps of 4x4-pixel cells with ties (values quantised to 5 levels), lesions as random rectangles
    cells = (torch.randint(0, 5, (6, 2, 6, 5), generator=g) / 4.0).float()
    pred = cells.repeat_interleave(4, dim=2).repeat_interleave(4, dim=3)
    pred[0, 0] = 0.25  # a constant map
    mask = torch.zeros_like(pred)
    for i in range(6):
        for c in range(2):
            if torch.rand(1, generator=g) < 0.8:
                r, q = torch.randint(0, 20, (2,), generator=g).tolist()
                mask[i, c, r : r + 4, q : q + 3] = 1
    for measure in ("hit", "border"):
        got = compute_pointing_game(pred, mask, tolerance, border, measure).numpy()
        want = loop_pointing(pred.numpy(), mask.numpy(), tolerance, border, measure)
        np.testing.assert_array_equal(got, want)


def test_metric_accumulates_and_the_handler_publishes_per_class_rates() -> None:
    pred = torch.zeros(4, 2, 8, 8)
    mask = torch.zeros(4, 2, 8, 8)
    for i, hit in enumerate([True, False, True, True]):
        mask[i, 0, 1, 1] = 1
        pred[i, 0, 1 if hit else 6, 1] = 1.0
    mask[0, 1, 7, 7] = 1
    pred[0, 1, 7, 7] = 1.0
    metric = PointingGameMetric()
    metric(pred[:2], mask[:2])
    metric([p for p in pred[2:]], [m for m in mask[2:]])  # decollated lists, as MONAI's engines give
    assert metric.aggregate().tolist() == [0.75, 1.0]
    border = PointingGameMetric(measure="border")
    border(pred, mask)
    assert border.aggregate().tolist() == [0.0, 1.0]  # the malignant peak sits in the corner

    engine = Engine(lambda e, batch: batch)
    PointingGame(class_index=0).attach(engine, "hit_benign")
    PointingGame().attach(engine, "hit_mean")
    state = engine.run([(pred[:2], mask[:2]), (pred[2:], mask[2:])])
    assert state.metrics["hit_benign"] == pytest.approx(0.75)
    assert state.metrics["hit_mean"] == pytest.approx((0.75 + 1.0) / 2)
    assert state.metric_details["hit_benign"].shape == (4, 2)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="measure"):
        PointingGameMetric(measure="peak")
    with pytest.raises(ValueError, match="tolerance"):
        compute_pointing_game(torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 4, 4), tolerance=-1)
    with pytest.raises(ValueError, match="y_pred"):
        compute_pointing_game(torch.full((1, 1, 4, 4), 2.0), torch.zeros(1, 1, 4, 4))
