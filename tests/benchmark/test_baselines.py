"""The Table-1 baselines (CAM, GMIC, fully supervised U-Net): networks, losses, and their training and evaluation
through train.yaml + a size preset + glam_benchmark/configs/baseline_<name>.yaml (+ evaluate.yaml).

Values are checked against independent computations: numpy sorts for top-t% pooling, a per-patch loop over the
crops with the attention, classifier and fusion written out from their weights, BCE and soft Dice by formula.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import BUNDLE_ROOT, REPO_ROOT, TINY_CONFIG, TRAIN_CONFIG
from ignite.engine import Events
from monai.bundle import ConfigWorkflow

from scripts.training.workflow import GLAMWorkflow

CONFIGS = REPO_ROOT / "glam_benchmark" / "configs"
EVAL_CONFIG = BUNDLE_ROOT / "configs" / "evaluate.yaml"
META = str(BUNDLE_ROOT / "configs" / "metadata.json")
BASELINES = ("cam", "gmic", "unet")
TINY_UNET = [4, 4, 8, 8, 16, 4]
SIZE = (256, 160)  # the tiny preset's image size


def np_top_t(x: np.ndarray, t: float) -> np.ndarray:
    """(B, C, ...) -> (B, C): mean of the k = max(1, round(n t)) largest values, by a full sort."""
    flat = np.sort(x.reshape(*x.shape[:2], -1).astype(np.float64), axis=-1)
    k = max(1, round(flat.shape[-1] * t))
    return flat[..., -k:].mean(-1)


def np_bce(p: np.ndarray, y: np.ndarray) -> float:
    p, y = p.astype(np.float64), y.astype(np.float64)
    return float(np.mean(-(y * np.log(p) + (1 - y) * np.log(1 - p))))


def images(batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 1, *SIZE, generator=torch.Generator().manual_seed(seed))


def tiny_gmic():
    from glam_benchmark.baselines import GMIC

    return GMIC(patch_size=64, num_patches=2, t_global=0.1, local_width=4, attention_hidden=8)


# -- networks ------------------------------------------------------------------------------------------------------
def test_cam_with_t_one_is_the_spatial_mean_of_its_only_map():
    from glam_benchmark.baselines import CAM

    torch.manual_seed(0)
    model = CAM(t=1.0).eval()
    with torch.no_grad():
        out = model(images())
    assert set(out) == {"y_global", "saliency_global", "z_global"}
    s = out["saliency_global"]
    assert s.shape == (2, 2, 4, 3)  # the backbone's stride-64 map of 256 x 160 (46 x 30 at 2944 x 1920)
    assert out["y_global"].shape == (2, 2) and out["z_global"].shape == (2, 256)
    assert torch.allclose(out["y_global"], s.mean(dim=(2, 3)), atol=1e-7)
    assert ((s > 0) & (s < 1)).all()


def test_cam_top_t_pools_the_largest_values():
    from glam_benchmark.baselines import CAM

    torch.manual_seed(1)
    model = CAM(t=0.25).eval()
    with torch.no_grad():
        out = model(images(seed=1))
    expected = np_top_t(out["saliency_global"].numpy(), 0.25)  # 3 of the 12 pixels
    np.testing.assert_allclose(out["y_global"].numpy(), expected, rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match="t"):
        CAM(t=0.0)


def test_gmic_outputs_match_a_per_patch_computation_from_the_weights():
    from scripts.patches import select_patch_boxes

    torch.manual_seed(2)
    model = tiny_gmic().eval()
    x = images(seed=2)
    with torch.no_grad():
        out = model(x)
    assert {k: tuple(v.shape) for k, v in out.items()} == {
        "y_global": (2, 2),
        "saliency_global": (2, 2, 4, 3),
        "z_global": (2, 256),
        "patch_boxes": (2, 2, 4),
        "attention": (2, 2),
        "z_local": (2, 32),
        "y_local": (2, 2),
        "y_fusion": (2, 2),
    }
    boxes = out["patch_boxes"]
    assert torch.equal(boxes, select_patch_boxes(out["saliency_global"], SIZE, 64, 2))
    assert (
        (boxes[..., 2:] == 64).all() and (boxes[..., 0] + 64 <= SIZE[0]).all() and (boxes[..., 1] + 64 <= SIZE[1]).all()
    )
    v, u, w = (model.attention.attn_v.weight, model.attention.attn_u.weight, model.attention.attn_w.weight)
    cls_w, cls_b = model.patch_classifier.weight, model.patch_classifier.bias
    fus_w, fus_b = model.fusion.linear.weight, model.fusion.linear.bias
    with torch.no_grad():
        for b in range(2):
            h = []
            for r, c, ph, pw in boxes[b].tolist():
                crop = x[b : b + 1, :, r : r + ph, c : c + pw]  # plain slicing, one patch at a time
                h.append(model.local_network(crop)[0].double())
            h = torch.stack(h)  # (K, D)
            scores = (torch.tanh(h @ v.double().T) * torch.sigmoid(h @ u.double().T)) @ w.double().T  # (K, 1)
            alpha = torch.softmax(scores[:, 0], dim=0)
            z_l = (alpha[:, None] * h).sum(0)
            y_l = torch.sigmoid(z_l @ cls_w.double().T + cls_b.double())
            z = torch.cat([out["z_global"][b].double(), z_l])
            y_f = torch.sigmoid(z @ fus_w.double().T + fus_b.double())
            torch.testing.assert_close(out["attention"][b].double(), alpha, rtol=0, atol=1e-5)
            torch.testing.assert_close(out["z_local"][b].double(), z_l, rtol=0, atol=1e-5)
            torch.testing.assert_close(out["y_local"][b].double(), y_l, rtol=0, atol=1e-5)
            torch.testing.assert_close(out["y_fusion"][b].double(), y_f, rtol=0, atol=1e-5)
    np.testing.assert_allclose(out["y_global"].numpy(), np_top_t(out["saliency_global"].numpy(), 0.1), atol=1e-7)


def test_gmic_loss_gradients_reach_every_part():
    from glam_benchmark.baselines import GMICLoss

    torch.manual_seed(3)
    model = tiny_gmic().train()
    out = model(images(seed=3))
    GMICLoss(lambda_sparsity=1e-3)(out, torch.tensor([[1.0, 0.0], [0.0, 1.0]])).backward()
    parts = ("global_network.", "local_network.", "patch_classifier.", "attention.", "fusion.")
    seen = dict.fromkeys(parts, 0)
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"{name} got a zero gradient"
        seen[next(part for part in parts if name.startswith(part))] += 1
    assert all(seen.values()), seen


def test_gmic_rejects_bad_arguments():
    from glam_benchmark.baselines import GMIC

    with pytest.raises(ValueError, match="num_patches"):
        GMIC(num_patches=0)
    with pytest.raises(ValueError, match="local_width"):
        GMIC(local_width=0)
    with pytest.raises(ValueError, match="num_patches=13 exceeds"):  # 12 disjoint 64 px windows on the 4 x 3 map
        GMIC(patch_size=64, num_patches=13, local_width=4)(images(1))


def test_unet_map_is_a_probability_map_of_the_image_size_and_its_score_is_top_t():
    from glam_benchmark.baselines import UNetSaliency

    torch.manual_seed(4)
    model = UNetSaliency(t=0.01, features=TINY_UNET).eval()
    with torch.no_grad():
        out = model(images(seed=4))
    s = out["saliency_global"]
    assert s.shape == (2, 2, *SIZE) and out["logits"].shape == s.shape
    assert (s >= 0).all() and (s <= 1).all()
    torch.testing.assert_close(s, torch.sigmoid(out["logits"]))
    np.testing.assert_allclose(out["y_global"].numpy(), np_top_t(s.numpy(), 0.01), atol=1e-6)
    with pytest.raises(ValueError, match="features"):
        UNetSaliency(features=(4, 4, 8))


def test_unet_input_stride_runs_on_the_pooled_image_and_upsamples_its_logits():
    import torch.nn.functional as F

    from glam_benchmark.baselines import UNetSaliency

    torch.manual_seed(5)
    model = UNetSaliency(t=0.01, features=TINY_UNET, input_stride=2).eval()
    x = images(seed=5)
    with torch.no_grad():
        out = model(x)
        # the same U-Net on a 2x2 block average of the image, its logits bilinearly resized to the image's size
        half = x.unflatten(-1, (-1, 2)).unflatten(-3, (-1, 2)).mean(dim=(-3, -1))
        expected = F.interpolate(model.unet(half), size=x.shape[-2:], mode="bilinear", align_corners=False)
    assert out["logits"].shape == (2, 2, *SIZE)
    torch.testing.assert_close(out["logits"], expected)
    torch.testing.assert_close(out["saliency_global"], torch.sigmoid(expected))
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="input_stride"):
            UNetSaliency(features=TINY_UNET, input_stride=bad)


# -- losses --------------------------------------------------------------------------------------------------------
def test_cam_and_gmic_losses_by_formula():
    from glam_benchmark.baselines import CAMLoss, GMICLoss

    g = torch.Generator().manual_seed(5)
    out = {k: torch.rand(3, 2, generator=g) * 0.9 + 0.05 for k in ("y_global", "y_local", "y_fusion")}
    out["saliency_global"] = torch.rand(3, 2, 4, 3, generator=g)
    y = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    lam = 1e-2
    npo = {k: v.numpy() for k, v in out.items()}
    l1 = np.abs(npo["saliency_global"]).reshape(3, -1).sum(1).mean()  # sum over pixels and classes, batch mean
    cam = np_bce(npo["y_global"], y.numpy()) + lam * l1
    gmic = cam + np_bce(npo["y_local"], y.numpy()) + np_bce(npo["y_fusion"], y.numpy())
    assert CAMLoss(lam)(out, y).item() == pytest.approx(cam, rel=1e-6)
    assert GMICLoss(lam)(out, y).item() == pytest.approx(gmic, rel=1e-6)
    assert set(GMICLoss(lam).components(out, y)) == {"bce_global", "l1_global", "bce_local", "bce_fusion"}
    with pytest.raises(ValueError, match="y_fusion"):
        GMICLoss(lam)({k: v for k, v in out.items() if k != "y_fusion"}, y)
    with pytest.raises(ValueError, match="target"):
        CAMLoss(lam)(out, y[:, :1])
    with pytest.raises(ValueError, match="lambda_sparsity"):
        CAMLoss(-1.0)


def test_mask_dice_bce_loss_by_formula_leaves_out_unknown_masks():
    from glam_benchmark.baselines import MaskDiceBCELoss

    g = torch.Generator().manual_seed(6)
    logits = torch.randn(3, 2, 5, 4, generator=g) * 2
    mask = torch.zeros(3, 2, 5, 4)
    mask[0, 0, 1:3, 1:3] = 1  # benign lesion with its mask
    mask[2, 1, 0, :] = 1  # malignant lesion with its mask
    # image 1 is labelled malignant but has no malignant mask: that pair is unknown and left out
    label = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    smooth = 1e-5
    p = 1 / (1 + np.exp(-logits.numpy().astype(np.float64)))
    m = mask.numpy().astype(np.float64)
    dice, bce = [], []
    for b in range(3):
        for c in range(2):
            if label[b, c] == 1 and m[b, c].sum() == 0:
                continue
            pb, gb = p[b, c], m[b, c]
            dice.append(1 - (2 * (pb * gb).sum() + smooth) / ((pb**2).sum() + (gb**2).sum() + smooth))
            bce.append(np_bce(pb, gb))
    assert len(dice) == 5
    loss = MaskDiceBCELoss(lambda_dice=1.0, lambda_bce=0.5, smooth=smooth)
    terms = loss.components({"logits": logits}, {"label": label, "mask": mask})
    assert terms["dice"].item() == pytest.approx(np.mean(dice), rel=1e-6)
    assert terms["bce"].item() == pytest.approx(0.5 * np.mean(bce), rel=1e-6)
    assert loss({"logits": logits}, {"label": label, "mask": mask}).item() == pytest.approx(
        np.mean(dice) + 0.5 * np.mean(bce), rel=1e-6
    )
    with pytest.raises(ValueError, match="with_masks=True"):
        loss({"logits": logits}, label)


def test_outputs_transform_reports_the_chosen_score_as_y_global():
    from scripts.transforms.outputs import GLAMOutputsd

    g = torch.Generator().manual_seed(7)
    pred = {k: torch.rand(2, generator=g) for k in ("y_global", "y_local", "y_fusion")}
    pred["saliency_global"] = torch.rand(2, 4, 3, generator=g)
    item = {"pred": pred, "label": {"label": torch.tensor([1.0, 0.0]), "mask": torch.zeros(2, 8, 6)}}
    default = GLAMOutputsd()(item)
    assert torch.equal(default["y_global"], pred["y_global"])
    fused = GLAMOutputsd(score_key="y_fusion")(item)
    assert torch.equal(fused["y_global"], pred["y_fusion"]) and torch.equal(fused["y_fusion"], pred["y_fusion"])
    assert fused["S_g"].shape == (2, 8, 6) and "S_c" not in fused
    with pytest.raises(ValueError, match="score_key 'y_other'"):
        GLAMOutputsd(score_key="y_other")(item)


# -- workflows -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def baseline_data(tmp_path_factory, tiny_datalist):
    """The tiny datalist for training and, for evaluation, one whose test split mixes the labels of both classes
    (so that both AUCs are defined; its images are the training ones, which is all an evaluation test needs)."""
    from scripts.data import load_datalist
    from scripts.data.datalist import resolve_paths

    root = tmp_path_factory.mktemp("baselines")
    content = resolve_paths(load_datalist(tiny_datalist), Path(tiny_datalist).parent)
    eval_datalist = root / "eval_datalist.json"
    eval_datalist.write_text(json.dumps({"validation": content["validation"], "test": content["training"][:8]}))
    return root, Path(tiny_datalist), eval_datalist


def overrides(root: Path, datalist: Path, name: str) -> dict:
    extra = {"unet_features": TINY_UNET} if name == "unet" else {}
    return {"datalist": str(datalist), "ckpt_root": str(root / "models"), "output_root": str(root / "out"), **extra}


def check_report(eval_dir: Path, n_images: int) -> dict:
    summary = json.loads((eval_dir / "metrics.json").read_text())
    assert summary["maps"] == ["S_g"] and summary["stage"] == "global" and summary["n_images"] == n_images
    for c in ("benign", "malignant"):
        stats = summary["metrics"]["S_g"][c]
        assert all(math.isfinite(v) for k, v in stats.items() if k != "froc"), summary["metrics"]
        assert all(math.isfinite(v) for v in stats["froc"].values()), stats["froc"]  # sensitivity at each rate
        assert math.isfinite(summary["classification_auc"][c])
    with open(eval_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == n_images and "S_g_dice_malignant" in rows[0] and "S_c_dice_malignant" not in rows[0]
    return summary


@pytest.mark.parametrize("name", BASELINES)
def test_baseline_trains_and_evaluates_through_the_bundle_configs(baseline_data, name):
    root, datalist, eval_datalist = baseline_data
    root = root / name
    overlay = str(CONFIGS / f"baseline_{name}.yaml")
    train = GLAMWorkflow(
        config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG), overlay],
        meta_file=META,
        workflow_type="train",
        **overrides(root, datalist, name),
    )
    train.initialize()
    assert train.check_properties() == []
    result = train.run()[-1]
    assert [r["stage"] for r in result] == ["global"]
    folders = sorted(p.name for p in (root / "models").iterdir() if not p.name.startswith("."))  # not the run's lock
    assert folders == [name]  # its own folder, not GLAM's stages
    assert (root / "models" / name / "model.pt").is_file() and (root / "out" / name).is_dir()

    evaluate = ConfigWorkflow(
        config_file=[str(TRAIN_CONFIG), str(EVAL_CONFIG), str(TINY_CONFIG), overlay],
        meta_file=META,
        workflow_type="infer",
        **overrides(root, eval_datalist, name),
    )
    evaluate.initialize()
    assert evaluate.check_properties() == []
    seen = []
    evaluator = evaluate.parser.get_parsed_content("validate#evaluator")
    evaluator.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.extend(e.state.output))
    summary = evaluate.run()[-1]
    assert summary == check_report(root / "out" / name / "evaluate", 8)
    assert summary["checkpoint"] == str(root / "models" / name / "model.pt")
    score = {"cam": "y_global", "gmic": "y_fusion", "unet": "y_global"}[name]
    for item in seen:  # the reported score is the model's classification output
        assert torch.equal(item["y_global"], item["pred"][score])
        assert item["S_g"].shape == item["lesion_mask"].shape == (2, *SIZE)


def header_commands(overlay: Path) -> list[list[str]]:
    """The train and evaluate commands of an overlay's header comment, as argument lists from ``python`` on (the
    header puts the bundle on ``PYTHONPATH``)."""
    lines = [line[1:].strip() for line in overlay.read_text().splitlines() if line.startswith("#")]
    text = re.sub(r"\\\s+", " ", "\n".join(lines))
    prefix = "PYTHONPATH=bundle python -m monai.bundle run_workflow scripts.GLAMWorkflow --run_id "
    commands = [line.removeprefix("PYTHONPATH=bundle ") for line in text.splitlines() if line.startswith(prefix)]
    assert [c.split()[6] for c in commands] == ["training", "evaluating"], commands
    return [re.findall(r'"[^"]*"|\S+', c) for c in commands]


def resolved(configs: list, overlay: Path, ckpt_root: Path) -> dict:
    """The overlay's network arguments and the validation window's size and spacing, as ``configs`` resolve them
    (an evaluation's checkpoint under ``ckpt_root`` records no settings, so it takes nothing from the file)."""
    from monai.bundle import ConfigParser

    from glam_benchmark.presets import load_yaml

    parser = ConfigParser()
    parser.read_config([str(REPO_ROOT / c) for c in configs])
    parser["ckpt_root"] = str(ckpt_root)
    if "evaluating" in parser:  # a baseline's checkpoint: weights without GLAM's settings record
        ckpt = Path(parser.get_parsed_content("ckpt_path"))
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        torch.save({}, ckpt)
    ids = [f"network_def#{k}" for k in load_yaml(overlay)["network_def"] if k != "_target_"]
    transforms = "validate#preprocessing#transforms#"
    ids += [f"{transforms}5#window", f"{transforms}5#pixel_spacing", f"{transforms}10#window"]
    out = json.loads(json.dumps({i: parser.get_parsed_content(i) for i in ids}))  # a window as a list, not a tuple
    if "network_def#backbone" in out:  # GlobalBackbone's defaults, whether None (GLAM's default) or {} (train.yaml's)
        out["network_def#backbone"] = out["network_def#backbone"] or {}
    return out


@pytest.mark.parametrize("name", BASELINES)
def test_baseline_evaluation_builds_the_network_and_window_it_was_trained_with(tmp_path, name):
    """The driver's and the documented evaluation configs (a baseline's checkpoint records no model settings) give
    the baseline's network and the validation window the values its training configs give, for every preset."""
    from glam_benchmark.driver import ModelSteps
    from glam_benchmark.presets import MODELS, flatten_preset

    overlay = CONFIGS / f"baseline_{name}.yaml"
    pairs = []
    presets = [TINY_CONFIG, REPO_ROOT / "configs" / "quickstart.yaml"]
    for size in ("cpu", "full", "calibrated"):  # the calibrated preset stands on the CPU one (benchmark#base)
        presets.append(flatten_preset(CONFIGS / f"benchmark_{size}.yaml", tmp_path / f"{size}.json")[0])
    for preset in presets:
        steps = ModelSteps.of(MODELS[name], preset)
        pairs.append((steps.train_cfg, steps.eval_cfg))
    train, evaluate = (ast.literal_eval(a.strip('"')) for args in header_commands(overlay) for a in args if "[" in a)
    pairs.append((train, evaluate))
    pairs.append(([c for c in train if "quickstart" not in c], [c for c in evaluate if "quickstart" not in c]))
    for train, evaluate in pairs:
        expected = resolved(train, overlay, tmp_path)
        assert all(v != "checkpoint" for v in expected.values()), (train, expected)
        assert resolved(evaluate, overlay, tmp_path) == expected, evaluate
    glam = ModelSteps.of(MODELS["glam"], TINY_CONFIG)  # GLAM's evaluation takes its settings from its checkpoint
    assert glam.eval_cfg == [TRAIN_CONFIG, TINY_CONFIG, EVAL_CONFIG]


@pytest.mark.slow
def test_documented_commands_train_and_evaluate_every_baseline(baseline_data):
    """Each overlay's header commands, run as written with the tiny preset in place of the quick start's."""
    root, datalist, eval_datalist = baseline_data
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(BUNDLE_ROOT)}
    for name in BASELINES:
        out = root / f"cli_{name}"
        train_args, eval_args = header_commands(CONFIGS / f"baseline_{name}.yaml")
        for args, data in ((train_args, datalist), (eval_args, eval_datalist)):
            extra = [a for k, v in overrides(out, data, name).items() for a in (f"--{k}", str(v))]
            args = [
                a.strip('"').replace("configs/quickstart.yaml", str(TINY_CONFIG.relative_to(REPO_ROOT))) for a in args
            ]
            done = subprocess.run(
                [sys.executable, *args[1:], *extra], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env
            )
            assert done.returncode == 0, done.stderr[-3000:]
        check_report(out / "out" / name / "evaluate", 8)


