"""The vocabulary module is the one place where stages, classes and maps are spelled, and the code stays in rooms a
reader can walk (docs/architecture.md)."""

import ast
import json

import pytest
import torch
from conftest import BUNDLE_ROOT, REPO_ROOT

from scripts.enums import CLASS_NAMES, MAP_NAMES, STAGES, LesionClass, MapName, OutputKey, Stage

# every spelling of a stage, a class or a map that code could write as a literal
NAMES = {*STAGES, *CLASS_NAMES, *MAP_NAMES, OutputKey.SALIENCY_GLOBAL, OutputKey.SALIENCY_LOCAL, OutputKey.SALIENCY}
PYTHON_FILES = sorted(
    p
    for root in (BUNDLE_ROOT / "scripts", REPO_ROOT / "tools", REPO_ROOT / "label_app")
    for p in root.rglob("*.py")
    if "__pycache__" not in p.parts
)
VOCABULARY_FILE = BUNDLE_ROOT / "scripts" / "enums.py"


def test_values_are_the_names_users_see_on_disk():
    # file names (<stem>_S_c_benign.png), CSV columns and configs are built from these values: pin them
    assert STAGES == ("global", "local", "joint")
    assert CLASS_NAMES == ("benign", "malignant")
    assert MAP_NAMES == ("S_g", "S_l", "S_c")


def test_members_behave_as_their_values():
    assert f"{MapName.COMBINED}_{LesionClass.BENIGN}" == "S_c_benign"
    assert Stage("joint") is Stage.JOINT and Stage.JOINT == "joint"
    assert {OutputKey.SALIENCY: 1}["saliency"] == 1
    assert json.dumps({Stage.GLOBAL: [LesionClass.MALIGNANT]}) == '{"global": ["malignant"]}'


def test_members_compile_in_torchscript_through_their_values():
    class Outputs(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {OutputKey.SALIENCY.value: x}

    assert list(torch.jit.script(Outputs())(torch.zeros(1))) == ["saliency"]


@pytest.mark.parametrize("path", PYTHON_FILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_no_name_is_spelled_outside_the_vocabulary(path):
    if path == VOCABULARY_FILE:
        return
    literals = [
        f"line {node.lineno}: {node.value!r}"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES
    ]
    assert not literals, f"{path.relative_to(REPO_ROOT)} spells names of the vocabulary (scripts/enums.py): {literals}"


@pytest.mark.parametrize("path", PYTHON_FILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_no_module_is_over_600_lines(path):
    lines = path.read_text(encoding="utf-8").count("\n")
    assert lines <= 600, f"{path.relative_to(REPO_ROOT)} has {lines} lines: split it along its jobs"
