"""The localisation probe (tools/probe_localisation.py) and what needs no learning
(tools/glam_benchmark/trivial.py): helpers against hand-made cases and loops, and one learning test."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, requires_cuda

sys.path.insert(0, str(REPO_ROOT / "tools"))
from glam_benchmark import trivial  # noqa: E402

_spec = importlib.util.spec_from_file_location("probe_localisation", REPO_ROOT / "tools" / "probe_localisation.py")
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


def loop_auc(scores, labels):
    """Share of (positive, negative) pairs ranked right, ties half: the definition, pair by pair."""
    total = count = 0.0
    for s_p, y_p in zip(scores, labels):
        for s_n, y_n in zip(scores, labels):
            if y_p == 1 and y_n == 0:
                total += 1.0 if s_p > s_n else 0.5 if s_p == s_n else 0.0
                count += 1
    return total / count


def test_auc_matches_the_pairwise_definition_and_is_nan_without_both_classes():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, 40).astype(float)  # many ties
    labels = rng.integers(0, 2, 40)
    assert trivial.auc(scores, labels) == pytest.approx(loop_auc(scores, labels))
    assert trivial.auc(np.array([0.1, 0.9]), np.array([0, 1])) == 1.0
    assert np.isnan(trivial.auc(np.array([0.1, 0.2]), np.array([1, 1])))


def test_the_probe_and_the_baselines_see_the_validation_workflows_model_inputs(tiny_datalist):
    """validation_transform (the probe's and the trivial baselines' data) = the cached validation chain then its
    per-step half: the standardised window the validation evaluator feeds the model, with masks and labels."""
    from conftest import TINY_CONFIG, TRAIN_CONFIG
    from monai.bundle import ConfigParser
    from monai.data import list_data_collate

    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(TINY_CONFIG)])
    parser["datalist"] = tiny_datalist
    items = parser.get_parsed_content("val_datalist")[:3]
    split = trivial.preprocess_items(items, trivial.validation_transform(parser))
    cached = [parser.get_parsed_content("validate#preprocessing")(dict(item)) for item in items]
    image, targets, _, _ = parser.get_parsed_content("validate#prepare_batch")(list_data_collate(cached), "cpu")
    torch.testing.assert_close(split["image"].float(), image.to(torch.float16).float(), rtol=0, atol=0)
    assert torch.equal(split["mask"], targets["mask"].to(torch.uint8)) and torch.equal(split["label"], targets["label"])
    flat = split["image"].float().flatten(1)
    torch.testing.assert_close(flat.mean(1), torch.zeros(3), rtol=0, atol=2e-3)
    torch.testing.assert_close(flat.std(1, unbiased=False), torch.ones(3), rtol=0, atol=2e-3)


def test_breast_statistics_ignore_the_background():
    image = torch.full((1, 1, 4, 4), -1.0)
    image[0, 0, :2, :2] = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    stats = trivial.breast_statistics(image)
    assert stats["max"][0] == 6.0 and stats["mean"][0] == 3.0
    assert stats["std"][0] == pytest.approx(np.std([1, 2, 3, 6], ddof=1))


def test_brightest_cell_map_peaks_on_the_brightest_block_and_the_baselines_count_hits():
    images = torch.zeros(2, 1, 32, 32)
    images[0, 0, 20:24, 4:8] = 5.0  # image 0: bright block at rows 16-23, cols 0-7 of the 8-px grid
    images[1, 0, 0:4, 24:28] = 5.0  # image 1: bright block in the top-right cell
    maps = trivial.brightest_cell_maps(images, 8)
    assert maps.shape == (2, 2, 32, 32)
    assert maps[0, 0, 16:24, 0:8].min() == 1.0 and maps[0, 0].sum() == 64.0  # one cell at 1, the rest 0
    masks = torch.zeros(2, 2, 32, 32, dtype=torch.uint8)
    masks[0, 1, 18:22, 2:6] = 1  # malignant lesion under image 0's bright block: a hit
    masks[1, 0, 26:30, 2:6] = 1  # benign lesion far from image 1's bright block: a miss
    labels = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    # the peak of a block of ones is its centre, (19.5, 3.5): within 1 px of the lesion's pixel centres
    out = trivial.no_learning_baselines(images, masks, labels, cell=8, tolerance=1.0)
    assert out["brightest_cell_hit"] == {"benign": 0.0, "malignant": 1.0}
    assert out["brightest_cell_pooled"] == 0.5 and out["cell"] == 8
    # the maximum ranks image 0 (the malignant one) and image 1 equally: AUC 0.5 for either class
    assert out["statistics"]["max"]["malignant"] == 0.5


def test_shift_batch_translates_and_fills_with_the_background():
    images = torch.arange(16.0).reshape(1, 1, 4, 4) + 1
    images[0, 0, 0, 0] = 0.0  # the minimum, used as the fill
    gen = torch.Generator().manual_seed(0)
    for _ in range(10):
        shifted = probe.shift_batch(images, (2, 2), gen)
        # every value is either the fill or one of the image's values, and one block of the image survives intact
        assert set(shifted.flatten().tolist()) <= set(images.flatten().tolist())
    assert torch.equal(probe.shift_batch(images, (0, 0), gen), images)


def test_set_values_and_config_loading():
    assert probe.parse_value("[1, 2]") == [1, 2] and probe.parse_value("1e-3") == 1e-3
    assert probe.parse_value("replicate") == "replicate" and probe.parse_value("True") is True
    parser = probe.load_parser(REPO_ROOT / "configs" / "benchmark_cpu.yaml", "cam", {"cam_t": 1.0})
    assert parser.get("stage") == "global" and parser.get("cam_t") == 1.0
    with pytest.raises(ValueError, match="--model"):
        probe.load_parser(None, "unet", {})
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        probe.load_parser(REPO_ROOT / "missing.yaml", "glam", {})


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_the_probe_runs_on_a_device_in_bf16_and_repeats_itself_in_float32(tmp_path, tiny_datalist, device):
    """Two epochs on the tiny data: float32 twice gives the same figures (the draws come from CPU generators);
    with bf16 the global module's convolutions ran in bf16 and every figure is defined; images/s per epoch."""

    def parser():  # a fresh one per run: a parser keeps the network it built (and trained)
        return probe.load_parser(REPO_ROOT / "tests" / "configs" / "tiny.yaml", "glam", {"datalist": tiny_datalist})

    runs = [probe.run_probe(parser(), 2, tmp_path / "cache", log=lambda _: None, device=device) for _ in range(2)]
    for a, b in zip(runs[0]["epochs"], runs[1]["epochs"]):  # assert_equal: NaN (a class without lesions) == NaN
        np.testing.assert_equal(*({k: v for k, v in e.items() if k not in ("seconds", "images_per_s")} for e in (a, b)))
    dtypes = set()
    conv = torch.nn.Conv2d.forward

    def spy(self, x):
        out = conv(self, x)
        dtypes.add(out.dtype)
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.Conv2d, "forward", spy)
        bf16 = probe.run_probe(parser(), 2, tmp_path / "cache", log=lambda _: None, device=device, bf16=True)
    assert dtypes == {torch.bfloat16}
    for epoch in bf16["epochs"]:
        assert np.isfinite(epoch["loss"]) and epoch["images_per_s"] > 0
        assert all(0 <= v <= 1 for v in epoch["hit"] + epoch["dice"] if not np.isnan(v))