def test_outputs_transform_writes_the_global_scales_on_request():
    from scripts.transforms.outputs import GLAMOutputsd

    g = torch.Generator().manual_seed(3)
    scales = [torch.rand(2, h, w, generator=g) for h, w in ((4, 3), (2, 2), (1, 1))]
    pred = {"y_global": torch.rand(2, generator=g), "saliency_global": torch.rand(2, 4, 3, generator=g)}
    pred.update({f"saliency_scale{i}": s for i, s in enumerate(scales)})
    item = {"pred": pred, "label": {"label": torch.tensor([1.0, 0.0]), "mask": torch.zeros(2, 8, 6)}}
    assert not any(f"S_{i}" in GLAMOutputsd()(item) for i in range(3))
    assert not any(f"S_{i}" in GLAMOutputsd(scales="false")(item) for i in range(3))  # a command-line override
    out = GLAMOutputsd(scales="true")(item)
    for i, s in enumerate(scales):
        expected = np.zeros((2, 8, 6), np.float32)
        h, w = s.shape[-2:]
        for c in range(2):
            for r in range(8):
                for col in range(6):
                    expected[c, r, col] = s[c, r * h // 8, col * w // 6]
        np.testing.assert_array_equal(out[f"S_{i}"].numpy(), expected)
    # a baseline without scales (CAM, U-Net) writes none
    no_scales = {"pred": {k: pred[k] for k in ("y_global", "saliency_global")}, "label": item["label"]}
    assert not any(f"S_{i}" in GLAMOutputsd(scales=True)(no_scales) for i in range(3))
