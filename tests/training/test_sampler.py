"""The balanced epoch sampler (scripts/training/sampler.py) against counts and draws computed independently."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from monai.data import DataLoader

from scripts.training.sampler import BalancedEpochSampler, positive_flags

# ---------------------------------------------------------------------------------------------------------------
# positive_flags


def test_positive_flags_any_lesion_label_and_missing_labels_are_negative():
    items = [
        {"image": "a", "label": [0, 1]},
        {"image": "b", "label": [0, 0]},
        {"image": "c", "label": [1, 1]},
        {"image": "d", "label": None},
        {"image": "e"},
        {"image": "f", "label": [1.0, 0.0]},
        {"image": "g", "label": [True, False]},
    ]
    assert positive_flags(items) == [True, False, True, False, False, True, True]


@pytest.mark.parametrize("bad", [[2, 0], [0, -1], [0.5, 0], [], "yes", [[0, 1], [1]], [float("nan"), 0]])
def test_positive_flags_bad_label_names_the_item(bad):
    items = [{"image": "ok.png", "label": [0, 1]}, {"image": "bad_one.png", "label": bad}]
    with pytest.raises(ValueError) as err:
        positive_flags(items)
    assert "item 1" in str(err.value) and "bad_one.png" in str(err.value)


# ---------------------------------------------------------------------------------------------------------------
# BalancedEpochSampler


def _flags(n_pos: int, n_neg: int, seed: int = 0) -> list[bool]:
    flags = np.array([True] * n_pos + [False] * n_neg)
    np.random.default_rng(seed).shuffle(flags)
    return flags.tolist()


def _epoch(sampler: BalancedEpochSampler, epoch: int) -> list[int]:
    sampler.set_epoch(epoch)
    return list(sampler)


def test_each_epoch_is_all_positives_plus_as_many_distinct_negatives():
    flags = _flags(7, 20)
    pos = {i for i, f in enumerate(flags) if f}
    neg = {i for i, f in enumerate(flags) if not f}
    sampler = BalancedEpochSampler(flags, seed=5)
    assert len(sampler) == 14
    for epoch in range(6):
        indices = _epoch(sampler, epoch)
        assert len(indices) == 14 and len(set(indices)) == 14  # no repeats
        assert pos <= set(indices)
        assert len(set(indices) & neg) == 7


def test_epochs_are_reshuffled_and_draw_different_negatives():
    flags = _flags(10, 30)
    sampler = BalancedEpochSampler(flags, seed=1)
    epochs = [_epoch(sampler, e) for e in range(5)]
    orders = {tuple(e) for e in epochs}
    negative_sets = {frozenset(i for i in e if not flags[i]) for e in epochs}
    assert len(orders) == 5 and len(negative_sets) == 5
    # positives are not simply listed first: the epoch is one shuffled sequence
    assert any(not all(flags[i] for i in e[:10]) for e in epochs)


def test_negatives_are_drawn_uniformly_over_epochs():
    flags = _flags(6, 18, seed=2)
    neg = [i for i, f in enumerate(flags) if not f]
    sampler = BalancedEpochSampler(flags, seed=0)
    n_epochs = 3000
    counts = dict.fromkeys(neg, 0)
    for epoch in range(n_epochs):
        for i in sampler.epoch_indices(epoch):
            if not flags[i]:
                counts[i] += 1
    p = 6 / 18  # each negative is one of the 6 drawn out of 18
    expected, sd = n_epochs * p, math.sqrt(n_epochs * p * (1 - p))
    assert all(abs(c - expected) < 5 * sd for c in counts.values()), counts


def test_same_epoch_same_indices_across_instances_and_calls():
    flags = _flags(5, 12)
    a = BalancedEpochSampler(flags, seed=3)
    b = BalancedEpochSampler(flags, seed=3)  # a fresh process resuming at epoch 4
    first = _epoch(a, 4)
    _epoch(a, 5)
    assert _epoch(a, 4) == first == _epoch(b, 4)
    assert _epoch(BalancedEpochSampler(flags, seed=4), 4) != first


@pytest.mark.parametrize("n_pos, n_neg, replicas", [(7, 20, 3), (6, 6, 4), (5, 1, 2)])
def test_rank_split_is_disjoint_and_covers_the_epoch(n_pos, n_neg, replicas):
    flags = _flags(n_pos, n_neg)
    full = BalancedEpochSampler(flags, seed=9).epoch_indices(2)
    shares = []
    for rank in range(replicas):
        s = BalancedEpochSampler(flags, seed=9, num_replicas=replicas, rank=rank)
        shares.append(_epoch(s, 2))
    n = len(full)
    per_rank = -(-n // replicas)
    assert all(len(share) == per_rank for share in shares)
    # position k of the padded epoch goes to rank k % replicas; padding repeats the epoch's first indices
    padded = (full * 2)[: per_rank * replicas]
    for rank, share in enumerate(shares):
        assert share == padded[rank::replicas]
    covered = [i for share in shares for i in share]
    assert set(covered) == set(full)
    assert len(covered) - n == per_rank * replicas - n  # only the padding is shared between ranks


def test_fewer_negatives_than_positives_uses_every_negative():
    flags = _flags(9, 3)
    sampler = BalancedEpochSampler(flags, seed=0)
    assert len(sampler) == 12
    for epoch in range(3):
        assert sorted(_epoch(sampler, epoch)) == list(range(12))


def test_no_positives_uses_every_image():
    sampler = BalancedEpochSampler([False] * 5, seed=0)
    assert sorted(_epoch(sampler, 0)) == list(range(5))


def test_no_negatives_and_negative_ratio():
    assert sorted(_epoch(BalancedEpochSampler([True] * 4), 1)) == [0, 1, 2, 3]
    flags = _flags(4, 20)
    sampler = BalancedEpochSampler(flags, negatives_per_positive=2.0)
    indices = _epoch(sampler, 0)
    assert len(indices) == 12 and sum(not flags[i] for i in indices) == 8


def test_sampler_rejects_bad_arguments():
    with pytest.raises(ValueError, match="non-empty"):
        BalancedEpochSampler([])
    with pytest.raises(ValueError, match="rank"):
        BalancedEpochSampler([True, False], num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="negatives_per_positive"):
        BalancedEpochSampler([True, False], negatives_per_positive=-1)


def test_sampler_drives_a_dataloader():
    flags = _flags(3, 10)
    sampler = BalancedEpochSampler(flags, seed=0)
    loader = DataLoader(list(range(len(flags))), batch_size=2, sampler=sampler)
    sampler.set_epoch(1)
    seen = torch.cat(list(loader)).tolist()
    assert seen == sampler.epoch_indices(1) and len(loader) == 3
