"""The GLAM paper's Table-1 benchmark on synthetic mammograms, as a package of one idea per module.

``tools/benchmark.py`` is its command line (``python tools/benchmark.py --preset configs/benchmark_cpu.yaml``);
its docstring says what a run does. The modules, from the bottom up (each imports only those above it):

- :mod:`.paths`: where the repository, the bundle and its configs are; puts the bundle on ``sys.path``;
- :mod:`.files`: atomic writes of the driver's outputs (JSON, text, PNG);
- :mod:`.presets`: the benchmarked models, the preset's budget, the benchmark's error;
- :mod:`.search`: the random-search space, the trials drawn from it and their bundle overrides;
- :mod:`.steps`: bundle command lines and the runner of workflow subprocesses (logs, wall times, resume);
- :mod:`.metrics`: reading the workflows' ``metrics.json``, Table-1 rows, the acceptance conditions;
- :mod:`.report`: writing ``results.md``;
- :mod:`.figures`: the Dice scatter, the example and per-scale figures;
- :mod:`.driver`: preparing the data, running every step in order, the argument parser and ``main``.

This folder sits in the repository's ``tools/``, which has no ``__init__.py`` on purpose (it must not shadow the
bundle's ``scripts`` package), so the package is imported as ``glam_benchmark`` with ``tools/`` on ``sys.path``.
"""

# first: puts the bundle on sys.path, so that every module can import the bundle's ``scripts`` package
from . import paths  # noqa: F401
