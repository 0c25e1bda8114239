"""Saliency-guided patch selection (paper Algorithm 1), random patches, cropping and map rendering.

Boxes are long tensors (B, K, 4) of (row, col, height, width); what GLAM's forward reaches compiles with TorchScript.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .enums import MapName
from .errors import UsageError


def as_pair(value: int | Sequence[int], name: str) -> tuple[int, int]:
    """An int or a pair of ints as a (rows, cols) pair of positive ints."""
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or any(isinstance(v, bool) or int(v) != v or int(v) < 1 for v in pair):
        raise UsageError(f"{name} must be a positive int or a pair of positive ints, got {value!r}")
    return int(pair[0]), int(pair[1])


def map_window_size(patch_size: list[int], image_size: list[int], map_size: list[int]) -> tuple[int, int]:
    """The patch's size on the saliency map: round(p * h / H) rows, round(p * w / W) cols (at least 1)."""
    # int(): sizes are tensors while tracing
    rows = max(1, int(round(int(patch_size[0]) * int(map_size[0]) / int(image_size[0]))))
    cols = max(1, int(round(int(patch_size[1]) * int(map_size[1]) / int(image_size[1]))))
    return rows, cols


def max_disjoint_windows(map_size: list[int], window: tuple[int, int]) -> int:
    """How many disjoint windows of ``window`` tile a map of ``map_size``."""
    return (int(map_size[0]) // int(window[0])) * (int(map_size[1]) // int(window[1]))


def _check_maps(saliency: torch.Tensor) -> None:
    if saliency.ndim != 4:
        raise UsageError(f"saliency must be (B, C, h, w), got shape {tuple(saliency.shape)}")


def _class_agnostic_map(saliency: torch.Tensor) -> torch.Tensor:
    """Algorithm 1, lines 2-5: min-max normalise each class map (a constant one to 0), then sum the classes."""
    s = saliency.float()
    # torch.finfo(torch.float32).tiny: TorchScript has no finfo
    lo = s.amin(dim=(-2, -1), keepdim=True)
    span = s.amax(dim=(-2, -1), keepdim=True) - lo
    normalised = torch.where(span > 0, (s - lo) / span.clamp_min(1.1754943508222875e-38), torch.zeros_like(s))
    return normalised.sum(dim=1, keepdim=True)


def select_map_windows(saliency: torch.Tensor, window: tuple[int, int], num_patches: int) -> torch.Tensor:
    """Greedy window selection on a saliency map (Algorithm 1, lines 6-13).

    Args:
        saliency: (B, C, h, w) maps, e.g. S_g.
        window: the window (rows, cols) on the map.
        num_patches: K (training) or M (inference).

    Returns:
        (B, K, 2) long upper-left corners (row, col) on the map, in selection order: each step takes the window of
        largest mean (the first on ties) and zeroes it.
    """
    if not torch.jit.is_scripting():
        _check_maps(saliency)
    wh, ww = int(window[0]), int(window[1])
    h, w = saliency.shape[-2], saliency.shape[-1]
    if wh > h or ww > w:
        raise UsageError(f"patch window {wh}x{ww} on the map does not fit the {h}x{w} saliency map")
    current = _class_agnostic_map(saliency)
    rows = torch.arange(h, device=saliency.device)
    cols = torch.arange(w, device=saliency.device)
    corners: list[torch.Tensor] = []
    for _ in range(num_patches):
        pooled = F.avg_pool2d(current, (wh, ww), stride=1)
        pooled_w = pooled.shape[-1]
        index = pooled.flatten(1).argmax(dim=1)
        r, c = index // pooled_w, index % pooled_w
        corners.append(torch.stack([r, c], dim=-1))
        in_rows = (rows >= r[:, None]) & (rows < (r + wh)[:, None])
        in_cols = (cols >= c[:, None]) & (cols < (c + ww)[:, None])
        current = current.masked_fill((in_rows[:, :, None] & in_cols[:, None, :])[:, None], 0.0)
    return torch.stack(corners, dim=1)


def map_to_image_boxes(
    corners: torch.Tensor, map_size: list[int], image_size: list[int], patch_size: list[int]
) -> torch.Tensor:
    """Window corners on the map -> (B, K, 4) patch boxes inside the image (Algorithm 1, line 10).

    row = round(row_map * H / h) in integer arithmetic (halves up), likewise for columns, then clamped inside.
    """
    h, w, H, W, ph, pw = map_size[0], map_size[1], image_size[0], image_size[1], patch_size[0], patch_size[1]
    r = (2 * corners[..., 0] * H + h) // (2 * h)
    c = (2 * corners[..., 1] * W + w) // (2 * w)
    r = r.clamp(0, H - ph)
    c = c.clamp(0, W - pw)
    return torch.stack([r, c, torch.full_like(r, ph), torch.full_like(c, pw)], dim=-1)


def select_patch_boxes(
    saliency: torch.Tensor, image_size: list[int], patch_size: list[int], num_patches: int
) -> torch.Tensor:
    """Algorithm 1: S_g (B, C, h, w) -> (B, K, 4) boxes of ``patch_size`` (rows, cols; an int from Python)."""
    if not torch.jit.is_scripting():
        patch_size = list(as_pair(patch_size, "patch_size"))
        _check_patch_count(num_patches, saliency.shape[-2:], image_size, patch_size)
    map_size = [saliency.shape[-2], saliency.shape[-1]]
    window = map_window_size(patch_size, image_size, map_size)
    corners = select_map_windows(saliency, window, num_patches)
    return map_to_image_boxes(corners, map_size, image_size, patch_size)


def window_peaks(saliency: torch.Tensor, corners: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
    """The cell of largest class-agnostic saliency (Algorithm 1, lines 2-5) inside each map window.

    Args:
        saliency: (B, C, h, w) maps, e.g. S_g.
        corners: (B, K, 2) long upper-left corners of windows on the map, e.g. :func:`select_map_windows`'s.
        window: the window (rows, cols) on the map.

    Returns:
        (B, K, 2) long cells (row, col) on the map; the first in row-major order on ties.
    """
    _check_maps(saliency)
    wh, ww = int(window[0]), int(window[1])
    agnostic = _class_agnostic_map(saliency)[:, 0]  # (B, h, w)
    device = saliency.device
    b = torch.arange(saliency.shape[0], device=device)[:, None, None, None]
    rows = (corners[..., 0, None] + torch.arange(wh, device=device))[..., :, None]  # (B, K, wh, 1)
    cols = (corners[..., 1, None] + torch.arange(ww, device=device))[..., None, :]  # (B, K, 1, ww)
    index = agnostic[b, rows, cols].flatten(2).argmax(dim=2)  # (B, K) over each window's wh * ww cells
    return torch.stack([corners[..., 0] + index // ww, corners[..., 1] + index % ww], dim=-1)


def cell_centred_boxes(
    cells: torch.Tensor, map_size: list[int], image_size: list[int], patch_size: list[int]
) -> torch.Tensor:
    """Map cells (B, K, 2) -> (B, K, 4) patch boxes centred on the cells' centres, moved inside the image.

    The cell (r, c) covers image rows [r * H / h, (r + 1) * H / h); the box's row is its centre minus half the patch,
    rounded halves up in integer arithmetic, then clamped to [0, H - ph]; likewise for columns.
    """
    h, w, H, W, ph, pw = map_size[0], map_size[1], image_size[0], image_size[1], patch_size[0], patch_size[1]
    r = ((2 * cells[..., 0] + 1) * H + h * (1 - ph)).div(2 * h, rounding_mode="floor")
    c = ((2 * cells[..., 1] + 1) * W + w * (1 - pw)).div(2 * w, rounding_mode="floor")
    r = r.clamp(0, H - ph)
    c = c.clamp(0, W - pw)
    return torch.stack([r, c, torch.full_like(r, ph), torch.full_like(c, pw)], dim=-1)


def select_peak_centred_boxes(
    saliency: torch.Tensor, image_size: list[int], patch_size: list[int], num_patches: int
) -> torch.Tensor:
    """Algorithm 1's windows, each patch centred on the class-agnostic peak inside its window: (B, K, 4) boxes.

    A training option (``centre_patches``): the window of largest mean saliency can hold its lesion anywhere, even on
    one side every time, and a local module then learns the side; centring on the peak puts the lesion nearer the
    middle. Validation and inference keep Algorithm 1's boxes.
    """
    patch_size = list(as_pair(patch_size, "patch_size"))
    _check_patch_count(num_patches, saliency.shape[-2:], image_size, patch_size)
    map_size = [saliency.shape[-2], saliency.shape[-1]]
    window = map_window_size(patch_size, image_size, map_size)
    corners = select_map_windows(saliency, window, num_patches)
    return cell_centred_boxes(window_peaks(saliency, corners, window), map_size, list(image_size), patch_size)


def _check_patch_count(
    num_patches: int, map_size: Sequence[int], image_size: Sequence[int], patch_size: Sequence[int]
) -> None:
    if isinstance(num_patches, bool) or not isinstance(num_patches, int) or num_patches < 1:
        raise UsageError(f"num_patches must be a positive int, got {num_patches!r}")
    if image_size[0] < patch_size[0] or image_size[1] < patch_size[1]:
        raise UsageError(
            f"image of {image_size[0]}x{image_size[1]} is smaller than the {patch_size[0]}x{patch_size[1]} patch"
        )
    window = map_window_size(patch_size, image_size, map_size)
    available = max_disjoint_windows(map_size, window)
    if num_patches > available:
        raise UsageError(
            f"num_patches={num_patches} exceeds the {available} disjoint {patch_size[0]}x{patch_size[1]} patch "
            f"windows available in a {image_size[0]}x{image_size[1]} image"
        )


def random_patch_boxes(
    image: torch.Tensor,
    patch_size: int | Sequence[int],
    num_patches: int,
    generator: torch.Generator | None = None,
    stride: int | None = None,
) -> torch.Tensor:
    """K random patch boxes per image inside the breast, disjoint where possible (the local stage's negatives).

    Grid corners are drawn with probability proportional to their window's foreground fraction.

    Args:
        image: (B, 1, H, W) images.
        patch_size: patch (rows, cols).
        num_patches: K.
        generator: a ``torch.Generator`` on the image's device.
        stride: candidate grid step in pixels (default a quarter patch).

    Returns:
        (B, K, 4) long boxes.
    """
    if image.ndim != 4:
        raise UsageError(f"image must be (B, 1, H, W), got shape {tuple(image.shape)}")
    ph, pw = as_pair(patch_size, "patch_size")
    H, W = image.shape[-2:]
    if H < ph or W < pw:
        raise UsageError(f"image of {H}x{W} is smaller than the {ph}x{pw} patch")
    if isinstance(num_patches, bool) or not isinstance(num_patches, int) or num_patches < 1:
        raise UsageError(f"num_patches must be a positive int, got {num_patches!r}")
    if generator is not None and generator.device.type != image.device.type:
        raise UsageError(f"generator is on {generator.device} but the image is on {image.device}: use one device")
    stride = max(1, min(ph, pw) // 4) if stride is None else int(stride)
    foreground = (image > image.amin(dim=(-3, -2, -1), keepdim=True)).float()
    fraction = F.avg_pool2d(foreground, (ph, pw), stride=stride)[:, 0]  # (B, nr, nc) candidate corners
    nr, nc = fraction.shape[-2:]
    r0 = torch.arange(nr, device=image.device) * stride
    c0 = torch.arange(nc, device=image.device) * stride
    centre = foreground[:, 0][:, (r0 + ph // 2)[:, None], (c0 + pw // 2)[None, :]]
    weights = (fraction * centre).flatten(1)
    weights = torch.where(weights.sum(1, keepdim=True) > 0, weights, torch.ones_like(weights))
    cand_r = r0[:, None].expand(nr, nc).reshape(-1)
    cand_c = c0[None, :].expand(nr, nc).reshape(-1)
    available = weights.clone()
    boxes = []
    for _ in range(num_patches):
        usable = torch.where(available.sum(1, keepdim=True) > 0, available, weights)
        pick = torch.multinomial(usable, 1, generator=generator)[:, 0]
        r, c = cand_r[pick], cand_c[pick]
        boxes.append(torch.stack([r, c, torch.full_like(r, ph), torch.full_like(c, pw)], dim=-1))
        overlaps = ((cand_r[None] - r[:, None]).abs() < ph) & ((cand_c[None] - c[:, None]).abs() < pw)
        available = available.masked_fill(overlaps, 0.0)
    return torch.stack(boxes, dim=1)


def shift_patch_boxes(
    boxes: torch.Tensor,
    image_size: Sequence[int],
    max_shift: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Move each box by a random offset in ``[-max_shift, max_shift]`` pixels per axis, kept inside the image.

    A training augmentation: Algorithm 1 centres patches on lesions, a cue the local module could learn instead.

    Args:
        boxes: (B, K, 4) long boxes inside the image.
        image_size: (H, W).
        max_shift: the largest offset in pixels (0: boxes unchanged).
        generator: a ``torch.Generator`` on the boxes' device.

    Returns:
        (B, K, 4) long boxes of the same sizes.
    """
    if boxes.ndim != 3 or boxes.shape[-1] != 4:
        raise UsageError(f"boxes must be (B, K, 4), got shape {tuple(boxes.shape)}")
    if isinstance(max_shift, bool) or not isinstance(max_shift, int) or max_shift < 0:
        raise UsageError(f"max_shift must be a non-negative int (pixels), got {max_shift!r}")
    if generator is not None and generator.device.type != boxes.device.type:
        raise UsageError(f"generator is on {generator.device} but the boxes are on {boxes.device}: use one device")
    if max_shift == 0:
        return boxes
    offsets = torch.randint(-max_shift, max_shift + 1, (*boxes.shape[:-1], 2), generator=generator, device=boxes.device)
    size = boxes[..., 2:]
    limit = torch.tensor([int(image_size[0]), int(image_size[1])], device=boxes.device) - size
    corner = torch.minimum((boxes[..., :2] + offsets).clamp(min=0), limit)
    return torch.cat([corner, size], dim=-1)


def crop_patches(image: torch.Tensor, boxes: torch.Tensor, patch_size: list[int] | None = None) -> torch.Tensor:
    """Crop same-size patches: image (B, C, H, W), boxes (B, K, 4) inside it -> (B, K, C, ph, pw).

    ``patch_size`` (the size of every box; an int from Python) spares a host read of the boxes.
    """
    if not torch.jit.is_scripting():
        if image.ndim != 4 or boxes.ndim != 3 or boxes.shape[-1] != 4 or boxes.shape[0] != image.shape[0]:
            raise UsageError(
                "crop_patches needs image (B, C, H, W) and boxes (B, K, 4), "
                f"got {tuple(image.shape)}, {tuple(boxes.shape)}"
            )
        if patch_size is not None:
            patch_size = list(as_pair(patch_size, "patch_size"))
    if patch_size is None:
        patch_size = [int(boxes[0, 0, 2]), int(boxes[0, 0, 3])]
    ph, pw = patch_size[0], patch_size[1]
    device = image.device
    b = torch.arange(image.shape[0], device=device)[:, None, None, None, None]
    ch = torch.arange(image.shape[1], device=device)[None, None, :, None, None]
    rows = (boxes[..., 0, None] + torch.arange(ph, device=device))[:, :, None, :, None]
    cols = (boxes[..., 1, None] + torch.arange(pw, device=device))[:, :, None, None, :]
    return image[b, ch, rows, cols]


def render_saliency(
    saliency_global: torch.Tensor,
    patch_maps: torch.Tensor,
    boxes: torch.Tensor,
    image_size: list[int],
    stride: int = 4,
    gamma_c: float = 0.5,
) -> dict[str, torch.Tensor]:
    """Render S_g, S_l and S_c on the image grid sampled every ``stride`` pixels (docs/model.md, "Outputs").

    Output pixel (i, j) is image pixel (i * stride, j * stride). S_l: each patch map nearest-upsampled into its box
    of a zero map (later patches overwrite earlier ones); S_c = gamma_c * S_g + (1 - gamma_c) * S_l.

    Args:
        saliency_global: S_g (B, C, h, w).
        patch_maps: A (B, K, C, a, b), the local module's maps of the patches in ``boxes``.
        boxes: (B, K, 4) long boxes in image pixels.
        image_size: (H, W) of the image.
        stride: sampling step in image pixels.
        gamma_c: weight of S_g in S_c.

    Returns:
        ``{"S_g", "S_l", "S_c"}`` maps (:class:`MapName`), each (B, C, ceil(H / stride), ceil(W / stride)).
    """
    H, W = int(image_size[0]), int(image_size[1])
    if not 0.0 <= gamma_c <= 1.0:
        raise UsageError(f"gamma_c must be in [0, 1], got {gamma_c}")
    if not torch.jit.is_scripting():
        if patch_maps.ndim != 5 or boxes.shape[:2] != patch_maps.shape[:2]:
            raise UsageError(
                "patch_maps (B, K, C, a, b) and boxes (B, K, 4) disagree: "
                f"{tuple(patch_maps.shape)}, {tuple(boxes.shape)}"
            )
    device = saliency_global.device
    img_rows = torch.arange(0, H, stride, device=device)
    img_cols = torch.arange(0, W, stride, device=device)
    h, w = saliency_global.shape[-2], saliency_global.shape[-1]
    s_g = saliency_global.index_select(-2, img_rows * h // H).index_select(-1, img_cols * w // W)

    patch_maps = patch_maps.float()  # float32 maps also under autocast
    s_g = s_g.float()
    shape = patch_maps.shape
    B, K, C, a, b = shape[0], shape[1], shape[2], shape[3], shape[4]
    ho, wo = img_rows.numel(), img_cols.numel()
    rel_r = img_rows[None, None, :] - boxes[..., 0, None]  # (B, K, ho)
    rel_c = img_cols[None, None, :] - boxes[..., 1, None]  # (B, K, wo)
    ph, pw = boxes[..., 2, None], boxes[..., 3, None]
    inside_r = (rel_r >= 0) & (rel_r < ph)
    inside_c = (rel_c >= 0) & (rel_c < pw)
    src_r = (rel_r.clamp(min=0) * a // ph).clamp(max=a - 1)
    src_c = (rel_c.clamp(min=0) * b // pw).clamp(max=b - 1)
    # gather rows then columns: (B, K, C, a, b) -> (B, K, C, ho, b) -> (B, K, C, ho, wo)
    values = patch_maps.gather(3, src_r[:, :, None, :, None].expand(B, K, C, ho, b))
    values = values.gather(4, src_c[:, :, None, None, :].expand(B, K, C, ho, wo))
    inside = (inside_r[..., :, None] & inside_c[..., None, :])[:, :, None]  # (B, K, 1, ho, wo)
    s_l = torch.zeros((B, C, ho, wo), dtype=patch_maps.dtype, device=device)
    for k in range(K):  # later patches overwrite earlier ones
        s_l = torch.where(inside[:, k], values[:, k], s_l)
    s_c = gamma_c * s_g + (1.0 - gamma_c) * s_l
    return {MapName.GLOBAL.value: s_g, MapName.LOCAL.value: s_l, MapName.COMBINED.value: s_c}


class PatchSelector(nn.Module):
    """Algorithm 1 as a module: (S_g (B, C, h, w), image size) -> (B, K, 4) patch boxes.

    Args:
        patch_size: patch (rows, cols) in image pixels.
        num_patches: K.
    """

    def __init__(self, patch_size: int | Sequence[int] = 512, num_patches: int = 1) -> None:
        super().__init__()
        self.patch_size = as_pair(patch_size, "patch_size")
        if isinstance(num_patches, bool) or not isinstance(num_patches, int) or num_patches < 1:
            raise UsageError(f"num_patches must be a positive int, got {num_patches!r}")
        self.num_patches = num_patches

    def forward(self, saliency: torch.Tensor, image_size: list[int]) -> torch.Tensor:
        return select_patch_boxes(saliency, image_size, list(self.patch_size), self.num_patches)
