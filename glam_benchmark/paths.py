"""Where things are: the repository, the bundle and the bundle configs the benchmark layers its presets over.

Importing this module puts the bundle root first on ``sys.path`` (as MONAI's bundle workflow does), so that
``import scripts`` is the bundle's own package (``scripts.atomic``, ``scripts.data``, ``scripts.visualize``), never
the repository's ``tools/`` folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUNDLE_ROOT = REPO_ROOT / "bundle"
if str(BUNDLE_ROOT) not in sys.path:
    sys.path.insert(0, str(BUNDLE_ROOT))

TRAIN_CONFIG = BUNDLE_ROOT / "configs" / "train.yaml"
EVAL_CONFIG = BUNDLE_ROOT / "configs" / "evaluate.yaml"
META_FILE = BUNDLE_ROOT / "configs" / "metadata.json"
DEFAULT_SEARCH = REPO_ROOT / "configs" / "benchmark_search.yaml"


def display_path(path: Path) -> Path:
    """Relative to the repository when inside it (what a reader can use), else as is."""
    path = Path(path)
    return path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
