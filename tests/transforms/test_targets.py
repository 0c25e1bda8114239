"""Stacking the per-class masks into the training target (scripts/transforms/targets.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scripts.transforms.targets import StackMasksd

# ---------------------------------------------------------------------------------------------------------------
# StackMasksd


def test_stack_masks_zeros_for_missing_masks():
    image = torch.zeros(1, 6, 4)
    malignant = torch.zeros(1, 6, 4)
    malignant[0, 2:4, 1] = 1
    out = StackMasksd(keys=["mask_benign", "mask_malignant"])({"image": image, "mask_malignant": malignant})
    assert out["mask"].shape == (2, 6, 4) and out["mask"].dtype == torch.float32
    assert torch.equal(out["mask"][0], torch.zeros(6, 4)) and torch.equal(out["mask"][1], malignant[0])
    assert "mask_benign" not in out and "mask_malignant" not in out
    for empty in (None, "", "  "):
        out = StackMasksd()({"image": image, "mask_benign": empty, "mask_malignant": np.ones((6, 4))})
        assert torch.equal(out["mask"], torch.stack([torch.zeros(6, 4), torch.ones(6, 4)]))
    kept = StackMasksd(remove_keys=False)({"image": image, "mask_benign": np.ones((6, 4))})
    assert "mask_benign" in kept


def test_stack_masks_size_mismatch_names_the_key():
    data = {"image": torch.zeros(1, 6, 4), "mask_benign": torch.zeros(1, 6, 4), "mask_malignant": torch.zeros(6, 5)}
    with pytest.raises(ValueError, match="mask_malignant"):
        StackMasksd()(data)
    with pytest.raises(ValueError, match="reference"):
        StackMasksd()({"mask_benign": torch.zeros(6, 4)})
    with pytest.raises(ValueError, match="mask_benign.*path"):
        StackMasksd()({"image": torch.zeros(1, 6, 4), "mask_benign": "masks/a.png"})
