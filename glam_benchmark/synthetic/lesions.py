"""Lesion shapes: each renderer returns a lesion's intensity profile (peak about 1) and its mask in a small window
around its centre, with the window's origin; the generator scales the profile by the lesion's contrast and adds it
to the tissue. Benign circumscribed masses and punctate calcifications, malignant spiculated masses and fine
pleomorphic calcifications."""

from __future__ import annotations

import math

import numpy as np

from .config import _u


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
