"""The quick start's data generation says what it does while it runs (bundle/scripts/data/synthetic/dataset.py):
one line when it starts, one at every tenth of the images, nothing when the data set is reused."""

from __future__ import annotations

import re

import pytest


@pytest.mark.parametrize("workers", [1, 2])
def test_synthetic_data_generation_logs_its_progress(tmp_path, caplog, workers):
    from glam_benchmark.synthetic import ensure_synthetic_dataset

    with caplog.at_level("INFO", logger="glam_benchmark.synthetic"):
        datalist = ensure_synthetic_dataset(tmp_path, 20, size=(128, 80), seed=3, workers=workers)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("generating 20 synthetic images for ")
    progress = re.compile(r"synthetic data: (\d+)/20 images written")
    written = [int(m.group(1)) for m in map(progress.match, messages) if m]
    assert written == list(range(2, 21, 2))  # every tenth, in order, up to all of them

    caplog.clear()
    with caplog.at_level("INFO", logger="glam_benchmark.synthetic"):
        assert ensure_synthetic_dataset(tmp_path, 20, size=(128, 80), seed=3, workers=workers) == datalist
    assert not caplog.records  # reused: nothing generated, nothing said
