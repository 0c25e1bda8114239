"""Registries of the variants a network picks by name (MONAI's component-store idiom).

A :class:`Registry` is MONAI's :class:`~monai.utils.ComponentStore` (the store behind
:class:`~monai.networks.layers.factories.LayerFactory`, through which MONAI's networks pick their ``Norm`` / ``Act``
layers by name) with one addition: :meth:`Registry.look_up` names the argument being looked up, so that an unknown
name is reported as ``"aggregation must be one of ('concat', 'attention'), got 'max'"`` with MONAI's
did-you-mean hint (:func:`~monai.utils.look_up_option`). Names keep their case (``LayerFactory`` upper-cases them,
which would change the value a checkpoint records).

Adding a variant is one registration, next to the variant, instead of an edit at every place that compares names::

    @AGGREGATIONS.register("max", "the largest patch score")
    def _max_aggregation(in_features: int, hidden_features: int, t: float) -> nn.Module: ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from monai.utils import ComponentStore, look_up_option

from .errors import UsageError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(ComponentStore):
    """Named components (factories, specifications) with lookups that name the argument and the choices.

    Args:
        name: what the components are, for ``print(registry)``.
        description: one line on what they are for.
    """

    def register(self, name: str, description: str = "") -> Callable[[T], T]:
        """Decorator storing its target under ``name`` (a Python identifier); the name must be new, so that a
        registration cannot silently replace a variant that checkpoints record by name."""
        if name in self:
            raise UsageError(f"{self.name}: {name!r} is already registered")

        def deco(value: T) -> T:
            return self.add(name, description or (getattr(value, "__doc__", None) or "").strip(), value)

        return deco

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests and plug-ins that register a variant for a while)."""
        self.look_up(name, "name")
        del self.components[name]

    def look_up(self, name: Any, argument: str) -> Any:
        """The component stored under exactly ``name``; a ``ValueError`` naming ``argument``, the choices and
        MONAI's closest-name guess otherwise (``look_up_option`` alone would also accept ``" concat "``, a value a
        checkpoint would then record as is)."""
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
