"""The README's quick start is what CI runs."""

import re

from conftest import REPO_ROOT


def bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_ci_runs_the_readme_test_command():
    readme = (REPO_ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1]
    blocks = bash_blocks(quick_start)
    assert len(blocks) >= 2
    test_command = blocks[1]
    assert "pytest" in test_command
    ci_lines = [
        line.strip()
        for line in (REPO_ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert test_command in ci_lines


def test_requirements_pin_torch_exactly():
    req = (REPO_ROOT / "requirements.txt").read_text().splitlines()
    assert "torch==2.13.0" in [line.strip() for line in req]
    assert not any(line.strip().startswith("torchvision") for line in req)