def test_the_probe_saves_its_best_epoch_tests_it_and_starts_from_a_saved_module(tmp_path, tiny_datalist):
    """--save writes the epoch of the best validation pointing game (reloaded, it scores that epoch's validation
    figures again); --test scores it on the test split beside that split's no-learning baselines; --init starts
    from a saved module, strictly (a module of other settings is refused by name)."""

    def parser(**overrides):
        preset = REPO_ROOT / "tests" / "configs" / "tiny.yaml"
        return probe.load_parser(preset, "glam", {"datalist": tiny_datalist, **overrides})

    lines: list[str] = []
    saved = tmp_path / "best.pt"
    result = probe.run_probe(parser(), 3, tmp_path / "cache", log=lines.append, save=saved, test=True)
    hits = [float(np.nanmean(e["hit"])) for e in result["epochs"]]
    assert result["best_epoch"] == 1 + int(np.argmax(hits)) and saved.is_file()
    network = probe.load_weights(parser().get_parsed_content("network_def"), saved)
    val = probe.preprocess_split(
        parser().get_parsed_content("datalist_content")["validation"],
        probe.validation_transform(parser()),
        tmp_path / "cache",
        {"image_size": [256, 160], "crop": [5, 4]},
    )
    again = probe.evaluate(network, val, result["tolerance"], 4.0, memory_format=torch.channels_last)
    best = result["epochs"][result["best_epoch"] - 1]
    np.testing.assert_allclose(again["hit"], best["hit"])
    np.testing.assert_allclose(again["dice"], best["dice"], rtol=1e-6)
    n_test = len(json.loads(open(tiny_datalist).read())["test"])
    assert set(result["test"]) == {"auc", "dice", "hit", "border"} and "brightest_cell_hit" in result["test_baselines"]
    assert any(line.startswith(f"test ({n_test} images, epoch {result['best_epoch']})") for line in lines)
    probe.run_probe(parser(), 1, tmp_path / "cache", log=lines.append, init=saved)
    assert f"initialised from {saved}" in lines
    with pytest.raises(ValueError, match="patch_size"):
        probe.run_probe(parser(patch_size=32), 1, tmp_path / "cache", log=lines.append, init=saved)


