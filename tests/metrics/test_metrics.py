"""Soft Dice and PxAP metrics against independent numpy computations (docs/metrics.md, paper appendix E)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import requires_cuda
from ignite.engine import Engine
from torchrun_job import free_port

from scripts.handlers import PxAP, SoftDice
from scripts.metrics import (
    PxAPMetric,
    SoftDiceMetric,
    average_precision_from_histograms,
    compute_pxap_histograms,
    compute_soft_dice,
)

# ---------------------------------------------------------------- independent numpy reference (wsolevaluation)
NP_EDGES = np.append(np.arange(0, 1, 0.001), [1.0, 2.0, 3.0])


def np_hist(scores: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positive, negative) score histograms of one map, as wsolevaluation's MaskEvaluator.accumulate."""
    pos, _ = np.histogram(scores[mask == 1], bins=NP_EDGES)
    neg, _ = np.histogram(scores[mask == 0], bins=NP_EDGES)
    return pos.astype(float), neg.astype(float)


def np_ap(pos: np.ndarray, neg: np.ndarray) -> float:
    """wsolevaluation's MaskEvaluator.compute, as a fraction rather than a percentage."""
    num_pos = pos.sum()
    tp = pos[::-1].cumsum()
    fn = num_pos - tp
    fp = neg[::-1].cumsum()
    non_zero = (tp + fp) != 0
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = tp / (tp + fp)
        recall = tp / (tp + fn)
    return float((precision[1:] * np.diff(recall))[non_zero[1:]].sum())


