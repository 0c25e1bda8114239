"""One idea, one owner module: the code of the bundle (``bundle/scripts``), the tools (``tools/``) and the label
app (``label_app/``) renames files only through ``scripts/atomic.py``, enters ``torch.autocast`` only in
``scripts/precision.py``, and decides whether a pixel spacing is usable (positive, inside ``spacing_range``) only in
``scripts/data/geometry.py``. Each check reads the code's syntax tree, and each is shown failing on a bad file."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from conftest import BUNDLE_ROOT, REPO_ROOT

SCANNED = (BUNDLE_ROOT / "scripts", REPO_ROOT / "tools", REPO_ROOT / "label_app", REPO_ROOT / "glam_benchmark")
ATOMIC = BUNDLE_ROOT / "scripts" / "atomic.py"
PRECISION = BUNDLE_ROOT / "scripts" / "precision.py"
GEOMETRY = BUNDLE_ROOT / "scripts" / "data" / "geometry.py"
#: the functions of data/geometry.py that hold the spacing rules: usable_spacing (finite, positive, in the range),
#: spacing_in_range (the range comparison it asks), stated_spacing_ok (what a datalist or a CSV may state) and
#: as_spacing_range (the range option's own bounds)
SPACING_OWNERS = frozenset({"usable_spacing", "spacing_in_range", "stated_spacing_ok", "as_spacing_range"})


def python_files(roots: tuple[Path, ...] = SCANNED) -> Iterator[Path]:
    for root in roots:
        yield from sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def dotted(node: ast.AST) -> str:
    """``torch.cuda.amp.autocast`` for an attribute chain over a name, ``""`` for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def renames(tree: ast.AST) -> list[int]:
    """Lines that rename a file: ``os.replace`` / ``os.rename`` / ``os.renames`` / ``shutil.move`` (called or
    imported), and a method ``.replace`` / ``.rename`` called with one argument that is not a literal (or with
    ``target=`` alone), which is ``Path.replace(target)`` / ``Path.rename(target)``: ``str.replace`` and
    ``bytes.replace`` take two or three arguments, ``dataclasses.replace`` and ``datetime.replace`` keywords, pandas'
    ``replace`` / ``rename`` a mapping."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("os", "shutil"):
            if any(a.name in ("replace", "rename", "renames", "move") for a in node.names):
                lines.append(node.lineno)
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if dotted(node.func) in ("os.replace", "os.rename", "os.renames", "shutil.move"):
            lines.append(node.lineno)
        elif node.func.attr in ("replace", "rename"):
            keywords = {k.arg for k in node.keywords}
            positional = len(node.args) == 1 and not keywords and not isinstance(node.args[0], _LITERALS)
            if positional or (not node.args and keywords == {"target"}):
                lines.append(node.lineno)
    return sorted(lines)


_LITERALS = (ast.Constant, ast.Dict, ast.JoinedStr)


def autocasts(tree: ast.AST) -> list[int]:
    """Lines that enter or switch autocast through torch: ``torch.autocast``, ``torch.cuda.amp.autocast``,
    ``torch.amp.autocast``..., ``torch.set_autocast_*``, or ``autocast`` imported from a torch module."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (node.attr == "autocast" or node.attr.startswith("set_autocast")):
            if dotted(node).split(".")[0] == "torch":
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            if any(a.name == "autocast" for a in node.names):
                lines.append(node.lineno)
    return sorted(lines)


def _mentions(node: ast.AST, tainted: set[str], word: str) -> bool:
    """Whether ``node`` names ``word`` (a name, attribute or text with it, any case) or a name in ``tainted``."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and (sub.id in tainted or word in sub.id.lower()):
            return True
        if isinstance(sub, ast.Attribute) and word in sub.attr.lower():
            return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and word in sub.value.lower():
            return True
    return False


def _targets(node: ast.AST) -> list[str]:
    """The names an assignment, a loop or a comprehension binds (``a, (b, *c) = ...``; not ``self.x = ...``)."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.comprehension, ast.NamedExpr)):
        targets = [node.target]
    else:
        return []
    names, stack = [], list(targets)
    while stack:
        target = stack.pop()
        if isinstance(target, ast.Name):
            names.append(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            stack.extend(target.elts)
        elif isinstance(target, ast.Starred):
            stack.append(target.value)
    return names


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _expressions(stmt: ast.stmt) -> list[ast.AST]:
    """The nodes of ``stmt`` itself: not those of the statements it holds (an ``if``'s body) nor of a nested
    function or class."""
    found, stack = [], [c for c in ast.iter_child_nodes(stmt) if not isinstance(c, ast.stmt)]
    while stack:
        node = stack.pop()
        found.append(node)
        if not isinstance(node, (*_SCOPES, ast.ClassDef)):
            stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, ast.stmt))
    return found


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and not isinstance(node.value, bool) and node.value == 0


