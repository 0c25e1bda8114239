"""Algorithm 1 (greedy saliency-guided patch selection) against a plain loop implementation."""

import numpy as np
import pytest
import torch
from references import loop_algorithm_1

from scripts.patches import (
    PatchSelector,
    crop_patches,
    map_to_image_boxes,
    map_window_size,
    random_patch_boxes,
    select_map_windows,
    select_patch_boxes,
    select_peak_centred_boxes,
    shift_patch_boxes,
)


@pytest.mark.parametrize("shape,window,k", [((23, 15), (4, 4), 3), ((12, 10), (3, 5), 4), ((9, 9), (9, 9), 1)])
def test_greedy_selection_equals_loop_on_random_maps(shape, window, k):
    rng = np.random.default_rng(0)
    s = rng.random((4, 2) + shape).astype(np.float32)
    got = select_map_windows(torch.from_numpy(s), window, k)
    assert got.shape == (4, k, 2) and got.dtype == torch.long
    assert got.tolist() == [[list(p) for p in sample] for sample in loop_algorithm_1(s, window, k)]


def test_ties_constant_maps_and_border_windows():
    # exact dyadic values so sums are exact in float32 and ties are real ties
    s = np.zeros((3, 2, 8, 8), dtype=np.float32)
    s[0] = 0.25  # both classes constant: normalised to zero everywhere -> every window ties -> first index (0, 0)
    s[1, 0, 6:, 6:] = 1.0  # salient bottom-right corner block: the border window must be found
    s[1, 1] = 0.5  # constant second class contributes nothing
    s[2, 0, 0:2, 0:2] = 1.0  # two equal blocks: the first in row-major order wins the tie, then the other
    s[2, 0, 4:6, 4:6] = 1.0
    got = select_map_windows(torch.from_numpy(s), (2, 2), 3).tolist()
    expected = loop_algorithm_1(s, (2, 2), 3)
    assert got == [[list(p) for p in sample] for sample in expected]
    assert got[0][0] == [0, 0]
    assert got[1][0] == [6, 6]
    assert got[2][:2] == [[0, 0], [4, 4]]


def test_constant_map_does_not_produce_nan():
    s = torch.full((1, 2, 6, 6), 0.7)
    corners = select_map_windows(s, (2, 2), 2)
    assert corners.tolist() == [[[0, 0], [0, 0]]]


def test_full_size_geometry_from_the_spec():
    # 512 px patches on S_g of 184x120 for a 2944x1920 image: a 32x32 window, 153x89 positions,
    # image rows/cols = map rows/cols * 16, never leaving the image.
    assert map_window_size((512, 512), (2944, 1920), (184, 120)) == (32, 32)
    rng = np.random.default_rng(1)
    s = torch.from_numpy(rng.random((2, 2, 184, 120)).astype(np.float32))
    corners = select_map_windows(s, (32, 32), 6)
    assert int(corners[..., 0].max()) <= 152 and int(corners[..., 1].max()) <= 88
    boxes = select_patch_boxes(s, (2944, 1920), 512, 6)
    torch.testing.assert_close(boxes[..., 0], corners[..., 0] * 16)
    torch.testing.assert_close(boxes[..., 1], corners[..., 1] * 16)
    assert (boxes[..., 2:] == 512).all()
    assert int((boxes[..., 0] + 512).max()) <= 2944 and int((boxes[..., 1] + 512).max()) <= 1920


def test_map_to_image_rounding_and_clamping():
    corners = torch.tensor([[[0, 0], [1, 1], [3, 2], [10, 10]]])
    # map 10x10 on a 25x25 image: row_px = round(r * 2.5): 0, 2.5 -> 3 (halves up), 7.5 -> 8, 25 -> clamped to 25-8
    boxes = map_to_image_boxes(corners, (10, 10), (25, 25), (8, 8))
    assert boxes[0, :, 0].tolist() == [0, 3, 8, 17]
    assert boxes[0, :, 1].tolist() == [0, 3, 5, 17]


