"""Synthetic screening mammograms with pixel-exact lesion masks: the bundle's default data set and the
benchmark's ground truth.

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
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import fft as sp_fft
from scipy import ndimage

__all__ = [
    "SyntheticConfig",
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
        return FULL_SIZE_SPACING_MM * FULL_SIZE_WIDTH / self.size[1]


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
        return [int(any(les.cls == c for les in self.lesions)) for c in ("benign", "malignant")]


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


def power_law_field(
    shape: tuple[int, int], beta: float, rng: np.random.Generator, anisotropy: float = 1.0
) -> np.ndarray:
    """Gaussian random field with power spectrum ~ 1/f^beta, zero mean and unit std, (H, W) float32.

    White noise filtered in the Fourier domain by f^(-beta/2). ``anisotropy`` > 1 stretches structures along
    the columns (towards the nipple) by stretching the horizontal frequency axis. The lowest frequency is
    clamped at one cycle per image so the field has no infinite DC power.
    """
    h, w = shape
    noise = rng.standard_normal((h, w), dtype=np.float32)
    spec = sp_fft.rfft2(noise)
    fy = np.fft.fftfreq(h).astype(np.float32)[:, None]
    fx = (np.fft.rfftfreq(w).astype(np.float32) * np.float32(anisotropy))[None, :]
    f = np.sqrt(fy * fy + fx * fx)
    np.maximum(f, np.float32(1.0 / max(h, w)), out=f)
    spec *= f ** np.float32(-beta / 2.0)
    spec[0, 0] = 0.0
    out = sp_fft.irfft2(spec, s=(h, w)).astype(np.float32, copy=False)
    out -= out.mean()
    std = float(out.std())
    return out / np.float32(std if std > 0 else 1.0)


def _smoothstep(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


def _choice(rng: np.random.Generator, probabilities: Sequence[float]) -> int:
    p = np.asarray(probabilities, dtype=np.float64)
    return int(rng.choice(len(p), p=p / p.sum()))


def _u(rng: np.random.Generator, bounds: tuple[float, float]) -> float:
    return float(rng.uniform(bounds[0], bounds[1]))


@dataclass(frozen=True)
class _Geometry:
    """Breast outline in a frame centred on the chest wall, rotated by ``tilt`` (radians, positive = the nipple
    points down-right as in an MLO view). ``a``: half-height, ``b``: depth (pixels); ``harmonics`` modulate the
    radius so outlines are not perfect ellipses."""

    cy: float
    a: float
    b: float
    tilt: float
    harmonics: tuple[tuple[float, float], ...]  # (amplitude, phase) for k = 2, 3, ...

    def radius(self, theta: np.ndarray) -> np.ndarray:
        c, s = np.cos(theta), np.sin(theta)
        r = 1.0 / np.sqrt((c / self.b) ** 2 + (s / self.a) ** 2)
        mod = np.ones_like(theta)
        for k, (amp, phase) in enumerate(self.harmonics, start=2):
            mod = mod + amp * np.cos(k * theta + phase)
        return r * mod

    def normalised_radius(self, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(d, edge): d < 1 inside the breast (0 at the chest-wall centre); edge = radial distance in pixels
        from the pixel to the outline (positive inside)."""
        dy = rows - self.cy
        ct, st = math.cos(self.tilt), math.sin(self.tilt)
        u = cols * ct + dy * st
        v = -cols * st + dy * ct
        rho = np.hypot(u, v)
        r = self.radius(np.arctan2(v, u))
        return rho / r, r - rho

    def to_pixel(self, depth: float, angle: float) -> tuple[float, float]:
        """Breast coordinates (depth in [0, 1], angle in [-1, 1] = top .. bottom) -> (row, col)."""
        theta = angle * (math.pi / 2) * 0.8
        r = float(self.radius(np.array([theta]))[0]) * depth
        u, v = r * math.cos(theta), r * math.sin(theta)
        ct, st = math.cos(self.tilt), math.sin(self.tilt)
        return self.cy + u * st + v * ct, u * ct - v * st


