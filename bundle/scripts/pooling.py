"""Top-t% pooling: the mean of the largest t% of a saliency map's values, per sample and class."""

from __future__ import annotations

import torch
from torch import nn

from .errors import UsageError


def check_fraction(t: float, name: str = "t") -> float:
    """``t`` as a float in (0, 1]."""
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise UsageError(f"{name} must be a number in (0, 1], got {t!r}")
    if not 0.0 < float(t) <= 1.0:
        raise UsageError(f"{name} must be in (0, 1] (a fraction of the map, e.g. 0.03 for 3%), got {t}")
    return float(t)


def num_top_values(num_values: int, t: float) -> int:
    """k = max(1, round(n * t)), the number of values top-t% pooling averages."""
    return max(1, int(round(int(num_values) * t)))  # int(): shapes are tensors while tracing


def top_t_pool(x: torch.Tensor, t: float, start_dim: int = 2) -> torch.Tensor:
    """Mean of the k = max(1, round(n * t)) largest values over the dimensions from ``start_dim`` on.

    Args:
        x: e.g. saliency maps (B, C, H, W).
        t: the pooled fraction in (0, 1]; 1 is global average pooling.
        start_dim: first pooled dimension.
    """
    if not torch.jit.is_scripting():  # modules check t when built
        t = check_fraction(t)
    flat = x.flatten(start_dim)
    k = num_top_values(flat.shape[-1], t)
    if k == flat.shape[-1]:
        return flat.mean(-1)
    return flat.topk(k, dim=-1, sorted=False).values.mean(-1)


class TopTPooling(nn.Module):
    """Top-t% pooling (GMIC, GLAM): (B, C, H, W) -> (B, C).

    Args:
        t: the pooled fraction in (0, 1] (0.03 for the paper's 3%).
    """

    def __init__(self, t: float) -> None:
        super().__init__()
        self.t = check_fraction(t)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim < 3:
            raise UsageError(f"TopTPooling expects (B, C, ...) maps, got shape {tuple(x.shape)}")
        return top_t_pool(x, self.t)

    def extra_repr(self) -> str:
        return f"t={self.t}"