class _SpacingScan:
    """One function's (or the module's) statements in order, tracking which names may hold a spacing or a spacing
    range: a name does from its assignment from an expression that names one until it is assigned something else;
    after a branch or a loop, what either way may hold one."""

    def __init__(self) -> None:
        self.lines: set[int] = set()

    @staticmethod
    def bind(state: tuple[set[str], set[str]], node: ast.AST, value: ast.AST) -> None:
        for names, word in zip(state, ("spacing", "spacing_range")):
            if _mentions(value, names, word):
                names.update(_targets(node))
            elif not isinstance(node, ast.AugAssign):
                names.difference_update(_targets(node))

    def check(self, state: tuple[set[str], set[str]], compare: ast.Compare) -> None:
        sides = [compare.left, *compare.comparators]
        named_bound = any(isinstance(s, (ast.Name, ast.Attribute)) and _mentions(s, set(), "spacing") for s in sides)
        in_range = named_bound or any(_mentions(s, state[1], "spacing_range") for s in sides)
        positive = any(map(_is_zero, sides)) and any(_mentions(s, state[0], "spacing") for s in sides)
        if in_range or positive:
            self.lines.add(compare.lineno)

    def run(self, statements: list[ast.stmt], state: tuple[set[str], set[str]]) -> tuple[set[str], set[str]]:
        for stmt in statements:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue  # a scope of its own
            nodes = _expressions(stmt)
            for node in nodes:  # a comprehension's or a walrus's names, before the comparisons that use them
                if isinstance(node, (ast.comprehension, ast.NamedExpr)):
                    self.bind(state, node, node.iter if isinstance(node, ast.comprehension) else node.value)
            for node in nodes:
                if isinstance(node, ast.Compare) and any(isinstance(op, _ORDER) for op in node.ops):
                    self.check(state, node)
            if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and stmt.value is not None:
                self.bind(state, stmt, stmt.value)
            elif isinstance(stmt, (ast.For, ast.AsyncFor)):
                self.bind(state, stmt, stmt.iter)
            state = self.branches(stmt, state)
        return state

    def branches(self, stmt: ast.stmt, state: tuple[set[str], set[str]]) -> tuple[set[str], set[str]]:
        """The state after the statements ``stmt`` holds: each branch (a body, ``else``, a handler, a case) from
        the state before it, a loop's body or a ``try``'s handlers possibly not run, the union of all."""
        if isinstance(stmt, ast.ClassDef):
            return self.run(stmt.body, state)
        blocks = [getattr(stmt, name, []) for name in ("body", "orelse")]
        blocks += [h.body for h in getattr(stmt, "handlers", []) + getattr(stmt, "cases", [])]
        blocks = [b for b in blocks if b and isinstance(b[0], ast.stmt)]
        if not blocks:
            return state
        after = [self.run(b, (set(state[0]), set(state[1]))) for b in blocks]
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.Try)) or not getattr(stmt, "orelse", True):
            after.append(state)  # the body may not run (a loop, an if without else), or stop (a try)
        merged = (set().union(*(a[0] for a in after)), set().union(*(a[1] for a in after)))
        return self.run(getattr(stmt, "finalbody", []), merged)


