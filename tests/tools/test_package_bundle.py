"""tools/package_bundle.py: the zip's file list, the --weights check, configs/inference.json for
``monai.bundle.load``, and the verification from a clean folder."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import BUNDLE_ROOT, REPO_ROOT

SCRIPT = REPO_ROOT / "tools" / "package_bundle.py"
NAME = "glam_mammography"
VERSION = json.loads((BUNDLE_ROOT / "configs" / "metadata.json").read_text())["version"]


def _load_tool():
    spec = importlib.util.spec_from_file_location("package_bundle", SCRIPT)
    if "package_bundle" not in sys.modules:
        module = importlib.util.module_from_spec(spec)
        sys.modules["package_bundle"] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["package_bundle"]


def _names(zip_path) -> set[str]:
    with zipfile.ZipFile(zip_path) as zf:
        return {i.filename for i in zf.infolist() if not i.is_dir()}


def test_zip_keeps_the_zoo_layout_and_leaves_out_caches_outputs_and_models(tmp_path):
    """A copy of the bundle with the junk a working folder collects: none of it reaches the zip, every source
    file does (compared with an independent walk of the copy), and of the model files only the shipped
    models/model.pt, byte for byte (none with ship_weights=False)."""
    tool = _load_tool()
    bundle = tmp_path / "bundle"
    shutil.copytree(BUNDLE_ROOT, bundle, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    expected = {
        f"{NAME}/{p.relative_to(bundle).as_posix()}"
        for top in ("configs", "scripts", "docs")
        for p in (bundle / top).rglob("*")
        if p.is_file()
    } | {f"{NAME}/LICENSE"}
    (bundle / "scripts" / "__pycache__").mkdir(exist_ok=True)
    (bundle / "scripts" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (bundle / "scripts" / "stray.pyc").write_bytes(b"\0")
    junk_files = ("eval/metrics.json", "runs/events.out", "inference/predictions.csv")
    for junk in (*junk_files, "models/joint/model.pt", "models/verify_model.ts", "models/model_key_metric=0.5.pt"):
        (bundle / junk).parent.mkdir(parents=True, exist_ok=True)
        (bundle / junk).write_bytes(b"x")

    zip_path = tool.build_zip(tmp_path / "dist", NAME, bundle_root=bundle)
    assert zip_path.name == f"{NAME}_v{VERSION}.zip"
    names = _names(zip_path)
    expected |= {f"{NAME}/configs/inference.json"}  # generated for monai.bundle.load
    assert names == expected | {f"{NAME}/models/model.pt"}
    with zipfile.ZipFile(zip_path) as zf:
        assert zf.read(f"{NAME}/models/model.pt") == (BUNDLE_ROOT / "models" / "model.pt").read_bytes()
        # the shipped model's window is already the metadata's: the file is shipped unchanged
        assert zf.read(f"{NAME}/configs/metadata.json") == (BUNDLE_ROOT / "configs" / "metadata.json").read_bytes()

    zip_path = tool.build_zip(tmp_path / "dist", NAME, bundle_root=bundle, ship_weights=False)
    names = _names(zip_path)
    assert names == expected
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    # the paper's reproduction (glam_benchmark/) stays out: no baseline, probe, benchmark or synthetic-data code
    lab = re.compile(r"(^|[/_])(cam|gmic|unet|baseline|probe|benchmark|synthetic)([/_.]|$)", re.IGNORECASE)
    assert not [n for n in names if lab.search(n.split("/", 1)[1])]
    for required in ("configs/inference.yaml", "configs/metadata.json", "scripts/__init__.py", "LICENSE"):
        assert f"{NAME}/{required}" in names
    for required in ("docs/README.md", "docs/data_license.txt"):
        assert f"{NAME}/{required}" in names
    with zipfile.ZipFile(zip_path) as zf:
        assert f"{NAME}/models/" in zf.namelist()  # the folder is there even without weights
        assert zf.read(f"{NAME}/LICENSE") == (BUNDLE_ROOT / "LICENSE").read_bytes()
    assert not list(zip_path.parent.glob(".*.tmp"))  # written atomically: no temporary file left


def test_bundle_license_is_apache_and_readme_links_the_data_licence():
    text = (BUNDLE_ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    data = (BUNDLE_ROOT / "docs" / "data_license.txt").read_text(encoding="utf-8")
    assert "no patient data" in data and "glam_benchmark/synthetic/" in data


def test_weights_with_a_wrong_key_fail_naming_the_key(tmp_path, capsys):
    from scripts.networks import GLAMSaliencyNet

    tool = _load_tool()
    state = GLAMSaliencyNet().state_dict()
    first = next(k for k in state if k != "model_settings")  # a layer's weight, not the settings record
    state["not_a_layer.weight"] = state.pop(first)
    weights = tmp_path / "bad.pt"
    torch.save(state, weights)
    assert tool.main(["--out", str(tmp_path / "dist"), "--weights", str(weights)]) == 1
    err = capsys.readouterr().err
    assert "FAILED weights" in err
    assert "not_a_layer.weight" in err and first in err  # the unexpected and the missing key are both named
    assert not list(tmp_path.rglob("*.zip"))  # nothing half-built is left behind


def test_no_weights_excludes_weights_and_needs_no_model(tmp_path, capsys):
    """--no-weights: models/ stays empty; it cannot be combined with --weights."""
    tool = _load_tool()
    with pytest.raises(SystemExit):
        tool.main(["--out", str(tmp_path / "dist"), "--no-weights", "--weights", str(tmp_path / "w.pt")])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"\[weights\].*exclude each other"):
        tool.build_zip(tmp_path / "dist", NAME, weights=tmp_path / "w.pt", ship_weights=False)
    bundle = tmp_path / "bundle"
    shutil.copytree(BUNDLE_ROOT, bundle, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "models"))
    (bundle / "models").mkdir()
    zip_path = tool.build_zip(tmp_path / "dist", NAME, bundle_root=bundle)  # a bundle without weights
    assert not [n for n in _names(zip_path) if "/models/" in n]


def test_training_checkpoint_is_not_a_state_dict(tmp_path):
    tool = _load_tool()
    weights = tmp_path / "ckpt.pt"
    torch.save({"network": {"w": torch.zeros(1)}, "epoch": 3}, weights)
    with pytest.raises(ValueError, match=r"\[weights\].*ckpt\.pt: not a plain state dict"):
        tool.build_zip(tmp_path / "dist", NAME, weights=weights)


@pytest.mark.slow
def test_package_and_verify_from_a_clean_folder(tmp_path):
    """The command line end to end: build, unzip elsewhere, metadata against the schema (when ../shared has it),
    every config parsed with only the bundle on the path, inference on two synthetic images."""
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "dist"), "--keep", str(tmp_path / "verify")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    zip_path = tmp_path / "dist" / f"{NAME}_v{VERSION}.zip"
    assert f"bundle verified: {zip_path}" in res.stdout
    for step in ("build", "unzip", "load_configs", "monai_load", "verify_net_in_out", "synthetic_inputs", "inference"):
        assert f"ok     {step}" in res.stdout
    # monai.bundle.load gave the network of configs/inference.json with every shipped tensor
    assert (
        "monai_load       GLAMSaliencyNet with the 200 tensors of models/model.pt; S_c (1, 2, 184, 120)" in res.stdout
    )
    schema = REPO_ROOT.parent / "shared" / "schema" / "meta_schema_20240725.json"
    assert ("ok     verify_metadata" if schema.is_file() else "skip   verify_metadata") in res.stdout
    # by default the bundle's demonstration model is shipped and run in its own window, without any preset
    assert "synthetic_inputs 2 images of 736x480" in res.stdout
    assert "predictions.csv has 2 rows (shipped models/model.pt)" in res.stdout
    # the inference ran on the unzipped copy: its outputs and the bundle it used are in the kept folder
    assert (tmp_path / "verify" / "unzipped" / NAME / "configs" / "inference.yaml").is_file()
    rows = (tmp_path / "verify" / "out" / "predictions.csv").read_text(encoding="utf-8").strip().splitlines()
    assert len(rows) == 3 and all("/verify/inputs/" in r for r in rows[1:])
    assert _names(zip_path) >= {f"{NAME}/docs/data_license.txt", f"{NAME}/scripts/__init__.py"}


@pytest.mark.slow
def test_a_config_reaching_outside_the_bundle_fails_the_config_step(tmp_path):
    """The verification has teeth: a config importing a repository module and a non-MONAI target is rejected."""
    tool = _load_tool()
    bundle = tmp_path / "bundle"
    shutil.copytree(BUNDLE_ROOT, bundle, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (bundle / "configs" / "extra.yaml").write_text(
        "imports:\n  - $import tests.conftest\nnet:\n  _target_: mypkg.Net\n", encoding="utf-8"
    )
    zip_path = tool.build_zip(tmp_path / "dist", NAME, bundle_root=bundle)
    with pytest.raises(ValueError, match=r"\[load_configs\]") as info:
        tool.verify_zip(zip_path, NAME, None, tool.Report())
    assert "imports tests.conftest" in str(info.value) and "_target_ mypkg.Net" in str(info.value)


def _tiny_weights(path, record: bool = True, **sizes):
    """A random GLAM state dict; ``record=False``: without the settings record (a checkpoint from before the bundle
    recorded settings)."""
    from scripts.networks import GLAMSaliencyNet
    from scripts.networks.settings import SETTINGS_KEY

    torch.manual_seed(0)
    state = GLAMSaliencyNet(stage="joint", **sizes).state_dict()
    if not record:
        state.pop(SETTINGS_KEY)
    torch.save(state, path)
    return path


def test_weights_that_record_their_settings_need_no_preset(tmp_path):
    """A checkpoint with its settings record (every checkpoint the bundle's training writes): packaged without a
    preset, the configs are shipped unchanged, the metadata's shapes become the recorded window, and the packaged
    inference.yaml builds the network the weights load into strictly. A preset that disagrees with the record is
    refused, naming the setting."""
    import yaml
    from monai.bundle import ConfigParser

    tool = _load_tool()
    weights = _tiny_weights(tmp_path / "tiny.pt", patch_size=64, local_depth=18, local_width=4, image_size=(320, 192))
    zip_path = tool.build_zip(tmp_path / "dist", NAME, weights=weights)
    with zipfile.ZipFile(zip_path) as zf:
        packaged = zf.read(f"{NAME}/configs/inference.yaml")
        meta = json.loads(zf.read(f"{NAME}/configs/metadata.json"))
        (tmp_path / "models").mkdir()
        (tmp_path / "models" / "model.pt").write_bytes(zf.read(f"{NAME}/models/model.pt"))
    assert packaged == (BUNDLE_ROOT / "configs" / "inference.yaml").read_bytes()
    fmt = meta["network_data_format"]
    assert fmt["inputs"]["image"]["spatial_shape"] == [320, 192]
    assert fmt["outputs"]["pred"]["spatial_shape"] == [80, 48]
    parser = ConfigParser(yaml.safe_load(packaged))
    parser["bundle_root"] = str(tmp_path)  # the packaged models/model.pt
    assert parser.get_parsed_content("image_size") == [320, 192]
    net = parser.get_parsed_content("network_def")
    net.load_state_dict(torch.load(tmp_path / "models" / "model.pt", weights_only=True), strict=True)
    assert tuple(net.patch_size) == (64, 64)

    other = tmp_path / "other.yaml"
    other.write_text("patch_size: 32\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[weights\].*patch_size: checkpoint \[64, 64\], network \[32, 32\]"):
        tool.build_zip(tmp_path / "dist2", NAME, weights=weights, preset=other)
    assert not list((tmp_path / "dist2").glob("*.zip"))


def test_preset_writes_the_model_sizes_into_the_packaged_configs_and_metadata(tmp_path):
    """Weights trained with a size preset before checkpoints recorded their settings: without --preset they are
    refused (the full-size network_def has other shapes); with it, the packaged inference.yaml and train.yaml build
    the preset's network (parsed here by MONAI's ConfigParser), comments are kept, and the metadata's shapes follow
    the image size."""
    import yaml
    from monai.bundle import ConfigParser

    tool = _load_tool()
    preset = REPO_ROOT / "tests" / "configs" / "tiny_inference.yaml"
    weights = _tiny_weights(tmp_path / "tiny.pt", record=False, patch_size=64, local_depth=18, local_width=4)
    with pytest.raises(ValueError, match=r"\[weights\].*does not match network_def"):
        tool.build_zip(tmp_path / "dist", NAME, weights=weights)

    zip_path = tool.build_zip(tmp_path / "dist", NAME, weights=weights, preset=preset)
    with zipfile.ZipFile(zip_path) as zf:
        packaged = {rel: zf.read(f"{NAME}/{rel}").decode() for rel in tool.PRESET_CONFIGS}
        meta = json.loads(zf.read(f"{NAME}/configs/metadata.json"))
        assert zf.read(f"{NAME}/models/model.pt") == weights.read_bytes()
    for rel, text in packaged.items():
        original = (BUNDLE_ROOT / rel).read_text(encoding="utf-8")
        assert text.count("\n") == original.count("\n") and text.count("#") == original.count("#")
        parser = ConfigParser(yaml.safe_load(text))
        assert parser["image_size"] == [256, 160] and parser["patch_size"] == 64
        assert parser["local_depth"] == 18 and parser["local_width"] == 4
        assert parser["crop_iterations"] == 5 and parser["crop_buffer"] == 4
        assert parser["num_workers"] != 0  # not a model id: the preset's value stays out
    fmt = meta["network_data_format"]
    assert fmt["inputs"]["image"]["spatial_shape"] == [256, 160]
    assert fmt["outputs"]["pred"]["spatial_shape"] == [64, 40]
    # the packaged config's network takes the shipped weights strictly
    parser = ConfigParser(yaml.safe_load(packaged["configs/inference.yaml"]))
    parser["bundle_root"] = str(tmp_path)
    parser.get_parsed_content("network_def").load_state_dict(torch.load(weights, weights_only=True), strict=True)


def test_preset_errors_name_the_file_and_the_id(tmp_path):
    tool = _load_tool()
    weights = _tiny_weights(tmp_path / "tiny.pt", patch_size=64, local_depth=18, local_width=4)
    expr = tmp_path / "expr.yaml"
    expr.write_text("patch_size: 64\nimage_size: '$[256, 160]'\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[preset\].*expr\.yaml: image_size is an expression"):
        tool.build_zip(tmp_path / "dist", NAME, weights=weights, preset=expr)
    unrelated = tmp_path / "unrelated.yaml"
    unrelated.write_text("num_workers: 0\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[preset\].*unrelated\.yaml sets none of the model ids"):
        tool.build_zip(tmp_path / "dist", NAME, weights=weights, preset=unrelated)
    with pytest.raises(ValueError, match=r"\[preset\].*give both"):
        tool.build_zip(tmp_path / "dist", NAME, preset=expr)
    assert not list(tmp_path.rglob("*.zip"))


@pytest.mark.slow
def test_package_weights_with_their_preset_and_verify(tmp_path):
    """The sharing path for a model trained with a preset: the verification runs inference with the shipped
    weights at the preset's image size from the unzipped bundle alone."""
    weights = _tiny_weights(tmp_path / "tiny.pt", record=False, patch_size=64, local_depth=18, local_width=4)
    preset = REPO_ROOT / "tests" / "configs" / "tiny_inference.yaml"
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "dist"), "--weights", str(weights)]
        + ["--preset", str(preset), "--keep", str(tmp_path / "verify")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "synthetic_inputs 2 images of 256x160" in res.stdout
    assert "predictions.csv has 2 rows (shipped models/model.pt)" in res.stdout


def test_inference_json_is_the_packaged_yaml_with_a_self_locating_bundle_root(tmp_path):
    """configs/inference.json holds what MONAI reads from the packaged inference.yaml (the preset's sizes
    included), bundle_root an expression locating the bundle by its scripts package (inference.yaml's own since it
    runs from any folder). A hand-written inference.json in the bundle is refused rather than overwritten."""
    import yaml

    tool = _load_tool()
    weights = _tiny_weights(tmp_path / "tiny.pt", record=False, patch_size=64, local_depth=18, local_width=4)
    preset = REPO_ROOT / "tests" / "configs" / "tiny_inference.yaml"
    zip_path = tool.build_zip(tmp_path / "dist", NAME, weights=weights, preset=preset)
    with zipfile.ZipFile(zip_path) as zf:
        from_yaml = yaml.safe_load(zf.read(f"{NAME}/configs/inference.yaml"))
        from_json = json.loads(zf.read(f"{NAME}/configs/inference.json"))
    assert from_yaml["patch_size"] == 64
    assert from_json["bundle_root"] == "$os.path.dirname(os.path.dirname(os.path.abspath(scripts.__file__)))"
    assert from_json == from_yaml

    bundle = tmp_path / "bundle"
    shutil.copytree(BUNDLE_ROOT, bundle, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "models"))
    (bundle / "configs" / "inference.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[inference_json\].*inference\.json exists"):
        tool.build_zip(tmp_path / "dist2", NAME, bundle_root=bundle)
    (bundle / "configs" / "inference.json").unlink()
    text = (bundle / "configs" / "inference.yaml").read_text(encoding="utf-8")
    (bundle / "configs" / "inference.yaml").write_text(text.replace("  - $import os\n", ""), encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[inference_json\].*lacks the imports \['\$import os'\]"):
        tool.build_zip(tmp_path / "dist2", NAME, bundle_root=bundle)
    assert not list((tmp_path / "dist2").glob("*.zip"))


# Run in a fresh interpreter whose only extra path entry is the unzipped bundle, from a folder that is not the
# bundle's (as a user calls MONAI's API): what monai.bundle.load returns, saved for the test to compare.
_LOAD = r"""
import json, sys
from pathlib import Path
import torch
import monai
bundle_dir, name, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
h, w = int(sys.argv[4]), int(sys.argv[5])
net = monai.bundle.load(name, bundle_dir=str(bundle_dir), workflow_type="inference", device="cpu")
info = {"type": type(net).__name__, "is_module": isinstance(net, torch.nn.Module)}
if info["is_module"]:
    torch.save(net.state_dict(), out / "loaded.pt")
    info["source"] = sys.modules[type(net).__module__].__file__
    info["patch_size"] = list(net.patch_size)
    x = torch.rand(1, 1, h, w, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        net.eval()
        info["forward"] = list(net(x).shape)
        info["forward_all"] = {k: list(v.shape) for k, v in net.forward_all(x).items() if torch.is_tensor(v)}
(out / "loaded.json").write_text(json.dumps(info))
"""


def _monai_load(zip_path: Path, tmp_path: Path, window: tuple[int, int]) -> tuple[dict, dict | None]:
    """Unzip ``zip_path`` and call monai.bundle.load on it in a clean interpreter; (what it returned, its state)."""
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(tmp_path / "unzipped")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(tmp_path / "unzipped" / NAME), PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1")
    args = [str(tmp_path / "unzipped"), NAME, str(elsewhere), *map(str, window)]
    res = subprocess.run(
        [sys.executable, "-c", _LOAD, *args], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    info = json.loads((elsewhere / "loaded.json").read_text())
    state = torch.load(elsewhere / "loaded.pt", weights_only=True) if info["is_module"] else None
    return info, state


@pytest.mark.parametrize("weights", ["shipped", "tiny"])
def test_monai_load_returns_the_network_holding_the_packaged_weights(tmp_path, weights):
    """monai.bundle.load(name, bundle_dir, workflow_type="inference") on the unzipped bundle, from another folder
    with only the bundle on the path, returns the GLAM network of configs/inference.json (its class from the
    bundle) whose tensors are the packaged weights', one by one (load() itself copies matching names and shapes
    silently), built with the settings those weights record; it runs on an input of their window. The tiny weights
    (other sizes than the repository's models/model.pt) show the network follows the packaged checkpoint."""
    from scripts.networks.settings import SETTINGS_KEY, decode_settings, settings_differences

    tool = _load_tool()
    if weights == "shipped":
        source, window, patch = BUNDLE_ROOT / "models" / "model.pt", (736, 480), [128, 128]
        zip_path = tool.build_zip(tmp_path / "dist", NAME)
    else:
        window, patch = (256, 160), [64, 64]
        source = _tiny_weights(tmp_path / "tiny.pt", patch_size=64, local_depth=18, local_width=4, image_size=window)
        zip_path = tool.build_zip(tmp_path / "dist", NAME, weights=source)
    info, state = _monai_load(zip_path, tmp_path, window)

    assert info["is_module"], f"monai.bundle.load returned a {info['type']}"
    assert info["type"] == "GLAMSaliencyNet" and info["patch_size"] == patch
    assert Path(info["source"]).resolve().is_relative_to((tmp_path / "unzipped" / NAME).resolve())
    expected = torch.load(source, weights_only=True)
    assert set(state) == set(expected)
    for key, tensor in expected.items():
        if key != SETTINGS_KEY:  # the network keeps its own record (it names this bundle's version)
            assert torch.equal(state[key], tensor), key
    assert settings_differences(decode_settings(expected[SETTINGS_KEY]), decode_settings(state[SETTINGS_KEY])) == []
    h, w = window
    assert info["forward"] == [1, 2, h // 4, w // 4]  # S_c, what the zoo's tools call the network for
    outputs = info["forward_all"]
    assert outputs["saliency"] == outputs["saliency_local"] == [1, 2, h // 4, w // 4]
    assert outputs["y_global"] == [1, 2]


DEMO_PHRASES = ("demonstration", "synthetic", "calibrated", "benchmark")


def _zip_texts(zip_path) -> tuple[dict, str, str, set[str]]:
    with zipfile.ZipFile(zip_path) as zf:
        meta = json.loads(zf.read(f"{NAME}/configs/metadata.json"))
        card = zf.read(f"{NAME}/docs/README.md").decode()
        licence = zf.read(f"{NAME}/docs/data_license.txt").decode()
    return meta, card, licence, _names(zip_path)


def test_user_weights_are_described_by_their_records_and_the_users_text(tmp_path):
    """--weights mine.pt: the metadata and the model card describe the user's model (its settings record, the
    selection.json beside it, the evaluation's metrics.json, the text given), never the demonstration model."""
    tool = _load_tool()
    stage_dir = tmp_path / "models" / "joint"
    stage_dir.mkdir(parents=True)
    weights = _tiny_weights(stage_dir / "model.pt", patch_size=64, local_depth=18, local_width=4, image_size=(320, 192))
    record = {"stage": "joint", "metric": "val_auc_mean", "reason": "no masks", "best_epoch": 2, "best_value": 0.8125}
    record.update(epochs_run=3, validation_items=40)
    (stage_dir / "selection.json").write_text(json.dumps(record))
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"S_c": {"dice_malignant": 0.21}}))
    card_file = tmp_path / "card.md"
    card_file.write_text("# Our GLAM\nTrained on the hospital's 2019-2022 screening exams.\n")
    licence_file = tmp_path / "licence.txt"
    licence_file.write_text("Internal data; not redistributable.\n")
    texts = tool.ModelTexts(
        description="GLAM trained on our hospital's screening mammograms.",
        data_source="Hospital X, 2019-2022, 4,000 screening exams",
        model_card=card_file,
        metrics=metrics,
        data_license=licence_file,
    )
    meta, card, licence, names = _zip_texts(tool.build_zip(tmp_path / "dist", NAME, weights=weights, texts=texts))
    assert meta["description"] == texts.description and meta["data_source"] == texts.data_source
    assert meta["eval_metrics"]["evaluation"] == {"S_c": {"dice_malignant": 0.21}}
    assert meta["eval_metrics"]["selection"] == (
        "joint stage selected at epoch 2 of 3 by val_auc_mean = 0.8125 on 40 validation images (no masks)"
    )
    assert list(meta["changelog"]) == [VERSION] and "model.pt" in meta["changelog"][VERSION]
    assert card == card_file.read_text() and licence == licence_file.read_text()
    assert f"{NAME}/docs/training_curves.png" not in names
    assert meta["network_data_format"]["inputs"]["image"]["spatial_shape"] == [320, 192]
    text = json.dumps({k: meta[k] for k in ("description", "data_source", "eval_metrics", "changelog", "intended_use")})
    assert not [p for p in DEMO_PHRASES if p in text.lower()]

    # without text: written from the records, saying what the packager did not state
    meta, card, licence, _ = _zip_texts(tool.build_zip(tmp_path / "dist2", NAME, weights=weights))
    assert (
        "This model: 320x192 input window, 64 px patches, ResNet-18-HR local module of width 4" in meta["description"]
    )
    assert meta["data_source"].startswith("Not stated by the packager")
    assert "not stated" in licence
    assert meta["description"] in card and "| image_size | [320, 192] |" in card
    assert "val_auc_mean = 0.8125" in card
    text = json.dumps({k: meta[k] for k in ("description", "data_source", "eval_metrics", "changelog")}) + card
    assert not [p for p in DEMO_PHRASES if p in text.lower()]

    # the bundle's own weights keep the bundle's own texts; user text without --weights is refused
    with pytest.raises(tool.PackagingError, match="give them with --weights"):
        tool.build_zip(tmp_path / "dist3", NAME, texts=tool.ModelTexts(description="x"))


def test_command_line_refuses_model_text_without_weights(tmp_path, capsys):
    tool = _load_tool()
    assert tool.main(["--out", str(tmp_path / "dist"), "--description", "ours", "--no-weights"]) == 1
    assert "FAILED metadata: [metadata] --description, --data_source" in capsys.readouterr().err
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())


def test_the_description_names_the_local_padding_when_it_is_not_the_papers():
    _load_tool()
    from model_texts import settings_summary

    record = {"image_size": [320, 192], "patch_size": [64, 64], "local_depth": 18, "local_width": 4}
    assert "ResNet-18-HR local module of width 4, the paper's" in settings_summary(record)
    replicate = settings_summary({**record, "local_padding_mode": "replicate"})
    assert "ResNet-18-HR local module of width 4 padding by replication, the paper's" in replicate
    assert "replication" not in settings_summary({**record, "local_padding_mode": "zeros"})
