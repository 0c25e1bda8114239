"""FROC (scripts.metrics.froc) against a hand-worked case and a brute-force numpy reference."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
import torch

from scripts.metrics.froc import FROCMetric, froc_candidates, match_candidates


def _hand_case() -> tuple[torch.Tensor, torch.Tensor]:
    """Three 8x8 images, one class. Lesions: A (image 0, rows 1-2 x cols 1-2), B (image 1, rows 5-6 x cols 5-6),
    C (image 1, the pixel (1, 5)); image 2 has none. Isolated peaks: on A 0.9; on B 0.6; on C 0.2; elsewhere
    0.8 and 0.3 (image 0), 0.7 (image 1), 0.5 and 0.95 (image 2)."""
    maps = torch.zeros(3, 1, 8, 8)
    masks = torch.zeros(3, 1, 8, 8)
    masks[0, 0, 1:3, 1:3] = 1
    masks[1, 0, 5:7, 5:7] = 1
    masks[1, 0, 1, 5] = 1
    for i, r, c, v in [
        (0, 1, 1, 0.9),
        (0, 5, 5, 0.8),
        (0, 6, 1, 0.3),
        (1, 5, 6, 0.6),
        (1, 2, 2, 0.7),
        (1, 1, 5, 0.2),
        (2, 3, 3, 0.5),
        (2, 0, 7, 0.95),
    ]:
        maps[i, 0, r, c] = v
    return maps, masks


def test_hand_worked_case():
    # the sweep by hand (threshold: false positives, lesions found): 0.95: 1, 0 | 0.9: 1, 1 | 0.8: 2, 1 |
    # 0.7: 3, 1 | 0.6: 3, 2 | 0.5: 4, 2 | 0.3: 5, 2 | 0.2: 5, 3; three images, three lesions.
    # 0.25 FP/image allows 0 FP -> nothing found; 0.5 allows 1 -> 0.9: 1/3; 1 allows 3 -> 0.6: 2/3; 2 and 4 -> 1.
    maps, masks = _hand_case()
    metric = FROCMetric(radius=1)
    metric(maps[:2], masks[:2])  # two calls: the counts accumulate
    metric(maps[2:], masks[2:])
    np.testing.assert_allclose(metric.aggregate().numpy(), [[0.0, 1 / 3, 2 / 3, 1.0, 1.0]])
    assert metric.get_buffer()[:, 0].tolist() == [1.0, 2.0, 0.0]
    fpi, sens = metric.curve()
    nonzero = np.flatnonzero(np.diff(fpi[0].numpy()) + np.diff(sens[0].numpy()))
    points = list(zip(fpi[0].numpy()[nonzero + 1].round(4), sens[0].numpy()[nonzero + 1].round(4)))
    assert points == [
        (0.3333, 0.0),
        (0.3333, 0.3333),
        (0.6667, 0.3333),
        (1.0, 0.3333),
        (1.0, 0.6667),
        (1.3333, 0.6667),
        (1.6667, 0.6667),
        (1.6667, 1.0),
    ]


def test_a_class_without_lesions_is_nan_and_a_map_without_peaks_finds_nothing():
    maps, masks = _hand_case()
    two = torch.cat([maps, torch.zeros_like(maps)], 1)  # class 1: an all-zero map (no candidate), no lesion
    metric = FROCMetric(radius=1)
    metric(two, torch.cat([masks, torch.zeros_like(masks)], 1))
    out = metric.aggregate().numpy()
    assert np.isnan(out[1]).all()
    metric.reset()
    metric(torch.zeros_like(maps), masks)
    np.testing.assert_array_equal(metric.aggregate().numpy(), np.zeros((1, 5)))


def test_plateau_gives_one_candidate_and_tolerance_reaches_a_lesion():
    m = torch.zeros(1, 1, 16, 16)
    m[0, 0, 4:8, 4:8] = 0.5  # one nearest-upsampled cell
    scores, rows, cols = froc_candidates(m, radius=4, max_candidates=5)
    assert torch.isfinite(scores).sum() == 1 and (rows[0, 0, 0].item(), cols[0, 0, 0].item()) == (4, 4)
    m[0, 0, 12, 12], m[0, 0, 0, 15] = 0.7, 0.6
    scores, rows, cols = froc_candidates(m, radius=4, max_candidates=2)  # the two highest of three
    assert scores[0, 0].tolist() == pytest.approx([0.7, 0.6]) and rows[0, 0].tolist() == [12, 0]
    mask = np.zeros((16, 16))
    mask[4, 7:9] = 1  # lesion pixels 3 px right of (4, 4)... (4, 7) is 3 px away
    assert match_candidates(mask, np.array([4]), np.array([4]), tolerance=2.9)[0].tolist() == [0]
    assert match_candidates(mask, np.array([4]), np.array([4]), tolerance=3.0)[0].tolist() == [1]


def _components(mask: np.ndarray) -> np.ndarray:
    """8-connected labels by breadth-first search (an independent labelling)."""
    labels = np.zeros(mask.shape, np.int64)
    n = 0
    for r0, c0 in zip(*np.nonzero(mask)):
        if labels[r0, c0]:
            continue
        n += 1
        labels[r0, c0] = n
        queue = deque([(r0, c0)])
        while queue:
            r, c = queue.popleft()
            for dr in (-1, 0, 1):
                for dc in (-1, 0, 1):
                    rr, cc = r + dr, c + dc
                    if 0 <= rr < mask.shape[0] and 0 <= cc < mask.shape[1] and mask[rr, cc] and not labels[rr, cc]:
                        labels[rr, cc] = n
                        queue.append((rr, cc))
    return labels


def _reference(maps: np.ndarray, masks: np.ndarray, radius: int, k: int, rates) -> np.ndarray:
    """Brute force: scan every pixel for the candidate rule, label lesions by BFS, sweep every distinct score."""
    b, c, h, w = maps.shape
    out = np.zeros((c, len(rates)))
    for cls in range(c):
        fps, found, total = [], [], 0
        for i in range(b):
            m = maps[i, cls]
            cands = []

            def is_max(r, q, m=m):
                win = m[max(r - radius, 0) : r + radius + 1, max(q - radius, 0) : q + radius + 1]
                return m[r, q] > 0 and m[r, q] == win.max()

            for r in range(h):
                for q in range(w):
                    if is_max(r, q):
                        # plateau rule: no equal local maximum earlier in row-major order within the square
                        earlier = [
                            (rr, qq)
                            for rr in range(max(r - radius, 0), min(r + radius + 1, h))
                            for qq in range(max(q - radius, 0), min(q + radius + 1, w))
                            if (rr * w + qq) < (r * w + q) and m[rr, qq] == m[r, q] and is_max(rr, qq)
                        ]
                        if not earlier:
                            cands.append((m[r, q], r, q))
            cands = sorted(cands, key=lambda t: -t[0])[:k]
            labels = _components(masks[i, cls] > 0)
            n = labels.max()
            total += n
            best = {}
            for s, r, q in cands:
                lab = labels[r, q]
                if lab:
                    best[lab] = max(best.get(lab, -1), s)
                else:
                    fps.append(s)
            found += list(best.values())
        fps, found = np.array(fps), np.array(found)
        for j, rate in enumerate(rates):
            sens = 0.0
            for t in sorted(set(fps.tolist()) | set(found.tolist()) | {np.inf}):
                if (fps >= t).sum() <= rate * b:
                    sens = max(sens, (found >= t).sum() / total)
            out[cls, j] = sens
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_maps_match_the_brute_force_reference(seed):
    rng = np.random.default_rng(seed)
    b, c, h, w = 4, 2, 20, 24
    # blocky maps with a few peaks; every score in the middle of a 0.001 bin (two scores in one bin are one threshold
    # for the metric, two for the reference)
    raw = rng.random((b, c, h // 4, w // 4))
    maps = np.kron(raw, np.ones((4, 4)))[:, :, :h, :w] * rng.random((b, c, h, w)) ** 0.1
    maps = (np.floor(maps * 1000) / 1000 + 0.0004).astype(np.float32)
    masks = (rng.random((b, c, h, w)) > 0.93).astype(np.float32)
    # every candidate kept (equal scores at a top-k cut would make the choice arbitrary; the cut is tested above)
    assert torch.isfinite(froc_candidates(torch.from_numpy(maps), 2, 60)[0]).sum(-1).max() < 60
    metric = FROCMetric(radius=2, max_candidates=60)
    metric(torch.from_numpy(maps), torch.from_numpy(masks))
    expected = _reference(maps, masks, 2, 60, metric.rates)
    np.testing.assert_allclose(metric.aggregate().numpy(), expected, atol=1e-12)


@pytest.mark.parametrize("radius", [0, 1, 2, 3, 7, 8, 16, 40])
def test_max_filter_equals_max_pool(radius):
    """The doubling max filter gives max_pool2d's values exactly (-inf borders), plateaus and index maps included."""
    from scripts.metrics.froc import _max_filter

    rng = np.random.default_rng(radius)
    for shape in [(3, 1, 17, 23), (2, 1, 40, 33), (1, 1, 5, 4)]:
        x = torch.from_numpy(np.round(rng.random(shape), 1))  # ties on purpose
        padded = torch.nn.functional.pad(x, (radius,) * 4, value=-float("inf"))
        want = torch.nn.functional.max_pool2d(padded, 2 * radius + 1, stride=1)
        assert torch.equal(_max_filter(x, radius), want)