def spacing_comparisons(tree: ast.AST, owners: frozenset[str] = frozenset()) -> list[int]:
    """Lines outside the functions ``owners`` that decide whether a pixel spacing is usable: an order comparison
    (``<``, ``<=``, ``>``, ``>=``) of a spacing with 0 (positive?), or of anything with a spacing range (inside?).
    A spacing is a value whose expression names one (a name, attribute or metadata key with ``spacing`` in it:
    ``flat > 0`` after ``flat = ...meta.get("spacing")``), followed through the assignments of its function, or a
    parameter of a function named ``*_spacing`` (``valid_spacing(row, col)``); a range, one named ``spacing_range``
    (``low <= s`` after ``low, high = spacing_range``) or a bound named after a spacing (``v < STATED_SPACING_...``).
    Other comparisons of spacings (a resampling factor against a tolerance) are not validity and pass."""
    lines: set[int] = set()
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, _SCOPES))]:
        if getattr(scope, "name", None) in owners:
            continue
        params = set()
        if getattr(scope, "name", "").lower().endswith("_spacing"):
            params = {a.arg for a in scope.args.posonlyargs + scope.args.args + scope.args.kwonlyargs}
        scan = _SpacingScan()
        body = [ast.Expr(scope.body, lineno=scope.lineno)] if isinstance(scope, ast.Lambda) else scope.body
        scan.run(body, (params, set()))
        lines |= scan.lines
    return sorted(lines)


def findings(check, exempt: Path | None = None, roots: tuple[Path, ...] = SCANNED) -> list[str]:
    """``path:line`` of what ``check(tree, path)`` finds in every file under ``roots`` but ``exempt``."""
    found = []
    for path in python_files(roots):
        if path == exempt:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
        found += [f"{shown}:{line}" for line in check(tree, path)]
    return found


def test_only_atomic_py_renames_files():
    assert findings(lambda tree, path: renames(tree), ATOMIC) == [], (
        "rename through scripts.atomic (atomic_write, atomic_path, move_into_place)"
    )
    # the checker sees atomic.py's own rename, and the scan reaches the tools and the label app
    assert renames(ast.parse(ATOMIC.read_text(encoding="utf-8")))
    files = {p.relative_to(REPO_ROOT).as_posix() for p in python_files()}
    assert {"glam_benchmark/synthetic/writers.py", "label_app/nrrd_io.py", "bundle/scripts/inference/files.py"} <= files


def test_only_precision_py_enters_autocast():
    assert findings(lambda tree, path: autocasts(tree), PRECISION) == [], (
        "autocast through scripts.precision (autocast, full_precision)"
    )
    assert autocasts(ast.parse(PRECISION.read_text(encoding="utf-8")))


def test_only_the_geometry_owners_compare_a_pixel_spacing():
    found = findings(lambda tree, path: spacing_comparisons(tree, SPACING_OWNERS if path == GEOMETRY else frozenset()))
    assert found == [], "ask scripts.data.geometry.usable_spacing / spacing_in_range whether a spacing is usable"
    # the owners themselves compare (the check sees them when not exempted)
    tree = ast.parse(GEOMETRY.read_text(encoding="utf-8"))
    owners = {f.name: set(range(f.lineno, f.end_lineno + 1)) for f in tree.body if isinstance(f, ast.FunctionDef)}
    found = set(spacing_comparisons(tree))
    assert found & owners["usable_spacing"] and found & owners["spacing_in_range"], found


BAD_RENAMES = """
import os, shutil
from os import replace
from pathlib import Path

def save(path: Path, text: str) -> None:
    tmp = path.with_name(".x")
    tmp.write_text(text)
    tmp.replace(path)                       # 9
    os.replace(tmp, path)                   # 10
    (path.parent / "a").rename(path)        # 11
    os.rename(tmp, path)                    # 12
    shutil.move(tmp, path)                  # 13
    path.rename(target=tmp)                 # 14
"""

FINE_RENAMES = """
import dataclasses
from dataclasses import replace

def fine(cfg, text: str, name: str, df, old, new):
    a = text.replace("_", " ")
    b = name.replace(old, new)
    c = dataclasses.replace(cfg, n=1)
    d = replace(cfg, n=2)
    e = f"{a}".replace("-", "_").replace("x", "y")
    f = df.rename(columns={"a": "b"})
    g = df.replace({"a": "b"})
    h = text.replace("nan")
    return a, b, c, d, e, f, g, h
"""


def test_the_rename_check_finds_every_rename_and_no_string_replace():
    assert renames(ast.parse(BAD_RENAMES)) == [3, 9, 10, 11, 12, 13, 14]
    assert renames(ast.parse(FINE_RENAMES)) == []


