"""Inputs placed, mirrored and rotated in patient space, and a stand-in network whose map is the input's brightest
spot, for the tests that a map lies on its image (tests/inference/test_map_geometry.py and the label server's
tests/label_app/test_label_geometry_units.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

SHAPE = (300, 180)  # (H, W): rows x columns of the pictures
SPOT = 5  # side of the bright square, pixels
_C, _S = np.cos(np.pi / 6), np.sin(np.pi / 6)
#: NIfTI affines (RAS; voxel i = column, j = row) as dcm2niix and scanners write them, 0.5 mm pixels
AFFINES = {
    "mirrored": np.array([[-0.5, 0, 0, 40], [0, -0.5, 0, 120], [0, 0, 1, -7], [0, 0, 0, 1.0]]),
    "rotated": np.array([[0, -0.5, 0, 40], [0.5, 0, 0, 120], [0, 0, 1, -7], [0, 0, 0, 1.0]]),
    "oblique": np.array([[0.5, 0, 0, -20], [0, 0.5 * _C, -_S, 35], [0, 0.5 * _S, _C, 60], [0, 0, 0, 1.0]]),
    "offset": np.array([[0.5, 0, 0, 12.5], [0, 0.5, 0, -30], [0, 0, 1, 4], [0, 0, 0, 1.0]]),
}


def picture(facing: str) -> tuple[np.ndarray, tuple[int, int]]:
    """An (H, W) uint16 breast (a half ellipse on the chest-wall side: ``facing`` "right" puts the chest wall at
    column 0) with a bright square inside it; returns it and the square's top-left (row, col)."""
    h, w = SHAPE
    rows, cols = np.mgrid[:h, :w]
    breast = ((rows - h / 2) / (0.45 * h)) ** 2 + (cols / (0.6 * w)) ** 2 < 1
    image = np.where(breast, 1000 + (rows * 7 + cols * 3) % 200, 0).astype(np.uint16)
    top, left = 110, 30
    image[top : top + SPOT, left : left + SPOT] = 4000
    if facing == "left":
        return np.ascontiguousarray(image[:, ::-1]), (top, w - left - SPOT)
    return image, (top, left)


def write_nifti(path: Path, image: np.ndarray, affine: np.ndarray) -> Path:
    """``image`` (H, W) as a 2-D NIfTI stored x (column) first, as the readers take it, with ``affine``."""
    import nibabel as nib

    nib.save(nib.Nifti1Image(np.ascontiguousarray(image.T), affine), str(path))
    return path


def spot_outputs(item: dict) -> dict[str, torch.Tensor]:
    """One image's network outputs whose S_g is 1 on the brightest pixels of the preprocessed window and 0 elsewhere
    (both classes), with one empty patch: the map on the file is then the input's bright square, wherever the
    preprocessing flipped, cropped and windowed it."""
    window = torch.as_tensor(item["image"])[0].float()
    spot = (window >= window.max()).float()
    return {
        "saliency_global": torch.stack([spot, spot]),
        "patch_maps": torch.zeros((1, 2, 4, 4)),
        "patch_boxes": torch.tensor([[0, 0, 16, 16]]),
        "y_global": torch.tensor([0.25, 0.75]),
    }


def bright_pixels(array: np.ndarray) -> set[tuple[int, int]]:
    """The (index 0, index 1) of an array's maximum, as a set."""
    return {(int(a), int(b)) for a, b in np.argwhere(array >= array.max())}


def nrrd_affine(header: dict) -> np.ndarray:
    """RAS 4x4 affine (voxel i = column, j = row) of a NRRD header as ITK reads it: LPS space (the 2-D or the
    left-posterior-superior one), the axes x first; a 2-D space lies in z = 0."""
    directions = np.asarray(header["space directions"], dtype=np.float64)
    origin = np.asarray(header["space origin"], dtype=np.float64)
    lps = np.eye(4)
    k = directions.shape[1]
    lps[:k, 0], lps[:k, 1], lps[:k, 3] = directions[0], directions[1], origin
    if len(directions) == 3:
        lps[:3, 2] = directions[2]
    return np.diag([-1.0, -1.0, 1.0, 1.0]) @ lps


#: ITK's LPS <-> NIfTI's RAS (x and y change sign)
RAS = np.diag([-1.0, -1.0, 1.0, 1.0])


def itk_affine(path: str | Path) -> np.ndarray:
    """The RAS affine (voxel i = column, j = row) ITK, and so 3D Slicer, reads ``path`` with; a 2-D reading lies in
    z = 0."""
    import itk

    image = itk.imread(str(path))
    d = len(image.GetOrigin())
    lps = np.eye(4)
    lps[:d, :d] = itk.array_from_matrix(image.GetDirection()) * np.asarray(image.GetSpacing())[None]
    lps[:d, 3] = np.asarray(image.GetOrigin())
    return RAS @ lps
