"""The errors of building and reading datalists, in a module of their own so that every datalist module (the loader,
the CSV parsers, the source builders, the dataset-specific resolvers) raises them without importing the others."""

from __future__ import annotations

__all__ = ["CsvRowError", "DatalistError"]


class DatalistError(ValueError):
    """A datalist file or structure that cannot be used; the message names the file/split and the problem."""


class CsvRowError(ValueError):
    """A row that cannot become an item; ``items_from_csv`` leaves it out and lists the message (which names the
    row) among its problems."""