@pytest.mark.parametrize("tolerance", [0.0, 1.5, 4.0])
def test_match_candidates_against_every_pixel(tolerance):
    """Hits and lesion counts against a brute force over the whole mask: a labelled lesion's nearest pixel within the
    tolerance, candidates far from every lesion and on the mask's edges included (the labelling reads a crop)."""
    rng = np.random.default_rng(int(tolerance * 10))
    for _ in range(5):
        mask = np.zeros((30, 40))
        for _ in range(rng.integers(1, 4)):
            r, c = rng.integers(0, 28), rng.integers(0, 38)
            mask[r : r + rng.integers(1, 4), c : c + rng.integers(1, 4)] = 1
        rows, cols = rng.integers(0, 30, 25), rng.integers(0, 40, 25)
        rows[:2], cols[:2] = (0, 29), (0, 39)  # the corners
        labels = _components(mask > 0)
        lesion_r, lesion_c = np.nonzero(labels)
        want = []
        for r, c in zip(rows, cols):
            d = np.hypot(lesion_r - r, lesion_c - c)
            want.append(labels[lesion_r[d.argmin()], lesion_c[d.argmin()]] if d.min() <= tolerance else 0)
        hits, n = match_candidates(mask, rows, cols, tolerance)
        assert n == labels.max()
        # the same candidates grouped into the same lesions (the labels' numbering may differ)
        pairs = {(int(h), int(w)) for h, w in zip(hits, want)}
        assert all((h == 0) == (w == 0) for h, w in pairs) and len({h for h, _ in pairs}) == len({w for _, w in pairs})
        assert len(pairs) == len({w for _, w in pairs})
    assert match_candidates(np.zeros((5, 5)), np.array([1, 2]), np.array([1, 2]), tolerance)[1] == 0


def test_an_unbounded_tolerance_finds_the_nearest_lesion_from_anywhere():
    mask = np.zeros((30, 40))
    mask[2:4, 2:4] = mask[25:28, 30:35] = 1
    rows, cols = np.array([0, 29, 10, 20]), np.array([39, 0, 5, 36])
    hits, n = match_candidates(mask, rows, cols, float("inf"))
    assert n == 2 and (hits > 0).all()
    assert hits.tolist() == match_candidates(mask, rows, cols, 1e6)[0].tolist()
    assert hits[2] != hits[3] and hits[2] == match_candidates(mask, rows[2:3], cols[2:3], 7.3)[0][0]
