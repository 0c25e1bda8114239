"""``import scripts`` is the bundle's package, wherever it is imported from."""

import importlib
import os
import subprocess
import sys

import pytest
from conftest import BUNDLE_ROOT, REPO_ROOT


def test_repository_tools_folder_does_not_share_the_bundle_package_name():
    assert (REPO_ROOT / "tools").is_dir()
    assert not (REPO_ROOT / "scripts").exists()


def test_import_scripts_resolves_to_bundle_from_repository_root():
    # A fresh interpreter started in the repository root, with the bundle root on the path as MONAI's workflow
    # puts it: `import scripts` must be the bundle's package, not the repository's CLI folder.
    code = "import scripts, sys; print(scripts.__file__)"
    env_path = f"{BUNDLE_ROOT}"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={"PYTHONPATH": env_path, "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str(BUNDLE_ROOT / "scripts" / "__init__.py")


def test_bundle_scripts_importable_in_this_process():
    scripts = importlib.import_module("scripts")
    assert scripts.__file__ == str(BUNDLE_ROOT / "scripts" / "__init__.py")


def test_glam_benchmark_finds_the_bundle_from_the_repository_root():
    """``python -m glam_benchmark...`` from the repository root with nothing on PYTHONPATH: the package puts the
    bundle on sys.path once, so its ``scripts`` imports are the bundle's."""
    code = (
        "import sys; import glam_benchmark.synthetic, scripts; "
        "print(scripts.__file__); import glam_benchmark as g; print(sys.path.count(str(g.BUNDLE_ROOT)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env={"PATH": ""}, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [str(BUNDLE_ROOT / "scripts" / "__init__.py"), "1"]


@pytest.mark.parametrize("stray", ["namespace", "package"])
def test_glam_benchmark_is_not_shadowed_by_another_scripts_on_the_path(tmp_path, stray):
    """Another ``scripts`` ahead on the path (an empty folder some environments leave in site-packages: a namespace
    package; or a package of that name) must not stand in for the bundle's when glam_benchmark is imported."""
    (tmp_path / "scripts").mkdir()
    if stray == "package":
        (tmp_path / "scripts" / "__init__.py").write_text("")
    code = "import glam_benchmark.synthetic, scripts, scripts.enums; print(scripts.__file__)"
    # the path as a user's shell has it: the stray folder, not the bundle (conftest puts the bundle on PYTHONPATH)
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(BUNDLE_ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *kept])}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(BUNDLE_ROOT / "scripts" / "__init__.py")
