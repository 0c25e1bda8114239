"""The metrics' growing buffers: MONAI's ``Cumulative`` results from one tensor per buffer, a heap that stays flat,
and the ROC AUC over them (metric and handler) against a pairwise count."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

import numpy as np
import pytest
import torch
from ignite.engine import Engine
from monai.handlers import from_engine
from monai.metrics import Cumulative, ROCAUCMetric
from references import np_auc

from scripts.handlers import ROCAUC
from scripts.metrics import CompactCumulative, CompactROCAUCMetric, SoftDiceMetric


class Buffer(CompactCumulative, Cumulative):
    def aggregate(self):
        return self.get_buffer()


class MonaiBuffer(Cumulative):
    def aggregate(self):
        return self.get_buffer()


def test_buffers_give_monai_results_past_several_doublings():
    g = torch.Generator().manual_seed(0)
    ours, monai = Buffer(), MonaiBuffer()
    for size in (1, 3, 70, 5, 200, 2):  # 64 rows at first: the 70 and the 200 each grow the buffer
        a, b = torch.rand(size, 2, generator=g), torch.randint(0, 5, (size, 3, 2), generator=g)
        ours.extend(a, b)
        monai.extend(a, b)
    got, expected = ours.get_buffer(), monai.get_buffer()
    assert len(ours) == len(monai) == 281
    for x, y in zip(got, expected):
        assert x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)


def test_channel_first_rows_append_and_dtype_promotion():
    ours, monai = Buffer(), MonaiBuffer()
    for buf in (ours, monai):
        buf.extend(torch.tensor([[1, 2], [3, 4]]))  # int64 rows
        buf.append(torch.tensor([0.5, 1.5]))  # then a float32 sample: the rows become float32
    assert torch.equal(ours.get_buffer(), monai.get_buffer())
    assert ours.get_buffer().dtype == torch.float32
    assert ours.get_buffer().tolist() == [[1.0, 2.0], [3.0, 4.0], [0.5, 1.5]]
    # a list of channel-first tensors is a batch (MONAI's own conversion refuses rows of more than one value)
    listed = Buffer()
    listed.extend([torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])])
    assert listed.get_buffer().tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_get_buffer_is_a_copy_and_reset_empties():
    buf = Buffer()
    assert buf.get_buffer() is None and len(buf) == 0
    buf.extend(torch.ones(2, 3))
    copy = buf.get_buffer()
    copy += 1
    assert torch.equal(buf.get_buffer(), torch.ones(2, 3))
    buf.reset()
    assert buf.get_buffer() is None and len(buf) == 0


def test_rows_of_another_shape_or_buffer_count_are_refused():
    buf = Buffer()
    buf.extend(torch.zeros(2, 3))
    with pytest.raises(TypeError, match=r"rows of shape \(4,\) on cpu cannot join a buffer of rows of shape \(3,\)"):
        buf.extend(torch.zeros(1, 4))
    with pytest.raises(TypeError, match="2 buffers given, 1 before"):
        buf.extend(torch.zeros(1, 3), torch.zeros(1, 3))


def _heap_bytes() -> int | None:
    """glibc's heap size (mallinfo2's arena), or None on another C library."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if not hasattr(libc, "mallinfo2"):
        return None

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks".split()]

    libc.mallinfo2.restype = MallInfo2
    return int(libc.mallinfo2().arena)


def test_the_heap_stays_flat_over_many_images():
    """Each image's maps (2.8 MB) are freed while a metric keeps its value: the heap must not grow per image."""
    if _heap_bytes() is None:
        pytest.skip("glibc's mallinfo2 is not available")
    metric = SoftDiceMetric()
    mask = torch.zeros(1, 2, 736, 480)
    mask[0, 1, 100:160, 200:260] = 1
    maps = torch.rand(1, 2, 736, 480)
    metric(y_pred=maps, y=mask)  # first allocations (buffers, caches) before the heap is measured
    start = _heap_bytes()
    for _ in range(300):
        metric(y_pred=maps * 0.5, y=mask)  # a transient map per image, freed after the call
    grown = _heap_bytes() - start
    assert len(metric.get_buffer()) == 301
    # with MONAI's per-image buffers this loop grew glibc's heap by 1,245 MiB (4 MiB per image)
    assert grown < 100 * 2**20, f"the heap grew by {grown / 2**20:.0f} MiB over 300 images"


def test_roc_auc_metric_matches_monai_and_a_pairwise_count():
    g = torch.Generator().manual_seed(3)
    scores, labels = torch.rand(150, 2, generator=g), (torch.rand(150, 2, generator=g) < 0.4).float()
    ours, monai = CompactROCAUCMetric(average="none"), ROCAUCMetric(average="none")
    for lo in range(0, 150, 7):
        ours(scores[lo : lo + 7], labels[lo : lo + 7])
        monai(scores[lo : lo + 7], labels[lo : lo + 7])
    expected = [np_auc(scores[:, c].numpy(), labels[:, c].numpy()) for c in range(2)]
    assert list(ours.aggregate()) == pytest.approx(expected, abs=1e-12)
    assert list(monai.aggregate()) == pytest.approx(expected, abs=1e-12)
    assert ours.aggregate(average="macro") == pytest.approx(np.mean(expected), abs=1e-12)


def run_auc(batches, **handlers):
    engine = Engine(lambda e, batch: [{"score": s, "label": y} for s, y in zip(*batch)])
    for name, handler in handlers.items():
        handler.attach(engine, name)
    engine.run(batches)
    return engine.state.metrics


def test_roc_auc_handler_publishes_a_class_or_the_mean_of_the_defined_ones(caplog):
    g = torch.Generator().manual_seed(5)
    scores = torch.rand(40, 2, generator=g)
    labels = torch.stack([(torch.rand(40, generator=g) < 0.5).float(), torch.zeros(40)], 1)  # malignant: all 0
    batches = [(scores[lo : lo + 8], labels[lo : lo + 8]) for lo in range(0, 40, 8)]
    transform = from_engine(["score", "label"])
    benign = np_auc(scores[:, 0].numpy(), labels[:, 0].numpy())
    with caplog.at_level(logging.WARNING):
        m = run_auc(
            batches,
            auc_benign=ROCAUC(class_index=0, output_transform=transform),
            auc_malignant=ROCAUC(class_index=1, empty_value=-1.0, output_transform=transform),
            auc_mean=ROCAUC(output_transform=transform),
        )
    assert m["auc_benign"] == pytest.approx(benign, abs=1e-12)
    assert m["auc_malignant"] == -1.0
    assert m["auc_mean"] == pytest.approx(benign, abs=1e-12)  # the undefined class is left out of the mean
    assert "auc_malignant: n/a (the epoch's labels of class 1 are all alike)" in caplog.text
