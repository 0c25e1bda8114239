"""Where things are: the repository, the bundle, the bundle configs the benchmark layers its presets over, and
the benchmark's own configs."""

from __future__ import annotations

from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_ROOT.parent
BUNDLE_ROOT = REPO_ROOT / "bundle"
CONFIGS = PACKAGE_ROOT / "configs"

TRAIN_CONFIG = BUNDLE_ROOT / "configs" / "train.yaml"
EVAL_CONFIG = BUNDLE_ROOT / "configs" / "evaluate.yaml"
META_FILE = BUNDLE_ROOT / "configs" / "metadata.json"
DEFAULT_SEARCH = CONFIGS / "benchmark_search.yaml"


def display_path(path: Path) -> Path:
    """Relative to the repository when inside it (what a reader can use), else as is."""
    path = Path(path)
    return path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
