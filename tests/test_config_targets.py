"""The configs name GLAM's own components under ``scripts.``, not glue: at most 70 ``_target_: scripts.`` entries in
bundle/configs, none of them a function of at most two statements (a one-line expression reads better there)."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pydoc import locate

import pytest
from conftest import BUNDLE_ROOT

MAX_TARGETS = 70
TARGET = re.compile(r"_target_: (scripts\.[\w.]+)")


def config_targets() -> list[tuple[str, str]]:
    """``(config file, target)`` of every ``_target_: scripts.`` entry, one per occurrence."""
    return [
        (path.name, name)
        for path in sorted((BUNDLE_ROOT / "configs").glob("*.yaml"))
        for name in TARGET.findall(path.read_text(encoding="utf-8"))
    ]


def statements(source: str) -> int:
    """The statements of the body of the function whose source is ``source`` (nested ones count as part of theirs),
    its docstring left out."""
    (node,) = ast.parse(textwrap.dedent(source)).body
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return len(body)


@pytest.mark.parametrize(
    "source, expected",
    [
        ('def f(x):\n    """doc"""\n    return x\n', 1),
        ("    @classmethod\n    def f(cls, x):\n        y = x\n        if y:\n            y += 1\n        return y", 3),
    ],
)
def test_statements_counts_the_body_without_the_docstring(source, expected):
    assert statements(source) == expected


def test_configs_name_components_not_glue():
    targets = config_targets()
    assert len(targets) <= MAX_TARGETS, f"{len(targets)} `_target_: scripts.` entries in bundle/configs"
    glue = []
    for config, name in sorted(set(targets)):
        target = locate(name)
        if inspect.isclass(target):
            continue
        assert callable(target), f"{config}: {name} is neither a class nor a function"
        count = statements(inspect.getsource(inspect.unwrap(getattr(target, "__func__", target))))
        if count <= 2:
            glue.append(f"{config}: {name} ({count} statement(s))")
    assert glue == [], "functions a one-line expression would replace: " + "; ".join(glue)