def test_the_cache_is_computed_once_and_written_under_a_unique_temporary_name(tmp_path, monkeypatch):
    calls = []

    def transform(item):  # a deterministic preprocessing that counts its calls
        calls.append(item["id"])
        return {
            "image": torch.full((1, 2, 2), float(item["id"])),
            "mask": torch.zeros(2, 2, 2),
            "label": torch.tensor([0, 1]),
        }

    items = [{"id": 1}, {"id": 2}]
    first = probe.preprocess_split(items, transform, tmp_path, {"image_size": [2, 2]})
    again = probe.preprocess_split(items, transform, tmp_path, {"image_size": [2, 2]})
    assert calls == [1, 2] and torch.equal(again["image"], first["image"]) and again["image"][1].max() == 2.0
    assert [p.suffix for p in tmp_path.iterdir()] == [".pt"]  # no temporary file left behind
    probe.preprocess_split(items, transform, tmp_path, {"image_size": [4, 4]})  # other settings: another file
    assert calls == [1, 2, 1, 2] and len(list(tmp_path.iterdir())) == 2

    # a second probe finishing the same cache file while the first writes it: both succeed, the file is whole
    real_save, nested = torch.save, []

    def save_twice(obj, f):
        real_save(obj, f)
        if not nested:  # the other probe writes and renames its file between this one's write and its rename
            nested.append(True)
            probe.preprocess_split(items, transform, tmp_path / "shared", {"image_size": [2, 2]})

    monkeypatch.setattr(probe.torch, "save", save_twice)
    shared = probe.preprocess_split(items, transform, tmp_path / "shared", {"image_size": [2, 2]})
    monkeypatch.undo()
    assert torch.equal(shared["image"], first["image"])
    assert torch.equal(torch.load(next((tmp_path / "shared").glob("*.pt")), weights_only=True)["image"], first["image"])


@pytest.mark.slow
def test_a_few_cpu_minutes_of_the_recipe_localise_well_above_chance(tmp_path):
    """The learning test: the CPU benchmark's global module (small receptive fields, replicate padding,
    breast-only pooling, top-t 1 %, no sparsity term) trained by the probe for 8 epochs on the quick start's 400
    synthetic 368x240 images. Its pointing game (peak within 16 px of a lesion of the map's class) starts near
    chance and ends far above it: measured with these settings 0.00 / 0.06 at epoch 1 and 0.38 / 0.56 at epoch 8
    (benign / malignant; 0.59 / 0.61 at epoch 7), against 0.015 for maps that peak at random. About 2.5 minutes
    on 2 cores."""
    from scripts.metrics import PointingGameMetric

    data_root = str(tmp_path / "data")
    overrides = {
        "datalist": f"$scripts.data.synthetic.ensure_synthetic_dataset({data_root!r}, n=@quickstart_images, "
        "size=@image_size, seed=@seed, config=@quickstart_data)",
        # the sizes it was measured at (the quick start's before it moved to 736x480 and 800 images)
        "quickstart_images": 400,
        "image_size": [368, 240],
        "pixel_spacing": 0.8,
        "crop_iterations": 12,
        "crop_buffer": 6,
        "max_shift": [4, 4],
        "learning_rate": {"global": 1.0e-3, "local": 1.0e-3, "joint": 1.0e-4},
        "global_backbone": {"stem_pool": False, "blocks_per_layer": 1, "padding_mode": "replicate"},
        "pool_in_breast": True,
        "lambda_sparsity": 0.0,
        "pointing_tolerance": 16,
        "peak_border": 8,
    }
    parser = probe.load_parser(REPO_ROOT / "configs" / "quickstart.yaml", "glam", overrides)
    lines = []
    result = probe.run_probe(parser, epochs=8, cache_dir=tmp_path / "cache", seed=0, log=lines.append)
    assert any(line.startswith("epoch   8") for line in lines)

    # chance: maps of uniform noise peak anywhere; their hit rate on the same validation lesions
    val = probe.preprocess_split(
        parser.get_parsed_content("datalist_content")["validation"],
        probe.validation_transform(parser),
        tmp_path / "cache",
        {
            "image_size": parser.get_parsed_content("image_size"),
            "crop": [parser.get_parsed_content("crop_iterations"), parser.get_parsed_content("crop_buffer")],
        },
    )
    noise = torch.rand(val["mask"].shape, generator=torch.Generator().manual_seed(0))
    chance = PointingGameMetric(tolerance=result["tolerance"], check_values=False)
    chance(noise, val["mask"])
    chance_rate = float(np.nanmean(chance.aggregate().numpy()))

    first = float(np.nanmean(result["epochs"][0]["hit"]))
    last = float(np.nanmean(result["epochs"][-1]["hit"]))
    assert chance_rate < 0.05, chance_rate
    assert last >= 0.2 and last >= 5 * chance_rate and last >= first + 0.1, (first, last, chance_rate, lines)
    assert float(np.nanmean(result["epochs"][-1]["border"])) < 0.3, lines
