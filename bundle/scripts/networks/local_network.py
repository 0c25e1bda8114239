"""The local module f_l of GLAM: a ResNet with stride 1 in every layer ("ResNet-34-HR"), torchvision's module
names so that the authors' weights load one to one."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from ..enums import OutputKey
from ..errors import UsageError
from .global_network import PADDING_MODES

#: blocks per layer for the supported depths
LOCAL_DEPTHS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}


class BasicBlock(nn.Module):
    """Post-activation basic block; a 1x1 conv + BN shortcut where the width changes."""

    def __init__(self, in_planes: int, planes: int, padding_mode: str = "zeros") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, padding=1, bias=False, padding_mode=padding_mode)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False, padding_mode=padding_mode)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = (
            nn.Sequential(nn.Conv2d(in_planes, planes, 1, bias=False), nn.BatchNorm2d(planes))
            if in_planes != planes
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity, inplace=True)


class ResNetHR(nn.Module):
    """ResNet-18/34 with stride 1 in every layer: (B, 3, p, p) -> (B, 8 * width, p/4, p/4).

    Args:
        depth: 18 or 34.
        width: channels of the first layer (64 in the paper).
        in_channels: 3, as torchvision's stem.
        padding_mode: how every padded convolution pads its input: ``"zeros"`` (the paper's) or ``"replicate"``
            (the border pixels repeated), with which a convolution cannot tell the patch's edge from its inside.

    Raises:
        ValueError: an unknown depth or padding mode, or a width below 1.
    """

    def __init__(self, depth: int = 34, width: int = 64, in_channels: int = 3, padding_mode: str = "zeros") -> None:
        super().__init__()
        if depth not in LOCAL_DEPTHS:
            raise UsageError(f"local network depth must be one of {sorted(LOCAL_DEPTHS)}, got {depth}")
        if int(width) < 1:
            raise UsageError(f"local network width must be a positive integer, got {width}")
        if padding_mode not in PADDING_MODES:
            raise UsageError(f"local network padding_mode must be one of {PADDING_MODES}, got {padding_mode!r}")
        self.conv1 = nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False, padding_mode=padding_mode)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        widths = [width * m for m in (1, 2, 4, 8)]
        in_planes = width
        for i, (w, n) in enumerate(zip(widths, LOCAL_DEPTHS[depth])):
            self.add_module(
                f"layer{i + 1}",
                nn.Sequential(*[BasicBlock(in_planes if j == 0 else w, w, padding_mode) for j in range(n)]),
            )
            in_planes = w
        self.out_channels = in_planes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))


def _recompute_keeps_bn_statistics(modules: tuple[nn.Module, ...]):
    """``context_fn`` for ``torch.utils.checkpoint`` that does not update BN statistics twice."""

    @contextlib.contextmanager
    def recompute():
        norms = [m for module in modules for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        saved = [
            (m, m.momentum, None if m.num_batches_tracked is None else m.num_batches_tracked.clone()) for m in norms
        ]
        for m in norms:
            m.momentum = 0.0
        try:
            yield
        finally:
            for m, momentum, tracked in saved:
                m.momentum = momentum
                if tracked is not None:
                    m.num_batches_tracked.copy_(tracked)

    return lambda: (contextlib.nullcontext(), recompute())


class LocalNetwork(nn.Module):
    """GLAM's local module: patch saliency maps A_k and patch representations z_k.

    Args:
        num_classes: saliency channels (benign, malignant).
        depth: 18 or 34 (ResNet-34-HR in the paper).
        width: first-layer width (64 in the paper).
        activation_checkpointing: recompute the activations in the backward pass (half the memory per patch).
        padding_mode: ``"zeros"`` (the paper's) or ``"replicate"``: zeros mark the patch's border, from which the
            network can learn where in the patch it is rather than what the patch shows (:class:`ResNetHR`).

    Forward: patches (N, 1, p, p) -> ``patch_maps`` (N, 2, p/4, p/4) in [0, 1] and ``patch_features``
    (N, 8 * width).
    """

    def __init__(
        self,
        num_classes: int = 2,
        depth: int = 34,
        width: int = 64,
        activation_checkpointing: bool = False,
        padding_mode: str = "zeros",
    ) -> None:
        super().__init__()
        self.dn_resnet = ResNetHR(depth=depth, width=width, padding_mode=padding_mode)
        self.gn_conv_last = nn.Conv2d(self.dn_resnet.out_channels, num_classes, 1, bias=False)
        self.representation_size = self.dn_resnet.out_channels
        self.activation_checkpointing = bool(activation_checkpointing)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():
            if self.activation_checkpointing and self.training and torch.is_grad_enabled():
                return self._checkpointed_features(x)
        return self.dn_resnet(x)

    def _checkpointed_features(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        net = self.dn_resnet
        # the stem (the largest maps) and every residual block
        segments = [(self._stem, (net.conv1, net.bn1))]
        segments += [(block, (block,)) for layer in (net.layer1, net.layer2, net.layer3, net.layer4) for block in layer]
        for fn, modules in segments:
            x = checkpoint(fn, x, use_reentrant=False, context_fn=_recompute_keeps_bn_statistics(modules))
        return x

    def _stem(self, x: torch.Tensor) -> torch.Tensor:
        net = self.dn_resnet
        return net.maxpool(net.relu(net.bn1(net.conv1(x))))

    def fuse_batchnorm(self) -> LocalNetwork:
        """Fold every batch norm into the convolution before it, in place (eval mode, after loading weights)."""
        if self.training:
            raise UsageError("fuse_batchnorm is for inference: call .eval() first")
        net = self.dn_resnet
        net.conv1, net.bn1 = fuse_conv_bn_eval(net.conv1, net.bn1), nn.Identity()
        for block in (b for layer in (net.layer1, net.layer2, net.layer3, net.layer4) for b in layer):
            block.conv1, block.bn1 = fuse_conv_bn_eval(block.conv1, block.bn1), nn.Identity()
            block.conv2, block.bn2 = fuse_conv_bn_eval(block.conv2, block.bn2), nn.Identity()
            if block.downsample is not None:
                block.downsample = nn.Sequential(fuse_conv_bn_eval(block.downsample[0], block.downsample[1]))
        return self

    def forward(self, patches: torch.Tensor) -> dict[str, torch.Tensor]:
        features = self._features(patches.expand(-1, 3, -1, -1))
        return {
            OutputKey.PATCH_MAPS.value: torch.sigmoid(self.gn_conv_last(features).float()),
            OutputKey.PATCH_FEATURES.value: features.mean(dim=(-2, -1)),
        }