def np_image_pxap(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    out = np.full(pred.shape[:2], np.nan)
    for i in range(pred.shape[0]):
        for c in range(pred.shape[1]):
            if y[i, c].any():
                out[i, c] = np_ap(*np_hist(pred[i, c], y[i, c]))
    return out


def np_dataset_pxap(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    out = np.full(pred.shape[1], np.nan)
    for c in range(pred.shape[1]):
        pos, neg = np.zeros(len(NP_EDGES) - 1), np.zeros(len(NP_EDGES) - 1)
        for i in range(pred.shape[0]):
            if y[i, c].any():
                p, n = np_hist(pred[i, c], y[i, c])
                pos, neg = pos + p, neg + n
        if pos.sum() > 0:
            out[c] = np_ap(pos, neg)
    return out


def np_soft_dice(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    out = np.full(pred.shape[:2], np.nan)
    for i in range(pred.shape[0]):
        for c in range(pred.shape[1]):
            s, g = pred[i, c].astype(np.float64), y[i, c].astype(np.float64)
            if g.sum() > 0:
                out[i, c] = 2 * (s * g).sum() / ((s**2).sum() + (g**2).sum())
    return out


def make_data(seed: int, n: int = 6, c: int = 2, h: int = 24, w: int = 20, dtype=np.float32):
    """Random maps with lesions (rectangles), some scores exactly on or next to histogram edges, and some
    image/class pairs without a lesion."""
    rng = np.random.default_rng(seed)
    y = np.zeros((n, c, h, w), dtype=np.float32)
    for i in range(n):
        for k in range(c):
            if (i + k) % 4 == 3:
                continue  # no lesion of this class in this image
            r, s = rng.integers(0, h - 6), rng.integers(0, w - 6)
            y[i, k, r : r + rng.integers(2, 7), s : s + rng.integers(2, 7)] = 1
    pred = (0.6 * rng.random(y.shape) + 0.4 * y * rng.random(y.shape)).astype(dtype)
    flat = pred.reshape(-1)
    idx = rng.choice(flat.size, size=flat.size // 4, replace=False)
    edges = NP_EDGES[rng.integers(0, 1001, size=idx.size)].astype(dtype)  # edges up to 1.0
    nudge = rng.integers(-1, 2, size=idx.size)
    on_edge = np.where(
        nudge < 0, np.nextafter(edges, dtype(-1)), np.where(nudge > 0, np.nextafter(edges, dtype(2)), edges)
    )
    flat[idx] = np.clip(on_edge, 0, 1)
    flat[:3] = [0.0, 1.0, 0.5]
    return pred, y


def t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


# ---------------------------------------------------------------- PxAP
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_histograms_equal_numpy_histogram(dtype):
    pred, y = make_data(0, dtype=dtype)
    hist = compute_pxap_histograms(t(pred), t(y)).numpy()
    assert hist.shape == (6, 2, 2, 1002) and hist.dtype == np.int64
    for i in range(pred.shape[0]):
        for c in range(pred.shape[1]):
            pos, neg = np_hist(pred[i, c], y[i, c])
            np.testing.assert_array_equal(hist[i, c, 1], pos)
            np.testing.assert_array_equal(hist[i, c, 0], neg)


@pytest.mark.parametrize("torch_dtype", [torch.float16, torch.bfloat16])
def test_histograms_of_half_precision_scores_equal_numpy_on_their_values(torch_dtype):
    pred, y = make_data(1)
    pred_t = t(pred).to(torch_dtype)
    hist = compute_pxap_histograms(pred_t, t(y)).numpy()
    exact = pred_t.float().numpy()
    for i in range(pred.shape[0]):
        pos, neg = np_hist(exact[i, 0], y[i, 0])
        np.testing.assert_array_equal(hist[i, 0, 1], pos)
        np.testing.assert_array_equal(hist[i, 0, 0], neg)


def test_image_level_pxap_equals_numpy():
    pred, y = make_data(2)
    metric = PxAPMetric(level="image")
    metric(t(pred), t(y))
    expected = np_image_pxap(pred, y)
    assert np.isnan(expected).any() and not np.isnan(expected).all()
    buffer = metric.get_buffer().numpy()
    np.testing.assert_allclose(buffer, expected, rtol=1e-12, atol=1e-14, equal_nan=True)
    np.testing.assert_allclose(metric.aggregate().numpy(), np.nanmean(expected, 0), rtol=1e-12)
    np.testing.assert_allclose(metric.aggregate(reduction="std").numpy(), np.nanstd(expected, 0), rtol=1e-10)


def test_dataset_level_pxap_equals_numpy():
    pred, y = make_data(3, n=7)
    metric = PxAPMetric(level="dataset")
    metric(t(pred), t(y))
    expected = np_dataset_pxap(pred, y)
    np.testing.assert_allclose(metric.aggregate().numpy(), expected, rtol=1e-12)
    # the same object also gives the image level, and dataset level differs from it on this data
    np.testing.assert_allclose(
        metric.aggregate(level="image").numpy(), np.nanmean(np_image_pxap(pred, y), 0), rtol=1e-12
    )
    assert not np.allclose(expected, metric.aggregate(level="image").numpy())
    hist = metric.get_histograms()
    assert hist.shape == (2, 2, 1002)


@pytest.mark.parametrize("value", [0.0, 0.37, 0.5, 1.0])
def test_constant_map_gives_prevalence_exactly(value):
    y = np.zeros((3, 1, 10, 10), dtype=np.float32)
    y[0, 0, :3, :3] = 1  # 9 / 100
    y[1, 0, 2:9, 1:8] = 1  # 49 / 100
    y[2, 0, 0, :7] = 1  # 7 / 100
    pred = np.full_like(y, value)
    image = PxAPMetric(level="image")
    image(t(pred), t(y))
    assert image.get_buffer()[:, 0].tolist() == [9 / 100, 49 / 100, 7 / 100]
    dataset = PxAPMetric(level="dataset")
    dataset(t(pred), t(y))
    assert dataset.aggregate().item() == 65 / 300
    assert np_ap(*np_hist(pred[0, 0], y[0, 0])) == 9 / 100  # the reference agrees


@pytest.mark.parametrize("low,high", [(0.0, 1.0), (0.2, 0.8), (0.4995, 0.5005)])
def test_perfect_map_gives_one_exactly(low, high):
    y = np.zeros((2, 2, 8, 8), dtype=np.float32)
    y[0, 0, 2:5, 2:6] = 1
    y[1, 1, 5:, :] = 1
    y[1, 0, 0, 0] = 1
    pred = np.where(y == 1, high, low).astype(np.float32)
    for level in ("image", "dataset"):
        metric = PxAPMetric(level=level)
        metric(t(pred), t(y))
        assert metric.aggregate().tolist() == [1.0, 1.0]


def test_pxap_hand_computed_small_case():
    # positives score 0.9, 0.4; negatives 0.6, 0.1 -> thresholds from the top: (tp, fp) = (1, 0), (1, 1), (2, 1),
    # (2, 2); AP = 1 * 0.5 + 2/3 * 0.5
    pred = torch.tensor([[[[0.9, 0.4, 0.6, 0.1]]]])
    y = torch.tensor([[[[1, 1, 0, 0]]]])
    metric = PxAPMetric()
    metric(pred, y)
    assert metric.aggregate().item() == pytest.approx(0.5 + 1 / 3, abs=1e-15)


def test_average_precision_from_histograms_without_positives_is_nan():
    hist = torch.zeros(2, 1002, dtype=torch.int64)
    hist[0, 10] = 5
    assert torch.isnan(average_precision_from_histograms(hist))


# ---------------------------------------------------------------- soft Dice
def test_soft_dice_hand_computed():
    pred = torch.tensor([[[[1.0, 0.5], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]], [[0.25, 0.0], [0.0, 0.0]]]])
    y = torch.tensor([[[[1, 1], [0, 0]], [[0, 1], [0, 0]], [[0, 0], [0, 0]]]])
    dice = compute_soft_dice(pred, y)
    assert dice.shape == (1, 3) and dice.dtype == torch.float64
    assert dice[0, 0].item() == pytest.approx(2 * 1.5 / (1.25 + 2), abs=1e-15)  # 12/13
    assert dice[0, 1].item() == 0.0  # lesion, empty map
    assert torch.isnan(dice[0, 2])  # no lesion: undefined
    perfect = compute_soft_dice(y.float(), y)
    assert perfect[0, :2].tolist() == [1.0, 1.0]


def test_soft_dice_equals_numpy_loop_and_excludes_lesion_free_images():
    pred, y = make_data(4)
    metric = SoftDiceMetric()
    metric(t(pred), t(y))
    expected = np_soft_dice(pred, y)
    buffer = metric.get_buffer().numpy()
    np.testing.assert_array_equal(np.isnan(buffer), np.isnan(expected))
    np.testing.assert_allclose(buffer, expected, rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(metric.aggregate().numpy(), np.nanmean(expected, 0), rtol=1e-6)
    np.testing.assert_allclose(metric.aggregate(reduction="std").numpy(), np.nanstd(expected, 0), rtol=1e-5)


def test_class_without_any_lesion_aggregates_to_nan():
    pred, y = make_data(5)
    y[:, 1] = 0
    for metric in (SoftDiceMetric(), PxAPMetric(level="image"), PxAPMetric(level="dataset")):
        metric(t(pred), t(y))
        result = metric.aggregate()
        assert not torch.isnan(result[0]) and torch.isnan(result[1])
        assert torch.isnan(metric.get_buffer()[:, 1]).all()


# ---------------------------------------------------------------- accumulation and inputs
@pytest.mark.parametrize("make_metric", [SoftDiceMetric, lambda: PxAPMetric(level="dataset")])
def test_several_calls_equal_one_call_on_the_concatenation(make_metric):
    pred, y = make_data(6, n=7)
    whole, parts, listed = make_metric(), make_metric(), make_metric()
    whole(t(pred), t(y))
    for sl in (slice(0, 3), slice(3, 4), slice(4, 7)):
        parts(t(pred[sl]), t(y[sl]))
    listed([t(p) for p in pred], [t(g) for g in y])  # decollated channel-first items
    for other in (parts, listed):
        assert torch.equal(other.get_buffer().isnan(), whole.get_buffer().isnan())
        torch.testing.assert_close(other.get_buffer(), whole.get_buffer(), equal_nan=True, rtol=0, atol=0)
        torch.testing.assert_close(other.aggregate(), whole.aggregate(), rtol=0, atol=0)
    if isinstance(whole, PxAPMetric):
        assert torch.equal(parts.get_histograms(), whole.get_histograms())
        torch.testing.assert_close(parts.aggregate(level="image"), whole.aggregate(level="image"), rtol=1e-15, atol=0)


def test_reset_starts_again():
    pred, y = make_data(7)
    metric = PxAPMetric(level="dataset")
    metric(t(pred) * 0.5, t(y))
    metric.reset()
    metric(t(pred), t(y))
    np.testing.assert_allclose(metric.aggregate().numpy(), np_dataset_pxap(pred, y), rtol=1e-12)
    assert len(metric.get_buffer()) == len(pred)


@pytest.mark.parametrize("make_metric", [SoftDiceMetric, PxAPMetric])
@pytest.mark.parametrize(
    "pred,y,match",
    [
        (torch.rand(2, 1, 4, 4), torch.zeros(2, 1, 4, 5), "same shape"),
        (torch.rand(1, 4, 4), torch.zeros(1, 4, 4), "y_pred must be 4-D"),
        (torch.rand(2, 1, 4, 4), torch.zeros(2, 1, 16), "y must be 4-D"),
        (torch.full((1, 1, 2, 2), 1.5), torch.zeros(1, 1, 2, 2), r"y_pred must contain scores in \[0, 1\]"),
        (torch.full((1, 1, 2, 2), -0.1), torch.zeros(1, 1, 2, 2), r"y_pred must contain scores in \[0, 1\]"),
        (torch.tensor([[[[0.5, float("nan")]]]]), torch.zeros(1, 1, 1, 2), "1 NaN"),
        (torch.rand(1, 1, 2, 2), torch.full((1, 1, 2, 2), 0.5), "y must be a binary mask"),
        (torch.rand(1, 1, 2, 2), torch.full((1, 1, 2, 2), 2), "y must be a binary mask"),
        (torch.rand(1, 1, 2, 2) > 0.5, torch.zeros(1, 1, 2, 2), "y_pred must hold real scores"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(make_metric, pred, y, match):
    with pytest.raises(ValueError, match=match):
        make_metric()(pred, y)


def test_bad_arguments():
    with pytest.raises(ValueError, match="level"):
        PxAPMetric(level="pixel")
    with pytest.raises(ValueError, match="step"):
        PxAPMetric(step=0)
    with pytest.raises(ValueError, match="no data"):
        SoftDiceMetric().aggregate()
    with pytest.raises(ValueError, match="no data"):
        PxAPMetric(level="dataset").aggregate()
    metric = PxAPMetric(level="dataset")
    metric(torch.rand(1, 2, 4, 4), torch.ones(1, 2, 4, 4))
    with pytest.raises(ValueError, match="only defined for level='image'"):
        metric.aggregate(reduction="std")
    with pytest.raises(ValueError, match="reduction"):
        metric.aggregate(reduction="median", level="image")
    for other in (metric, SoftDiceMetric()):
        other(torch.rand(1, 2, 4, 4), torch.ones(1, 2, 4, 4))
        with pytest.raises(ValueError, match="3 classes but earlier batches had 2"):
            other(torch.rand(1, 3, 4, 4), torch.ones(1, 3, 4, 4))


def test_check_values_off_skips_value_checks_and_drops_out_of_range_scores():
    pred = torch.tensor([[[[0.5, 4.0, -1.0, 3.0]]]])
    y = torch.tensor([[[[1, 1, 0, 0]]]])
    hist = compute_pxap_histograms(pred, y, check_values=False)
    pos, neg = np_hist(pred.numpy()[0, 0], y.numpy()[0, 0])  # numpy also keeps 3.0 (closed last bin)
    np.testing.assert_array_equal(hist[0, 0, 1].numpy(), pos)
    np.testing.assert_array_equal(hist[0, 0, 0].numpy(), neg)
    assert hist.sum() == 2


def test_step_option_follows_the_same_procedure():
    pred, y = make_data(8, n=3)
    edges = np.append(np.arange(0, 1, 0.01), [1.0, 2.0, 3.0])
    metric = PxAPMetric(level="dataset", step=0.01)
    metric(t(pred), t(y))
    hist = metric.get_histograms().numpy()
    c = 0
    lesion = [i for i in range(3) if y[i, c].any()]
    pos = sum(np.histogram(pred[i, c][y[i, c] == 1], bins=edges)[0] for i in lesion)
    neg = sum(np.histogram(pred[i, c][y[i, c] == 0], bins=edges)[0] for i in lesion)
    np.testing.assert_array_equal(hist[c, 1], pos)
    np.testing.assert_array_equal(hist[c, 0], neg)
    assert metric.aggregate()[c].item() == pytest.approx(np_ap(pos.astype(float), neg.astype(float)), rel=1e-12)


# ---------------------------------------------------------------- devices
@requires_cuda
@pytest.mark.cuda
def test_cpu_and_cuda_agree():
    pred, y = make_data(9, n=5, h=64, w=48)
    results = {}
    for device in ("cpu", "cuda"):
        dice, pxap = SoftDiceMetric(), PxAPMetric(level="dataset")
        for sl in (slice(0, 2), slice(2, 5)):
            dice(t(pred[sl]).to(device), t(y[sl]).to(device))
            pxap(t(pred[sl]).to(device), t(y[sl]).to(device))
        assert pxap.get_histograms().device.type == device
        results[device] = [
            dice.get_buffer().cpu(),
            dice.aggregate().cpu(),
            pxap.get_buffer().cpu(),
            pxap.aggregate().cpu(),
            pxap.aggregate(level="image").cpu(),
            pxap.get_histograms().cpu(),
        ]
    for a, b in zip(results["cpu"], results["cuda"]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, equal_nan=True)
    assert torch.equal(results["cpu"][-1], results["cuda"][-1])


@requires_cuda
@pytest.mark.cuda
def test_no_host_synchronisation_per_call_on_cuda():
    pred, y = make_data(11, n=4)
    pred_c, y_c = t(pred).cuda(), t(y).cuda()
    dice, pxap = SoftDiceMetric(check_values=False), PxAPMetric(check_values=False)
    dice(pred_c[:1], y_c[:1])  # first call builds the cached edges on the device
    pxap(pred_c[:1], y_c[:1])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(1, 4):
            dice(pred_c[i : i + 1], y_c[i : i + 1])
            pxap(pred_c[i : i + 1], y_c[i : i + 1])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    np.testing.assert_allclose(pxap.aggregate().cpu().numpy(), np.nanmean(np_image_pxap(pred, y), 0), rtol=1e-12)


# ---------------------------------------------------------------- DDP
def _metric_results(shards: list) -> dict:
    dice, pxap = SoftDiceMetric(), PxAPMetric(level="dataset")
    for pred, y in shards:
        dice(pred, y)
        pxap(pred, y)
    # the Ignite handlers aggregate through the same collective calls
    engine = Engine(lambda e, batch: batch)
    SoftDice(class_index=0).attach(engine, "dice_benign")
    PxAP(level="dataset").attach(engine, "pxap_dataset_mean")
    engine.run(shards)
    return {
        "handlers": torch.tensor(
            [engine.state.metrics["dice_benign"], engine.state.metrics["pxap_dataset_mean"]], dtype=torch.float64
        ),
        "dice_buffer": dice.get_buffer(),
        "dice": dice.aggregate(),
        "dice_std": dice.aggregate(reduction="std"),
        "pxap_buffer": pxap.get_buffer(),
        "pxap_dataset": pxap.aggregate(),
        "pxap_image": pxap.aggregate(level="image"),
        "hist": pxap.get_histograms(),
    }


def _ddp_worker(rank: int, world_size: int, port: int, shards: list, result_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        torch.save(_metric_results(shards[rank]), f"{result_file}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_processes_equal_one_process_on_the_union(tmp_path):
    pred, y = make_data(10, n=7)
    # uneven shards (4 and 3 images, in batches of different sizes) exercise MONAI's padded gather
    shards = [
        [(t(pred[0:3]), t(y[0:3])), (t(pred[3:4]), t(y[3:4]))],
        [(t(pred[4:7]), t(y[4:7]))],
    ]
    result_file = str(tmp_path / "result")
    mp.spawn(_ddp_worker, args=(2, free_port(), shards, result_file), nprocs=2, join=True)
    ranks = [torch.load(f"{result_file}.{r}", weights_only=True) for r in range(2)]

    single = _metric_results([(t(pred), t(y))])
    np.testing.assert_allclose(single["pxap_dataset"].numpy(), np_dataset_pxap(pred, y), rtol=1e-12)
    expected_handlers = [single["dice"][0].item(), single["pxap_dataset"].mean().item()]
    assert single["handlers"].tolist() == pytest.approx(expected_handlers, rel=1e-15)
    for result in ranks:  # every rank sees the global result
        assert torch.equal(result["hist"], single["hist"])
        for key in single:
            torch.testing.assert_close(result[key], single[key], rtol=1e-15, atol=0, equal_nan=True)
