"""Synthetic screening mammograms with pixel-exact lesion masks: the quick start's data set and the benchmark's
ground truth.

What is modelled (see ``docs/data.md`` for the calibration and the numbers):

- a compressed breast against the chest-wall edge (column 0: the breast faces right, as after the authors'
  flip), an irregular elliptical outline, peripheral thickness fall-off and a skin line;
- fibroglandular tissue from a Gaussian random field with a power-law spectrum P(f) ~ 1/f^beta
  (beta = 3 by default, the standard model of mammographic background), soft-thresholded at a per-case
  density (BI-RADS a-d-like), anisotropic so that structures run towards the nipple;
- a pectoral-muscle wedge on MLO views;
- lesions: benign circumscribed round/oval masses and round punctate calcifications; malignant irregular or
  spiculated masses and clustered fine pleomorphic calcifications;
- detector blur (Gaussian MTF) and Poisson-Gaussian acquisition noise, 12-bit values in a uint16 array
  (0..4095, background exactly 0, breast pixels >= 1, like the authors' 16-bit PNGs).

Arrays are (H, W) = displayed rows top-to-bottom x columns. Every random draw comes from a generator seeded by
``(seed, patient, side, view)``, so one image does not depend on how many others are generated, the same seed
gives byte-identical arrays, and images can be generated in parallel.

Writing files (PNG / DICOM / NIfTI), the patient split and the datalist are in :func:`make_synthetic_dataset`.

The package's rooms: ``config`` (constants, :class:`SyntheticConfig`, the plan and case records), ``anatomy``
(tissue texture fields and the breast outline), ``lesions`` (lesion shapes), ``generator``
(:class:`SyntheticMammogramGenerator`), ``writers`` (PNG / NIfTI / DICOM files) and ``dataset`` (data sets on disk).
Every name is re-exported here (``glam_benchmark.synthetic.X``); ``python -m glam_benchmark.synthetic`` writes a
data set or a preview figure.
"""

from __future__ import annotations

# the ``X as X`` imports: public names outside __all__
from .anatomy import power_law_field
from .config import (
    BENIGN_TYPES,
    MALIGNANT_TYPES,
    MAX_VALUE_12BIT,
    BreastPlan,
    LesionSpec,
    SyntheticCase,
    SyntheticConfig,
    synthetic_spacing_mm,
)
from .config import FULL_SIZE_SPACING_MM as FULL_SIZE_SPACING_MM
from .config import FULL_SIZE_WIDTH as FULL_SIZE_WIDTH
from .config import REFERENCE_WIDTH as REFERENCE_WIDTH
from .config import SIDES as SIDES
from .config import VIEWS as VIEWS
from .dataset import ensure_synthetic_dataset, make_synthetic_dataset
from .generator import SyntheticMammogramGenerator
from .generator import patient_id_for as patient_id_for
from .writers import deterministic_uid as deterministic_uid
from .writers import write_mammogram_dicom, write_mask_png, write_nifti, write_png16

__all__ = [
    "SyntheticConfig",
    "synthetic_spacing_mm",
    "SyntheticCase",
    "LesionSpec",
    "BreastPlan",
    "SyntheticMammogramGenerator",
    "power_law_field",
    "make_synthetic_dataset",
    "ensure_synthetic_dataset",
    "write_png16",
    "write_mask_png",
    "write_nifti",
    "write_mammogram_dicom",
    "BENIGN_TYPES",
    "MALIGNANT_TYPES",
    "MAX_VALUE_12BIT",
]
