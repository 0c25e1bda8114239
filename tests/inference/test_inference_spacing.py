"""Inference on files whose pixel spacing differs from the model's (bundle/configs/inference.yaml with a tiny, randomly
initialised GLAMSaliencyNet that records its pixel spacing): a mammogram stored at twice the model's pixel size gives,
on its own pixel grid, the maps of the same mammogram stored at the model's pixel size; a file that states no spacing
gets a spacing estimated so that its breast fits the window, with one warning and a note in errors.csv."""

from __future__ import annotations

import csv
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from conftest import BUNDLE_ROOT, REPO_ROOT
from scipy import ndimage as ndi

INFERENCE_CONFIG = BUNDLE_ROOT / "configs" / "inference.yaml"
TINY_INFERENCE = REPO_ROOT / "tests" / "configs" / "tiny_inference.yaml"
META = BUNDLE_ROOT / "configs" / "metadata.json"
TINY = dict(patch_size=64, local_depth=18, local_width=4, image_size=(256, 160))
FINE_SIZE = (512, 320)  # twice the tiny window (256, 160) each way: the window sees a part of the breast
# the coarse files, each the fine picture averaged over 2x2 blocks, in a format that states its spacing another way
COARSE = ("coarse_png.png", "coarse_nifti.nii.gz", "coarse_dicom_R.dcm")
UNKNOWN, CORRUPT = "unknown.png", "corrupt.png"
# the coarse files state 1.2 mm, above the pixel sizes of mammograms (0.02-1 mm): the option widens the range
SPACING_RANGE = [0.02, 2.0]


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _maps(out: Path, stem: str, name: str) -> np.ndarray:
    """maps/<stem>_<name>.nii.gz (W, H, 1, 1, 2) -> (2, H, W)."""
    data = np.asarray(nib.load(str(out / "maps" / f"{stem}_{name}.nii.gz")).get_fdata(), dtype=np.float32)
    return data[:, :, 0, 0, :].transpose(2, 1, 0)


