"""The label server on real-shaped files (issue 45): one loading path with the bundle's inference, one id per file,
bounds decided before work, and a model with NaN weights refused. One server (tools/start_label_server.sh on a
free 127.0.0.1 port, stopped by the fixture) serves a studies folder made here:

- ``cbis.dcm``: an MLO DICOM of 1472 x 960 pixels **without** a pixel spacing (as CBIS-DDSM's are), compared with
  ``monai.bundle run inference`` on the same file;
- two patients' DICOMs that share a stem (``pat.dcm``, ``pat.dicom``) and a third that differs in case only
  (``pat.DCM``); a PNG beside a DICOM of the same stem (``scan.png``, ``scan.dcm``); a PNG beside a NRRD of the same
  stem (``dup.png``, ``dup.nrrd``);
- a DICOM with a 250-byte name and a PNG whose name holds U+202E (right-to-left override).
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import nrrd
import numpy as np
import pytest
from _dicom_factory import make_dataset
from _film_factory import film
from conftest import BUNDLE_ROOT, REPO_ROOT
from label_client import free_port, running_server

pytestmark = pytest.mark.slow

LONG_NAME = "a" * 246 + ".dcm"  # 250 bytes
BIDI_NAME = "evil\u202egnp.png"  # shows as "evilpng.png"-like text in a viewer


def _dicom(path: Path, pixels: np.ndarray, view: str, patient: str, spacing=None) -> None:
    ds = make_dataset(pixels, spacing=spacing, view_position=view, patient_id=patient, bits_stored=16)
    ds.save_as(str(path), write_like_original=False)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from glam_benchmark.synthetic import SyntheticConfig, make_synthetic_dataset
    from scripts.data.readers import read_mammogram

    root = tmp_path_factory.mktemp("identity")
    cfg = SyntheticConfig(lesion_prevalence=1.0, benign_mass_contrast=(2.5, 4.0), malignant_mass_contrast=(2.5, 4.0))
    make_synthetic_dataset(root / "png", 3, size=(736, 480), seed=45, fmt="png", config=cfg)
    pngs = sorted((root / "png" / "images").glob("*.png"))
    # twice the synthetic size: without a spacing, the bundle estimates one that fits the breast into its window
    big = [np.kron(read_mammogram(p)[0], np.ones((2, 2))).astype(np.uint16) for p in pngs]
    studies, originals = root / "studies", root / "originals"
    studies.mkdir()
    originals.mkdir()
    _dicom(studies / "cbis.dcm", big[0], "MLO", "P-CBIS")
    shutil.copy(studies / "cbis.dcm", originals / "cbis.dcm")
    _dicom(studies / "pat.dcm", big[1], "CC", "P-ONE")
    _dicom(studies / "pat.dicom", big[2], "CC", "P-TWO")
    _dicom(studies / "pat.DCM", big[0][:, ::-1].copy(), "CC", "P-THREE", spacing=(0.2, 0.2))
    shutil.copy(pngs[1], studies / "scan.png")
    _dicom(studies / "scan.dcm", big[2], "CC", "P-SCAN")
    shutil.copy(pngs[1], studies / "dup.png")
    nrrd.write(str(studies / "dup.nrrd"), read_mammogram(pngs[2])[0].astype(np.uint16), index_order="C")
    _dicom(studies / LONG_NAME, big[1], "CC", "P-LONG")
    # a digitised film of lettering, a ruler and noise, no breast: the bundle's errors.csv row, the app's refusal
    empty, _ = film(1472, 960, "CC", "L", breast=False)
    _dicom(studies / "nobreast.dcm", empty, "CC", "P-EMPTY")
    shutil.copy(studies / "nobreast.dcm", originals / "nobreast.dcm")
    shutil.copy(pngs[2], studies / BIDI_NAME)

    out = root / "bundle_out"
    cmd = [sys.executable, "-m", "monai.bundle", "run", "inference"]
    cmd += ["--config_file", str(BUNDLE_ROOT / "configs" / "inference.yaml")]
    cmd += ["--meta_file", str(BUNDLE_ROOT / "configs" / "metadata.json"), "--bundle_root", str(BUNDLE_ROOT)]
    cmd += ["--input_dir", str(originals), "--output_dir", str(out), "--outputs", "[S_c,png]"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=REPO_ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    with open(out / "predictions.csv", newline="") as f:
        rows = {r["output_stem"]: r for r in csv.DictReader(f)}
    with open(out / "errors.csv", newline="") as f:
        errors = {Path(r["image"]).name: r for r in csv.DictReader(f)}
    return {"root": root, "studies": studies, "bundle_out": out, "rows": rows, "errors": errors}


@pytest.fixture(scope="module")
def server(site):
    with running_server(site["studies"], site["root"] / "server.log") as srv:
        yield srv


def _json(server, query: str, params: dict | None = None) -> tuple[int, dict]:
    status, content = server.infer(query + "&output=json", params)
    return status, json.loads(content)


def test_a_dicom_without_spacing_is_served_at_the_scale_of_the_bundles_inference(server, site, tmp_path):
    from scripts.data.readers import read_mammogram

    row = site["rows"]["cbis"]
    assert row["spacing_source"] == "fit_breast" and row["view"] == "MLO"
    status, result = _json(server, "image=cbis.dcm")
    assert status == 200, result
    # what predictions.csv states, the JSON states: the spacing used, its source, the view, the window on the file
    assert result["read_from"] == "cbis.dcm"
    assert result["spacing_source"] == "fit_breast" and result["file_spacing_mm"] is None
    np.testing.assert_allclose(result["spacing_mm"], [float(row["spacing_row_mm"]), float(row["spacing_col_mm"])])
    assert result["view"] == "MLO" and result["view_source"] == row["view_source"] == "ViewPosition"
    assert result["window"] == [int(row[f"window_{k}"]) for k in ("y0", "x0", "y1", "x1")]
    assert result["breast_in_window"] == pytest.approx(
        float(row["breast_in_window"])
    )  # the share predictions.csv states
    assert any("pixel spacing not stated" in n for n in result["notes"])
    # the same patch (its size is the model's patch at the estimated scale: about twice the model's 128 pixels)
    bundle_boxes = [[int(v) for v in box.split()] for box in row["patch_boxes"].split(";")]
    assert result["patch_boxes"] == bundle_boxes
    height = bundle_boxes[0][2] - bundle_boxes[0][0]
    assert 200 < height < 320, bundle_boxes
    for cls in ("benign", "malignant"):
        assert abs(result[f"prob_{cls}"] - float(row[f"prob_{cls}"])) < 1e-5
    # the heatmap on the file's grid, without an invented spacing, equal to the bundle's map
    heat, header = server.infer_map(tmp_path, "image=cbis.dcm", {"overlay": "heatmap"})
    assert heat.shape == read_mammogram(site["studies"] / "cbis.dcm")[0].shape == (1472, 960)
    assert "space directions" not in header and "spacings" not in header
    from PIL import Image

    bundle = np.asarray(Image.open(site["bundle_out"] / "maps" / "cbis_S_c_malignant.png"), dtype=np.float64) / 65535
    assert np.abs(heat.astype(int) - np.round(bundle * 255)).max() <= 1
    assert (heat > 0).mean() > 0.05  # the map covers the breast, not a patch of 0.4 % of the image
    # the viewers' copy has no geometry either: nothing invented
    status, headers, content = server.request("GET", "/datastore/image?image=cbis.dcm")
    assert status == 200
    (tmp_path / "copy.nrrd").write_bytes(content)
    copy, copy_header = nrrd.read(str(tmp_path / "copy.nrrd"), index_order="C")
    assert "space directions" not in copy_header and copy_header.get("glam_source") == "cbis.dcm"
    np.testing.assert_array_equal(copy, read_mammogram(site["studies"] / "cbis.dcm")[0])


def test_every_file_is_an_image_of_its_own(server, site, tmp_path):
    from scripts.data.readers import read_mammogram

    ids = set(server.get("/datastore/?output=all")["objects"])
    expected = {
        "cbis.dcm",
        "pat.dcm",
        "pat.dicom",
        "pat.DCM",
        "scan",
        "scan.dcm",
        "dup.png",
        "dup.nrrd",
        "nobreast.dcm",
    }
    assert ids == expected
    log = server.log.read_text(errors="replace")
    assert "ingest: 6 DICOM converted, 0 up to date, 1 failed" in log
    assert "'dup.nrrd' and 'dup.png' share the id 'dup'" in log
    # each id serves its own file's pixels, and the two patients' scores differ
    for image_id, source in [("pat.dcm", "pat.dcm"), ("pat.dicom", "pat.dicom"), ("pat.DCM", "pat.DCM")]:
        status, _, content = server.request("GET", f"/datastore/image?image={image_id}")
        assert status == 200
        path = tmp_path / f"{uuid.uuid4().hex}.nrrd"
        path.write_bytes(content)
        np.testing.assert_array_equal(
            nrrd.read(str(path), index_order="C")[0], read_mammogram(site["studies"] / source)[0]
        )
    scores = {}
    for image_id in ("pat.dcm", "pat.dicom", "scan", "scan.dcm"):
        status, result = _json(server, f"image={image_id}")
        assert status == 200, result
        scores[image_id] = (result["prob_benign"], result["prob_malignant"])
    assert scores["pat.dcm"] != scores["pat.dicom"] and scores["scan"] != scores["scan.dcm"]
    # the shared stem names no file: 404 naming the ids of both
    status, result = _json(server, "image=dup")
    assert status == 404 and "dup.nrrd" in result["detail"] and "dup.png" in result["detail"]
    # an upload whose id would name another file is refused, and nothing is written
    status, _, content = server.form("PUT", "/datastore/image?image=scan", {}, {"file": ("x.nrrd", b"NRRD0004\n")})
    assert status == 409 and b"already names scan.png" in content
    assert not (site["studies"] / "scan.nrrd").exists()


def test_names_that_cannot_be_served_are_one_line_each(server, site):
    log = server.log.read_text(errors="replace")
    failed = [line for line in log.splitlines() if line.startswith("ingest: FAILED")]
    assert len(failed) == 1 and LONG_NAME in failed[0] and "rename the file" in failed[0], failed
    assert "Traceback" not in log.split("Started server process")[0]
    assert "skipped 'evil\u202egnp.png'" in log and "U+202E" in log
    status, result = _json(server, "image=evil%E2%80%AEgnp")
    assert status == 400 and "U+202E" in result["detail"]


def _timed(fn):
    begin = time.monotonic()
    out = fn()
    return out, time.monotonic() - begin


def test_an_image_the_datastore_has_not_is_one_404_with_one_wording_on_every_route(server):
    """An unknown id and a stem two files share are each answered 404 with one message by inference, batch
    inference and every datastore route; a label tag an image lacks likewise. Before, the same unknown id read
    "image id 'x' is not in the datastore", "Image NOT Found" or "Image x not found" by route, and the two info
    routes answered 200 with an empty record."""
    label = {"label": ("x.nrrd", b"NRRD0004\n")}
    for image_id, message in [
        ("nope", "image id 'nope' is not in the datastore"),
        ("dup", "image id 'dup' is shared by 2 files; each is served under its own id: ['dup.nrrd', 'dup.png']"),
    ]:
        answers = {
            "infer": server.form("POST", f"/infer/glam?image={image_id}&output=json", {"params": "{}"}),
            "download": server.request("GET", f"/datastore/image?image={image_id}"),
            "image info": server.request("GET", f"/datastore/image/info?image={image_id}"),
            "update info": server.form("PUT", f"/datastore/image/info?image={image_id}", {"info": "{}"}),
            "save label": server.form("PUT", f"/datastore/label?image={image_id}&tag=final", {"params": "{}"}, label),
            "label": server.request("GET", f"/datastore/label?label={image_id}&tag=final"),
            "label info": server.request("GET", f"/datastore/label/info?label={image_id}&tag=final"),
            "update label": server.form("PUT", f"/datastore/label/info?label={image_id}&tag=final", {"info": "{}"}),
            "remove label": server.request("DELETE", f"/datastore/label?id={image_id}&tag=final"),
            "remove": server.request("DELETE", f"/datastore/image?id={image_id}"),
        }
        for route, (status, _, body) in answers.items():
            assert (status, json.loads(body)) == (404, {"detail": message}), route
        assert server.request("HEAD", f"/datastore/image?image={image_id}")[0] == 404
        body = json.dumps({"images": [image_id]}).encode()
        status, _, content = server.request(
            "POST", "/batch/infer/glam?run_sync=true", body, {"Content-Type": "application/json"}
        )
        assert status == 200 and json.loads(content)[image_id] == {"error": message, "status": 404}
    for route in ("/datastore/label?label=scan&tag=reader_7", "/datastore/label/info?label=scan&tag=reader_7"):
        status, _, body = server.request("GET", route)
        assert (status, json.loads(body)) == (404, {"detail": "image id 'scan' has no label tagged 'reader_7'"})


def test_bounds_are_decided_before_work_and_in_milliseconds(server, site, tmp_path):
    import nibabel as nib

    # a 56-byte .nii.gz whose header states 12000 x 12000 16-bit pixels
    header = nib.Nifti1Header()
    header.set_data_shape((12000, 12000))
    header.set_data_dtype(np.int16)
    header["vox_offset"] = 352
    bomb = gzip.compress(header.binaryblock + bytes(4 + 64))
    assert len(bomb) < 2500
    strip = tmp_path / "strip.nrrd"
    nrrd.write(str(strip), np.full((65000, 10), 1000, np.uint16), index_order="C")
    huge_int = '{"threshold": ' + "9" * 5000 + "}"
    rss = server.rss_mb()
    cases = {
        "nifti": (
            lambda: server.form("POST", "/infer/glam?output=json", {"params": "{}"}, {"file": ("b.nii.gz", bomb)})
        ),
        "strip": (lambda: server.form("POST", "/infer/glam?output=json", {"params": "{}"}, {"file": strip})),
        "int": (lambda: server.form("POST", "/infer/glam?image=cbis.dcm&output=json", {"params": huge_int})),
    }
    expected = {
        "nifti": (413, "12000 x 12000 = 144,000,000 pixels, above the server's limit"),
        "strip": (400, "65000 x 10 pixels is no mammogram the model can place"),
        "int": (400, "an integer of 5000 digits"),
    }
    for name, call in cases.items():
        (status, _, content), seconds = _timed(call)
        detail = json.loads(content)["detail"]
        assert (status, expected[name][1] in detail) == (expected[name][0], True), (name, status, detail)
        assert "\n" not in detail and seconds < 2.0, (name, seconds)
        print(f"{name}: {status} in {seconds * 1000:.0f} ms")
    assert server.rss_mb() < rss + 50


def test_info_answers_while_inferences_run(server):
    """Six inferences run one after the other on the model; /info/ and a refusal answer meanwhile."""
    done: list[float] = []

    def infer():
        status, _ = server.infer("image=cbis.dcm&output=json")
        assert status == 200
        done.append(time.monotonic())

    threads = [threading.Thread(target=infer) for _ in range(6)]
    begin = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(0.3)
    _, info_s = _timed(lambda: server.get("/info/"))
    (status, _), refusal_s = _timed(lambda: server.infer("image=dup&output=json"))
    answered = time.monotonic()
    for t in threads:
        t.join(timeout=300)
    assert len(done) == 6 and status == 404
    assert sum(t > answered for t in done) >= 2, "the inferences ended before /info/ was asked: nothing measured"
    assert info_s < 1.0 and refusal_s < 1.0, (info_s, refusal_s)
    print(f"/info/ {info_s * 1000:.0f} ms, refusal {refusal_s * 1000:.0f} ms, six inferences {max(done) - begin:.1f} s")


def test_a_model_with_a_nan_weight_is_refused_at_start(site, tmp_path):
    import torch

    state = torch.load(BUNDLE_ROOT / "models" / "model.pt", weights_only=True)
    name = next(k for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 1)
    state[name] = state[name].clone()
    state[name].view(-1)[0] = float("nan")
    bad = tmp_path / "nan.pt"
    torch.save(state, bad)
    studies = tmp_path / "studies"
    studies.mkdir()
    shutil.copy(site["studies"] / "scan.png", studies / "scan.png")
    log = tmp_path / "nan.log"
    cmd = ["bash", str(REPO_ROOT / "tools" / "start_label_server.sh"), "--studies", str(studies)]
    cmd += ["--port", str(free_port()), "--device", "cpu", "--model", str(bad)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and "Application startup failed" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    text = log.read_text(errors="replace")
    # the bundle's own loader's line: the file, the tensor and its count of NaN values
    lines = [line for line in text.splitlines() if " holds " in line and "NaN" in line]
    assert lines and name in lines[0] and str(bad) in lines[0], text[-3000:]
    assert "Application startup complete" not in text


def test_a_film_without_a_breast_is_refused_as_the_bundle_refuses_it(server, site):
    """The bundle's inference makes the film an errors.csv row (no prediction); the app answers 400 with the same
    line after the image's name."""
    row = site["errors"]["nobreast.dcm"]
    assert "nobreast" not in site["rows"]
    reason = row["error"]
    assert "BreastNotFound: no tissue region large enough to be a breast" in reason, row
    status, result = _json(server, "image=nobreast.dcm")
    assert status == 400, result
    assert result["detail"] == "image 'nobreast.dcm': " + reason[reason.index("BreastNotFound") :]
