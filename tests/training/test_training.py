"""The three-stage training workflow on tiny synthetic data: properties, each stage, the 'all' runner."""

from pathlib import Path

import pytest
import torch
from conftest import TINY_CONFIG, TRAIN_CONFIG, tiny_overrides
from monai.bundle import ConfigWorkflow

from scripts.patches import select_peak_centred_boxes
from scripts.training.workflow import GLAMWorkflow

META = str(TRAIN_CONFIG.parent / "metadata.json")


def workflow(tmp_path: Path, datalist: str, **overrides) -> ConfigWorkflow:
    """The training workflow from Python: GLAMWorkflow (train.yaml's `training` builds it from the
    `monai.bundle run` command line, which a test does not have)."""
    return GLAMWorkflow(
        config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG)],
        meta_file=META,
        workflow_type="train",
        **tiny_overrides(tmp_path, datalist, **overrides),
    )


@pytest.mark.parametrize("stage", ["global", "local", "joint"])
def test_each_stage_config_passes_monai_train_properties(tmp_path, tiny_datalist, stage):
    wf = workflow(tmp_path, tiny_datalist, stage=stage)
    wf.initialize()
    assert wf.check_properties() == []


def test_all_stages_run_in_order_and_hand_over_checkpoints(tmp_path, tiny_datalist):
    wf = workflow(tmp_path, tiny_datalist, stage="all")
    wf.initialize()
    results = wf.run()[-1]
    assert [r["stage"] for r in results] == ["global", "local", "joint"]
    for stage in ("global", "local", "joint"):
        best = tmp_path / "models" / stage / "model.pt"
        last = torch.load(tmp_path / "models" / stage / "last.pt", weights_only=True)
        assert best.is_file()
        assert last["trainer"]["iteration"] == last["trainer"]["epoch_length"]  # one whole epoch
        assert set(last) == {"network", "optimizer", "lr_scheduler", "best_metric", "trainer"}
    # the local stage started from the global stage's best model and kept the global module frozen
    global_best = torch.load(tmp_path / "models" / "global" / "model.pt", weights_only=True)
    local_best = torch.load(tmp_path / "models" / "local" / "model.pt", weights_only=True)
    for k, v in global_best.items():
        if k.startswith("global_network."):
            assert torch.equal(local_best[k], v), k
    assert any(not torch.equal(local_best[k], global_best[k]) for k in global_best if k.startswith("local_network."))


def test_centre_patches_trains_the_local_and_joint_stages_on_peak_centred_patches(tmp_path, tiny_datalist, monkeypatch):
    import scripts.networks.glam as glam

    calls = []

    def spy(saliency, *args):
        calls.append(saliency.shape)
        return select_peak_centred_boxes(saliency, *args)

    monkeypatch.setattr(glam, "select_peak_centred_boxes", spy)
    wf = workflow(tmp_path, tiny_datalist, stage="all", centre_patches=True)
    wf.initialize()
    results = wf.run()[-1]
    assert [r["stage"] for r in results] == ["global", "local", "joint"]
    # one call per training iteration of the local and joint stages (validation keeps Algorithm 1's patches)
    trained = sum(
        torch.load(tmp_path / "models" / s / "last.pt", weights_only=True)["trainer"]["iteration"]
        for s in ("local", "joint")
    )
    assert len(calls) == trained > 0


def test_a_later_stage_alone_needs_the_previous_stage(tmp_path, tiny_datalist):
    wf = workflow(tmp_path, tiny_datalist, stage="local")
    wf.initialize()
    with pytest.raises(RuntimeError) as err:
        wf.run()
    chain, e = [], err.value
    while e is not None:  # MONAI wraps the handler's error in its config-evaluation errors
        chain.append(e)
        e = e.__cause__
    root = chain[-1]
    assert isinstance(root, FileNotFoundError)
    assert "previous stage's model" in str(root) and str(tmp_path / "models" / "global" / "model.pt") in str(root)
