"""The label server's answers lie on their image: the .nii.gz and .nrrd maps of an input mirrored, rotated, oblique or
offset in patient space carry its geometry, with its bright square at the same voxels, through the task's own writing
(``GLAMSaliencyInfer._run`` with inference.yaml's loading and a stand-in network whose map is the bright square); an
ingested DICOM's copy for the viewers and its answer share the DICOM's plane. They import MONAI Label, so they run in
the label environment (test_label_geometry.py runs this file there); in the project's environment they are skipped."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import BUNDLE_ROOT, REPO_ROOT

pytest.importorskip("monailabel")
sys.path.insert(0, str(REPO_ROOT / "label_app"))

import nibabel as nib  # noqa: E402
import nrrd  # noqa: E402
import torch  # noqa: E402
from _map_geometry import AFFINES, bright_pixels, nrrd_affine, picture, spot_outputs, write_nifti  # noqa: E402
from glam_infer import GLAMSaliencyInfer, overlay_settings  # noqa: E402

CONFIGS = [
    str(BUNDLE_ROOT / "configs" / "inference.yaml"),
    str(REPO_ROOT / "tests" / "configs" / "tiny_inference.yaml"),
]


class _SpotNetwork:
    """Stands in for the GLAM network: its map is the brightest pixels of the preprocessed window."""

    def forward_all(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: v[None] for k, v in spot_outputs({"image": images[0]}).items()}


@pytest.fixture(scope="module")
def task() -> GLAMSaliencyInfer:
    """The task's writing as the server runs it, around the stand-in network (no weights are needed): inference.yaml's
    preprocessing for a model without a pixel spacing, so nothing is resampled."""
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(CONFIGS)
    parser["bundle_root"] = str(BUNDLE_ROOT)
    parser["pixel_spacing"] = None
    infer = GLAMSaliencyInfer.__new__(GLAMSaliencyInfer)
    infer.transform = parser.get_parsed_content("preprocessing")
    infer.loading = parser.get_parsed_content("loading")
    infer.glam, infer.device, infer.gamma_c, infer.window = _SpotNetwork(), torch.device("cpu"), 0.5, (256, 160)
    return infer


def _answer(task: GLAMSaliencyInfer, path: Path, extension: str) -> tuple[str, dict]:
    settings = overlay_settings({"overlay": "heatmap", "heatmap_class": "malignant", "result_extension": extension})
    return task._run(task.loading({"image": str(path)}), settings)


def _itk_affine(path: str) -> np.ndarray:
    """The RAS affine (voxel i = column, j = row) ITK, 3D Slicer's reader, places ``path`` with."""
    import itk

    image = itk.imread(path)
    d = len(image.GetOrigin())
    lps = np.eye(4)
    lps[:d, :d] = itk.array_from_matrix(image.GetDirection()) * np.asarray(image.GetSpacing())[None]
    lps[:d, 3] = np.asarray(image.GetOrigin())
    return np.diag([-1.0, -1.0, 1.0, 1.0]) @ lps


@pytest.mark.parametrize(
    ("case", "facing"), [("mirrored", "left"), ("rotated", "left"), ("oblique", "right"), ("offset", "right")]
)
def test_nifti_and_nrrd_answers_take_the_inputs_geometry_and_voxels(task, tmp_path, case, facing):
    image, _ = picture(facing)
    path = write_nifti(tmp_path / f"{case}.nii.gz", image, AFFINES[case])
    source = nib.load(str(path))
    spot = bright_pixels(np.asarray(source.dataobj))  # (i, j) = (column, row) of the input's bright square
    assert len(spot) == 25
    nifti_file, _ = _answer(task, path, ".nii.gz")
    answer = nib.load(nifti_file)
    np.testing.assert_allclose(answer.affine, source.affine, atol=1e-6)
    assert bright_pixels(np.asarray(answer.dataobj)) == spot
    nrrd_file, _ = _answer(task, path, ".nrrd")
    data, header = nrrd.read(nrrd_file, index_order="C")
    np.testing.assert_allclose(nrrd_affine(header), source.affine, atol=1e-6)
    np.testing.assert_allclose(_itk_affine(nrrd_file), source.affine, atol=1e-6)  # where Slicer puts it
    assert {(c, r) for r, c in bright_pixels(data.reshape(image.shape))} == spot


def test_an_ingested_dicoms_copy_and_its_answer_share_the_dicoms_plane(task, tmp_path):
    """A DICOM in a patient frame, rotated a quarter turn: the viewers' copy ingest writes and the NRRD answer for the
    DICOM state the same geometry, MONAI's affine of the DICOM, with the bright square on the same pixels."""
    from _dicom_factory import make_dataset, save
    from ingest import copy_name, ingest_dicoms
    from monai.data import PydicomReader
    from pydicom.uid import generate_uid

    image, _ = picture("left")
    ds = make_dataset(image, spacing=None, pixel_spacing=(0.07, 0.08), laterality=None)
    ds.FrameOfReferenceUID = generate_uid()
    ds.ImagePositionPatient = [10.0, -20.5, 30.0]
    ds.ImageOrientationPatient = [0.0, 1.0, 0.0, -1.0, 0.0, 0.0]
    path = save(ds, tmp_path / "plane.dcm")
    report = ingest_dicoms(tmp_path)
    assert not report.failed, report.failed
    copy, copy_header = nrrd.read(str(tmp_path / copy_name(path.name)), index_order="C")
    reader = PydicomReader()
    expected = reader.get_data(reader.read(str(path)))[1]["affine"]
    np.testing.assert_allclose(nrrd_affine(copy_header), expected, atol=1e-6)
    answer_file, _ = _answer(task, path, ".nrrd")
    data, header = nrrd.read(answer_file, index_order="C")
    np.testing.assert_allclose(nrrd_affine(header), expected, atol=1e-6)
    assert data.shape == copy.shape and bright_pixels(data.reshape(image.shape)) == bright_pixels(image)
