"""The bundle's version from ``configs/metadata.json``; imports nothing of the bundle, so any module can ask."""

from __future__ import annotations

import json
from pathlib import Path

METADATA_FILE = Path(__file__).resolve().parents[1] / "configs" / "metadata.json"


def bundle_version() -> str | None:
    """The bundle's ``version`` (:data:`METADATA_FILE`), None when not found."""
    try:
        return str(json.loads(METADATA_FILE.read_text(encoding="utf-8"))["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