def test_patch_selector_module_and_batch_independence():
    rng = np.random.default_rng(2)
    s = torch.from_numpy(rng.random((3, 2, 46, 30)).astype(np.float32))
    selector = PatchSelector(patch_size=128, num_patches=4)
    batch = selector(s, (736, 480))
    singles = torch.cat([selector(s[i : i + 1], (736, 480)) for i in range(3)])
    assert torch.equal(batch, singles)


def test_crop_patches_matches_slicing():
    image = torch.arange(2 * 1 * 20 * 16, dtype=torch.float32).reshape(2, 1, 20, 16)
    boxes = torch.tensor([[[0, 0, 8, 8], [12, 8, 8, 8]], [[5, 3, 8, 8], [2, 7, 8, 8]]])
    patches = crop_patches(image, boxes)
    assert patches.shape == (2, 2, 1, 8, 8)
    for b in range(2):
        for k in range(2):
            r, c, h, w = boxes[b, k].tolist()
            assert torch.equal(patches[b, k], image[b, :, r : r + h, c : c + w])


def test_random_patches_inside_breast_and_not_overlapping():
    image = torch.zeros(2, 1, 256, 160)
    image[:, :, 16:240, :100] = 1.0  # the "breast" on the left; background elsewhere
    g = torch.Generator().manual_seed(0)
    boxes = random_patch_boxes(image, 48, 4, generator=g)
    assert boxes.shape == (2, 4, 4)
    for b in range(2):
        for k in range(4):
            r, c, h, w = boxes[b, k].tolist()
            assert image[b, 0, r + h // 2, c + w // 2] == 1.0  # centred on the breast
            for j in range(k):
                r2, c2 = boxes[b, j, :2].tolist()
                assert abs(r - r2) >= 48 or abs(c - c2) >= 48  # disjoint
    again = random_patch_boxes(image, 48, 4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(boxes, again)


def test_random_patches_fall_back_to_overlap_when_space_runs_out():
    image = torch.ones(1, 1, 64, 64)
    boxes = random_patch_boxes(image, 48, 3, generator=torch.Generator().manual_seed(0))
    assert boxes.shape == (1, 3, 4)
    assert int(boxes[..., 0].max()) <= 16 and int(boxes[..., 1].max()) <= 16


def test_shifted_boxes_move_by_the_drawn_offsets_and_stay_inside():
    H, W, p, s = 100, 80, 32, 10
    corners = [(0, 0), (68, 48), (40, 30), (5, 44), (60, 3)]  # two corners of the image, the middle, near edges
    boxes = torch.tensor([[[r, c, p, p] for r, c in corners]] * 64)  # (64, 5, 4)
    shifted = shift_patch_boxes(boxes, (H, W), s, generator=torch.Generator().manual_seed(7))
    # the same draw, then the clamping done by hand
    offsets = torch.randint(-s, s + 1, (64, 5, 2), generator=torch.Generator().manual_seed(7)).numpy()
    for b in range(64):
        for k, (r, c) in enumerate(corners):
            er = min(max(r + offsets[b, k, 0], 0), H - p)
            ec = min(max(c + offsets[b, k, 1], 0), W - p)
            assert shifted[b, k].tolist() == [er, ec, p, p]
    middle = shifted[:, 2, :2] - boxes[:, 2, :2]
    assert middle.abs().max() == s and len(set(middle.flatten().tolist())) > s  # the whole range is drawn
    assert shifted.dtype == boxes.dtype
    assert torch.equal(shift_patch_boxes(boxes, (H, W), 0), boxes)


def loop_peak_centred_boxes(saliency, image_size, patch_size, k):
    """Reference: Algorithm 1's windows by loops, each window's largest class-agnostic cell (first row-major), and a
    box centred on that cell's centre in image pixels, rounded halves up, moved inside the image."""
    (H, W), (ph, pw), (h, w) = image_size, patch_size, saliency.shape[-2:]
    window = map_window_size(list(patch_size), list(image_size), [h, w])
    boxes = []
    for sample, corners in zip(saliency.astype(np.float64), loop_algorithm_1(saliency, window, k)):
        total = sum((c - c.min()) / (c.max() - c.min()) if c.max() > c.min() else 0.0 * c for c in sample)
        per_image = []
        for r0, c0 in corners:
            best, cell = -np.inf, None
            for r in range(r0, r0 + window[0]):
                for c in range(c0, c0 + window[1]):
                    if total[r, c] > best:
                        best, cell = total[r, c], (r, c)
            top = int(np.floor((cell[0] + 0.5) * H / h - ph / 2 + 0.5))
            left = int(np.floor((cell[1] + 0.5) * W / w - pw / 2 + 0.5))
            per_image.append([min(max(top, 0), H - ph), min(max(left, 0), W - pw), ph, pw])
        boxes.append(per_image)
    return boxes


@pytest.mark.parametrize(
    "image_size,map_size,patch_size,k",
    [
        ((736, 480), (46, 30), (128, 128), 3),
        ((100, 70), (7, 9), (30, 20), 4),
        ((2944, 1920), (184, 120), (512, 512), 6),
    ],
)
def test_peak_centred_boxes_equal_a_loop_on_random_maps(image_size, map_size, patch_size, k):
    s = np.random.default_rng(1).random((3, 2, *map_size)).astype(np.float32)
    got = select_peak_centred_boxes(torch.from_numpy(s), list(image_size), list(patch_size), k)
    assert got.dtype == torch.long and got.tolist() == loop_peak_centred_boxes(s, image_size, patch_size, k)


def test_peak_centred_box_by_hand():
    # one class peaks at cell (10, 12) of a 46x30 map over 736x480 pixels (16 px cells); Algorithm 1's 8x8 window
    # holding it starts at (6, 8), so its 128 px patch starts at (96, 128) and has the peak's centre (168, 200) at
    # 72 px from its top and 72 from its left; centred, the patch starts at 168 - 64 = 104 and 200 - 64 = 136
    s = torch.zeros(1, 2, 46, 30)
    s[0, 0, 6:14, 8:16] = 1.0
    s[0, 0, 10, 12] = 2.0
    assert select_patch_boxes(s, [736, 480], [128, 128], 1).tolist() == [[[96, 128, 128, 128]]]
    assert select_peak_centred_boxes(s, [736, 480], [128, 128], 1).tolist() == [[[104, 136, 128, 128]]]
    # a peak on the map's top edge: the first window holding its 3x3 block starts at (0, 19); centred on the peak's
    # (8, 408), the patch would start 56 px above the image and is moved down to row 0
    s = torch.zeros(1, 2, 46, 30)
    s[0, 1, 0:3, 24:27] = 1.0
    s[0, 1, 0, 25] = 3.0
    assert select_patch_boxes(s, [736, 480], [128, 128], 1).tolist() == [[[0, 304, 128, 128]]]
    assert select_peak_centred_boxes(s, [736, 480], [128, 128], 1).tolist() == [[[0, 344, 128, 128]]]


@pytest.mark.parametrize(
    "args,match",
    [
        ((torch.zeros(2, 4), (10, 10), 2), r"boxes must be \(B, K, 4\)"),
        ((torch.zeros(1, 1, 4, dtype=torch.long), (10, 10), -1), "max_shift must be a non-negative int"),
        ((torch.zeros(1, 1, 4, dtype=torch.long), (10, 10), 2.5), "max_shift must be a non-negative int"),
    ],
)
def test_bad_shift_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        shift_patch_boxes(*args)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_patches": 16}, "exceeds the 15 disjoint"),
        ({"num_patches": 0}, "num_patches must be a positive int"),
        ({"image_size": (100, 480)}, "smaller than the 128x128 patch"),
    ],
)
def test_bad_patch_arguments(kwargs, match):
    s = torch.rand(1, 2, 46, 30)
    args = {"image_size": (736, 480), "patch_size": 128, "num_patches": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        select_patch_boxes(s, **args)
