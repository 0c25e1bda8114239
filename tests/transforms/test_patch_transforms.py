import numpy as np
import pytest
import torch
from monai.transforms import Compose
from references import loop_algorithm_1

from scripts.transforms.patches import RandPatchCrop, RandPatchCropd, SaliencyPatchCrop, SaliencyPatchCropd


def test_saliency_patch_crop_uses_algorithm_1():
    rng = np.random.default_rng(0)
    img = rng.random((1, 256, 160)).astype(np.float32)
    sal = rng.random((2, 32, 20)).astype(np.float32)
    patches, boxes = SaliencyPatchCrop(num_patches=3, patch_size=64)(img, sal)
    corners = loop_algorithm_1(sal[None], (8, 8), 3)[0]
    assert boxes.tolist() == [[r * 8, c * 8, 64, 64] for r, c in corners]
    assert patches.shape == (3, 1, 64, 64)
    for k, (r, c, h, w) in enumerate(boxes.tolist()):
        np.testing.assert_array_equal(patches[k].numpy(), img[:, r : r + h, c : c + w])


def test_saliency_patch_cropd_crops_image_and_masks_with_the_same_boxes():
    rng = np.random.default_rng(1)
    d = {
        "image": torch.from_numpy(rng.random((1, 128, 96)).astype(np.float32)),
        "mask_benign": torch.from_numpy((rng.random((1, 128, 96)) > 0.5).astype(np.float32)),
        "sg": torch.from_numpy(rng.random((2, 8, 6)).astype(np.float32)),
    }
    out = SaliencyPatchCropd(["image", "mask_benign", "mask_malignant"], "sg", 2, 32, allow_missing_keys=True)(d)
    assert out["image"].shape == (2, 1, 32, 32) and out["mask_benign"].shape == (2, 1, 32, 32)
    for k, (r, c, h, w) in enumerate(out["patch_boxes"].tolist()):
        torch.testing.assert_close(out["mask_benign"][k], d["mask_benign"][:, r : r + h, c : c + w])
    with pytest.raises(ValueError, match="saliency_key 'missing'"):
        SaliencyPatchCropd(["image"], "missing", 1, 32)(d)


def test_rand_patch_cropd_is_reproducible_and_in_breast():
    img = torch.zeros(1, 128, 96)
    img[:, 8:120, :60] = 1.0
    d = {"image": img, "label_map": img * 2}
    t1 = RandPatchCropd(["image", "label_map"], num_patches=3, patch_size=32).set_random_state(seed=7)
    t2 = RandPatchCropd(["image", "label_map"], num_patches=3, patch_size=32).set_random_state(seed=7)
    a, b = t1(d), t2(d)
    assert torch.equal(a["patch_boxes"], b["patch_boxes"])
    assert torch.equal(a["label_map"], 2 * a["image"])
    for r, c, h, w in a["patch_boxes"].tolist():
        assert img[0, r + h // 2, c + w // 2] == 1.0
    later = [t1(d)["patch_boxes"] for _ in range(5)]
    assert any(not torch.equal(boxes, a["patch_boxes"]) for boxes in later)  # each call draws anew
    pipeline = Compose([RandPatchCropd(["image"], 2, 32)]).set_random_state(seed=1)
    assert pipeline(d)["image"].shape == (2, 1, 32, 32)


def test_rand_patch_crop_array_rejects_bad_input():
    with pytest.raises(ValueError, match=r"channel-first \(C, H, W\)"):
        RandPatchCrop(2, 32)(torch.zeros(64, 64))
    with pytest.raises(ValueError, match="smaller than the 32x32 patch"):
        RandPatchCrop(2, 32)(torch.zeros(1, 16, 64))
    with pytest.raises(ValueError, match="num_patches must be a positive int"):
        RandPatchCrop(0, 32)
