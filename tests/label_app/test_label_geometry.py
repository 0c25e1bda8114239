"""The label app's NRRD files state the geometry they are given as ITK (3D Slicer's reader) and the bundle's reader
read it back: a picture out of the plane z = 0 (offset, oblique) as a (W, H, 1) volume, one in it as a 2-D image;
and the label server's answers lie on their image (test_label_geometry_units.py, run in the label environment)."""

from __future__ import annotations

import subprocess

import nrrd
import numpy as np
import pytest
from _map_geometry import AFFINES, RAS, itk_affine, picture
from conftest import REPO_ROOT


def _write(path, image, **kwargs):
    import sys

    sys.path.insert(0, str(REPO_ROOT / "label_app"))
    from nrrd_io import write_nrrd_2d

    write_nrrd_2d(path, image, **kwargs)
    return path


@pytest.mark.parametrize("case", sorted(AFFINES))
def test_a_nrrd_out_of_the_plane_is_a_volume_itk_and_the_reader_place_as_given(tmp_path, case):
    from scripts.data.readers import read_mammogram
    from scripts.inference.maps import file_affine

    image, _ = picture("right")
    path = _write(tmp_path / f"{case}.nrrd", image, affine=AFFINES[case])
    assert nrrd.read_header(str(path))["sizes"].tolist() == [image.shape[1], image.shape[0], 1]
    np.testing.assert_allclose(itk_affine(path), AFFINES[case], atol=1e-6)
    array, meta = read_mammogram(path)
    np.testing.assert_array_equal(array, image)
    np.testing.assert_allclose(meta["spacing"], (0.5, 0.5))
    np.testing.assert_allclose(file_affine(meta), AFFINES[case], atol=1e-6)


def test_a_nrrd_in_the_plane_stays_2d_with_its_rotation_and_origin(tmp_path):
    from scripts.data.readers import read_mammogram
    from scripts.inference.maps import file_affine

    image, _ = picture("left")
    # a quarter turn in the plane, 0.1 mm rows and 0.2 mm columns, placed at (5, -3) mm
    affine = np.array([[0, -0.1, 0, 5.0], [0.2, 0, 0, -3.0], [0, 0, 1, 0], [0, 0, 0, 1.0]])
    path = _write(tmp_path / "inplane.nrrd", image, affine=affine)
    header = nrrd.read_header(str(path))
    assert header["dimension"] == 2 and header["space dimension"] == 2
    np.testing.assert_allclose(itk_affine(path), affine, atol=1e-6)
    array, meta = read_mammogram(path)
    np.testing.assert_array_equal(array, image)
    np.testing.assert_allclose(meta["spacing"], (0.1, 0.2))
    np.testing.assert_allclose(file_affine(meta), affine, atol=1e-6)
    # a spacing alone: ITK's axes for a picture, from 0 (the viewers' copies of DICOMs without a plane)
    plain = _write(tmp_path / "plain.nrrd", image, spacing=(0.1, 0.2))
    np.testing.assert_allclose(itk_affine(plain), RAS @ np.diag([0.2, 0.1, 1.0, 1.0]), atol=1e-6)


@pytest.mark.slow
def test_label_geometry_units_pass_in_the_label_environment():
    from label_client import label_python

    res = subprocess.run(
        [
            label_python(),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/label_app/test_label_geometry_units.py",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    summary = res.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, summary
