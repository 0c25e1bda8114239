"""``import scripts`` is the bundle's package, wherever it is imported from."""

import importlib
import subprocess
import sys

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
