"""What the synthetic generator is told and what it hands back: the constants, :class:`SyntheticConfig` (every
parameter, with its validation), the per-breast plan (:class:`BreastPlan`, :class:`LesionSpec`), the generated
view (:class:`SyntheticCase`) and the draws from the config's (low, high) ranges that every part shares."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scripts.enums import CLASS_NAMES

__all__ = [
    "SyntheticConfig",
    "SyntheticCase",
    "LesionSpec",
    "BreastPlan",
    "BENIGN_TYPES",
    "MALIGNANT_TYPES",
    "MAX_VALUE_12BIT",
    "VIEWS",
    "SIDES",
    "REFERENCE_WIDTH",
    "FULL_SIZE_SPACING_MM",
    "FULL_SIZE_WIDTH",
    "synthetic_spacing_mm",
]

MAX_VALUE_12BIT = 4095
BENIGN_TYPES = ("circumscribed_mass", "punctate_calcifications")
MALIGNANT_TYPES = ("spiculated_mass", "pleomorphic_calcifications")
VIEWS = ("CC", "MLO")
SIDES = ("L", "R")
# Width the size parameters are expressed at: lesion sizes scale with the image width (the 736x480 quarter-size
# image is the reference the calibration in docs/data.md was done at).
REFERENCE_WIDTH = 480
# Full-size images (2944x1920) at about 0.1 mm per pixel; smaller images cover the same field.
FULL_SIZE_SPACING_MM = 0.1
FULL_SIZE_WIDTH = 1920


def synthetic_spacing_mm(size: Sequence[int]) -> float:
    """The isotropic pixel spacing (mm) that synthetic images of ``size`` (H, W) stand for: every size covers the field
    of a 1920-px-wide image at 0.1 mm, so 736x480 is 0.4 mm and 368x240 0.8 mm (a preset's ``pixel_spacing``)."""
    if len(size) != 2 or int(size[1]) < 1:
        raise ValueError(f"size must be (H, W) with W >= 1, got {size!r}")
    return FULL_SIZE_SPACING_MM * FULL_SIZE_WIDTH / int(size[1])


@dataclass(frozen=True)
class SyntheticConfig:
    """Every parameter of the generator. Ranges are (low, high) of a uniform draw per case or lesion.

    Intensities are in units of the 12-bit full scale (1.0 = 4095) before noise; contrasts of lesions are
    relative to the texture standard deviation of the breast they are placed in (``sigma_tex``: the standard
    deviation of the noise-free tissue image over the breast, pectoral muscle excluded).
    """

    size: tuple[int, int] = (736, 480)
    # probability that a breast (both of its views) holds at least one lesion; the NYU data set of the paper has
    # about 0.014 (6,541 of 458,852 breasts), the default keeps a small demo set trainable: most images are
    # still lesion-free. Among positive breasts: benign only, malignant only, both.
    lesion_prevalence: float = 0.4
    class_mix: tuple[float, float, float] = (0.5, 0.3, 0.2)
    # probabilities of 1, 2, 3 lesions of a class in a positive breast
    lesions_per_class: tuple[float, ...] = (0.7, 0.22, 0.08)
    # probability that a lesion of a class is a mass (else a calcification cluster)
    benign_mass_fraction: float = 0.6
    malignant_mass_fraction: float = 0.55
    # texture
    beta: float = 3.0
    density_fractions: tuple[float, float, float, float] = (0.08, 0.25, 0.45, 0.65)  # BI-RADS a, b, c, d
    density_probabilities: tuple[float, float, float, float] = (0.1, 0.4, 0.4, 0.1)
    fat_level: tuple[float, float] = (0.08, 0.13)
    gland_contrast: tuple[float, float] = (0.32, 0.42)
    septa_contrast: tuple[float, float] = (0.06, 0.11)
    # lesion sizes in pixels at REFERENCE_WIDTH (scaled with the width)
    benign_mass_radius: tuple[float, float] = (8.0, 20.0)
    malignant_mass_radius: tuple[float, float] = (7.0, 17.0)
    spicule_length: tuple[float, float] = (1.3, 2.4)  # times the local radius of the mass
    calc_cluster_radius: tuple[float, float] = (2.5, 4.5)  # 1-2 % of the width across (particle centres)
    benign_calc_cluster_radius: tuple[float, float] = (4.0, 8.0)
    # contrasts relative to sigma_tex
    benign_mass_contrast: tuple[float, float] = (0.9, 1.6)
    malignant_mass_contrast: tuple[float, float] = (0.9, 1.7)
    calc_contrast: tuple[float, float] = (1.0, 2.0)
    # each lesion's mask covers at most this fraction of the image (the paper's ROIs are typically <= 1 %)
    max_lesion_area: float = 0.01
    # calcification masks: "cluster" = the cluster's outline (what radiologists annotate), "particles" = only
    # the calcified pixels
    calc_mask: str = "cluster"
    # acquisition: detector blur (pixels), Poisson gain (counts per quantum) and electronic noise (counts)
    mtf_sigma: float = 0.5
    noise_gain: float = 1.5
    electronic_noise: float = 6.0

    def __post_init__(self) -> None:
        h, w = self.size
        if int(h) != h or int(w) != w or h < 64 or w < 48:
            raise ValueError(f"size must be two integers (H, W) with H >= 64 and W >= 48, got {self.size}")
        if not 0.0 <= self.lesion_prevalence <= 1.0:
            raise ValueError(f"lesion_prevalence must be in [0, 1], got {self.lesion_prevalence}")
        if len(self.class_mix) != 3 or min(self.class_mix) < 0 or sum(self.class_mix) <= 0:
            raise ValueError(f"class_mix must be three non-negative weights, got {self.class_mix}")
        if self.calc_mask not in ("cluster", "particles"):
            raise ValueError(f"calc_mask must be 'cluster' or 'particles', got {self.calc_mask!r}")
        if not 0.0 < self.max_lesion_area <= 0.25:
            raise ValueError(f"max_lesion_area must be in (0, 0.25], got {self.max_lesion_area}")
        if self.beta <= 0:
            raise ValueError(f"beta must be positive, got {self.beta}")

    @property
    def scale(self) -> float:
        """Lesion-size scale: image width over the 480-px reference width."""
        return self.size[1] / REFERENCE_WIDTH

    @property
    def spacing_mm(self) -> float:
        """Isotropic pixel spacing: the field of a 1920-px-wide image at 0.1 mm, whatever the size."""
        return synthetic_spacing_mm(self.size)


@dataclass(frozen=True)
class LesionSpec:
    """One lesion of a breast: its kind and the parameters shared by both views of the breast.

    ``depth`` (0 = chest wall, 1 = skin) and ``angle`` (-1 top .. 1 bottom of the breast outline) place it in
    breast coordinates, so a lesion appears at corresponding places in the CC and MLO views.
    """

    kind: str  # one of BENIGN_TYPES or MALIGNANT_TYPES
    cls: str  # "benign" or "malignant"
    size: float  # radius at REFERENCE_WIDTH (pixels)
    contrast: float  # relative to sigma_tex
    depth: float
    angle: float
    shape_seed: int


@dataclass(frozen=True)
class BreastPlan:
    """Per-breast choices shared by its views: density category, intensity levels and lesions."""

    patient_index: int
    laterality: str
    density_category: int  # 0..3 = BI-RADS a..d
    density: float
    fat: float
    gland: float
    septa: float
    lesions: tuple[LesionSpec, ...]

    @property
    def label(self) -> list[int]:
        """Breast-level [benign, malignant] label."""
        return [int(any(les.cls == c for les in self.lesions)) for c in CLASS_NAMES]


@dataclass
class SyntheticCase:
    """One generated view.

    image: (H, W) uint16, 0 outside the breast, 1..4095 inside. mask_benign / mask_malignant: (H, W) uint8 0/1.
    breast_mask: (H, W) bool. label: [benign, malignant] derived from the masks (1 where the mask is non-empty).
    lesions: one dict per lesion actually drawn (kind, class, centre (row, col), mask area in pixels, contrast).
    sigma_tex: texture standard deviation of the breast (12-bit counts) the lesion contrasts refer to.
    """

    image: np.ndarray
    mask_benign: np.ndarray
    mask_malignant: np.ndarray
    breast_mask: np.ndarray
    patient_id: str
    laterality: str
    view: str
    density_category: int
    sigma_tex: float
    lesions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def label(self) -> list[int]:
        return [int(self.mask_benign.any()), int(self.mask_malignant.any())]


def _choice(rng: np.random.Generator, probabilities: Sequence[float]) -> int:
    p = np.asarray(probabilities, dtype=np.float64)
    return int(rng.choice(len(p), p=p / p.sum()))


def _u(rng: np.random.Generator, bounds: tuple[float, float]) -> float:
    return float(rng.uniform(bounds[0], bounds[1]))
