"""Registries of the variants a network picks by name (MONAI's ``ComponentStore``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from monai.utils import ComponentStore, look_up_option

from .errors import UsageError

__all__ = ["Registry"]

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
