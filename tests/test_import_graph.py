"""The bundle's code imports in layers: no module imports itself back through others (no import cycle), no two of
its packages import each other (bundle/scripts' subpackages, the top-level modules as one more package, the
``tools/__init__`` facade on its own), and the Ignite handlers stand below the workflow wings (``handlers`` imports
none of ``training``, ``evaluation``, ``inference``, which all build on handlers). Every ``import`` / ``from``
statement counts, those inside functions too (an import hidden in a function is still a cycle); every package, new
ones included, is checked as it comes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import BUNDLE_ROOT, REPO_ROOT

SCRIPTS = BUNDLE_ROOT / "scripts"
#: packages being taken apart, not checked
IGNORED_PACKAGES: tuple[str, ...] = ()
TOP_LEVEL = "top-level modules"
FACADE = "tools/__init__"
#: package -> the packages it must not import: the handlers are shared by the workflow wings, so they sit below them
BELOW = {"handlers": ("training", "evaluation", "inference")}


def modules_of(root: Path, ignored: tuple[str, ...] = ()) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under the package ``root`` (packages by their ``__init__``)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if len(parts) > 1 and parts[1] in ignored:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def import_graph(root: Path, ignored: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """Module -> the modules of the same top package it imports (relative imports resolved; ``from m import x``
    counts as importing ``m.x`` when that is a module, else ``m``); imports of ignored packages are left out."""
    modules = modules_of(root, ignored)
    top = root.name

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                parts = target.split(".")
                if parts[0] != top or (len(parts) > 1 and parts[1] in ignored):
                    continue
                resolved = known(target)
                if resolved is not None and resolved != name:
                    graph[name].add(resolved)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import one another, directly or through others (strongly connected components of
    more than one module; Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def package_of(module: str, root: Path) -> str:
    """The package a module belongs to: its subpackage of ``root``, the top-level modules, or the facade."""
    parts = module.split(".")
    if len(parts) == 1:
        return FACADE
    return parts[1] if (root / parts[1]).is_dir() else TOP_LEVEL


def mutual_packages(graph: dict[str, set[str]], root: Path) -> dict[tuple[str, str], list[str]]:
    """``(package a, package b)`` -> the imports both ways, for every pair of packages that import each other."""
    between: dict[tuple[str, str], list[str]] = {}
    for module, imported in graph.items():
        for other in imported:
            pair = (package_of(module, root), package_of(other, root))
            if pair[0] != pair[1]:
                between.setdefault(pair, []).append(f"{module} -> {other}")
    return {
        (a, b): sorted(edges) + sorted(between[(b, a)])
        for (a, b), edges in between.items()
        if a < b and (b, a) in between
    }


def layer_violations(graph: dict[str, set[str]], root: Path, below: dict[str, tuple[str, ...]]) -> list[str]:
    """``"module -> imported"`` for every import from a package of ``below`` into one it must stay below."""
    return sorted(
        f"{module} -> {other}"
        for module, imported in graph.items()
        for other in imported
        if package_of(other, root) in below.get(package_of(module, root), ())
    )


def test_the_bundle_has_no_import_cycle_and_no_mutually_importing_packages():
    graph = import_graph(SCRIPTS, IGNORED_PACKAGES)
    # the graph sees the imports (a parser that saw none would pass): known ones, relative and absolute, in functions
    assert "scripts.data.geometry" in graph["scripts.transforms.mammo.breast"]
    assert "scripts.networks.settings" in graph["scripts.networks.glam"]
    assert {"scripts.training.workflow", "scripts.inference.writer", "scripts.evaluation.report"} <= set(graph)
    assert cycles(graph) == [], f"import cycles: {cycles(graph)}"
    mutual = mutual_packages(graph, SCRIPTS)
    assert mutual == {}, "packages that import each other: " + "; ".join(
        f"{a} <-> {b}: {', '.join(edges)}" for (a, b), edges in mutual.items()
    )


#: the wings: none imports another, and the evaluation's and inference's configs name no training component (what
#: they share with training lives below them: scripts.distributed, scripts.data.checks)
WINGS = ("training", "evaluation", "inference")
WING_CONFIGS = ("evaluate.yaml", "multi_gpu_evaluate.yaml", "inference.yaml", "multi_gpu_inference.yaml")


def test_no_wing_imports_another_and_the_other_wings_configs_name_no_training_component():
    graph = import_graph(SCRIPTS, IGNORED_PACKAGES)
    crossing = sorted(
        f"{module} -> {other}"
        for module, imported in graph.items()
        for other in imported
        if package_of(module, SCRIPTS) in WINGS
        and package_of(other, SCRIPTS) in WINGS
        and package_of(module, SCRIPTS) != package_of(other, SCRIPTS)
    )
    assert crossing == [], f"wings importing each other: {crossing}"
    assert "scripts.distributed" in graph["scripts.inference.ranks"]  # the graph sees the shared room
    named = {
        name: [
            line.strip()
            for line in (BUNDLE_ROOT / "configs" / name).read_text().splitlines()
            if "scripts.training" in line
        ]
        for name in WING_CONFIGS
    }
    assert named == {name: [] for name in WING_CONFIGS}


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "pkg"


def test_the_checks_find_a_cycle_through_a_function_import_and_a_mutual_package_pair(tmp_path):
    """A cycle closed by an import inside a function, a package pair that imports each other (one way through a
    relative ``from .. import``, the other absolute), and an ignored package's imports left out."""
    root = write_package(
        tmp_path,
        {
            "__init__.py": "from .a import thing\n",
            "a.py": "from .b import other\nthing = 1\n",
            "b.py": "def other():\n    from . import a\n    return a\n",
            "c.py": "import os\n",
            "data/__init__.py": "",
            "data/read.py": "from ..nets.model import Model\n",
            "nets/__init__.py": "",
            "nets/model.py": "from pkg.data import read\nfrom pkg.old.stuff import x\nfrom ..c import os\nModel = 1\n",
            "old/__init__.py": "",
            "old/stuff.py": "from ..nets import model\nx = 1\n",
        },
    )
    graph = import_graph(root, ("old",))
    assert graph["pkg"] == {"pkg.a"} and graph["pkg.b"] == {"pkg.a"} and graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.nets.model"] == {"pkg.data.read", "pkg.c"} and "pkg.old.stuff" not in graph
    assert sorted(cycles(graph)) == [["pkg.a", "pkg.b"], ["pkg.data.read", "pkg.nets.model"]]
    assert list(mutual_packages(graph, root)) == [("data", "nets")]
    assert mutual_packages(graph, root)[("data", "nets")] == [
        "pkg.data.read -> pkg.nets.model",
        "pkg.nets.model -> pkg.data.read",
    ]


