"""A map lies on its image: every map file of an input carries the input's geometry (orientation, origin, pixel
spacing), and its voxel (i, j) is the input's voxel (i, j). Inputs mirrored, rotated, oblique and offset in patient
space (as dcm2niix writes NIfTI), DICOMs with and without a plane, and a PNG go through inference.yaml's own loading
and the writer (GLAMInferenceWriter.write_item) with a stand-in network whose map is the input's bright square; the
geometry is compared with nibabel's affine of the input, MONAI's PydicomReader and ITK's reading of the input (the
library 3D Slicer and ITK-SNAP read files with)."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
import pytest
from _dicom_factory import make_dataset, save
from _map_geometry import AFFINES, bright_pixels, itk_affine, picture, spot_outputs, write_nifti
from conftest import BUNDLE_ROOT, REPO_ROOT
from pydicom.uid import generate_uid

CONFIGS = [
    str(BUNDLE_ROOT / "configs" / "inference.yaml"),
    str(REPO_ROOT / "tests" / "configs" / "tiny_inference.yaml"),
]


def _transforms(pixel_spacing):
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(CONFIGS)
    parser["bundle_root"] = str(BUNDLE_ROOT)
    parser["pixel_spacing"] = pixel_spacing
    return parser.get_parsed_content("preprocessing"), parser.get_parsed_content("loading")


@pytest.fixture(scope="module")
def transforms():
    """inference.yaml's preprocessing and loading for a model without a pixel spacing: nothing is resampled, so the
    map's bright square is the input's, pixel for pixel."""
    return _transforms(None)


def _write(transforms, path: Path, out: Path, outputs=("S_g", "S_c")) -> tuple[dict, list[str]]:
    """``path`` through the loading and the writer into ``out``: (the preprocessed item, the image's notes)."""
    from scripts.inference.files import OutputSelection
    from scripts.inference.folder import InferenceOutputFolder
    from scripts.inference.writer import GLAMInferenceWriter

    preprocessing, loading = transforms
    item = loading({"image": str(path)})
    item["output_stem"] = path.name.split(".")[0]
    folder = InferenceOutputFolder(out, {}, OutputSelection.parse(list(outputs)))
    folder.open([])
    notes: list[str] = []
    try:
        GLAMInferenceWriter(folder, preprocessing).write_item(item, spot_outputs(item), notes)
    finally:
        folder.close()
    return item, notes


def _map(out: Path, stem: str, name: str) -> nib.Nifti1Image:
    return nib.load(str(out / "maps" / f"{stem}_{name}.nii.gz"))


@pytest.mark.parametrize(
    ("case", "facing"), [("mirrored", "left"), ("rotated", "left"), ("oblique", "right"), ("offset", "right")]
)
def test_nifti_maps_take_the_inputs_affine_and_lie_on_its_voxels(transforms, tmp_path, case, facing):
    image, _ = picture(facing)
    path = write_nifti(tmp_path / f"{case}.nii.gz", image, AFFINES[case])
    item, notes = _write(transforms, path, tmp_path / "out")
    assert notes == [] and bool(item["image"].meta["flipped_to_right"]) == (facing == "left")
    source = nib.load(str(path))
    spot = bright_pixels(np.asarray(source.dataobj))  # (i, j) of the input's bright square
    assert len(spot) == 25
    for name in ("S_g", "S_c"):
        written = _map(tmp_path / "out", case, name)
        np.testing.assert_allclose(written.affine, source.affine, atol=1e-6)
        data = np.asarray(written.get_fdata())[:, :, 0, 0, :]
        for c in range(2):
            assert bright_pixels(data[..., c]) == spot, (name, c)


def _plane_dicom(path: Path, facing: str) -> tuple[Path, np.ndarray]:
    """A mammogram DICOM in a patient frame of reference, rotated a quarter turn, without SliceThickness."""
    image, _ = picture(facing)
    ds = make_dataset(image, spacing=None, pixel_spacing=(0.07, 0.08), laterality=None, view_position="CC")
    ds.FrameOfReferenceUID = generate_uid()
    ds.ImagePositionPatient = [10.0, -20.5, 30.0]
    ds.ImageOrientationPatient = [0.0, 1.0, 0.0, -1.0, 0.0, 0.0]
    return save(ds, path), image


def test_a_dicom_in_a_frame_of_reference_gives_its_plane_to_every_map(transforms, tmp_path):
    from monai.data import PydicomReader

    path, image = _plane_dicom(tmp_path / "plane.dcm", "left")
    out = tmp_path / "out"
    _, notes = _write(transforms, path, out, ("S_c", "dicom_map"))
    assert not any("DICOM outputs not written" in n for n in notes), notes
    # the NIfTI map: MONAI's affine of the DICOM (voxel i = column, as its reader's swap_ij gives it)
    reader = PydicomReader()
    monai_affine = reader.get_data(reader.read(str(path)))[1]["affine"]
    written = _map(out, "plane", "S_c")
    np.testing.assert_allclose(written.affine, monai_affine, atol=1e-6)
    # ITK places it there too (its DICOM reader takes the pixel size of a mammogram from ImagerPixelSpacing only,
    # which this file lacks: it reads 1 mm, so the directions are compared as unit vectors)
    by_itk = itk_affine(path)
    np.testing.assert_allclose(written.affine[:, 3], by_itk[:, 3], atol=1e-6)
    unit = written.affine[:3, :3] / np.linalg.norm(written.affine[:3, :3], axis=0)
    np.testing.assert_allclose(unit, by_itk[:3, :3] / np.linalg.norm(by_itk[:3, :3], axis=0), atol=1e-6)
    spot = {(r, c) for c, r in bright_pixels(np.asarray(written.get_fdata())[:, :, 0, 0, 1])}
    assert spot == bright_pixels(image)
    # the Segmentation: the source's frame of reference, position, orientation and spacing, on its pixels
    seg = pydicom.dcmread(str(out / "dicom" / "plane_map.dcm"))
    source = pydicom.dcmread(str(path))
    assert seg.FrameOfReferenceUID == source.FrameOfReferenceUID
    shared = seg.SharedFunctionalGroupsSequence[0]
    np.testing.assert_allclose([float(v) for v in shared.PixelMeasuresSequence[0].PixelSpacing], [0.07, 0.08])
    iop = shared.PlaneOrientationSequence[0].ImageOrientationPatient
    np.testing.assert_allclose([float(v) for v in iop], [float(v) for v in source.ImageOrientationPatient])
    for frame in seg.PerFrameFunctionalGroupsSequence:
        ipp = frame.PlanePositionSequence[0].ImagePositionPatient
        np.testing.assert_allclose([float(v) for v in ipp], [10.0, -20.5, 30.0])
    frames = seg.pixel_array  # (2, H, W): benign, malignant
    assert frames.shape == (2, *image.shape) and bright_pixels(frames[1]) == bright_pixels(image)


def test_files_without_a_plane_are_placed_as_itk_places_them(transforms, tmp_path):
    """A DICOM without ImagePositionPatient / ImageOrientationPatient (most mammograms) and a PNG: DICOM's and ITK's
    default axes (LPS) from position 0, at the file's pixel spacing."""
    from PIL import Image

    image, _ = picture("left")
    dicom = save(make_dataset(image, spacing=(0.07, 0.08), laterality=None), tmp_path / "flat.dcm")
    png = tmp_path / "flat_png.png"
    Image.fromarray((image // 16).astype(np.uint8)).save(png)
    for path in (dicom, png):
        _write(transforms, path, tmp_path / "out", ("S_c",))
        written = _map(tmp_path / "out", path.name.split(".")[0], "S_c")
        np.testing.assert_allclose(written.affine, itk_affine(path), atol=1e-6, err_msg=path.name)
        spot = {(r, c) for c, r in bright_pixels(np.asarray(written.get_fdata())[:, :, 0, 0, 1])}
        assert spot == bright_pixels(image), path.name


def test_a_dicom_orientation_that_is_not_two_unit_directions_is_noted(transforms, tmp_path):
    from scripts.inference.maps import file_affine

    image, _ = picture("right")
    ds = make_dataset(image, spacing=(0.1, 0.1))
    ds.ImageOrientationPatient = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]  # the same direction twice
    path = save(ds, tmp_path / "bad_iop.dcm")
    notes: list[str] = []
    affine = file_affine({"format": "dicom", "filename": str(path), "spacing": (0.1, 0.1)}, notes)
    np.testing.assert_allclose(affine, np.diag([-0.1, -0.1, 1.0, 1.0]))
    assert len(notes) == 1 and notes[0].startswith("ImageOrientationPatient [1") and "DICOM's default" in notes[0]
    _, written_notes = _write(transforms, path, tmp_path / "out", ("S_c",))
    assert written_notes == notes


def test_a_resampled_input_keeps_its_affine_and_its_map_peaks_on_its_spot(tmp_path):
    """A model at 0.4 mm: the 0.5 mm input is resampled on the way in and its map on the way back; the map keeps the
    input's affine and peaks inside the input's bright square."""
    image, _ = picture("left")
    path = write_nifti(tmp_path / "offset.nii.gz", image, AFFINES["offset"])
    item, _ = _write(_transforms([0.4, 0.4]), path, tmp_path / "out", ("S_g",))
    assert tuple(item["image"].meta["resampled_shape"]) == (375, 225)
    source = nib.load(str(path))
    written = _map(tmp_path / "out", "offset", "S_g")
    np.testing.assert_allclose(written.affine, source.affine, atol=1e-6)
    data = np.asarray(written.get_fdata())[:, :, 0, 0, 1]
    assert data.max() > 0.5 and bright_pixels(data) <= bright_pixels(np.asarray(source.dataobj))


def test_a_nifti_affine_without_a_third_axis_gets_the_planes_normal():
    """A 2-D file stating a zero third column (nibabel cannot write a singular affine): the map keeps the file's
    plane and origin, with the plane's unit normal as its third axis."""
    from scripts.inference.maps import file_affine

    own = np.array([[0, -0.5, 0, 40], [0.4, 0, 0, 120], [0, 0, 0, -7], [0, 0, 0, 1.0]])  # (row, col) order
    affine = file_affine({"format": "nifti", "original_affine": own, "spacing": (0.4, 0.5)})
    expected = np.array([[-0.5, 0, 0, 40], [0, 0.4, 0, 120], [0, 0, -1, -7], [0, 0, 0, 1.0]])
    np.testing.assert_allclose(affine, expected)
