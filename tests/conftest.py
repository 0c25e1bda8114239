"""Test setup: the bundle root goes first on ``sys.path`` exactly as MONAI's bundle workflow puts it,
so ``import scripts`` resolves to ``bundle/scripts`` (the repository's ``tools/`` folder has no
``__init__.py`` and must not shadow it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
BUNDLE_ROOT = REPO_ROOT / "bundle"
SHARED_DIR = REPO_ROOT.parent / "shared"
SAMPLE_EXAM = SHARED_DIR / "sample_data" / "glam_exam0"

if str(BUNDLE_ROOT) not in sys.path:
    sys.path.insert(0, str(BUNDLE_ROOT))
# the repository's tools import as top-level modules (``import datalists``), as ``python tools/x.py`` finds them
if str(REPO_ROOT / "tools") not in sys.path:
    sys.path.append(str(REPO_ROOT / "tools"))
# the documented command line, `PYTHONPATH=bundle python -m monai.bundle run_workflow scripts.GLAMWorkflow ...`, in
# every subprocess a test starts
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(BUNDLE_ROOT), os.environ.get("PYTHONPATH", "")) if p)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest -n N: N workers share the cores, so each (and every process it starts) uses one thread instead of
    # one per core; more only oversubscribes the machine
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


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


TRAIN_CONFIG = BUNDLE_ROOT / "configs" / "train.yaml"
TINY_CONFIG = REPO_ROOT / "tests" / "configs" / "tiny.yaml"
#: the metrics train.yaml's validation publishes every epoch (validate#metrics)
VALIDATION_METRICS = (
    "val_soft_dice",
    "val_dice_benign",
    "val_dice_malignant",
    "val_pointing_game",
    "val_auc_benign",
    "val_auc_malignant",
)


@pytest.fixture(scope="session")
def tiny_datalist(tmp_path_factory) -> str:
    """A small synthetic dataset (24 images of 256x160, 6 patients, most breasts with lesions) for workflow tests."""
    from glam_benchmark.synthetic import ensure_synthetic_dataset

    root = tmp_path_factory.mktemp("tiny_data")
    return ensure_synthetic_dataset(root, n=24, size=(256, 160), seed=3, lesion_prevalence=0.6)


#: a workflow's overrides that run it on the CPU in float32, as the torchrun tests' gloo processes run (they see no
#: GPU): the one-process reference they are compared with, on a machine with a GPU too
CPU_REFERENCE = {"device": "$torch.device('cpu')", "amp": False}


def tiny_overrides(tmp_path: Path, datalist: str, **extra) -> dict:
    """Overrides that point a tiny training run at temporary folders."""
    return {
        "datalist": datalist,
        "ckpt_root": str(tmp_path / "models"),
        "output_root": str(tmp_path / "eval"),
        **extra,
    }


def assert_identical(a, b, where: str = "value") -> None:
    """Nested dicts / lists / tensors / arrays equal bit for bit (tensors with ``torch.equal``, same dtype; a
    MetaTensor's metadata and recorded operations too); ``where`` names the path."""
    import numpy as np
    import torch
    from monai.data import MetaTensor

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype, where
        diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b)), f"{where} differs (max abs difference {diff:.3g})"
        if isinstance(a, MetaTensor):
            assert isinstance(b, MetaTensor), where
            assert_identical(dict(a.meta), dict(b.meta), f"{where}.meta")
            assert [op["class"] for op in a.applied_operations] == [op["class"] for op in b.applied_operations], where
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys differ"
        for k in a:
            assert_identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.fixture(autouse=True)
def _bundle_logging_conf_keeps_pytest_capture(monkeypatch):
    """Every ``ConfigWorkflow`` over ``bundle/configs`` applies ``bundle/configs/logging.conf`` (as ``monai.bundle run``
    does), and ``logging.config.fileConfig`` replaces the root logger's handlers, pytest's log capture (``caplog``)
    among them. The conf is applied as it is; pytest's handlers are put back at once, and what the conf added to
    the root logger (its console handler, its level) is undone after the test, so that no test leaks it."""
    import logging

    import monai.bundle.workflows as bundle_workflows

    root = logging.getLogger()
    level, added = root.level, []
    apply = bundle_workflows.fileConfig

    def file_config(*args, **kwargs):
        pytest_handlers = [h for h in root.handlers if type(h).__module__.startswith("_pytest")]
        apply(*args, **kwargs)
        added.extend(h for h in root.handlers if h not in added)
        for handler in pytest_handlers:
            root.addHandler(handler)

    monkeypatch.setattr(bundle_workflows, "fileConfig", file_config)
    yield
    for handler in added:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)


def workflow_command(run_id: str) -> list[str]:
    """The documented command's words up to the run id: ``python -m monai.bundle run_workflow scripts.GLAMWorkflow
    --run_id <run_id>`` (the configs and overrides follow; ``PYTHONPATH`` is set above)."""
    return [sys.executable, "-m", "monai.bundle", "run_workflow", "scripts.GLAMWorkflow", "--run_id", run_id]
