"""The inference config builds the network from the checkpoint's settings record: a checkpoint trained with a preset
runs without the preset and gives the maps it gives with it; an override that contradicts the record is refused
with the setting named; a checkpoint without a record gets GLAM's defaults."""

from __future__ import annotations

import csv
import re

import nibabel as nib
import numpy as np
import pytest
import torch
from conftest import BUNDLE_ROOT, REPO_ROOT

INFERENCE_CONFIG = BUNDLE_ROOT / "configs" / "inference.yaml"
TINY_INFERENCE = REPO_ROOT / "tests" / "configs" / "tiny_inference.yaml"
META = BUNDLE_ROOT / "configs" / "metadata.json"
# the preset's model settings (tests/configs/tiny_inference.yaml) and two that differ from GLAM's defaults
PRESET_SETTINGS = dict(
    image_size=(256, 160),
    patch_size=64,
    local_depth=18,
    local_width=4,
    t_global=0.05,
    global_backbone={"width": 8, "padding_mode": "replicate"},
)
# what the preset sets besides model settings: preprocessing sizes and the run itself
RUN_OPTIONS = {"num_workers": 0, "crop_iterations": 5, "crop_buffer": 4, "panel_height": None, "precision": "fp32"}


def _parser(overrides: dict, files=(INFERENCE_CONFIG,)):
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config([str(f) for f in files])
    parser.read_meta(str(META))
    for key, value in overrides.items():
        parser[key] = value
    return parser


def _run(overrides: dict, files=(INFERENCE_CONFIG,)) -> None:
    from monai.bundle import ConfigWorkflow

    wf = ConfigWorkflow(config_file=[str(f) for f in files], meta_file=str(META), workflow_type="infer", **overrides)
    wf.initialize()
    wf.run()
    wf.finalize()


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    from glam_benchmark.synthetic import make_synthetic_dataset
    from scripts.networks import GLAMSaliencyNet

    root = tmp_path_factory.mktemp("settings")
    make_synthetic_dataset(root / "png", 2, size=(256, 160), seed=3, fmt="png")
    torch.manual_seed(0)
    ckpt = root / "model.pt"
    torch.save(GLAMSaliencyNet(stage="joint", **PRESET_SETTINGS).state_dict(), ckpt)
    return {"root": root, "images": root / "png" / "images", "ckpt": ckpt}


def test_the_network_and_window_come_from_the_checkpoint(case):
    parser = _parser({"ckpt_path": str(case["ckpt"])})
    net = parser.get_parsed_content("network_def")
    assert net.settings["patch_size"] == [64, 64] and net.settings["global_backbone"]["width"] == 8
    assert net.settings["t_global"] == 0.05 and net.local_network is not None
    assert parser.get_parsed_content("image_size") == [256, 160]  # the preprocessing's window
    assert parser.get_parsed_content("model_settings")["stage"] == "joint"  # the record holds the joint modules
    # without a checkpoint: GLAM's own defaults, the paper's full-size model
    default = _parser({"ckpt_path": str(case["root"] / "missing.pt")})
    assert default.get_parsed_content("image_size") == (2944, 1920)
    settings = default.get_parsed_content("model_settings")
    assert settings["patch_size"] == 512 and settings["local_width"] == 64 and settings["stage"] == "joint"


