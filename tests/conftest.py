"""Test setup: the bundle root goes first on ``sys.path`` exactly as MONAI's bundle workflow puts it,
so ``import scripts`` resolves to ``bundle/scripts`` (the repository's ``scripts/`` folder has no
``__init__.py`` and must not shadow it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
BUNDLE_ROOT = REPO_ROOT / "bundle"
SHARED_DIR = REPO_ROOT.parent / "shared"
SAMPLE_EXAM = SHARED_DIR / "sample_data" / "glam_exam0"

if str(BUNDLE_ROOT) not in sys.path:
    sys.path.insert(0, str(BUNDLE_ROOT))


@pytest.fixture(scope="session")
def sample_exam() -> Path:
    """The authors' sample exam from ``../shared``; tests that need it skip on a clone without it."""
    if not SAMPLE_EXAM.is_dir():
        pytest.skip(f"shared sample exam not found at {SAMPLE_EXAM}")
    return SAMPLE_EXAM


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


requires_cuda = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")