def _halve(a: np.ndarray) -> np.ndarray:
    """Mean over 2x2 blocks of the last two axes."""
    *lead, h, w = a.shape
    return a.reshape(*lead, h // 2, 2, w // 2, 2).mean(axis=(-3, -1))


def _agreement(fine: np.ndarray, coarse: np.ndarray) -> dict[str, float]:
    """How well a coarse file's map (2, h, w) matches the fine file's (2, 2h, 2w) halved: the Pearson correlation over
    the whole grid, and per class the rank of the fine map's value at the coarse map's peak among the fine map's
    values (1 = the fine map's own peak). Peaks are taken at least 3 px inside what both models saw: a random
    network's flat maps often peak on the window's edge, which the resampling blends with the zeros beyond it."""
    f = _halve(fine)
    scores = {"corr": float(np.corrcoef(f.ravel(), coarse.ravel())[0, 1])}
    for k in range(2):
        inner = ndi.binary_erosion((f[k] > 0) & (coarse[k] > 0), iterations=3)
        peak = np.unravel_index(np.argmax(np.where(inner, coarse[k], -1.0)), inner.shape)
        scores[f"peak_rank_{k}"] = float((f[k][inner] < f[k][peak]).mean())
    return scores


def _agrees(scores_g: dict[str, float], scores_c: dict[str, float]) -> bool:
    """The criterion: S_g correlates > 0.9 and peaks, per class, in the fine S_g's top 10 %; S_c correlates > 0.8
    (S_c also holds S_l, whose one patch a random network's flat S_g may place elsewhere)."""
    return (
        scores_g["corr"] > 0.9
        and min(scores_g["peak_rank_0"], scores_g["peak_rank_1"]) >= 0.9
        and scores_c["corr"] > 0.8
    )


def _run(folder: Path, out: Path, ckpt: Path) -> None:
    from monai.bundle import ConfigWorkflow

    wf = ConfigWorkflow(
        config_file=[str(INFERENCE_CONFIG), str(TINY_INFERENCE)],
        meta_file=str(META),
        workflow_type="infer",
        input_dir=str(folder),
        output_dir=str(out),
        ckpt_path=str(ckpt),
        outputs=["S_g", "S_c"],
        spacing_range=SPACING_RANGE,
    )
    wf.initialize()
    wf.run()
    wf.finalize()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """One folder (a synthetic left CC view at the model's spacing as a PNG with pHYs; the same picture at twice the
    spacing as a PNG, a NIfTI and a mirrored right-breast DICOM; a PNG without pHYs; a corrupt file) run through
    inference twice with the same weights: by a model that records its spacing and by one that does not."""
    from glam_benchmark.synthetic import (
        SyntheticConfig,
        SyntheticMammogramGenerator,
        synthetic_spacing_mm,
        write_mammogram_dicom,
        write_nifti,
        write_png16,
    )
    from scripts.networks import GLAMSaliencyNet

    root = tmp_path_factory.mktemp("inference_spacing")
    spacing = synthetic_spacing_mm(FINE_SIZE)  # 0.6 mm
    fine = SyntheticMammogramGenerator(SyntheticConfig(size=FINE_SIZE, lesion_prevalence=1.0), 0).generate(0, "L", "CC")
    coarse = np.round(_halve(fine.image.astype(np.float64))).astype(np.uint16)
    folder = root / "in"
    write_png16(folder / "fine.png", fine.image, spacing)
    write_png16(folder / COARSE[0], coarse, 2 * spacing)
    write_nifti(folder / COARSE[1], coarse, 2 * spacing)
    write_mammogram_dicom(
        folder / COARSE[2],
        coarse[:, ::-1],  # a right breast as the detector stores it: facing left
        patient_id="SYN0",
        laterality="R",
        view="CC",
        facing="left",
        spacing_mm=2 * spacing,
        study_uid="1.2.3",
        series_uid="1.2.3.4",
        sop_uid="1.2.3.4.5",
    )
    write_png16(folder / UNKNOWN, fine.image)  # no pHYs: the spacing is unknown
    (folder / CORRUPT).write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a png" * 4)
    result = {"folder": folder, "spacing": spacing}
    for name, model_spacing in (("resampled", spacing), ("unresampled", None)):
        torch.manual_seed(0)  # the same weights for both
        ckpt = root / f"{name}.pt"
        torch.save(GLAMSaliencyNet(stage="joint", pixel_spacing=model_spacing, **TINY).state_dict(), ckpt)
        result[name] = root / f"out_{name}"
        _run(folder, result[name], ckpt)
    return result


def _scores(out: Path, stem: str) -> tuple[dict[str, float], dict[str, float]]:
    rows = {r["output_stem"]: r for r in _read_csv(out / "predictions.csv")}
    flip = (lambda a: a[..., ::-1]) if stem.endswith("_R") else (lambda a: a)  # back to the fine file's orientation
    coarse = {name: flip(_maps(out, rows[stem]["output_stem"], name)) for name in ("S_g", "S_c")}
    fine = {name: _maps(out, rows["fine"]["output_stem"], name) for name in ("S_g", "S_c")}
    return _agreement(fine["S_g"], coarse["S_g"]), _agreement(fine["S_c"], coarse["S_c"])


@pytest.mark.parametrize("name", COARSE)
def test_a_file_at_twice_the_models_spacing_gets_the_maps_of_the_fine_file(runs, name):
    """The coarse file is enlarged to the model's spacing, so the model sees what it sees in the fine file, and its maps
    come back on the coarse file's own grid (half the fine one); they match the fine file's maps averaged over 2x2
    blocks. With the same weights but no spacing in the model (nothing resampled) the same criterion fails: the
    window then holds the whole breast at half the scale."""
    from scripts.data.readers import read_mammogram

    stem = name.split(".")[0]
    out = runs["resampled"]
    row = next(r for r in _read_csv(out / "predictions.csv") if r["output_stem"] == stem)
    assert (int(row["height"]), int(row["width"])) == read_mammogram(runs["folder"] / name)[0].shape == (256, 160)
    zooms = nib.load(str(out / "maps" / f"{stem}_S_c.nii.gz")).header.get_zooms()[:2]
    assert zooms == pytest.approx((2 * runs["spacing"],) * 2, rel=1e-3)  # the maps state the file's pixel size
    scores_g, scores_c = _scores(out, stem)
    assert _agrees(scores_g, scores_c), (scores_g, scores_c)
    control_g, control_c = _scores(runs["unresampled"], stem)
    assert not _agrees(control_g, control_c) and control_g["corr"] < 0.9, (control_g, control_c)


def test_unknown_spacing_is_estimated_and_noted_in_errors_csv(runs):
    """A file without a spacing gets one estimated so that its breast fits the window (predictions.csv says so, the
    maps come back on its grid at 1 mm, its geometry); errors.csv has the corrupt file's error and, for it, a note
    starting with the estimate; a model of unknown spacing resamples nothing and notes no spacing."""
    out = runs["resampled"]
    rows = {Path(r["image"]).name: r for r in _read_csv(out / "predictions.csv")}
    assert set(rows) == {"fine.png", *COARSE, UNKNOWN}
    assert _maps(out, rows[UNKNOWN]["output_stem"], "S_c").shape == (2, *FINE_SIZE)
    assert rows[UNKNOWN]["spacing_source"] == "fit_breast" and rows["fine.png"]["spacing_source"] in ("pHYs", "file")
    estimate = float(rows[UNKNOWN]["spacing_row_mm"])
    # the maps keep the file's geometry (no spacing: 1 mm, as a viewer shows the file), not the estimate
    zooms = nib.load(str(out / "maps" / f"{rows[UNKNOWN]['output_stem']}_S_c.nii.gz")).header.get_zooms()[:2]
    assert zooms == pytest.approx((1.0, 1.0))
    errors = _read_csv(out / "errors.csv")
    assert list(errors[0]) == ["image", "error", "note"]
    assert [Path(e["image"]).name for e in errors if e["error"]] == [CORRUPT]
    notes = {Path(e["image"]).name: e["note"] for e in errors if not e["error"]}
    assert notes[UNKNOWN].startswith(f"pixel spacing not stated: estimated {estimate:.4g} mm, the breast fitted")
    assert not any("pixel spacing" in n for name, n in notes.items() if name != UNKNOWN)
    unresampled = _read_csv(runs["unresampled"] / "errors.csv")
    assert not any("pixel spacing" in e["note"] for e in unresampled)


def test_the_warning_names_the_file_and_the_estimate_once(runs, tmp_path, caplog):
    """One warning line for the file, naming it and the estimate at the model's anisotropic spacing; no second line
    about its spacing (earlier versions printed 'states 1 mm per pixel' and 'assumed 0.6 mm' for the same file)."""
    from scripts.networks import GLAMSaliencyNet

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / UNKNOWN).write_bytes((runs["folder"] / UNKNOWN).read_bytes())
    torch.manual_seed(0)
    ckpt = tmp_path / "model.pt"
    torch.save(GLAMSaliencyNet(stage="joint", pixel_spacing=[0.6, 0.5], **TINY).state_dict(), ckpt)
    with caplog.at_level("WARNING", logger="scripts"):
        _run(folder, tmp_path / "out", ckpt)
    warned = [r.getMessage() for r in caplog.records if UNKNOWN in r.getMessage()]
    assert len(warned) == 1, warned
    assert warned[0].startswith(f"{folder / UNKNOWN}: pixel spacing not stated: estimated ")
    assert "window at 0.6 x 0.5 mm" in warned[0]
