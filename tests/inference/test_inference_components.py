"""The named components inference.yaml is made of, each against a hand-computed case: the model settings (the
checkpoint's record merged with the ids that override it), the network loaded for inference, the run record, the
batch size / workers / writer threads rules, the plan as the dataset's data, the maps the outputs need, the note of
maps stating a pixel size the file does not, a datalist given by its path, the run's last step, and the config as a
MONAI inference workflow with few expressions."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from config_chains import parse
from conftest import BUNDLE_ROOT

INFERENCE_CONFIG = BUNDLE_ROOT / "configs" / "inference.yaml"
META = BUNDLE_ROOT / "configs" / "metadata.json"
TINY = dict(image_size=(256, 160), patch_size=64, local_depth=18, local_width=4, t_global=0.05)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from scripts.networks import GLAMSaliencyNet

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("components") / "model.pt"
    torch.save(GLAMSaliencyNet(stage="joint", **TINY).state_dict(), path)
    return path


def test_checkpoint_settings_are_the_record_else_glams_defaults(ckpt, tmp_path):
    from scripts.networks.inference import CHECKPOINT_SETTINGS, checkpoint_settings
    from scripts.networks.settings import SETTINGS_KEY, decode_settings, encode_settings

    recorded = checkpoint_settings(ckpt)
    assert set(recorded) == set(CHECKPOINT_SETTINGS)
    assert recorded["image_size"] == [256, 160] and recorded["patch_size"] == [64, 64]
    assert recorded["local_width"] == 4 and recorded["t_global"] == 0.05 and recorded["joint_modules"] is True
    # no file: GLAM's defaults, the paper's full-size model
    default = checkpoint_settings(tmp_path / "missing.pt")
    assert default["image_size"] == (2944, 1920) and default["patch_size"] == 512 and default["local_width"] == 64
    # a record without a setting (an older checkpoint): GLAM's default for that one, the record for the others
    state = torch.load(ckpt, weights_only=True)
    record = decode_settings(state["model_settings"])
    del record["local_depth"]
    state[SETTINGS_KEY] = encode_settings(record)
    older = tmp_path / "older.pt"
    torch.save(state, older)
    partial = checkpoint_settings(older)
    assert partial["local_depth"] == 34 and partial["local_width"] == 4  # GLAM's ResNet-34 default, the record's 4


def test_inference_settings_merge_the_overrides_and_read_text_as_the_command_line_gives_it(ckpt):
    from scripts.networks.inference import FROM_CHECKPOINT, checkpoint_settings, inference_settings

    recorded = checkpoint_settings(ckpt)
    kept = inference_settings(recorded)
    assert {k: kept[k] for k in recorded} == recorded
    assert kept["stage"] == "joint" and kept["num_patches_eval"] == 1 and kept["gamma_c"] == 0.5
    given = inference_settings(
        recorded,
        stage=FROM_CHECKPOINT,
        num_patches_eval="3",
        gamma_c="0.25",
        patch_size=32,
        joint_modules="false",
        pool_in_breast="true",
        t_local="0.1",
        attention_hidden="16",
        local_width=FROM_CHECKPOINT,
    )
    assert given["patch_size"] == 32 and given["local_width"] == 4
    assert given["joint_modules"] is False and given["stage"] == "local"  # no joint modules: the local stage
    assert given["pool_in_breast"] is True
    assert given["num_patches_eval"] == 3 and given["attention_hidden"] == 16
    assert given["gamma_c"] == 0.25 and given["t_local"] == 0.1 and isinstance(given["t_global"], float)
    assert inference_settings(recorded, stage="local")["stage"] == "local"  # a stage given stays
    with pytest.raises(ValueError, match="unknown model settings \\['patch_sise'\\]"):
        inference_settings(recorded, patch_sise=32)
    with pytest.raises(ValueError, match="joint_modules must be true or false"):
        inference_settings(recorded, joint_modules="maybe")


def test_the_network_is_built_from_the_settings_and_loaded_strictly(ckpt):
    from scripts.networks import AutocastInference, GLAMSaliencyNet
    from scripts.networks.fast_inference import load_for_inference
    from scripts.networks.inference import checkpoint_settings, inference_settings

    settings = inference_settings(checkpoint_settings(ckpt))
    net = GLAMSaliencyNet(**settings)
    loaded = load_for_inference(net, ckpt, "cpu", "fp32")
    assert loaded is net and not loaded.training
    saved = torch.load(ckpt, weights_only=True)
    assert all(torch.equal(v, saved[k]) for k, v in loaded.state_dict().items())
    fast = load_for_inference(GLAMSaliencyNet(**settings), ckpt, "cpu", "bf16")
    assert isinstance(fast, AutocastInference) and fast.dtype == torch.bfloat16
    # an override that contradicts the record: refused with the setting and the file named
    other = GLAMSaliencyNet(**inference_settings(checkpoint_settings(ckpt), local_width=8))
    with pytest.raises(ValueError, match=r"local_width: checkpoint 4, network 8") as raised:
        load_for_inference(other, ckpt, "cpu", "fp32")
    assert str(ckpt) in str(raised.value)


def test_run_settings_are_the_record_of_the_run(ckpt):
    """inference.yaml's run_settings, with the command line's texts as they arrive."""
    parser = parse(ckpt_path=str(ckpt), precision="fp32", crop_iterations="5", crop_buffer=4.0)
    for key, value in {"input_spacing": [0.1, 0.1], "spacing_fallback": "model", "panel_height": None}.items():
        parser[key] = value
    parser["accept_non_mammography"] = "false"
    parser["spacing_range"] = ["0.05", 0.5]
    settings = parser.get_parsed_content("run_settings")
    assert settings == {
        "checkpoint_sha256": hashlib.sha256(ckpt.read_bytes()).hexdigest(),
        "model": parser.get_parsed_content("network_def").settings,
        "precision": "fp32",
        "crop_iterations": 5,
        "crop_buffer": 4,
        "input_spacing": [0.1, 0.1],
        "spacing_fallback": "model",
        "accept_non_mammography": False,  # the command line's text "false" is no
        "panel_height": None,
        "spacing_range": [0.05, 0.5],
    }


def test_batch_size_workers_and_writer_threads():
    from scripts.inference.inputs import batch_size_for, loader_workers
    from scripts.inference.writer import writer_threads

    assert batch_size_for("auto", "cpu") == 2 and batch_size_for("auto", torch.device("cuda:0")) == 8
    assert batch_size_for({"global": 8, "local": 4, "joint": 3}, "cpu") == 3  # a training preset: the joint one
    assert batch_size_for("4", "cpu") == 4
    with pytest.raises(ValueError, match="joint"):
        batch_size_for({"global": 8}, "cpu")
    # half the cores, at most 8 (workers may be 0: read in the main process)
    assert [loader_workers("auto", cpus=c) for c in (1, 2, 6, 16, 64)] == [0, 1, 3, 8, 8]
    assert loader_workers(5) == 5
    # half the cores, at least 2, at most 8
    assert [writer_threads("auto", cpus=c) for c in (1, 2, 6, 16, 64)] == [2, 2, 3, 8, 8]
    assert writer_threads("1") == 1


def test_the_loader_batches_in_order_with_the_errors_carried(tmp_path):
    from scripts.inference.inputs import SafeDataset

    items = [{"image": torch.full((1, 4, 3), float(i))} for i in range(5)]
    items[3] = {"image": str(tmp_path / "bad.png"), "error": "MammogramReadError: unreadable"}
    parser = parse(batch_size="auto", num_workers=0, device="cpu")
    parser["dataset"] = SafeDataset(items)
    batches = list(parser.get_parsed_content("dataloader"))
    assert [len(b["items"]) + len(b["errors"]) for b in batches] == [2, 2, 1]
    assert [float(img[0, 0, 0]) for b in batches if b["image"] is not None for img in b["image"]] == [0, 1, 2, 4]
    assert batches[1]["errors"] == [{"image": str(tmp_path / "bad.png"), "error": "MammogramReadError: unreadable"}]


def test_the_plan_is_the_sequence_of_its_items_and_its_skips_count_when_empty():
    from scripts.inference.folder import InferencePlan
    from scripts.inference.writer import GLAMInferenceWriter

    plan = InferencePlan(items=[{"image": "a"}, {"image": "b"}], total=3, skipped=1)
    assert len(plan) == 2 and plan[1] == {"image": "b"} and list(plan) == plan.items
    empty = InferencePlan(items=[], total=3, skipped=3)  # everything done before: falsy, yet a plan
    tables = type("Tables", (), {"written": 0, "failed": 0})()
    folder = type("Folder", (), {"plan": empty, "tables": tables, "outputs": None, "path": None})()
    assert GLAMInferenceWriter(folder, None, threads=2).stats()["skipped"] == 3


def test_the_maps_an_output_selection_brings_back_onto_the_file():
    from scripts.inference.files import OutputSelection

    panel_only = OutputSelection.parse(["panel"])
    assert panel_only.panel_maps() == ("S_c",) and panel_only.maps_on_file() == ("S_c",)
    written = OutputSelection.parse(["S_l", "S_g", "panel"])
    assert written.panel_maps() == ("S_g", "S_l") and written.maps_on_file() == ("S_g", "S_l")
    segmentation = OutputSelection.parse(["S_l"], "map")  # no panel; the DICOM Segmentation holds S_c
    assert segmentation.maps_on_file() == ("S_l", "S_c")
    assert OutputSelection.parse([], "none").maps_on_file() == ()


def test_the_note_of_maps_that_state_a_pixel_size_the_file_does_not():
    from scripts.inference.files import OutputSelection
    from scripts.inference.maps import map_spacing_note

    maps = OutputSelection.parse(["S_c"])
    assert map_spacing_note({"format": "dicom", "spacing": [0.07, 0.08]}, maps) is None  # the file's own
    assert map_spacing_note({"format": "png"}, maps) is None  # a PNG: 1 mm is what every viewer shows
    assert map_spacing_note({"format": "dicom"}, OutputSelection.parse(["panel"])) is None  # no map written
    note, first = map_spacing_note({"format": "dicom", "spacing": [0.0, 0.0]}, maps)
    assert first and note.endswith("the NIfTI maps state 1 mm per pixel") and "no valid pixel spacing" in note
    note, first = map_spacing_note({"format": "dicom", "spacing_used": [0.1, 0.1]}, maps)
    assert not first and note == "the NIfTI maps keep the file's grid at 1 mm per pixel"


def test_a_datalist_is_given_by_its_path_relative_paths_from_its_folder(tmp_path, monkeypatch):
    from scripts.inference.inputs import inference_items

    folder = tmp_path / "lists"
    folder.mkdir()
    items = [{"image": "images/a.dcm", "label": [0, 1]}, {"image": str(tmp_path / "b.png")}]
    (folder / "datalist.json").write_text(json.dumps({"test": items, "training": []}))
    monkeypatch.chdir(tmp_path)
    got = inference_items("", "lists/datalist.json", "test")
    assert got == [{"image": str(folder / "images" / "a.dcm"), "label": [0, 1]}, {"image": str(tmp_path / "b.png")}]
    with pytest.raises(ValueError, match="give input_dir"):
        inference_items("", "", "test")


def test_inference_yaml_is_a_monai_inference_workflow(ckpt, tmp_path):
    import numpy as np
    from monai.bundle import ConfigWorkflow
    from PIL import Image

    (tmp_path / "in").mkdir()
    Image.fromarray(np.zeros((32, 16), np.uint8)).save(tmp_path / "in" / "a.png")
    overrides = {"ckpt_path": str(ckpt), "input_dir": str(tmp_path / "in"), "output_dir": str(tmp_path / "out")}
    wf = ConfigWorkflow(config_file=str(INFERENCE_CONFIG), meta_file=str(META), workflow_type="infer", **overrides)
    wf.initialize()
    # every required property is there (building the evaluator and its dataset opens the output folder); MONAI also
    # wants the dataset's transform to be "@preprocessing", and it is "@loading" (the panel's pictures taken between
    # the reader and the rest of the preprocessing): listed, as before this config had its components
    assert wf.check_properties() == ["preprocessing"]
    wf.parser.get_parsed_content("output_folder").close()
    # the run's steps, in order: the log, the network with its weights, the folder, the run (the command line is
    # checked by GLAMWorkflow before it)
    steps = [s.get("_target_", s) if isinstance(s, dict) else s for s in wf.parser["inference"]]
    assert steps == [
        "$scripts.handlers.throughput.show_inference_log()",
        "@network",
        "@plan",
        "$@evaluator.run()",
        "$@writer.finish()",
    ]
