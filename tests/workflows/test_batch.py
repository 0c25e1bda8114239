"""GLAM's prepare-batch (scripts/workflows/batch.py): random patches for negatives, seeding, bad batches."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_CONFIG, TRAIN_CONFIG
from monai.bundle import ConfigParser

from scripts.workflows import (
    GLAMPrepareBatch,
)

# ---------------------------------------------------------------------------------------------------------------
# GLAMPrepareBatch


def test_prepare_batch_random_patches_for_negatives_only():
    label = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    batch = {"image": torch.randn(5, 1, 16, 8), "label": label}
    image, target, args, kwargs = GLAMPrepareBatch(random_negatives=True)(batch, torch.device("cpu"))
    expected = [not any(row) for row in label.tolist()]
    assert kwargs["random_patch_mask"].tolist() == expected
    assert isinstance(kwargs["generator"], torch.Generator)
    assert torch.equal(image, batch["image"]) and torch.equal(target, label) and args == ()
    # global and joint training: no patch arguments; evaluation: labels and masks
    assert GLAMPrepareBatch()(batch)[3] == {}
    mask = torch.zeros(5, 2, 16, 8)
    _, target, _, kwargs = GLAMPrepareBatch(with_masks=True)({**batch, "mask": mask})
    assert set(target) == {"label", "mask"} and torch.equal(target["mask"], mask) and kwargs == {}


def test_prepare_batch_patch_shift_for_the_local_module():
    batch = {"image": torch.randn(2, 1, 16, 8), "label": torch.tensor([[1.0, 0.0], [0.0, 0.0]])}
    kwargs = GLAMPrepareBatch(patch_shift=16)(batch)[3]
    assert kwargs["patch_shift"] == 16 and isinstance(kwargs["generator"], torch.Generator)
    assert "random_patch_mask" not in kwargs  # the joint stage: every image gets Algorithm 1's boxes, shifted
    both = GLAMPrepareBatch(random_negatives=True, patch_shift=4)(batch)[3]
    assert both["patch_shift"] == 4 and both["random_patch_mask"].tolist() == [False, True]
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match="patch_shift must be a non-negative int"):
            GLAMPrepareBatch(patch_shift=bad)


@pytest.mark.parametrize("stage,shift,negatives", [("global", 0, False), ("local", 24, True), ("joint", 24, False)])
def test_train_config_shifts_the_patches_of_the_local_and_joint_stages(stage, shift, negatives):
    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(TINY_CONFIG)])
    assert parser["patch_shift"] == 0  # the paper's fixed patches by default
    parser["patch_shift"] = 24
    parser["stage"] = stage
    prepare = parser.get_parsed_content("train#prepare_batch")
    assert (prepare.patch_shift, prepare.random_negatives) == (shift, negatives)


def test_prepare_batch_generator_depends_on_seed_and_epoch_only():
    batch = {"image": torch.zeros(1, 1, 4, 4), "label": torch.zeros(1, 2)}

    def draw(prepare, epoch):
        prepare.set_epoch(epoch)
        return torch.rand(4, generator=prepare(batch)[3]["generator"])

    a, b = GLAMPrepareBatch(random_negatives=True, seed=3), GLAMPrepareBatch(random_negatives=True, seed=3)
    first = draw(a, 2)
    assert torch.equal(draw(b, 2), first)
    assert not torch.equal(draw(a, 3), first)
    assert not torch.equal(draw(GLAMPrepareBatch(random_negatives=True, seed=4), 2), first)
    # within an epoch the generator goes on (the next batch gets other patches)
    a.set_epoch(2)
    gen = a(batch)[3]["generator"]
    torch.rand(4, generator=gen)
    assert not torch.equal(torch.rand(4, generator=a(batch)[3]["generator"]), first)


@pytest.mark.parametrize("shape", [(3,), (3, 1), (3, 3), (3, 2, 1), (2, 2)])
def test_prepare_batch_bad_label_shape_raises(shape):
    batch = {"image": torch.zeros(3, 1, 4, 4), "label": torch.zeros(shape)}
    with pytest.raises(ValueError, match="label"):
        GLAMPrepareBatch()(batch)


def test_prepare_batch_missing_keys_and_bad_mask_raise():
    with pytest.raises(ValueError, match="'label'"):
        GLAMPrepareBatch()({"image": torch.zeros(1, 1, 4, 4)})
    batch = {"image": torch.zeros(2, 1, 4, 4), "label": torch.zeros(2, 2)}
    with pytest.raises(ValueError, match="'mask'"):
        GLAMPrepareBatch(with_masks=True)(batch)
    with pytest.raises(ValueError, match="'mask'"):
        GLAMPrepareBatch(with_masks=True)({**batch, "mask": torch.zeros(2, 2, 4, 5)})
