"""The generator of synthetic views: :class:`SyntheticMammogramGenerator` plans each breast (density, lesions),
then builds each view from its outline, tissue texture, pectoral muscle, lesions and the acquisition (detector
blur and noise)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import ndimage

from scripts.enums import CLASS_NAMES, LesionClass

from .anatomy import _Geometry, _smoothstep, power_law_field
from .config import (
    BENIGN_TYPES,
    MALIGNANT_TYPES,
    MAX_VALUE_12BIT,
    SIDES,
    VIEWS,
    BreastPlan,
    LesionSpec,
    SyntheticCase,
    SyntheticConfig,
    _choice,
    _u,
)
from .lesions import _calcification_cluster, _circumscribed_mass, _spiculated_mass

__all__ = ["SyntheticMammogramGenerator", "patient_id_for"]


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
            # plain str values, not members: they end up in the cases' lesion dicts and plans as before
            benign, malignant = CLASS_NAMES
            classes = {0: [benign], 1: [malignant], 2: [benign, malignant]}[mix]
            for cls in classes:
                for _ in range(_choice(rng, cfg.lesions_per_class) + 1):
                    lesions.append(self._lesion_spec(rng, cls))
        return BreastPlan(int(patient_index), laterality, cat, density, fat, gland, septa, tuple(lesions))

    def _lesion_spec(self, rng: np.random.Generator, cls: str) -> LesionSpec:
        cfg = self.config
        if cls == LesionClass.BENIGN:
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

        masks = {c: np.zeros((h, w), dtype=bool) for c in CLASS_NAMES}
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
            mask_benign=(masks[LesionClass.BENIGN] & breast).astype(np.uint8),
            mask_malignant=(masks[LesionClass.MALIGNANT] & breast).astype(np.uint8),
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


def patient_id_for(patient_index: int) -> str:
    return f"SYN{int(patient_index):05d}"
