"""The bundle these scripts belong to: its version, from ``configs/metadata.json`` next to the ``scripts`` package.

A module of its own, importing nothing of the bundle, so that any package (a network recording the version that built
it, a tool) can ask without importing the others.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["METADATA_FILE", "bundle_version"]

#: the bundle's metadata (bundle/configs/metadata.json)
METADATA_FILE = Path(__file__).resolve().parents[1] / "configs" / "metadata.json"


def bundle_version() -> str | None:
    """The ``version`` of the bundle these scripts belong to (:data:`METADATA_FILE`), None when not found."""
    try:
        return str(json.loads(METADATA_FILE.read_text(encoding="utf-8"))["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