def test_the_autocast_check_finds_torch_autocast_in_any_spelling():
    bad = """
import torch
from torch import autocast
from torch.cuda.amp import autocast as ac

def f(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pass
    with torch.cuda.amp.autocast():
        pass
    torch.set_autocast_enabled(True)
"""
    fine = """
from scripts.precision import autocast, full_precision

def f(x, device):
    with autocast(device.type, enabled=False), full_precision(device.type):
        return x
"""
    assert autocasts(ast.parse(bad)) == [3, 4, 7, 9, 11]
    assert autocasts(ast.parse(fine)) == []


def test_the_spacing_check_finds_a_repeated_validity_rule():
    bad = """
import numpy as np

def map_spacing(meta):
    value = meta.get("spacing")
    flat = np.asarray(value, dtype=np.float64).reshape(-1)
    if flat.size == 2 and np.isfinite(flat).all() and (flat > 0).all():
        return float(flat[0]), float(flat[1])

def in_range(s, spacing_range):
    low, high = spacing_range
    return all(low <= v <= high for v in s)

def valid_spacing(row, col):
    return (row, col) if row > 0 and col > 0 else None

def usable_spacing(value):
    return value if value > 0 else None
"""
    fine = """
from scripts.data.geometry import usable_spacing

def spacing_for(meta, size):
    spacing = usable_spacing(meta.get("spacing"))
    if size > 0 and len(meta) >= 2:
        return spacing
"""
    assert spacing_comparisons(ast.parse(bad)) == [7, 12, 15, 18]
    assert spacing_comparisons(ast.parse(bad), owners=frozenset({"usable_spacing"})) == [7, 12, 15]
    assert spacing_comparisons(ast.parse(fine)) == []


def test_a_bad_file_fails_each_scan(tmp_path):
    """The scans over a folder (as over the repository) report a file that renames, autocasts and checks a spacing
    by itself, by file and line."""
    bad = tmp_path / "tool" / "bad.py"
    bad.parent.mkdir()
    bad.write_text(
        "import os\nimport torch\n\n"
        "def save(tmp, path, meta):\n"
        "    os.replace(tmp, path)\n"
        "    with torch.autocast('cpu'):\n"
        "        spacing = meta['spacing']\n"
        "    return spacing[0] > 0\n",
        encoding="utf-8",
    )
    roots = (tmp_path,)
    assert findings(lambda tree, path: renames(tree), roots=roots) == [f"{bad}:5"]
    assert findings(lambda tree, path: autocasts(tree), roots=roots) == [f"{bad}:6"]
    assert findings(lambda tree, path: spacing_comparisons(tree), roots=roots) == [f"{bad}:8"]


def test_atomic_path_moves_the_finished_file_into_place_and_removes_a_failed_one(tmp_path):
    """``atomic_path`` / ``move_into_place``: the target keeps its old bytes until the new file is complete, a
    failed write leaves no temporary file, a given staged name is used (``torch.save`` records it, less its last
    suffix, in the archive: the bytes are those of saving under that name), and ``durable`` moves the same bytes."""
    import torch

    from scripts.atomic import atomic_path, move_into_place

    target = tmp_path / "sub" / "out.bin"
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp.name.endswith("out.bin") and tmp.name.startswith(".")
        tmp.write_bytes(b"old")
    try:
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            assert target.read_bytes() == b"old"
            raise KeyError("stop")
    except KeyError:
        pass
    assert target.read_bytes() == b"old" and sorted(p.name for p in target.parent.iterdir()) == ["out.bin"]

    state = {"w": torch.arange(6.0).reshape(2, 3)}
    (tmp_path / "plain").mkdir()
    torch.save(state, tmp_path / "plain" / "model.pt.tmp")
    with atomic_path(tmp_path / "model.pt", staged_name="model.pt.tmp", durable=True) as tmp:
        assert tmp.name == "model.pt.tmp"
        torch.save(state, tmp)
    assert (tmp_path / "model.pt").read_bytes() == (tmp_path / "plain" / "model.pt.tmp").read_bytes()
    assert b"model.pt/data.pkl" in (tmp_path / "model.pt").read_bytes()  # the archive's folder: the staged name

    (tmp_path / "a").write_bytes(b"new")
    move_into_place(tmp_path / "a", target, durable=True)
    assert target.read_bytes() == b"new" and not (tmp_path / "a").exists()