class SyntheticMammogramGenerator:
    """Deterministic generator of synthetic mammogram views.

    ``generate(patient_index, laterality, view)`` always returns the same :class:`SyntheticCase` for the same
    seed and config; the CC and MLO views of a breast share its density and lesions (at corresponding places).
    """

    def __init__(self, config: SyntheticConfig | None = None, seed: int = 0) -> None:
        if int(seed) != seed or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.config = config or SyntheticConfig()
        self.seed = int(seed)

    # -- per-breast plan ---------------------------------------------------------------------------------
    def breast_plan(self, patient_index: int, laterality: str) -> BreastPlan:
        """Density, intensity levels and the lesions of one breast (shared by its CC and MLO views)."""
        if laterality not in SIDES:
            raise ValueError(f"laterality must be 'L' or 'R', got {laterality!r}")
        cfg = self.config
        rng = np.random.default_rng([self.seed, int(patient_index), SIDES.index(laterality), 99])
        cat = _choice(rng, cfg.density_probabilities)
        density = float(np.clip(cfg.density_fractions[cat] + rng.normal(0.0, 0.03), 0.03, 0.85))
        fat, gland, septa = _u(rng, cfg.fat_level), _u(rng, cfg.gland_contrast), _u(rng, cfg.septa_contrast)
        lesions: list[LesionSpec] = []
        if rng.random() < cfg.lesion_prevalence:
            mix = _choice(rng, cfg.class_mix)
            classes = {0: ["benign"], 1: ["malignant"], 2: ["benign", "malignant"]}[mix]
            for cls in classes:
                for _ in range(_choice(rng, cfg.lesions_per_class) + 1):
                    lesions.append(self._lesion_spec(rng, cls))
        return BreastPlan(int(patient_index), laterality, cat, density, fat, gland, septa, tuple(lesions))

    def _lesion_spec(self, rng: np.random.Generator, cls: str) -> LesionSpec:
        cfg = self.config
        if cls == "benign":
            is_mass = rng.random() < cfg.benign_mass_fraction
            kind = BENIGN_TYPES[0] if is_mass else BENIGN_TYPES[1]
            size = _u(rng, cfg.benign_mass_radius if is_mass else cfg.benign_calc_cluster_radius)
            contrast = _u(rng, cfg.benign_mass_contrast if is_mass else cfg.calc_contrast)
        else:
            is_mass = rng.random() < cfg.malignant_mass_fraction
            kind = MALIGNANT_TYPES[0] if is_mass else MALIGNANT_TYPES[1]
            size = _u(rng, cfg.malignant_mass_radius if is_mass else cfg.calc_cluster_radius)
            contrast = _u(rng, cfg.malignant_mass_contrast if is_mass else cfg.calc_contrast)
        return LesionSpec(
            kind=kind,
            cls=cls,
            size=size,
            contrast=contrast,
            depth=_u(rng, (0.25, 0.75)),
            angle=_u(rng, (-0.75, 0.75)),
            shape_seed=int(rng.integers(0, 2**31 - 1)),
        )

    # -- one view ---------------------------------------------------------------------------------------
    def generate(self, patient_index: int, laterality: str, view: str) -> SyntheticCase:
        """One view of one breast: image, per-class masks and metadata (facing right, chest wall at column 0)."""
        if view not in VIEWS:
            raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
        cfg = self.config
        plan = self.breast_plan(patient_index, laterality)
        rng = np.random.default_rng([self.seed, int(patient_index), SIDES.index(laterality), VIEWS.index(view), 7])
        h, w = cfg.size
        geom = self._geometry(rng, view)
        rows = np.arange(h, dtype=np.float32)[:, None]
        cols = np.arange(w, dtype=np.float32)[None, :]
        d, dist_edge = geom.normalised_radius(rows, cols)
        d = d.astype(np.float32, copy=False)
        breast = d < 1.0

        pectoral = np.zeros((h, w), dtype=bool)
        pect_soft = None
        if view == "MLO":
            top_w = w * _u(rng, (0.16, 0.32))
            left_h = h * _u(rng, (0.3, 0.55))
            p = _u(rng, (0.85, 1.25))  # < 1 concave, > 1 convex muscle edge
            q = (np.clip(cols / top_w, 0, None) ** p + np.clip(rows / left_h, 0, None) ** p).astype(np.float32)
            pectoral = q < 1.0
            pect_soft = _smoothstep((1.0 - q) * 25.0)  # a soft muscle edge of a few pixels
            breast |= pectoral

        # Fibroglandular tissue: soft threshold of a 1/f^beta field, denser towards the central breast.
        g = power_law_field((h, w), cfg.beta, rng, anisotropy=_u(rng, (1.2, 2.0)))
        g_env = g - np.float32(1.2) * np.clip(d, 0, 1.5) ** 2
        inside = g_env[breast & ~pectoral]
        sample = inside[:: max(1, inside.size // 20000)]
        thr = float(np.quantile(sample, 1.0 - plan.density)) if sample.size else 0.0
        glandular = 1.0 / (1.0 + np.exp(-(g_env - np.float32(thr)) / np.float32(0.25)))
        # fine modulation of the tissue by the field itself; floored so fat never reaches the background level
        tissue = np.maximum(plan.fat + plan.gland * glandular + np.float32(0.03) * g, np.float32(0.6 * plan.fat))
        # Fibrous septa (Cooper's ligaments): the zero set of a second, slightly smoothed 1/f^beta field drawn as
        # lines of about constant width (|field| / |gradient| is the distance to the zero crossing), mostly
        # visible in fat. They are also the clutter that spicules and calcifications must be told apart from.
        s2 = ndimage.gaussian_filter(
            power_law_field((h, w), cfg.beta, rng, anisotropy=_u(rng, (3.0, 5.0))), 1.0 * cfg.scale
        )
        gy, gx = np.gradient(s2)
        dist_zero = np.abs(s2) / (np.hypot(gy, gx) + np.float32(1e-6))
        septa = np.exp(-((dist_zero / np.float32(0.6 * cfg.scale + 0.4)) ** 2))
        tissue += np.float32(plan.septa) * septa * (1.0 - 0.5 * glandular)
        # processed (For Presentation) images equalise thickness: only a mild fall-off, then a bright skin line
        thickness = 1.0 - 0.25 * _smoothstep((d - 0.8) / 0.2)
        tissue *= thickness
        skin_px = max(1.0, 0.005 * w)
        tissue += np.float32(0.12) * ((dist_edge >= 0) & (dist_edge < skin_px))
        if pect_soft is not None:
            muscle = plan.fat + plan.gland * _u(rng, (0.9, 1.15)) + 0.08 * (1 - rows / max(h, 1))
            tissue = tissue * (1 - pect_soft) + muscle * pect_soft + np.float32(0.04) * g * pect_soft
        tissue = tissue.astype(np.float32, copy=False)
        soft_tissue = breast & ~pectoral
        sigma_tex = float(tissue[soft_tissue].std()) if soft_tissue.any() else 0.1

        masks = {"benign": np.zeros((h, w), dtype=bool), "malignant": np.zeros((h, w), dtype=bool)}
        drawn: list[dict[str, Any]] = []
        allowed = soft_tissue
        for spec in plan.lesions:
            info = self._draw_lesion(tissue, masks[spec.cls], allowed, geom, spec, sigma_tex, rng)
            if info is not None:
                drawn.append(info)

        # acquisition: detector blur, then Poisson (quantum) + Gaussian (electronic) noise in 12-bit counts
        if cfg.mtf_sigma > 0:
            tissue = ndimage.gaussian_filter(tissue, cfg.mtf_sigma, mode="nearest")
        counts = np.clip(tissue, 0, 1.2) * np.float32(MAX_VALUE_12BIT)
        if cfg.noise_gain > 0:
            counts = cfg.noise_gain * rng.poisson(counts / cfg.noise_gain).astype(np.float32)
        if cfg.electronic_noise > 0:
            counts += rng.normal(0.0, cfg.electronic_noise, size=counts.shape).astype(np.float32)
        image = np.where(breast, np.clip(np.rint(counts), 1, MAX_VALUE_12BIT), 0).astype(np.uint16)
        return SyntheticCase(
            image=image,
            mask_benign=(masks["benign"] & breast).astype(np.uint8),
            mask_malignant=(masks["malignant"] & breast).astype(np.uint8),
            breast_mask=breast,
            patient_id=patient_id_for(patient_index),
            laterality=laterality,
            view=view,
            density_category=plan.density_category,
            sigma_tex=sigma_tex * MAX_VALUE_12BIT,
            lesions=drawn,
        )

    def _geometry(self, rng: np.random.Generator, view: str) -> _Geometry:
        h, w = self.config.size
        harmonics = tuple((_u(rng, (0.0, 0.03)), _u(rng, (0, 2 * math.pi))) for _ in range(4))
        if view == "CC":
            return _Geometry(
                cy=h * _u(rng, (0.45, 0.55)),
                a=h * _u(rng, (0.36, 0.46)),
                b=w * _u(rng, (0.45, 0.75)),
                tilt=math.radians(_u(rng, (-5.0, 5.0))),
                harmonics=harmonics,
            )
        return _Geometry(
            cy=h * _u(rng, (0.3, 0.4)),
            a=h * _u(rng, (0.48, 0.6)),
            b=w * _u(rng, (0.5, 0.78)),
            tilt=math.radians(_u(rng, (12.0, 28.0))),
            harmonics=harmonics,
        )

    # -- lesions ----------------------------------------------------------------------------------------
    def _draw_lesion(
        self,
        tissue: np.ndarray,
        mask: np.ndarray,
        allowed: np.ndarray,
        geom: _Geometry,
        spec: LesionSpec,
        sigma_tex: float,
        view_rng: np.random.Generator,
    ) -> dict[str, Any] | None:
        """Add one lesion to ``tissue`` and its pixels to ``mask`` (in place); None if it found no room."""
        cfg = self.config
        h, w = tissue.shape
        scale = cfg.scale
        max_area = cfg.max_lesion_area * h * w
        size = spec.size
        for attempt in range(12):
            # jitter the breast coordinates per view (the projections differ), retry when it lands badly
            depth = float(np.clip(spec.depth + view_rng.normal(0, 0.05 + 0.03 * attempt), 0.15, 0.85))
            angle = float(np.clip(spec.angle + view_rng.normal(0, 0.08 + 0.05 * attempt), -0.85, 0.85))
            cy, cx = geom.to_pixel(depth, angle)
            if not (0 <= cy < h and 0 <= cx < w) or not allowed[int(cy), int(cx)]:
                continue
            profile, lesion_mask, (r0, c0) = self._render(
                spec, size * scale, cy, cx, np.random.default_rng([spec.shape_seed, 5])
            )
            r1, c1 = r0 + profile.shape[0], c0 + profile.shape[1]
            if r0 < 0 or c0 < 0 or r1 > h or c1 > w:
                continue
            area = int(lesion_mask.sum())
            if area > max_area:  # shrink so one lesion stays within max_lesion_area of the image
                size *= 0.9 * math.sqrt(max_area / area)
                continue
            inside = allowed[r0:r1, c0:c1]
            if area == 0 or (lesion_mask & ~inside).sum() > 0.05 * area:
                continue
            lesion_mask &= inside
            profile = profile * inside
            tissue[r0:r1, c0:c1] += np.float32(spec.contrast * sigma_tex) * profile
            mask[r0:r1, c0:c1] |= lesion_mask
            return {
                "kind": spec.kind,
                "class": spec.cls,
                "center": [round(cy, 2), round(cx, 2)],
                "bbox": [int(r0), int(c0), int(r1), int(c1)],
                "area": int(lesion_mask.sum()),
                "contrast_rel_texture": round(spec.contrast, 4),
                "radius_px": round(size * scale, 3),
            }
        return None

    def _render(
        self, spec: LesionSpec, radius: float, cy: float, cx: float, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
        """Lesion intensity profile (peak about 1) and its mask in a local window; returns the window origin."""
        cfg = self.config
        if spec.kind == "circumscribed_mass":
            return _circumscribed_mass(radius, cy, cx, rng)
        if spec.kind == "spiculated_mass":
            return _spiculated_mass(radius, cy, cx, rng, cfg.spicule_length, cfg.scale)
        fine = spec.kind == "pleomorphic_calcifications"
        return _calcification_cluster(radius, cy, cx, rng, cfg.scale, fine=fine, mask_mode=cfg.calc_mask)


def _local_grid(cy: float, cx: float, half: float) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Pixel-centre offsets (dy, dx) from (cy, cx) over a square window of half-size ``half``."""
    r0, c0 = int(math.floor(cy - half)), int(math.floor(cx - half))
    n = int(math.ceil(2 * half)) + 2
    dy = (np.arange(r0, r0 + n, dtype=np.float32) - np.float32(cy))[:, None]
    dx = (np.arange(c0, c0 + n, dtype=np.float32) - np.float32(cx))[None, :]
    return dy, dx, (r0, c0)


def _circumscribed_mass(
    radius: float, cy: float, cx: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Round/oval mass with a sharp margin; profile = projected thickness of an ellipsoid."""
    aspect = _u(rng, (0.65, 1.0))
    rot = _u(rng, (0, math.pi))
    ra, rb = radius / math.sqrt(aspect), radius * math.sqrt(aspect)
    dy, dx, origin = _local_grid(cy, cx, ra + 1)
    u = dx * math.cos(rot) + dy * math.sin(rot)
    v = -dx * math.sin(rot) + dy * math.cos(rot)
    q = (u / ra) ** 2 + (v / rb) ** 2
    mask = q < 1.0
    profile = np.sqrt(np.clip(1.0 - q, 0, 1)) ** 0.4
    return profile.astype(np.float32), mask, origin


def _spiculated_mass(
    radius: float, cy: float, cx: float, rng: np.random.Generator, spicule_length: tuple[float, float], scale: float
) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Irregular mass (radius modulated by low harmonics) with thin radiating spicules on most of them."""
    n_harm = 5
    amps = rng.uniform(0.04, 0.16, n_harm) / np.sqrt(np.arange(1, n_harm + 1))
    phases = rng.uniform(0, 2 * math.pi, n_harm)
    spiculated = rng.random() < 0.75
    n_spic = int(rng.integers(6, 15)) if spiculated else 0
    lengths = rng.uniform(*spicule_length, n_spic)
    half = radius * (1 + amps.sum()) * (1 + (lengths.max() if n_spic else 0)) + 2
    dy, dx, origin = _local_grid(cy, cx, half)
    rho = np.hypot(dy, dx)
    alpha = np.arctan2(dy, dx)
    r_alpha = np.full_like(alpha, radius)
    mod = np.ones_like(alpha)
    for k in range(n_harm):
        mod = mod + amps[k] * np.cos((k + 2) * alpha + phases[k])
    r_alpha = r_alpha * mod
    q = rho / r_alpha
    core = q < 1.0
    profile = (np.sqrt(np.clip(1.0 - q * q, 0, 1)) ** 0.5).astype(np.float32)
    mask = core.copy()
    half_width0 = max(0.6, 1.0 * scale)
    for ang, length_factor in zip(rng.uniform(0, 2 * math.pi, n_spic), lengths):
        e_y, e_x = math.sin(ang), math.cos(ang)
        t = dx * e_x + dy * e_y
        perp = np.abs(-dx * e_y + dy * e_x)
        length = radius * (1 + length_factor)
        frac = np.clip(t / length, 0, 1)
        hw = np.maximum(half_width0 * (1 - frac), 0.5)
        line = (t > 0) & (t <= length) & (perp <= hw)
        mask |= line
        np.maximum(profile, np.where(line, 0.45 * (1 - 0.6 * frac), 0).astype(np.float32), out=profile)
    return profile, mask, origin


def _calcification_cluster(
    radius: float,
    cy: float,
    cx: float,
    rng: np.random.Generator,
    scale: float,
    fine: bool,
    mask_mode: str,
) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """A cluster of calcified particles inside an ellipse of mean radius ``radius``.

    fine=True (malignant, fine pleomorphic): 6-16 particles of varied shape (dots of 1-2 px and short linear
    segments) and brightness, tightly clustered in an elongated region. fine=False (benign, punctate): 3-8 round
    particles of 2-3 px and uniform brightness, loosely spread.
    """
    aspect = _u(rng, (1.0, 2.2)) if fine else _u(rng, (1.0, 1.4))
    rot = _u(rng, (0, math.pi))
    ra, rb = radius * math.sqrt(aspect), radius / math.sqrt(aspect)
    dot_r = (0.6 * scale, 1.1 * scale) if fine else (1.0 * scale, 1.5 * scale)
    n = int(rng.integers(6, 17)) if fine else int(rng.integers(3, 9))
    half = ra + 2 * dot_r[1] + 3 * scale + 2
    dy, dx, origin = _local_grid(cy, cx, half)
    profile = np.zeros((dy.shape[0], dx.shape[1]), dtype=np.float32)
    particles = np.zeros(profile.shape, dtype=bool)
    # uniform positions in the ellipse (sqrt for an area-uniform radius)
    rr = np.sqrt(rng.uniform(0, 1, n))
    th = rng.uniform(0, 2 * math.pi, n)
    pu, pv = rr * np.cos(th) * ra, rr * np.sin(th) * rb
    py = pu * math.sin(rot) + pv * math.cos(rot)
    px = pu * math.cos(rot) - pv * math.sin(rot)
    for i in range(n):
        brightness = _u(rng, (0.5, 1.0)) if fine else _u(rng, (0.85, 1.0))
        r_dot = _u(rng, dot_r)
        ddy, ddx = dy - np.float32(py[i]), dx - np.float32(px[i])
        if fine and rng.random() < 0.4:  # short linear / branching fragment
            ang = _u(rng, (0, math.pi))
            length = _u(rng, (1.5, 3.5)) * scale
            t = ddx * math.cos(ang) + ddy * math.sin(ang)
            perp = np.abs(-ddx * math.sin(ang) + ddy * math.cos(ang))
            shape = (np.abs(t) <= length / 2) & (perp <= max(0.5, 0.5 * scale))
        else:
            shape = ddy * ddy + ddx * ddx <= r_dot * r_dot
        if not shape.any():  # a sub-pixel particle still calcifies its nearest pixel
            iy = int(round(float(py[i]) - float(dy[0, 0])))
            ix = int(round(float(px[i]) - float(dx[0, 0])))
            shape = np.zeros_like(particles)
            shape[iy, ix] = True
        particles |= shape
        np.maximum(profile, np.float32(brightness) * shape, out=profile)
    if mask_mode == "particles":
        return profile, particles, origin
    # the cluster outline: the sampling ellipse grown by a particle radius and a small margin, plus the particles
    u = dx * math.cos(rot) + dy * math.sin(rot)
    v = -dx * math.sin(rot) + dy * math.cos(rot)
    grow = dot_r[1] + 1.0 * scale
    outline = (u / (ra + grow)) ** 2 + (v / (rb + grow)) ** 2 < 1.0
    return profile, outline | particles, origin


def patient_id_for(patient_index: int) -> str:
    return f"SYN{int(patient_index):05d}"


# ------------------------------------------------------------------------------------------------------------
# writers (atomic: write to a temporary name beside the target, then os.replace)
# ------------------------------------------------------------------------------------------------------------
def _atomic_target(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # a hidden name that keeps the extension (nibabel picks compression from it)
    return path.with_name(f".tmp{os.getpid()}-{path.name}")


def write_png16(path: str | os.PathLike, image: np.ndarray) -> None:
    """(H, W) uint16 -> 16-bit grayscale PNG."""
    from PIL import Image

    path = Path(path)
    arr = np.ascontiguousarray(image, dtype=np.uint16)
    tmp = _atomic_target(path)
    Image.fromarray(arr).save(tmp, format="PNG")
    os.replace(tmp, path)


def write_mask_png(path: str | os.PathLike, mask: np.ndarray) -> None:
    """(H, W) binary mask -> 8-bit PNG with values 0 and 255 (the authors' mask format)."""
    from PIL import Image

    path = Path(path)
    tmp = _atomic_target(path)
    Image.fromarray(np.where(np.asarray(mask) > 0, 255, 0).astype(np.uint8)).save(tmp, format="PNG")
    os.replace(tmp, path)


def write_nifti(path: str | os.PathLike, array: np.ndarray, spacing_mm: float) -> None:
    """(H, W) array -> 2-D NIfTI whose first axis is x (columns) and second y (rows), as ITK, MONAI's
    PILReader (reverse_indexing) and NibabelReader lay out 2-D images: the stored data is ``array.T``."""
    import nibabel as nib

    path = Path(path)
    affine = np.diag([spacing_mm, spacing_mm, 1.0, 1.0])
    img = nib.Nifti1Image(np.ascontiguousarray(np.asarray(array).T), affine)
    img.header.set_xyzt_units("mm")
    tmp = _atomic_target(path)
    nib.save(img, str(tmp))
    os.replace(tmp, path)


# SNOMED CT view codes (DICOM CID 4014)
_VIEW_CODES = {"CC": ("399162004", "cranio-caudal"), "MLO": ("399368009", "medio-lateral oblique")}
# Patient Orientation (0020,0020): row direction \ column direction, for the breast facing right (chest wall at
# column 0) and for the detector-native right breast facing left.
_ORIENTATION = {
    ("L", "CC", "right"): ["A", "R"],
    ("L", "MLO", "right"): ["A", "FR"],
    ("R", "CC", "right"): ["A", "L"],
    ("R", "MLO", "right"): ["A", "FL"],
    ("R", "CC", "left"): ["P", "L"],
    ("R", "MLO", "left"): ["P", "FL"],
    ("L", "CC", "left"): ["P", "R"],
    ("L", "MLO", "left"): ["P", "FR"],
}


def deterministic_uid(*parts: Any) -> str:
    """A DICOM UID derived from ``parts`` (same parts -> same UID) under pydicom's root."""
    from pydicom.uid import generate_uid

    return str(generate_uid(entropy_srcs=[str(p) for p in parts]))


def write_mammogram_dicom(
    path: str | os.PathLike,
    image: np.ndarray,
    *,
    patient_id: str,
    laterality: str,
    view: str,
    facing: str,
    spacing_mm: float,
    study_uid: str,
    series_uid: str,
    sop_uid: str,
    instance_number: int = 1,
    photometric: str = "MONOCHROME2",
) -> None:
    """Write a Digital Mammography X-Ray Image - For Presentation (12 bits stored in 16) as explicit VR
    little endian. ``image``: (H, W) uint16 in 0..4095 with dense tissue bright; for MONOCHROME1 the stored
    values are inverted (4095 - x) as a MONOCHROME1 detector writes them. Works with pydicom 2.4 and 3.x."""
    import pydicom
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import DigitalMammographyXRayImageStorageForPresentation, ExplicitVRLittleEndian

    if photometric not in ("MONOCHROME1", "MONOCHROME2"):
        raise ValueError(f"photometric must be MONOCHROME1 or MONOCHROME2, got {photometric!r}")
    arr = np.asarray(image)
    if arr.ndim != 2:
        raise ValueError(f"{path}: image must be 2-D (H, W), got shape {arr.shape}")
    pixels = arr.astype(np.uint16)
    if photometric == "MONOCHROME1":
        pixels = (MAX_VALUE_12BIT - pixels.astype(np.int32)).clip(0, MAX_VALUE_12BIT).astype(np.uint16)

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = DigitalMammographyXRayImageStorageForPresentation
    meta.MediaStorageSOPInstanceUID = sop_uid
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    meta.ImplementationClassUID = deterministic_uid("glam-monai-synthetic-implementation")

    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = DigitalMammographyXRayImageStorageForPresentation
    ds.SOPInstanceUID = sop_uid
    ds.StudyInstanceUID = study_uid
    ds.SeriesInstanceUID = series_uid
    ds.Modality = "MG"
    ds.PresentationIntentType = "FOR PRESENTATION"
    ds.ImageType = ["DERIVED", "PRIMARY"]
    ds.Manufacturer = "GLAM-MONAI synthetic"
    ds.PatientID = patient_id
    ds.PatientName = f"Synthetic^{patient_id}"
    ds.PatientSex = "F"
    ds.StudyDate = "20240101"
    ds.StudyTime = "120000"
    ds.AccessionNumber = patient_id
    ds.StudyID = "1"
    ds.SeriesNumber = 1
    ds.InstanceNumber = int(instance_number)
    ds.BodyPartExamined = "BREAST"
    ds.ImageLaterality = laterality
    ds.ViewPosition = view
    code_value, meaning = _VIEW_CODES[view]
    code = Dataset()
    code.CodeValue = code_value
    code.CodingSchemeDesignator = "SCT"
    code.CodeMeaning = meaning
    ds.ViewCodeSequence = [code]
    ds.PatientOrientation = _ORIENTATION[(laterality, view, facing)]
    ds.BurnedInAnnotation = "NO"
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = photometric
    ds.Rows, ds.Columns = int(pixels.shape[0]), int(pixels.shape[1])
    ds.BitsAllocated = 16
    ds.BitsStored = 12
    ds.HighBit = 11
    ds.PixelRepresentation = 0
    ds.PixelSpacing = [f"{spacing_mm:.6g}", f"{spacing_mm:.6g}"]
    ds.ImagerPixelSpacing = [f"{spacing_mm:.6g}", f"{spacing_mm:.6g}"]
    ds.PixelIntensityRelationship = "LOG"
    # -1: higher stored values = less X-ray reaching the detector (dense tissue bright), i.e. MONOCHROME2 here
    ds.PixelIntensityRelationshipSign = 1 if photometric == "MONOCHROME1" else -1
    ds.WindowCenter = "2048"
    ds.WindowWidth = "4096"
    ds.PixelData = pixels.astype("<u2").tobytes()

    path = Path(path)
    tmp = _atomic_target(path)
    if int(pydicom.__version__.split(".")[0]) >= 3:
        pydicom.dcmwrite(tmp, ds, enforce_file_format=True)
    else:  # pydicom 2.x: encoding from the dataset flags, file meta written by write_like_original=False
        ds.is_little_endian = True
        ds.is_implicit_VR = False
        pydicom.dcmwrite(str(tmp), ds, write_like_original=False)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------------------
# data set
# ------------------------------------------------------------------------------------------------------------
_EXTENSIONS = {"png": ".png", "dcm": ".dcm", "nii": ".nii.gz"}


def _plan_images(n: int) -> list[tuple[int, str, str]]:
    """(patient, side, view) for n images: screening exams of 4 views (L-CC, L-MLO, R-CC, R-MLO) per patient."""
    out = []
    for i in range(n):
        p, k = divmod(i, 4)
        out.append((p, SIDES[k // 2], VIEWS[k % 2]))
    return out


def _write_one(args: tuple) -> dict[str, Any]:
    """Generate one view and write its files; returns the datalist item (paths relative to ``out_dir``)."""
    (config, seed, out_dir, fmt, facing_mode, photometric_mode, patient, side, view, index) = args
    gen = SyntheticMammogramGenerator(config, seed)
    case = gen.generate(patient, side, view)
    out = Path(out_dir)
    stem = f"{case.patient_id}_{side}_{view}"
    facing = "left" if facing_mode == "native" and side == "R" else "right"
    flip = (lambda a: a[:, ::-1]) if facing == "left" else (lambda a: a)
    image_rel = f"images/{stem}{_EXTENSIONS[fmt]}"
    spacing = config.spacing_mm
    if fmt == "png":
        write_png16(out / image_rel, flip(case.image))
    elif fmt == "nii":
        write_nifti(out / image_rel, flip(case.image), spacing)
    else:
        photometric = photometric_mode
        if photometric_mode == "mix":  # every third image MONOCHROME1, for readers' test mixes
            photometric = "MONOCHROME1" if index % 3 == 2 else "MONOCHROME2"
        study = deterministic_uid("glam-synthetic", seed, "study", patient)
        write_mammogram_dicom(
            out / image_rel,
            flip(case.image),
            patient_id=case.patient_id,
            laterality=side,
            view=view,
            facing=facing,
            spacing_mm=spacing,
            study_uid=study,
            series_uid=deterministic_uid("glam-synthetic", seed, "series", patient, side, view),
            sop_uid=deterministic_uid("glam-synthetic", seed, "sop", patient, side, view),
            instance_number=index + 1,
            photometric=photometric,
        )
    mask_ext = ".nii.gz" if fmt == "nii" else ".png"
    item: dict[str, Any] = {"image": image_rel, "label": case.label}
    for cls, mask in (("benign", case.mask_benign), ("malignant", case.mask_malignant)):
        rel = f"masks/{stem}_{cls}{mask_ext}"
        if fmt == "nii":
            write_nifti(out / rel, flip(mask).astype(np.uint8), spacing)
        else:
            write_mask_png(out / rel, flip(mask))
        item[f"mask_{cls}"] = rel
    item.update(
        patient_id=case.patient_id,
        laterality=side,
        view=view,
        facing=facing,
        density="abcd"[case.density_category],
        lesions=[les["kind"] for les in case.lesions],
    )
    return item


def make_synthetic_dataset(
    out_dir: str | os.PathLike,
    n: int,
    size: tuple[int, int] = (736, 480),
    seed: int = 0,
    fmt: str = "png",
    *,
    fractions: Sequence[float] = (0.7, 0.15, 0.15),
    lesion_prevalence: float | None = None,
    facing: str | None = None,
    photometric: str = "MONOCHROME2",
    config: SyntheticConfig | None = None,
    workers: int = 1,
) -> Path:
    """Generate ``n`` views (4 per patient: L-CC, L-MLO, R-CC, R-MLO) under ``out_dir`` and write
    ``out_dir/datalist.json``; returns its path.

    Layout: ``images/SYN00012_L_CC.<ext>``, ``masks/SYN00012_L_CC_{benign,malignant}.<png|nii.gz>`` (both masks
    always written, all-zero where the image has no lesion of that class: for synthetic data "no lesion" is
    known, not missing), ``datalist.json`` in MONAI layout with paths relative to ``out_dir`` and the split by
    patient (``fractions`` of patients for training/validation/test), and ``generator.json`` with the config.

    fmt: "png" (16-bit PNG, masks 0/255 PNG), "dcm" (MG DICOM For Presentation, masks 0/255 PNG) or "nii"
    (NIfTI, masks 0/1 NIfTI). facing: "right" (every breast faces right) or "native" (right breasts mirrored so
    the chest wall is at the right edge, as on a detector); default "native" for DICOM, "right" otherwise.
    photometric (DICOM only): "MONOCHROME2", "MONOCHROME1" or "mix" (every third image MONOCHROME1).
    The item key ``facing`` records the side the breast faces in the stored pixels.
    """
    from .datalist import save_datalist, split_by_patient

    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if fmt not in _EXTENSIONS:
        raise ValueError(f"fmt must be one of {sorted(_EXTENSIONS)}, got {fmt!r}")
    facing_mode = facing if facing is not None else ("native" if fmt == "dcm" else "right")
    if facing_mode not in ("right", "native"):
        raise ValueError(f"facing must be 'right' or 'native', got {facing!r}")
    if photometric not in ("MONOCHROME1", "MONOCHROME2", "mix"):
        raise ValueError(f"photometric must be MONOCHROME1, MONOCHROME2 or mix, got {photometric!r}")
    cfg = config or SyntheticConfig()
    cfg = replace(cfg, size=(int(size[0]), int(size[1])))
    if lesion_prevalence is not None:
        cfg = replace(cfg, lesion_prevalence=float(lesion_prevalence))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [
        (cfg, int(seed), str(out), fmt, facing_mode, photometric, p, side, view, i)
        for i, (p, side, view) in enumerate(_plan_images(int(n)))
    ]
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=int(workers)) as pool:
            items = list(pool.map(_write_one, jobs, chunksize=max(1, len(jobs) // (4 * workers))))
    else:
        items = [_write_one(job) for job in jobs]
    datalist = split_by_patient(items, fractions=fractions, seed=seed)
    description = {
        "generator": "scripts.data.synthetic",
        "seed": int(seed),
        "n": int(n),
        "format": fmt,
        "facing": facing_mode,
        "photometric": photometric,
        "config": asdict(cfg),
        "config_sha1": hashlib.sha1(json.dumps(asdict(cfg), sort_keys=True).encode()).hexdigest(),
    }
    tmp = _atomic_target(out / "generator.json")
    tmp.write_text(json.dumps(description, indent=2) + "\n")
    os.replace(tmp, out / "generator.json")
    return save_datalist(datalist, out / "datalist.json")


def ensure_synthetic_dataset(
    root: str | os.PathLike,
    n: int,
    size: tuple[int, int] = (736, 480),
    seed: int = 0,
    fmt: str = "png",
    **kwargs: Any,
) -> str:
    """The datalist of a synthetic dataset under ``root``, generated on first use.

    The dataset lives in ``root/synthetic_n{n}_{H}x{W}_seed{seed}_{fmt}_{tag}``, ``tag`` a hash of the other keyword
    arguments (``config``, ``lesion_prevalence``…), so other settings never reuse it, and is
    generated into a temporary folder that is renamed when complete, so an interrupted run leaves nothing half
    written. Returns the path of its ``datalist.json``.
    """
    settings = {k: (asdict(v) if isinstance(v, SyntheticConfig) else v) for k, v in sorted(kwargs.items())}
    tag = (
        hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:8]
        if kwargs
        else "default"
    )
    out = Path(root) / f"synthetic_n{int(n)}_{int(size[0])}x{int(size[1])}_seed{int(seed)}_{fmt}_{tag}"
    datalist = out / "datalist.json"
    if datalist.is_file():
        return str(datalist)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        make_synthetic_dataset(tmp, n, size=size, seed=seed, fmt=fmt, **kwargs)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(datalist)
