"""The local module's probes (tools/probe_local_module.py, tools/probe_local_stage.py): the per-lesion measures
against numpy loops over the same network outputs, the summary's grouping, and a local stage trained on patches."""

from __future__ import annotations

import importlib.util
import math
import sys

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tools"))


def _load(name):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


module_probe = _load("probe_local_module")
stage_probe = _load("probe_local_stage")
TINY = dict(patch_size=64, local_depth=18, local_width=4, image_size=(256, 160), joint_modules=True)


def _split(n=3, seed=0):
    """Images (n, 1, 256, 160) with a bright disc on textured tissue, masks of the disc in one class each."""
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(n, 1, 256, 160, generator=g) * 0.5
    masks = torch.zeros(n, 2, 256, 160, dtype=torch.uint8)
    yy, xx = torch.meshgrid(torch.arange(256), torch.arange(160), indexing="ij")
    for i in range(n):
        cy, cx, r = 60 + 60 * i, 50 + 20 * i, 6 + 4 * i
        disc = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
        images[i, 0][disc] += 2.0
        masks[i, i % 2][disc] = 1
    labels = masks.flatten(2).amax(2).float()
    return {"image": images, "mask": masks, "label": labels}


def _soft_dice(s, g):
    return 2 * float((s * g).sum()) / (float((s * s).sum()) + float(g.sum()))


def test_per_lesion_measures_match_numpy_loops():
    from scripts.networks import GLAM

    torch.manual_seed(0)
    network = GLAM(**TINY).set_stage("joint").eval()
    split = _split()
    rows = module_probe.per_lesion_rows(network, split, tolerance=16.0, batch=2)
    assert [(r["image"], r["class"]) for r in rows] == [(0, "benign"), (1, "malignant"), (2, "benign")]
    with torch.no_grad():
        out = network(split["image"])
        maps = network.full_resolution(out, (256, 160))
    boxes = out["patch_boxes"].numpy()
    for r in rows:
        b, c = r["image"], 0 if r["class"] == "benign" else 1
        g = split["mask"][b, c].numpy().astype(np.float64)
        s_g, s_l, s_c = (maps[m][b, c].numpy().astype(np.float64).clip(0, 1) for m in ("S_g", "S_l", "S_c"))
        inside = np.zeros_like(g)
        for y0, x0, h, w in boxes[b]:
            inside[y0 : y0 + h, x0 : x0 + w] = 1.0
        assert r["dice_g"] == pytest.approx(_soft_dice(s_g, g), rel=1e-5)
        assert r["dice_l"] == pytest.approx(_soft_dice(s_l, g), rel=1e-5, abs=1e-9)
        assert r["dice_c"] == pytest.approx(_soft_dice(s_c, g), rel=1e-5)
        assert r["dice_g_scaled"] == pytest.approx(_soft_dice(s_g / s_g.max(), g), rel=1e-5)
        assert r["in_patch"] == pytest.approx((g * inside).sum() / g.sum())
        assert r["lesion_to_patch"] == pytest.approx(g.sum() / (64 * 64))
        assert r["peak_g"] == pytest.approx(s_g[g > 0].max(), rel=1e-6)
        mass = (s_g * inside).sum()
        assert r["mass_g"] == pytest.approx((s_g * inside * g).sum() / mass, rel=1e-5)
        if (g * inside).sum() > 0:
            assert r["dice_l_patch"] == pytest.approx(_soft_dice(s_l, g * inside), rel=1e-5, abs=1e-9)
        else:
            assert math.isnan(r["dice_l_patch"])


def test_summary_groups_by_patch_and_size():
    rows = [
        {"class": "benign", "in_patch": 1.0, "lesion_to_patch": 0.01, **dict.fromkeys(module_probe.MEASURES, 0.5)},
        {"class": "benign", "in_patch": 0.0, "lesion_to_patch": 0.3, **dict.fromkeys(module_probe.MEASURES, 0.1)},
        {"class": "malignant", "in_patch": 0.5, "lesion_to_patch": 0.1, **dict.fromkeys(module_probe.MEASURES, 0.2)},
    ]
    rows[1]["dice_l_patch"] = float("nan")  # a missed lesion has no part in the patch
    summary = {(e["class"], e["group"]): e for e in module_probe.summarise(rows)}
    assert summary[("benign", "all")]["n"] == 2 and summary[("benign", "all")]["dice_g"] == pytest.approx(0.3)
    assert summary[("benign", "all")]["dice_l_patch"] == pytest.approx(0.5)  # NaN left out of the mean
    assert summary[("benign", "patch held")]["n"] == 1 and summary[("benign", "patch missed")]["n"] == 1
    assert summary[("benign", "lesion >= 1/4 patch")]["dice_c"] == pytest.approx(0.1)
    assert summary[("malignant", "patch partial")]["n"] == 1 and summary[("malignant", "lesion 1/16-1/4")]["n"] == 1
    assert summary[("malignant", "patch held")]["n"] == 0 and math.isnan(summary[("malignant", "patch held")]["dice_g"])
    table = module_probe.markdown(module_probe.summarise(rows), 1)
    assert table.splitlines()[0].startswith("| M | class | group | n | dice_g |")


