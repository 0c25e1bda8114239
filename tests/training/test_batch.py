"""GLAM's prepare-batch (scripts/training/batch.py): random patches for negatives, seeding, bad batches."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_CONFIG, TRAIN_CONFIG
from monai.bundle import ConfigParser

from scripts.training.batch import GLAMPrepareBatch

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
    assert parser["centre_patches"] is False
    parser["patch_shift"] = 24
    parser["centre_patches"] = True
    parser["stage"] = stage
    prepare = parser.get_parsed_content("train#prepare_batch")
    assert (prepare.patch_shift, prepare.random_negatives) == (shift, negatives)
    assert prepare.centre_patches == (stage != "global")
    # validation crops Algorithm 1's patches whatever the training does
    assert parser.get_parsed_content("validate#prepare_batch").centre_patches is False


def test_prepare_batch_centre_patches_for_the_local_module():
    batch = {"image": torch.randn(2, 1, 16, 8), "label": torch.tensor([[1.0, 0.0], [0.0, 0.0]])}
    kwargs = GLAMPrepareBatch(centre_patches=True, patch_shift=8)(batch)[3]
    assert kwargs["centre_patches"] is True and kwargs["patch_shift"] == 8
    assert "centre_patches" not in GLAMPrepareBatch(patch_shift=8)(batch)[3]
    for bad in (1, "true", None):
        with pytest.raises(ValueError, match="centre_patches must be true or false"):
            GLAMPrepareBatch(centre_patches=bad)


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


def test_the_per_step_transform_runs_image_by_image_on_the_batch_and_restarts_per_epoch():
    """The training config's per-step chain on a batch of uint16 regions: each image is shifted, standardised and
    augmented by the same chain applied to it alone with the epoch's random state (drawn image after image); the
    masks are cut with their image; the offset range stays on the host; set_epoch(e) replays epoch e."""
    from monai.data.utils import set_rnd

    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(TINY_CONFIG)])
    parser["train_masks"] = True
    prepare = parser.get_parsed_content("train#prepare_batch")
    window, shift = parser.get_parsed_content("image_size"), parser.get_parsed_content("max_shift")
    g = torch.Generator().manual_seed(0)
    rows, cols = window[0] + 2 * shift[0], window[1] + 2 * shift[1]
    batch = {
        "image": torch.randint(0, 4096, (3, 1, rows, cols), generator=g).to(torch.uint16),
        "mask": (torch.rand(3, 2, rows, cols, generator=g) > 0.9).to(torch.uint8),
        "label": torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]),
        "window_shift_range": torch.tensor([[[-4, 4], [-4, 4]], [[0, 2], [-1, 0]], [[-3, 0], [0, 4]]]),
    }
    prepare.set_epoch(3)
    image, target, _, _ = prepare(batch, torch.device("cpu"))
    # the reference: the same chain, item by item, from the state set_epoch(3) gives it
    chain = parser.get_parsed_content("train#batch_transforms")
    set_rnd(chain, (parser.get_parsed_content("seed") * 1_000_003 + 3 * 1_009) % (2**31))
    for i in range(3):
        item = chain({k: v[i] for k, v in batch.items()})
        assert torch.equal(image[i], item["image"]) and torch.equal(target["mask"][i], item["mask"].float())
    assert image.dtype == torch.float32 and tuple(image.shape) == (3, 1, *window)
    assert torch.equal(target["label"], batch["label"])
    prepare.set_epoch(3)
    assert torch.equal(prepare(batch, torch.device("cpu"))[0], image)  # the epoch replays
    prepare.set_epoch(4)
    assert not torch.equal(prepare(batch, torch.device("cpu"))[0], image)
