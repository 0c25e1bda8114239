"""bf16 in the workflows: `--amp true` on the CPU runs the path a GPU run takes (autocast follows the engine's device,
no gradient scaler), the convolutions run in bf16 inside the engines, and every metric handler, the validation
panels and the evaluation report take the bf16 outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import BUNDLE_ROOT, REPO_ROOT, TINY_CONFIG, TRAIN_CONFIG, VALIDATION_METRICS, tiny_overrides
from ignite.engine import Events
from monai.bundle import ConfigParser

from scripts.enums import STAGES
from scripts.precision import AutocastInferer, amp_plan

EVAL_CONFIG = BUNDLE_ROOT / "configs" / "evaluate.yaml"


def test_amp_plan_bf16_anywhere_fp16_through_monai_on_cuda_only():
    assert amp_plan("true", torch.bfloat16, "cpu") == {"autocast": torch.bfloat16, "engine_amp": False}
    assert amp_plan(True, "bfloat16", "cuda:0") == {"autocast": torch.bfloat16, "engine_amp": False}
    assert amp_plan("false", torch.bfloat16, "cuda:0") == {"autocast": None, "engine_amp": False}
    assert amp_plan(True, torch.float16, torch.device("cuda", 0)) == {"autocast": None, "engine_amp": True}
    with pytest.raises(ValueError, match="float16 needs a CUDA device.*cpu"):
        amp_plan(True, "float16", "cpu")
    with pytest.raises(ValueError, match="amp_dtype must be"):
        amp_plan(True, torch.float32, "cpu")


def test_autocast_inferer_runs_the_network_in_bf16_on_the_inputs_device():
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU())
    x = torch.randn(1, 1, 8, 8)
    assert AutocastInferer(torch.bfloat16)(x, net).dtype == torch.bfloat16
    assert AutocastInferer(None)(x, net).dtype == torch.float32
    torch.testing.assert_close(AutocastInferer(torch.bfloat16)(x, net).float(), net(x), rtol=0.02, atol=0.02)


def _conv_dtypes(network: torch.nn.Module) -> tuple[dict[str, set], list]:
    """Forward hooks on every convolution: module name -> the dtypes of its outputs."""
    seen: dict[str, set] = {}
    handles = []
    for name, module in network.named_modules():
        if isinstance(module, torch.nn.Conv2d):
            handles.append(module.register_forward_hook(lambda m, i, o, n=name: seen.setdefault(n, set()).add(o.dtype)))
    return seen, handles


def _parser(files: list[Path], overrides: dict) -> ConfigParser:
    parser = ConfigParser()
    parser.read_config([str(f) for f in files])
    for key, value in overrides.items():
        parser[key] = value
    return parser


def test_training_and_evaluation_run_bf16_on_the_cpu_with_amp_true(tmp_path, tiny_datalist):
    """Each stage with `--amp true` (a command-line 'true') on the CPU: every convolution that ran inside the trainer
    and the evaluator returned bf16, the trainer has no gradient scaler, every validation metric handler produced a
    value, the saliency panels were written; then the evaluation workflow reports from bf16 outputs."""
    overrides = tiny_overrides(tmp_path, tiny_datalist, amp="true", channels_last="true")
    for stage in STAGES:
        parser = _parser([TRAIN_CONFIG, TINY_CONFIG], {**overrides, "stage": stage})
        network = parser.get_parsed_content("network")
        seen, handles = _conv_dtypes(network)
        trainer = parser.get_parsed_content("train#trainer")
        evaluator = parser.get_parsed_content("validate#evaluator")
        metrics: dict = {}
        evaluator.add_event_handler(Events.COMPLETED, lambda e, m=metrics: m.update(e.state.metrics))
        parser.get_parsed_content("run_stage")
        for h in handles:
            h.remove()
        assert trainer.scaler is None and not trainer.amp
        assert seen and all(dtypes == {torch.bfloat16} for dtypes in seen.values()), seen
        ran = set(seen)
        assert any(n.startswith("global_network") for n in ran)
        if stage != "global":
            assert any(n.startswith("local_network") for n in ran)
        for name in VALIDATION_METRICS:
            value = float(metrics[name])  # AUC is NaN where the tiny validation split has one label value
            assert math.isfinite(value) or "auc" in name, (stage, name, value)
        assert any(math.isfinite(metrics[n]) for n in ("val_auc_benign", "val_auc_malignant"))
        assert list((tmp_path / "eval" / stage).glob("events.out.tfevents.*"))
        assert (tmp_path / "models" / stage / "model.pt").is_file()
    evaluation = _parser([TRAIN_CONFIG, TINY_CONFIG, EVAL_CONFIG], {**overrides, "eval_split": "validation"})
    seen, handles = _conv_dtypes(evaluation.get_parsed_content("network"))
    summary = evaluation.get_parsed_content("evaluating")[-1]
    for h in handles:
        h.remove()
    assert seen and all(dtypes == {torch.bfloat16} for dtypes in seen.values())
    report = json.loads((tmp_path / "eval" / "evaluate" / "metrics.json").read_text())
    assert report == summary and report["n_images"] == len(evaluation.get_parsed_content("eval_datalist")) > 0
    assert report["maps"] == ["S_g", "S_l", "S_c"]
    benign = [report["metrics"][m]["benign"] for m in report["maps"]]  # the split has benign lesions only
    assert all(0 <= row["dice_mean"] <= 1 and 0 <= row["pxap_image_mean"] <= 1 for row in benign)
    assert report["classification_auc"]["benign"] is not None


@pytest.mark.parametrize("baseline", ["cam", "gmic", "unet"])
def test_baselines_train_in_bf16_on_the_cpu_with_amp_true(tmp_path, tiny_datalist, baseline):
    """The baselines' overlays share the engines: their convolutions run in bf16 too, and validation completes (the
    U-Net's masks travel with its training batches and are cut with the shifted window on the device)."""
    overlay = REPO_ROOT / "glam_benchmark" / "configs" / f"baseline_{baseline}.yaml"
    parser = _parser([TRAIN_CONFIG, TINY_CONFIG, overlay], tiny_overrides(tmp_path, tiny_datalist, amp=True))
    seen, handles = _conv_dtypes(parser.get_parsed_content("network"))
    metrics: dict = {}
    parser.get_parsed_content("validate#evaluator").add_event_handler(
        Events.COMPLETED, lambda e: metrics.update(e.state.metrics)
    )
    parser.get_parsed_content("run_stage")
    for h in handles:
        h.remove()
    assert seen and all(dtypes == {torch.bfloat16} for dtypes in seen.values()), seen
    assert set(VALIDATION_METRICS) <= set(metrics) and math.isfinite(float(metrics["val_soft_dice"]))
    assert (tmp_path / "models" / baseline / "model.pt").is_file()