def test_a_preset_trained_checkpoint_runs_without_its_preset(case):
    common = {"input_dir": str(case["images"]), "ckpt_path": str(case["ckpt"]), **RUN_OPTIONS}
    without = case["root"] / "without_preset"
    _run({**common, "output_dir": str(without)})
    with_preset = case["root"] / "with_preset"
    _run(
        {
            **common,
            "output_dir": str(with_preset),
            "t_global": 0.05,
            "global_backbone": PRESET_SETTINGS["global_backbone"],
        },
        files=(INFERENCE_CONFIG, TINY_INFERENCE),
    )
    with open(without / "predictions.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(list(case["images"].iterdir())) > 0
    for path in sorted((with_preset / "maps").glob("*_S_c.nii.gz")):
        a = np.asarray(nib.load(str(path)).get_fdata())
        b = np.asarray(nib.load(str(without / "maps" / path.name)).get_fdata())
        np.testing.assert_array_equal(a, b)


def test_an_override_that_contradicts_the_checkpoint_is_refused_by_name(case):
    parser = _parser({"ckpt_path": str(case["ckpt"]), "patch_size": 32, "local_width": 8})
    with pytest.raises(Exception) as raised:  # MONAI wraps the network's ValueError in its own RuntimeError
        parser.get_parsed_content("network")
    cause = raised.value
    while cause.__cause__ is not None:
        cause = cause.__cause__
    assert isinstance(cause, ValueError)
    assert re.search(
        r"local_width: checkpoint 4, network 8; patch_size: checkpoint \[64, 64\], network \[32, 32\]", str(cause)
    )
    assert str(case["ckpt"]) in str(cause)
    # inference choices may differ from the record
    chosen = _parser({"ckpt_path": str(case["ckpt"]), "num_patches_eval": 2, "gamma_c": 0.8})
    chosen.get_parsed_content("network")


def test_the_authors_preset_overlay_still_builds_their_network(case, tmp_path):
    from scripts.networks import GLAM, REFERENCE_PRESET

    reference = BUNDLE_ROOT / "configs" / "inference_reference.yaml"
    parser = _parser({"ckpt_path": str(tmp_path / "missing.pt")}, files=(INFERENCE_CONFIG, reference))
    net = parser.get_parsed_content("network_def")
    expected = GLAM.reference().settings
    assert net.settings == expected
    assert REFERENCE_PRESET["pixel_spacing"] is None and net.settings["pixel_spacing"] is None
    # a converted checkpoint records the reference settings: inference.yaml alone rebuilds the same network
    torch.save(GLAM.reference().state_dict(), tmp_path / "converted.pt")
    alone = _parser({"ckpt_path": str(tmp_path / "converted.pt")}).get_parsed_content("network_def")
    assert alone.settings == expected and alone.stage == "local"


def test_the_default_precision_on_cuda_is_bf16_and_fp32_turns_the_autocast_off(monkeypatch, tmp_path):
    """inference.yaml's ``amp`` (the step's bf16 autocast) follows the device and ``precision``, read with CUDA
    reported present: on by default, off with ``precision: fp32``; ``auto`` resolves to the bf16 copy on CUDA."""
    from scripts.inference.inputs import batch_size_for
    from scripts.networks import resolve_precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _parser({"ckpt_path": str(tmp_path / "x.pt")}).get_parsed_content("amp") is True
    assert _parser({"ckpt_path": str(tmp_path / "x.pt"), "precision": "fp32"}).get_parsed_content("amp") is False
    assert _parser({"ckpt_path": str(tmp_path / "x.pt")}).get_parsed_content("amp_dtype") == torch.bfloat16
    assert resolve_precision(_parser({}).get_parsed_content("precision"), "cuda") == "bf16"
    parser = _parser({})
    batch = batch_size_for(parser.get_parsed_content("batch_size"), parser.get_parsed_content("device"))
    assert batch == 8  # batched on the GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _parser({"ckpt_path": str(tmp_path / "x.pt")}).get_parsed_content("amp") is False


def test_the_step_hands_float32_to_the_writers_under_bf16_autocast(case):
    """With the step's autocast on (bf16, here on the CPU) the network computes in bf16, and every floating-point
    output reaches the writers as float32, close to the float32 step's."""
    from scripts.inference.inputs import collate_inference
    from scripts.inference.step import GLAMInferenceStep
    from scripts.networks import GLAMInferer, GLAMSaliencyNet

    torch.manual_seed(0)
    net = GLAMSaliencyNet(stage="joint", **PRESET_SETTINGS).eval()
    engine = type("Engine", (), {"network": net, "inferer": GLAMInferer()})()
    image = torch.randn(2, 1, 256, 160)
    batch = collate_inference([{"image": image[0]}, {"image": image[1]}])
    bf16 = GLAMInferenceStep(amp=True, amp_dtype=torch.bfloat16)(engine, batch)["pred"]
    fp32 = GLAMInferenceStep(amp=False)(engine, batch)["pred"]
    floating = [k for k, v in fp32.items() if v.is_floating_point()]
    assert "saliency" in floating and "y_global" in floating
    for key in floating:
        assert bf16[key].dtype == torch.float32 and bf16[key].device.type == "cpu", key
    assert not torch.equal(bf16["y_global"], fp32["y_global"])  # the autocast did run in bf16
    torch.testing.assert_close(bf16["y_global"], fp32["y_global"], atol=0.02, rtol=0)
