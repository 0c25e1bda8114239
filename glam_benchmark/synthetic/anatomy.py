"""The breast without lesions: the 1/f^beta random fields its tissue is made of (:func:`power_law_field`) and its
outline (:class:`_Geometry`), which also maps breast coordinates to pixels so that a lesion appears at
corresponding places in the CC and MLO views."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import fft as sp_fft

__all__ = ["power_law_field"]


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
