"""The training dataset's cache of the deterministic preprocessing: same items as without it, reused, never stale."""

from __future__ import annotations

import torch
from conftest import TINY_CONFIG, TRAIN_CONFIG
from monai.bundle import ConfigParser
from monai.data.utils import set_rnd

from scripts.workflows import training_dataset


def _parser(datalist: str, **overrides) -> ConfigParser:
    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(TINY_CONFIG)])
    parser["datalist"] = datalist
    for key, value in overrides.items():
        parser[key] = value
    return parser


def _items(dataset, seed: int) -> list[dict]:
    set_rnd(dataset, seed)
    return [dataset[i] for i in range(len(dataset))]


def test_cached_items_equal_uncached_ones_with_the_same_random_draws(tiny_datalist: str):
    parser = _parser(tiny_datalist)
    data = parser.get_parsed_content("train_datalist")[:6]
    transform = parser.get_parsed_content("train#preprocessing")
    reference = _items(training_dataset(data, transform), seed=7)
    cached = training_dataset(data, transform, cache="true")  # as a command-line override arrives
    assert len(cached._cache) == 6  # filled on construction
    for want, got in zip(reference, _items(cached, seed=7)):
        assert set(got) == set(want)
        for key in ("image", "mask", "label"):
            assert torch.equal(torch.as_tensor(got[key]), torch.as_tensor(want[key])), key
    # the random window shift and augmentations still change from one epoch to the next
    other = _items(cached, seed=8)
    assert any(not torch.equal(a["image"], b["image"]) for a, b in zip(other, reference))


def test_the_cache_holds_the_deterministic_prefix_with_masks_as_bytes(tiny_datalist: str):
    parser = _parser(tiny_datalist, train_cache=True)
    dataset = parser.get_parsed_content("train#dataset")
    entry = dataset._cache[0]
    assert entry["image"].dtype == torch.float32 and entry["mask_benign"].dtype == torch.uint8
    # cropped to the breast, not yet windowed to the model's input size
    assert tuple(entry["image"].shape[-2:]) != tuple(parser.get_parsed_content("image_size"))