def test_the_handlers_import_no_workflow_wing():
    graph = import_graph(SCRIPTS, IGNORED_PACKAGES)
    assert "scripts.handlers.throughput" in graph["scripts.inference.step"]  # the wings build on the handlers
    assert layer_violations(graph, SCRIPTS, BELOW) == [], "handlers must not import a workflow wing"


def test_the_layer_check_finds_a_handler_that_imports_a_wing(tmp_path):
    """A handler importing the inference wing (relative, inside a function) and another the training wing
    (absolute) are found; the wings importing the handlers, and the handlers importing other packages, are not."""
    root = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "atomic.py": "",
            "handlers/__init__.py": "",
            "handlers/timing.py": "from ..atomic import x\ndef f():\n    from ..inference.inputs import KEY\n",
            "handlers/best.py": "import pkg.training.stage\n",
            "inference/__init__.py": "",
            "inference/inputs.py": "from ..handlers.timing import f\nKEY = 1\n",
            "training/__init__.py": "",
            "training/stage.py": "from pkg.handlers import best\n",
        },
    )
    graph = import_graph(root)
    assert layer_violations(graph, root, BELOW) == [
        "pkg.handlers.best -> pkg.training.stage",
        "pkg.handlers.timing -> pkg.inference.inputs",
    ]
    assert layer_violations(graph, root, {}) == []


def tool_imports(roots: tuple[Path, ...], tool_names: set[str]) -> list[str]:
    """``"file:line module"`` for every import (in functions too) of a top-level name in ``tool_names``."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                else:
                    continue
                found += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] in tool_names]
    return found


def test_the_bundle_and_the_label_app_import_no_repository_tool():
    """The zipped bundle holds no ``tools/``: the bundle's code and the label app import none of its modules
    (``datalists``, the datalist makers, among them), and the datalist makers import one another without a cycle."""
    tools = REPO_ROOT / "tools"
    names = {p.stem for p in tools.glob("*.py")} | {p.name for p in tools.iterdir() if (p / "__init__.py").is_file()}
    assert {"datalists", "make_datalist"} <= names
    assert tool_imports((SCRIPTS, REPO_ROOT / "label_app"), names) == []
    graph = import_graph(tools / "datalists")
    assert "datalists.parsers" in graph["datalists.builders"]  # the graph sees the package's own imports
    assert cycles(graph) == []


def test_the_tool_import_check_finds_an_import_inside_a_function(tmp_path):
    root = write_package(tmp_path, {"__init__.py": "import os\n", "a.py": "def f():\n    from datalists.x import y\n"})
    assert tool_imports((root,), {"datalists"}) == ["a.py:2 datalists.x"]
    assert tool_imports((root,), {"other"}) == []


#: the paper's reproduction (baselines, synthetic data, benchmark) imports the product, never the reverse
LAB = "glam_benchmark"
PRODUCT = (BUNDLE_ROOT, REPO_ROOT / "label_app", REPO_ROOT / "tools")


def lab_references(roots: tuple[Path, ...], lab: str = LAB) -> list[str]:
    """``path:line`` of every import of ``lab`` (any statement, in functions too) in the Python files under
    ``roots``, and of every config line (YAML / JSON) that names it as a ``_target_`` or ``$import``."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                if any(name.split(".")[0] == lab for name in names):
                    found.append(f"{path}:{node.lineno}")
        for path in sorted(p for suffix in ("*.yaml", "*.json") for p in root.rglob(suffix)):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if re.search(rf"(_target_\W+|\$import |\$from |\$){lab}\b", line):
                    found.append(f"{path}:{number}")
    return found


def test_the_bundle_label_app_and_tools_never_import_the_paper_reproduction():
    assert (REPO_ROOT / LAB / "__init__.py").is_file()  # the folder the rule is about exists
    assert lab_references(PRODUCT) == []


def test_the_lab_check_finds_imports_and_config_targets(tmp_path):
    """Absolute imports in a function and at the top, and a config target, are found; a relative import, a
    longer name sharing the prefix and a mention in a comment are not."""
    (tmp_path / "a.py").write_text(
        "import os\nfrom glam_benchmark.synthetic import x\n\ndef f():\n    import glam_benchmark\n"
        "from . import glam_benchmark\nimport glam_benchmarks\n# glam_benchmark in a comment\n",
        encoding="utf-8",
    )
    (tmp_path / "c.yaml").write_text(
        "net:\n  _target_: glam_benchmark.baselines.CAM\n# see glam_benchmark/README.md\n", encoding="utf-8"
    )
    a, c = tmp_path / "a.py", tmp_path / "c.yaml"
    assert lab_references((tmp_path,)) == [f"{a}:2", f"{a}:5", f"{c}:2"]