def test_summary_groups_by_lesion_kind_where_the_datalist_names_them():
    items = [
        {"lesions": ["spiculated_mass", "circumscribed_mass"]},
        {"lesions": ["pleomorphic_calcifications", "spiculated_mass"]},
        {"label": [1, 0]},  # a real datalist: no lesion kinds
    ]
    measures = dict.fromkeys(module_probe.MEASURES, 0.0)
    rows = [
        {"image": 0, "class": "benign", "in_patch": 1.0, "lesion_to_patch": 0.01, **measures, "dice_l": 0.4},
        {"image": 0, "class": "malignant", "in_patch": 1.0, "lesion_to_patch": 0.01, **measures, "dice_l": 0.1},
        {"image": 1, "class": "malignant", "in_patch": 1.0, "lesion_to_patch": 0.01, **measures, "dice_l": 0.3},
        {"image": 2, "class": "benign", "in_patch": 1.0, "lesion_to_patch": 0.01, **measures, "dice_l": 0.9},
    ]
    module_probe.lesion_kinds(items, rows)
    assert [r.get("kinds") for r in rows] == [
        "circumscribed_mass",
        "spiculated_mass",
        "pleomorphic_calcifications + spiculated_mass",
        None,
    ]
    summary = {(e["class"], e["group"]): e for e in module_probe.summarise(rows)}
    assert summary[("benign", "circumscribed_mass")]["n"] == 1
    assert summary[("benign", "circumscribed_mass")]["dice_l"] == pytest.approx(0.4)
    assert summary[("malignant", "spiculated_mass")]["dice_l"] == pytest.approx(0.1)
    assert summary[("malignant", "pleomorphic_calcifications + spiculated_mass")]["dice_l"] == pytest.approx(0.3)
    assert summary[("benign", "all")]["n"] == 2  # the row without kinds still counts in the other groups


def test_parse_run_names_the_allowed_changes():
    assert stage_probe.parse_run("control") == ("control", {})
    assert stage_probe.parse_run("t_local=0.05,negatives=algorithm1") == (
        "t_local=0.05,negatives=algorithm1",
        {"t_local": 0.05, "negatives": "algorithm1"},
    )
    with pytest.raises(SystemExit, match="KEY=VALUE with KEY one of"):
        stage_probe.parse_run("tlocal=0.05")
    with pytest.raises(SystemExit, match="negatives is 'random' or 'algorithm1'"):
        stage_probe.parse_run("negatives=all")


def test_a_local_stage_trains_only_the_local_module_and_scores_every_epoch():
    """From a frozen global module: the global weights stay, the local ones move, one record per epoch with the
    validation measures of both classes."""
    from scripts.networks import GLAM

    torch.manual_seed(0)
    shipped = GLAM(**TINY)
    global_state = {k: v.clone() for k, v in shipped.global_network.state_dict().items()}
    settings = {**TINY, "num_patches_train": 2}
    model = stage_probe.fresh_model(settings, global_state, t_local=0.1, seed=0)
    assert model.aggregation_module("local").t == pytest.approx(0.1)
    train = _split(4, seed=1)
    train["label"][3] = 0  # a lesion-free image: random in-breast patches
    boxes = stage_probe.algorithm1_boxes(model, train["image"], 2)
    assert boxes.shape == (4, 2, 4)
    before = {k: v.clone() for k, v in model.local_network.state_dict().items()}
    setting = {"learning_rate": 1e-3, "lambda_sparsity": 1e-4, "patch_shift": 8, "negatives": "random"}
    scores = []

    def score(m):
        scores.append(1)
        return stage_probe.class_means(module_probe.per_lesion_rows(m, train, 16.0, 2))

    records = stage_probe.train_run(model, train, boxes, setting, epochs=2, batch=2, seed=0, score=score)
    assert [r["epoch"] for r in records] == [1, 2] and len(scores) == 2
    assert all(len(r["val"]["dice_l"]) == 2 and np.isfinite(r["loss"]) for r in records)
    after = model.local_network.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if after[k].is_floating_point())
    for k, v in model.global_network.state_dict().items():
        assert torch.equal(v, global_state[k]), k
