"""The GLAM paper's reproduction beside the bundle: baselines, synthetic data, the Table-1 benchmark, measurements.

It imports the bundle's ``scripts`` package and is never imported by it. ``python -m glam_benchmark --preset
glam_benchmark/configs/benchmark_cpu.yaml`` runs the benchmark (README.md in this folder). The driver's modules,
from the bottom up (each imports only those above it; the package itself says where the repository, the
bundle and the configs are):

- :mod:`.files`: atomic writes of the driver's outputs (JSON, text, PNG);
- :mod:`.presets`: the benchmarked models, the preset's budget, the benchmark's error;
- :mod:`.search`: the random-search space, the trials drawn from it and their bundle overrides;
- :mod:`.steps`: bundle command lines and the runner of workflow subprocesses (logs, wall times, resume);
- :mod:`.metrics`: reading the workflows' ``metrics.json``, Table-1 rows, the acceptance conditions, what needs no
  learning;
- :mod:`.report`: writing ``results.md``;
- :mod:`.figures`: the Dice scatter, the example and per-scale figures;
- :mod:`.driver`: preparing the data, running every step in order, the argument parser and ``main``.

Beside them: :mod:`.baselines` (CAM, GMIC, U-Net and their losses), :mod:`.synthetic` (the mammogram generator),
:mod:`.performance` (the product's speed and memory measurements) and ``python -m glam_benchmark.demo``.
"""

import importlib.util
import sys
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


def _put_bundle_first() -> None:
    """Make ``import scripts`` the bundle's package (bundle/ first on sys.path, once) unless it already is.

    MONAI runs a bundle with its root on sys.path; from the repository root it is not, and another ``scripts`` on the
    path (a namespace folder some environments leave in site-packages) would otherwise be imported instead.

    Raises:
        ImportError: another ``scripts`` package was imported before this one.
    """
    own = BUNDLE_ROOT / "scripts" / "__init__.py"
    loaded = sys.modules.get("scripts")
    if loaded is not None:
        if Path(getattr(loaded, "__file__", None) or "") != own:
            raise ImportError(f"glam_benchmark needs the bundle's scripts package ({own}), not {loaded}")
        return
    spec = importlib.util.find_spec("scripts")
    if spec is None or Path(spec.origin or "") != own:
        sys.path[:] = [str(BUNDLE_ROOT)] + [p for p in sys.path if p != str(BUNDLE_ROOT)]
        importlib.invalidate_caches()


_put_bundle_first()
