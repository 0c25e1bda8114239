"""The bundle's metadata.json against the model-zoo schema and the repository's pins."""

import json
import re

import pytest
from conftest import BUNDLE_ROOT, REPO_ROOT, SHARED_DIR

SCHEMA = SHARED_DIR / "schema" / "meta_schema_20240725.json"
META = BUNDLE_ROOT / "configs" / "metadata.json"


def test_metadata_validates_against_the_model_zoo_schema():
    if not SCHEMA.is_file():
        pytest.skip(f"model-zoo schema not found at {SCHEMA}")
    from monai.bundle import verify_metadata

    verify_metadata(meta_file=str(META), filepath=str(SCHEMA))  # raises on any violation


def test_metadata_describes_glam_inputs_outputs_and_matches_the_pins():
    meta = json.loads(META.read_text())
    outputs = meta["network_data_format"]["outputs"]["pred"]
    assert outputs["channel_def"] == {"0": "benign", "1": "malignant"}
    assert meta["network_data_format"]["inputs"]["image"]["num_channels"] == 1
    assert "not for clinical" in meta["intended_use"].lower() or "not a medical device" in meta["intended_use"].lower()
    pins = dict(
        re.match(r"^([A-Za-z0-9_.-]+)==([^\s#]+)", line).groups()
        for line in (REPO_ROOT / "requirements.txt").read_text().splitlines()
        if re.match(r"^[A-Za-z0-9_.-]+==", line)
    )
    assert meta["pytorch_version"] == pins["torch"]
    assert meta["monai_version"] == pins["monai"]
    assert meta["required_packages_version"]["pytorch-ignite"] == pins["pytorch-ignite"]
    assert meta["version"] in meta["changelog"]


def test_metadata_shapes_are_the_shipped_models_window():
    """network_data_format describes the shipped models/model.pt: its input is the training window the checkpoint
    records (image_size) and its output the quarter-resolution map (the zoo's verify_net_in_out checks channels and
    dtype only, not these shapes)."""
    from scripts.networks import read_checkpoint_settings

    settings = read_checkpoint_settings(BUNDLE_ROOT / "models" / "model.pt")
    assert settings is not None, "the shipped model records no settings"
    fmt = json.loads(META.read_text())["network_data_format"]
    height, width = settings["image_size"]
    assert fmt["inputs"]["image"]["spatial_shape"] == [height, width] == [736, 480]
    assert fmt["outputs"]["pred"]["spatial_shape"] == [height // 4, width // 4] == [184, 120]


def test_metadata_says_the_shipped_weights_are_a_synthetic_demonstration():
    meta = json.loads(META.read_text())
    for key in ("intended_use", "description"):
        text = meta[key].lower()
        assert "demonstration" in text and "synthetic" in text, key
    assert "not for clinical" in meta["intended_use"].lower()
    assert "pixel spacing" in meta["image_classes"] and "736x480" in meta["image_classes"]
    assert "resampled to nothing" not in meta["image_classes"]
