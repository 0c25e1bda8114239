"""The cache of the deterministic preprocessing (train_cache / val_cache): the same items as without it, compact
(uint16 images, uint8 masks), reused across datasets and processes (disk), and never stale."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_CONFIG, TRAIN_CONFIG
from monai.bundle import ConfigParser
from monai.data import PersistentDataset
from monai.transforms import Compose, Transform
from PIL import Image

from scripts.training.datasets import cache_mode, training_dataset


def _parser(datalist: str, **overrides) -> ConfigParser:
    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(TINY_CONFIG)])
    parser["datalist"] = datalist
    for key, value in overrides.items():
        parser[key] = value
    return parser


class CountCalls(Transform):
    """Counts the items that went through the chain (a cache hit skips the whole chain)."""

    def __init__(self) -> None:
        self._calls = 0  # private: not part of the cache's hash of the transforms' settings

    def __call__(self, data):
        self._calls += 1
        return dict(data)


def _chain(parser: ConfigParser, config_id: str) -> tuple[Compose, CountCalls]:
    counter = CountCalls()
    return Compose([counter, *parser.get_parsed_content(config_id).transforms]), counter


def _items(dataset) -> list[dict]:
    return [dataset[i] for i in range(len(dataset))]


def _assert_same_items(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert set(g) == set(w)
        for key in w:
            if isinstance(w[key], torch.Tensor):
                assert g[key].dtype == w[key].dtype and torch.equal(g[key], w[key]), key
            else:
                assert g[key] == w[key], key


@pytest.mark.parametrize("config_id", ["train#preprocessing", "validate#preprocessing"])
def test_memory_and_disk_caches_give_the_uncached_items(tmp_path, tiny_datalist: str, config_id: str):
    parser = _parser(tiny_datalist, train_masks=True)
    data = parser.get_parsed_content("train_datalist")[:6]
    chain, counter = _chain(parser, config_id)
    reference = _items(training_dataset(data, chain, cache="none"))
    assert counter._calls == 6
    memory = training_dataset(data, chain, cache="memory")
    assert counter._calls == 12  # filled on construction
    _assert_same_items(_items(memory), reference)
    disk = training_dataset(data, chain, cache="disk", cache_dir=tmp_path / "cache")
    assert isinstance(disk, PersistentDataset) and disk.weights_only
    _assert_same_items(_items(disk), reference)  # the first pass computes and writes ...
    assert counter._calls == 18 and len(list((tmp_path / "cache").glob("*.pt"))) == 6
    again = training_dataset(data, chain, cache="disk", cache_dir=tmp_path / "cache")
    _assert_same_items(_items(again), reference)  # ... another dataset (a later stage or run) only reads
    assert counter._calls == 18
    # compact: the image as uint16 (the synthetic PNGs' own values), the masks as bytes, plain tensors
    entry = reference[0]
    assert entry["image"].dtype == torch.uint16 and entry["mask"].dtype == torch.uint8
    assert type(entry["image"]) is torch.Tensor
    window = parser.get_parsed_content("image_size")
    margin = parser.get_parsed_content("max_shift") if config_id.startswith("train") else [0, 0]
    assert list(entry["image"].shape[-2:]) == [w + 2 * m for w, m in zip(window, margin)]


def test_a_changed_file_or_setting_is_never_served_from_the_cache(tmp_path, tiny_datalist: str):
    parser = _parser(tiny_datalist)
    data = [dict(d) for d in parser.get_parsed_content("train_datalist")[:2]]
    # a copy of the first image, to rewrite
    image = tmp_path / "image.png"
    image.write_bytes(Path(data[0]["image"]).read_bytes())
    data[0]["image"] = str(image)
    chain, counter = _chain(parser, "train#preprocessing")
    cache = tmp_path / "cache"
    before = training_dataset(data, chain, cache="disk", cache_dir=cache)[0]["image"]
    assert counter._calls == 1
    # the same path, new pixels (written a moment later: another modification time)
    pixels = np.asarray(Image.open(image))
    time.sleep(0.01)
    Image.fromarray((pixels // 2).astype(pixels.dtype)).save(image)
    os.utime(image, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    after = training_dataset(data, chain, cache="disk", cache_dir=cache)[0]["image"]
    assert counter._calls == 2 and not torch.equal(after, before)
    # another crop setting: other cache files, another region
    changed, counter2 = _chain(_parser(tiny_datalist, crop_buffer=0), "train#preprocessing")
    training_dataset(data, changed, cache="disk", cache_dir=cache)[0]
    assert counter2._calls == 1 and len(list(cache.glob("*.pt"))) == 3


def test_train_and_validation_datasets_cache_as_configured(tmp_path, tiny_datalist: str):
    parser = _parser(tiny_datalist, train_cache="disk", val_cache="memory", output_root=str(tmp_path / "eval"))
    train = parser.get_parsed_content("train#dataset")
    assert isinstance(train, PersistentDataset) and Path(train.cache_dir) == tmp_path / "cache"
    assert type(parser.get_parsed_content("validate#dataset")).__name__ == "CacheDataset"


def test_cache_mode_values():
    assert [cache_mode(v) for v in ("disk", "Memory", "none", None)] == ["disk", "memory", "none", "none"]
    # the yes/no spellings of presets before 1.0 are refused with the valid modes named
    for old in ("ssd", True, "false"):
        with pytest.raises(ValueError, match=r"cache must be one of \('none', 'memory', 'disk'\), got"):
            cache_mode(old)
    with pytest.raises(ValueError, match="needs a cache_dir"):
        training_dataset([], Compose([]), cache="disk")


def test_a_damaged_disk_cache_entry_is_recomputed_with_a_warning(tmp_path, tiny_datalist: str, caplog):
    """A truncated cache file, one with random bytes written over its cached pixels, and one rewritten with other
    pixels but its old checksum are each recomputed (the same items as uncached), with a warning naming the file;
    the rewritten files then serve the next dataset without recomputing."""
    parser = _parser(tiny_datalist)
    data = parser.get_parsed_content("train_datalist")[:3]
    chain, counter = _chain(parser, "train#preprocessing")
    reference = _items(training_dataset(data, chain, cache="none"))
    cache = tmp_path / "cache"
    _assert_same_items(_items(training_dataset(data, chain, cache="disk", cache_dir=cache)), reference)
    assert counter._calls == 6
    files = {}
    for path in cache.glob("*.pt"):
        entry = torch.load(path, weights_only=True)
        files[entry["data"]["image_path"]] = path
    truncated, scribbled, swapped = (files[item["image_path"]] for item in reference)
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    # random bytes over the image's pixels where they sit in the file (torch stores tensors uncompressed)
    raw = bytearray(scribbled.read_bytes())
    pixels = reference[1]["image"].numpy().tobytes()
    start = raw.find(pixels[:256])
    assert start > 0
    raw[start + 100 : start + 164] = np.random.default_rng(0).integers(0, 256, 64, dtype=np.uint8).tobytes()
    scribbled.write_bytes(bytes(raw))
    # a well-formed file whose pixels no longer match the checksum stored with them
    entry = torch.load(swapped, weights_only=True)
    changed = entry["data"]["image"].numpy().copy()  # uint16: torch has no arithmetic for it
    changed[..., 5, 5] ^= 1
    entry["data"]["image"] = torch.from_numpy(changed)
    torch.save(entry, swapped)
    caplog.set_level("WARNING", logger="scripts.training.datasets")
    again = _items(training_dataset(data, chain, cache="disk", cache_dir=cache))
    _assert_same_items(again, reference)
    assert counter._calls == 9  # the three were recomputed
    warned = [r.getMessage() for r in caplog.records if "recomputing" in r.getMessage()]
    for path in (truncated, scribbled, swapped):
        assert sum(str(path) in m for m in warned) == 1, (path, warned)
    assert any("does not match its checksum" in m for m in warned if str(swapped) in m)
    caplog.clear()
    _assert_same_items(_items(training_dataset(data, chain, cache="disk", cache_dir=cache)), reference)
    assert counter._calls == 9 and not [r for r in caplog.records if "recomputing" in r.getMessage()]
