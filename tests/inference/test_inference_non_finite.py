"""Finite or refused in inference: a checkpoint holding NaN or Inf stops the run with one line naming the file and
the tensor, before the output folder is touched; an image whose model output is not finite (the weights finite) is
an errors.csv row naming the outputs, not a predictions.csv row with nan scores and a blank map."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import BUNDLE_ROOT, REPO_ROOT, workflow_command

from scripts.inference.step import split_non_finite

INFERENCE_CONFIG = BUNDLE_ROOT / "configs" / "inference.yaml"
TINY_INFERENCE = REPO_ROOT / "tests" / "configs" / "tiny_inference.yaml"
META = BUNDLE_ROOT / "configs" / "metadata.json"
TINY = dict(patch_size=64, local_depth=18, local_width=4, image_size=(256, 160))
TENSOR = "local_network.dn_resnet.layer1.0.conv1.weight"


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    from glam_benchmark.synthetic import make_synthetic_dataset
    from scripts.networks import GLAMSaliencyNet

    root = tmp_path_factory.mktemp("non_finite")
    make_synthetic_dataset(root / "png", 3, size=(256, 160), seed=1, fmt="png")
    folder = root / "png" / "images"
    torch.manual_seed(0)
    state = GLAMSaliencyNet(stage="joint", **TINY).state_dict()
    torch.save(state, root / "model.pt")
    return {"root": root, "folder": folder, "state": state, "ckpt": root / "model.pt"}


def test_split_non_finite_moves_the_bad_images_to_errors():
    from monai.data import MetaTensor

    items = [{"image": MetaTensor(torch.zeros(1, 2, 2), meta={"filename_or_obj": f"/in/{i}.png"})} for i in range(3)]
    y = torch.tensor([[0.1, 0.2], [float("nan"), 0.3], [0.4, 0.5]])
    maps = torch.zeros(3, 2, 4, 4)
    maps[1, 0, :2, :3] = float("inf")  # 6 Inf values in image 1
    maps[2, 1, 0, 0] = float("-inf")
    boxes = torch.arange(3 * 4).reshape(3, 1, 4)
    kept, pred, errors = split_non_finite(items, {"y_global": y, "saliency": maps, "patch_boxes": boxes})
    assert kept == [items[0]]
    assert torch.equal(pred["y_global"], y[:1]) and torch.equal(pred["patch_boxes"], boxes[:1])
    assert [e["image"] for e in errors] == ["/in/1.png", "/in/2.png"]
    assert errors[0]["error"].startswith(
        "NonFiniteOutput: the model's output is not finite (y_global holds 1 NaN values; saliency holds 6 Inf values)"
    )
    assert "(saliency holds 1 Inf values)" in errors[1]["error"]
    finite = {"y_global": y[:1], "saliency": maps[:1]}
    assert split_non_finite(items[:1], finite) == (items[:1], finite, [])
    assert split_non_finite(items[1:2], {"y_global": y[1:2]})[:2] == ([], None)


def test_a_non_finite_output_is_an_error_row_not_a_success_row(setup, tmp_path, caplog):
    """The fusion head's output (y_fusion) made NaN for the first image of every batch (batch size 2), the weights
    finite: those images are errors.csv rows (and warnings naming them), the others predictions as usual."""
    from monai.bundle import ConfigWorkflow

    out = tmp_path / "out"
    wf = ConfigWorkflow(
        config_file=[str(INFERENCE_CONFIG), str(TINY_INFERENCE)],
        meta_file=str(META),
        workflow_type="infer",
        input_dir=str(setup["folder"]),
        output_dir=str(out),
        ckpt_path=str(setup["ckpt"]),
    )
    wf.initialize()
    network = wf.parser.get_parsed_content("network")

    def first_image_nan(module, inputs, output):
        output = output.clone()
        output[0] = float("nan")
        return output

    network.fusion.register_forward_hook(first_image_nan)
    with caplog.at_level("WARNING", logger="scripts.inference.writer"):
        wf.run()
    wf.finalize()
    inputs = sorted(str(p) for p in setup["folder"].iterdir())
    assert len(inputs) == 3  # batches [0, 1], [2]
    errors = [e for e in _read_csv(out / "errors.csv") if e["error"]]
    rows = _read_csv(out / "predictions.csv")
    assert sorted(e["image"] for e in errors) == inputs[0::2]
    assert sorted(r["image"] for r in rows) == inputs[1::2]
    for e in errors:
        assert e["error"].startswith("NonFiniteOutput: the model's output is not finite (y_fusion holds 2 NaN values)")
    warned = [r.getMessage() for r in caplog.records if "NonFiniteOutput" in r.getMessage()]
    assert sorted(m.split(": NonFiniteOutput")[0] for m in warned) == inputs[0::2]
    for r in rows:
        assert 0 <= float(r["prob_benign"]) <= 1 and 0 <= float(r["prob_malignant"]) <= 1
    written = {p.name.split("_S_c")[0] for p in (out / "maps").iterdir()}
    assert written == {r["output_stem"] for r in rows}  # no map of a failed image
    timing = json.loads((out / "timing.json").read_text())
    assert timing["failed"] == 2 and timing["written"] == 1


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_load_for_inference_through_the_config_refuses_non_finite_weights(setup, tmp_path, value):
    """inference.yaml's `network` (load_for_inference), as the MONAI Label app loads through the bundle."""
    from monai.bundle import ConfigParser

    from scripts.errors import user_error

    state = {k: v.clone() for k, v in setup["state"].items()}
    state[TENSOR].view(-1)[5:8] = value
    torch.save(state, tmp_path / "model.pt")
    parser = ConfigParser()
    parser.read_config([str(INFERENCE_CONFIG), str(TINY_INFERENCE)])
    parser.update({"ckpt_path": str(tmp_path / "model.pt"), "device": "$torch.device('cpu')"})
    with pytest.raises(RuntimeError) as err:
        parser.get_parsed_content("network")
    found = user_error(err.value)
    kind = "NaN" if value != value else "Inf"
    assert str(found).startswith(f"{tmp_path / 'model.pt'}: tensor {TENSOR} holds 3 {kind} values;")


def test_the_command_line_stops_with_one_line_before_the_output_folder(setup, tmp_path):
    state = {k: v.clone() for k, v in setup["state"].items()}
    state[TENSOR].view(-1)[:3] = float("nan")
    ckpt = tmp_path / "model.pt"
    torch.save(state, ckpt)
    out = tmp_path / "out"
    configs = json.dumps([str(INFERENCE_CONFIG), str(TINY_INFERENCE)])
    cmd = [
        *workflow_command("inference"),
        "--config_file",
        configs,
    ]
    cmd += ["--meta_file", str(META), "--input_dir", str(setup["folder"]), "--output_dir", str(out)]
    cmd += ["--ckpt_path", str(ckpt)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: NonFiniteError: {ckpt}: tensor {TENSOR} holds 3 NaN values; the checkpoint is not usable (weights "
        "that diverged in training, or a damaged copy; see docs/training.md, 'Non-finite losses and weights')"
    ]
    assert "Traceback" not in proc.stderr and not out.exists()
