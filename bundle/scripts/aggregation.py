"""Patch-evidence aggregations (concatenation, gated attention), their registry, and the fusion head.

A new aggregation is one :func:`register_aggregation` call; GLAM builds it by name (``aggregation`` in train.yaml).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from monai.utils import ComponentStore, look_up_option
from torch import nn

from .enums import OutputKey, Stage
from .errors import UsageError
from .pooling import check_fraction, top_t_pool

T = TypeVar("T")


class Registry(ComponentStore):
    """Named components whose lookups name the argument, the choices and MONAI's did-you-mean hint.

    Names keep their case (``LayerFactory`` upper-cases them, changing the value a checkpoint records).

    Args:
        name: what the components are, for ``print(registry)``.
        description: one line on what they are for.
    """

    def register(self, name: str, description: str = "") -> Callable[[T], T]:
        """Decorator storing its target under a new ``name``: checkpoints record variants by name."""
        if name in self:
            raise UsageError(f"{self.name}: {name!r} is already registered")

        def deco(value: T) -> T:
            return self.add(name, description or (getattr(value, "__doc__", None) or "").strip(), value)

        return deco

    def unregister(self, name: str) -> None:
        """Remove ``name``."""
        self.look_up(name, "name")
        del self.components[name]

    def look_up(self, name: Any, argument: str) -> Any:
        """The component stored under exactly ``name`` (``look_up_option`` would accept ``" concat "``).

        Raises:
            ValueError: naming ``argument``, the choices and the closest name.
        """
        if isinstance(name, str) and name in self.components:
            return self.components[name].value
        hint = ""
        try:
            look_up_option(name, self.names, print_all_options=False)
            hint = f"did you mean {name.strip()!r}?"  # found once stripped of spaces
        except ValueError as err:
            first = str(err).splitlines()[0]
            hint = first if first.startswith("By ") else ""
        raise UsageError(f"{argument} must be one of {self.names}, got {name!r}" + (f" ({hint})" if hint else ""))


def _check_bag(patch_maps: torch.Tensor, patch_features: torch.Tensor | None) -> None:
    if patch_maps.ndim != 5:
        raise UsageError(f"patch_maps must be (B, K, C, h, w), got shape {tuple(patch_maps.shape)}")
    if patch_features is not None and (patch_features.ndim != 3 or patch_features.shape[:2] != patch_maps.shape[:2]):
        raise UsageError(
            f"patch_features must be (B, K, D) with the same B, K as patch_maps {tuple(patch_maps.shape[:2])}, "
            f"got shape {tuple(patch_features.shape)}"
        )


def _check_mask(mask: torch.Tensor, scores: torch.Tensor) -> None:
    if mask.shape != scores.shape:
        raise UsageError(f"mask must be (B, K) = {tuple(scores.shape)}, got shape {tuple(mask.shape)}")
    if not bool(mask.any(dim=1).all()):
        raise UsageError("mask must keep at least one patch per image")


class ConcatTopTAggregation(nn.Module):
    """Top-t% pooling of an image's K patch maps (B, K, C, h, w) as one map; z_local the mean of the (B, K, D) z_k.

    Args:
        t: the pooled fraction (the paper's 0.2; the authors' inference code uses 0.3).
    """

    def __init__(self, t: float = 0.2) -> None:
        super().__init__()
        self.t = check_fraction(t, "t_local")

    def forward(self, patch_maps: torch.Tensor, patch_features: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if not torch.jit.is_scripting():
            _check_bag(patch_maps, patch_features)
        out = {OutputKey.Y_LOCAL.value: top_t_pool(patch_maps.transpose(1, 2), self.t, start_dim=2)}
        if patch_features is not None:
            out[OutputKey.Z_LOCAL.value] = patch_features.mean(dim=1)
        return out

    def extra_repr(self) -> str:
        return f"t={self.t}"


class GatedAttentionAggregation(nn.Module):
    """Gated attention MIL pooling (Ilse et al. 2018) over the K patches of an image.

    a_k = w^T (tanh(V z_k) * sigmoid(U z_k)), alpha = softmax_k(a), y_l = sum_k alpha_k y_k (y_k the top-t% pooled
    A_k), z_l = sum_k alpha_k z_k. An optional (B, K) bool ``mask`` of forward marks the patches that exist.

    Args:
        in_features: D, the patch representation size.
        hidden_features: the attention's hidden size.
        t: top-t% fraction pooling each patch map into y_k.
    """

    def __init__(self, in_features: int = 512, hidden_features: int = 128, t: float = 0.2) -> None:
        super().__init__()
        self.t = check_fraction(t, "t_local")
        self.attn_v = nn.Linear(in_features, hidden_features, bias=False)
        self.attn_u = nn.Linear(in_features, hidden_features, bias=False)
        self.attn_w = nn.Linear(hidden_features, 1, bias=False)

    def forward(
        self, patch_maps: torch.Tensor, patch_features: torch.Tensor, mask: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        if not torch.jit.is_scripting():
            _check_bag(patch_maps, patch_features)
        scores = self.attn_w(torch.tanh(self.attn_v(patch_features)) * torch.sigmoid(self.attn_u(patch_features)))
        scores = scores.squeeze(-1).float()
        if mask is not None:
            mask = mask.to(device=scores.device, dtype=torch.bool)
            if not torch.jit.is_scripting():
                _check_mask(mask, scores)
            scores = scores.masked_fill(~mask, float("-inf"))
        attention = torch.softmax(scores, dim=1)
        y_patches = top_t_pool(patch_maps, self.t, start_dim=3)  # (B, K, C)
        y_local = (attention.unsqueeze(-1) * y_patches.float()).sum(dim=1).to(y_patches.dtype)
        z_local = (attention.unsqueeze(-1) * patch_features.float()).sum(dim=1).to(patch_features.dtype)
        return {
            OutputKey.Y_LOCAL.value: y_local,
            OutputKey.Z_LOCAL.value: z_local,
            OutputKey.ATTENTION.value: attention,
        }


class FusionHead(nn.Module):
    """Fusion of the global and local representations: y_f = sigmoid(W [z_g, z_l] + b), (B, C)."""

    def __init__(self, global_features: int = 256, local_features: int = 512, num_classes: int = 2) -> None:
        super().__init__()
        self.linear = nn.Linear(global_features + local_features, num_classes)

    def forward(self, z_global: torch.Tensor, z_local: torch.Tensor) -> torch.Tensor:
        # float32 probabilities under autocast
        return torch.sigmoid(self.linear(torch.cat([z_global, z_local.to(z_global.dtype)], dim=1)).float())


#: (in_features, hidden_features, t) -> module: GLAM's patch feature size, ``attention_hidden`` and ``t_local``
AggregationFactory = Callable[[int, int, float], nn.Module]


@dataclass(frozen=True)
class AggregationSpec:
    """How GLAM builds and holds one aggregation.

    The module maps ``patch_maps`` (B, K, C, h, w) and ``patch_features`` (B, K, D) to a dict of ``y_local`` (B, C),
    ``z_local`` (B, D) and optionally ``attention`` (B, K); it should compile with ``torch.jit.script``.

    Attributes:
        factory: ``(in_features, hidden_features, t) -> nn.Module``.
        attribute: the GLAM attribute holding it, the prefix of its weights in checkpoints (so fixed for good).
        joint_module: held only by networks built with ``joint_modules=True`` (the authors' gated attention).
    """

    factory: AggregationFactory
    attribute: str
    joint_module: bool = False


#: the aggregations GLAM can be built with, by its ``aggregation`` argument
AGGREGATIONS = Registry("GLAM aggregations", "patch-evidence aggregation modules, by the name `aggregation` takes")

#: the paper's aggregation per stage (GLAM's ``aggregation=None``)
PAPER_AGGREGATION: dict[str, str] = {Stage.LOCAL.value: "concat", Stage.JOINT.value: "attention"}


def register_aggregation(
    name: str,
    factory: AggregationFactory,
    attribute: str | None = None,
    joint_module: bool = False,
    description: str = "",
) -> AggregationSpec:
    """Register an aggregation under a new ``name``, held by GLAM at ``attribute`` (``"<name>_aggregation"``).

    Returns:
        its :class:`AggregationSpec`.
    """
    spec = AggregationSpec(factory=factory, attribute=attribute or f"{name}_aggregation", joint_module=joint_module)
    if not spec.attribute.isidentifier():
        raise UsageError(f"the attribute of aggregation {name!r} must be a Python identifier, got {spec.attribute!r}")
    return AGGREGATIONS.register(name, description)(spec)


# registration order is GLAM's construction order, hence the order initial weights are drawn in for a seed
register_aggregation(
    "concat",
    lambda in_features, hidden_features, t: ConcatTopTAggregation(t=t),
    description="top-t% pooling of the K patch maps as one map; z_l the mean of the z_k (no weights)",
)
register_aggregation(
    "attention",
    lambda in_features, hidden_features, t: GatedAttentionAggregation(in_features, hidden_features, t=t),
    attribute="attention",
    joint_module=True,
    description="gated attention MIL pooling (Ilse et al. 2018) of the top-t% pooled patch maps and of the z_k",
)
