"""The MONAI Label app for real: tools/start_label_server.sh starts the server in its own environment on a free
127.0.0.1 port with synthetic PNG and DICOM mammograms, and every check goes over HTTP. The server is started as a
user starts it from a fresh clone, without --model or --preset: it serves the shipped demonstration model
(bundle/models/model.pt, whose checkpoint records the settings it was trained with). The served maps are compared
with the bundle's own inference (`monai.bundle run inference`, its defaults too) on the same files.

The first run on a machine builds the label environment (requirements-label.txt; about 2 minutes, cached outside
the repository, keyed by the requirements' hash); later runs reuse it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import BUNDLE_ROOT, REPO_ROOT
from label_client import label_python, running_server
from PIL import Image

pytestmark = pytest.mark.slow

SHIPPED = BUNDLE_ROOT / "models" / "model.pt"
SIZE = (736, 480)  # the shipped model's window (synthetic 0.4 mm images)


@pytest.fixture(scope="module")
def label_setup(tmp_path_factory):
    """Studies (2 PNG + 2 DICOM with lesions) and the bundle's own inference on the same files with its defaults
    (the shipped model)."""
    from glam_benchmark.synthetic import SyntheticConfig, make_synthetic_dataset

    root = tmp_path_factory.mktemp("label")
    cfg = SyntheticConfig(lesion_prevalence=1.0, benign_mass_contrast=(2.5, 4.0), malignant_mass_contrast=(2.5, 4.0))
    make_synthetic_dataset(root / "png", 4, size=SIZE, seed=21, fmt="png", config=cfg)
    make_synthetic_dataset(root / "dcm", 4, size=SIZE, seed=22, fmt="dcm", config=cfg)
    studies, originals = root / "studies", root / "originals"
    studies.mkdir()
    originals.mkdir()
    datalist = json.loads((root / "png" / "datalist.json").read_text())
    items = [d for split in datalist.values() for d in split]
    png_items = sorted(items, key=lambda d: d["image"])[:2]
    for d in png_items:
        shutil.copy(root / "png" / d["image"], studies / Path(d["image"]).name)
        shutil.copy(root / "png" / d["image"], originals / Path(d["image"]).name)
    for f in sorted((root / "dcm" / "images").iterdir())[:2]:
        shutil.copy(f, studies / f"dcm_{f.name}")
        shutil.copy(f, originals / f"dcm_{f.name}")
    (studies / "dcm_broken.dcm").write_bytes(b"\0" * 128 + b"DICM" + b"\x02\x00")  # ingestion reports, goes on

    bundle_out = root / "bundle_out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "monai.bundle", "run", "inference"]
    cmd += ["--config_file", str(BUNDLE_ROOT / "configs" / "inference.yaml")]
    cmd += ["--meta_file", str(BUNDLE_ROOT / "configs" / "metadata.json"), "--bundle_root", str(BUNDLE_ROOT)]
    cmd += ["--input_dir", str(originals), "--output_dir", str(bundle_out), "--outputs", "[S_c,png]"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=REPO_ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return {
        "root": root,
        "studies": studies,
        "bundle_out": bundle_out,
        "png_items": png_items,
        "png_root": root / "png",
    }


@pytest.fixture(scope="module")
def server(label_setup):
    # as from a fresh clone: no --model, no --preset (the shipped model and the settings it records)
    with running_server(label_setup["studies"], label_setup["root"] / "server.log") as srv:
        yield srv


def _bundle_s_c(setup, stem: str) -> np.ndarray:
    """S_c (2, H, W) in [0, 1] as `monai.bundle run inference` wrote it (16-bit PNG per class)."""
    maps = setup["bundle_out"] / "maps"
    return np.stack(
        [
            np.asarray(Image.open(maps / f"{stem}_S_c_{c}.png"), dtype=np.float64) / 65535
            for c in ("benign", "malignant")
        ]
    )


def _bundle_predictions(setup) -> dict[str, dict]:
    import csv

    with open(setup["bundle_out"] / "predictions.csv", newline="") as f:
        return {r["output_stem"]: r for r in csv.DictReader(f)}


def test_info_lists_glam_as_a_2d_segmentation_model(server, label_setup):
    info = server.get("/info/")
    model = info["models"]["glam"]
    assert model["type"] == "segmentation" and model["dimension"] == 2
    assert model["labels"] == {"benign": 1, "malignant": 2}
    assert info["version"] == json.loads((BUNDLE_ROOT / "configs" / "metadata.json").read_text())["version"]
    assert model["config"]["overlay"] == ["label", "heatmap"] and model["config"]["threshold"] == 0.5
    # PNGs and the ingested DICOMs (as NRRD) are in the datastore; the broken DICOM is not
    ids = set(server.get("/datastore/?output=all")["objects"])
    stems = {Path(d["image"]).stem for d in label_setup["png_items"]}
    # a DICOM is served under its whole file name (its copy for the viewers is <name>.nrrd)
    dicoms = {f"dcm_{f.name}" for f in sorted((label_setup["root"] / "dcm" / "images").iterdir())[:2]}
    assert ids == stems | dicoms
    log = server.log.read_text()
    assert "ingest: FAILED" in log and "dcm_broken.dcm" in log and "ingest: 2 DICOM converted" in log


def test_scores_in_the_json_result_equal_the_bundles(server, label_setup):
    rows = _bundle_predictions(label_setup)
    for d in label_setup["png_items"]:
        stem = Path(d["image"]).stem
        status, content = server.infer(f"image={stem}&output=json")
        assert status == 200, content[:500]
        result = json.loads(content)
        for cls in ("benign", "malignant"):
            p = result[f"prob_{cls}"]
            assert 0.0 <= p <= 1.0
            assert abs(p - float(rows[stem][f"prob_{cls}"])) < 1e-5


def test_label_map_as_slicer_requests_it(server, label_setup, tmp_path):
    d = label_setup["png_items"][0]
    stem = Path(d["image"]).stem
    s_c = _bundle_s_c(label_setup, stem)
    # a threshold that the map crosses (the demonstration model's S_c need not reach the default 0.5)
    threshold = round(float(np.quantile(s_c.max(0), 0.99)), 3)
    params = {"overlay": "label", "result_extension": ".nrrd", "result_dtype": "uint8", "threshold": threshold}
    label, header = server.infer_map(tmp_path, f"image={stem}", params)
    original = np.asarray(Image.open(label_setup["png_root"] / d["image"]))
    assert label.dtype == np.uint8 and label.shape == original.shape == SIZE
    assert set(np.unique(label)) <= {0, 1, 2}
    expected = np.where(s_c.max(0) >= threshold, s_c.argmax(0) + 1, 0)
    assert (label != expected).mean() < 1e-3  # 16-bit rounding of the bundle's PNG at the threshold only
    assert 0.001 < (expected > 0).mean() < 0.05  # the comparison is not between two blank maps


def test_heatmap_keeps_values_and_geometry(server, label_setup, tmp_path):
    from scripts.data.readers import read_mammogram

    lesions = 0
    for d in label_setup["png_items"]:
        stem = Path(d["image"]).stem
        breast = read_mammogram(label_setup["png_root"] / d["image"])[0] > 0
        for c, cls in enumerate(("benign", "malignant")):
            heat, _ = server.infer_map(tmp_path, f"image={stem}", {"overlay": "heatmap", "heatmap_class": cls})
            assert heat.dtype == np.uint8 and heat.shape == SIZE
            assert len(np.unique(heat)) >= 20
            expected = np.round(_bundle_s_c(label_setup, stem)[c] * 255)
            assert np.abs(heat.astype(int) - expected).max() <= 1
            lesion = read_mammogram(label_setup["png_root"] / d[f"mask_{cls}"], mask=True)[0] > 0
            if lesion.any():
                # the demonstration model finds these synthetic lesions: its map of the lesion's class is brighter
                # on the lesion than on the rest of the breast (a map misplaced on the way back, e.g. left
                # unflipped, is not)
                assert heat[lesion].mean() > 3 * heat[breast & ~lesion].mean()
                lesions += 1
    assert lesions >= 1


def test_dicom_is_served_on_its_own_geometry(server, label_setup, tmp_path):
    from scripts.data.readers import read_mammogram

    f = sorted((label_setup["root"] / "dcm" / "images").iterdir())[0]
    _, meta = read_mammogram(f)
    heat, header = server.infer_map(tmp_path, f"image=dcm_{f.name}", {"overlay": "heatmap"})
    assert heat.shape == tuple(meta["shape"])
    spacing = np.linalg.norm(np.asarray(header["space directions"], dtype=float), axis=1)  # x (column) first
    np.testing.assert_allclose(spacing[::-1], meta["spacing"], rtol=1e-6)
    expected = np.round(_bundle_s_c(label_setup, f"dcm_{f.stem}")[1] * 255)
    assert np.abs(heat.astype(int) - expected).max() <= 1


def test_an_uploaded_file_is_served_like_a_datastore_image(server, label_setup, tmp_path):
    """The same pixels give the same map uploaded or from the datastore. MONAI Label hands the app an upload under a
    temporary name, so an uploaded PNG's view is unknown (the CC window rule) where the datastore's file name may
    state one (SYN00000_L_MLO.png: the MLO rule): the CC image compares like for like."""
    d = next(d for d in label_setup["png_items"] if "_CC" in d["image"])
    stem = Path(d["image"]).stem
    params = {"overlay": "heatmap"}
    stored, _ = server.infer_map(tmp_path, f"image={stem}", params)
    uploaded, _ = server.infer_map(tmp_path, "image=", params, upload=label_setup["png_root"] / d["image"])
    np.testing.assert_array_equal(uploaded, stored)


def test_bad_parameters_are_named(server, label_setup):
    stem = Path(label_setup["png_items"][0]["image"]).stem
    status, content = server.infer(f"image={stem}&output=json", {"overlay": "contours"})
    assert status == 400 and b"overlay must be one of" in content
    status, content = server.infer(f"image={stem}&output=json", {"threshold": 2})
    assert status == 400 and b"threshold must be in [0, 1]" in content


def test_save_label_keeps_a_heatmap_under_its_own_tag(server, label_setup):
    stem = Path(label_setup["png_items"][0]["image"]).stem
    status, content = server.infer(f"image={stem}&output=json", {"overlay": "heatmap", "save_label": True})
    assert status == 200, content[:500]
    labels = server.get("/datastore/?output=all")["objects"][stem]["labels"]
    assert "glam_heatmap_malignant" in labels and "original" not in labels
    saved = label_setup["studies"] / "labels" / "glam_heatmap_malignant"
    assert any(saved.glob(f"{stem}*"))


def test_server_without_model_or_preset_serves_the_shipped_model(server, label_setup, tmp_path):
    """The fixture's server was started with no --model and no --preset: it loaded bundle/models/model.pt and
    built the network and the window from the settings the checkpoint records (the maps the other tests compare
    are those of `monai.bundle run inference` with its defaults), and it answers with a map for an image."""
    log = server.log.read_text()
    assert f"weights {SHIPPED.resolve()}, presets []" in log
    assert f"GLAM weights {SHIPPED.resolve()} loaded strictly" in log
    d = label_setup["png_items"][1]
    stem = Path(d["image"]).stem
    heat, header = server.infer_map(tmp_path, f"image={stem}", {"overlay": "heatmap", "heatmap_class": "benign"})
    assert heat.shape == SIZE and heat.dtype == np.uint8 and heat.max() > 0
    np.testing.assert_allclose(np.linalg.norm(np.asarray(header["space directions"], dtype=float), axis=1), 0.4)
    expected = np.round(_bundle_s_c(label_setup, stem)[0] * 255)
    assert np.abs(heat.astype(int) - expected).max() <= 1


def test_log_shows_strict_weights_and_no_key_mismatch(server):
    log = server.log.read_text()
    assert "loaded strictly" in log
    for bad in ("missing keys", "unexpected key", "Unexpected key", "size mismatch", "Missing key"):
        assert bad not in log


BUNDLE_TESTS = [
    "tests/data/test_readers.py",
    "tests/transforms/test_mammo_transforms.py",
    "tests/benchmark/test_synthetic.py",
    "tests/data/test_datalist.py",
    "tests/data/test_check_data.py",
    "tests/networks/test_patch_selection.py",
    "tests/networks/test_pooling.py",
    "tests/metrics/test_metrics.py",
    "tests/inference/test_inference_workflow.py",
]


def test_bundle_unit_tests_pass_in_the_label_environment():
    """The bundle runs inside the label server, whose environment has numpy 1.26 and pydicom 2.x: its readers,
    transforms, generator, metrics and inference pieces are tested there too."""
    python = label_python()
    versions = subprocess.run(
        [python, "-c", "import numpy, pydicom, monai, torch; print(numpy.__version__, pydicom.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    numpy_version, pydicom_version = versions.stdout.split()
    assert numpy_version.startswith("1.") and pydicom_version.startswith("2."), versions.stdout
    res = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *BUNDLE_TESTS],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert " passed" in res.stdout.strip().splitlines()[-1]


def test_the_slicer_snippet_in_the_docs_fetches_image_and_heatmap(server, label_setup, monkeypatch, tmp_path):
    """docs/monailabel.md's console snippet, run as written against the server with Slicer's API recorded by a
    stand-in: it loads the stored mammogram and the heatmap of the same grid, and shows the heatmap in colour
    over the image."""
    import re
    import types

    text = (REPO_ROOT / "docs" / "monailabel.md").read_text(encoding="utf-8")
    section = text.split("### Heatmap as a coloured foreground layer", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    d = label_setup["png_items"][0]
    stem = Path(d["image"]).stem
    code = code.replace('"http://127.0.0.1:8000"', repr(server.base)).replace('"SYN00000_L_CC"', repr(stem))

    calls, volumes = [], []

    class Display:
        def __getattr__(self, name):
            return lambda *args: calls.append((name, args))

    class Volume:
        def __init__(self, path, properties=None):
            from scripts.data.readers import read_mammogram

            self.array = read_mammogram(path, mask=True)[0]  # raw stored values
            self.name = (properties or {}).get("name")
            self.display = Display()

        def GetDisplayNode(self):
            return self.display

    def load_volume(path, properties=None):
        volumes.append(Volume(path, properties))
        return volumes[-1]

    util = types.SimpleNamespace(
        loadVolume=load_volume,
        setSliceViewerLayers=lambda **kw: calls.append(("setSliceViewerLayers", kw)),
        resetSliceViews=lambda: None,
    )
    monkeypatch.setitem(sys.modules, "slicer", types.SimpleNamespace(util=util))
    exec(compile(code, "docs/monailabel.md", "exec"), {})

    image, heat = volumes
    np.testing.assert_array_equal(image.array, np.asarray(Image.open(label_setup["png_root"] / d["image"])))
    expected, _ = server.infer_map(tmp_path, f"image={stem}", {"overlay": "heatmap", "heatmap_class": "malignant"})
    np.testing.assert_array_equal(heat.array, expected)
    assert heat.name == "GLAM malignant"
    layers = [kw for name, kw in calls if name == "setSliceViewerLayers"][0]
    assert layers["background"] is image and layers["foreground"] is heat
    assert ("SetWindowLevelMinMax", (0, 255)) in calls
