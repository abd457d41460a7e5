"""Models, sized from the split's config (input shape, class count), and the head/base contract.

Contract: every model's classifier is the attribute ``fc`` and ``forward`` returns raw logits (no
log-softmax), so ``parts.split_head`` can cut any model into a feature extractor and a head, and the
loss is always cross-entropy on logits. Helpers that cut models into layers, head and body live beside
this file in ``parts.py``.
"""
from __future__ import annotations

import torch
from torch import nn


class FedAvgCNN(nn.Module):
    """The 4-layer CNN of McMahan et al. (AISTATS 2017) as PFLlib sizes it: conv 5x5 (32) -> pool ->
    conv 5x5 (64) -> pool -> fc 512 -> fc C. The flattened size follows the input: 1024 for 28x28,
    1600 for 32x32. Inputs too small for two unpadded 5x5 convolutions (the 8x8 Digits) use 'same'
    padding (2), giving 256 for 8x8, so the default model fits every bundled dataset. ``batch_norm``
    (``-m BNCNN``) adds BatchNorm after each convolution, the model FedBN-style methods need."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, hw: tuple[int, int] = (28, 28),
                 hidden: int = 512, batch_norm: bool = False):
        super().__init__()
        pad = 0 if min(hw) >= 16 else 2
        side = [s for s in hw]
        for _ in range(2):
            side = [(s + 2 * pad - 4) // 2 for s in side]

        def block(cin: int, cout: int) -> nn.Sequential:
            norm = [nn.BatchNorm2d(cout)] if batch_norm else []
            return nn.Sequential(nn.Conv2d(cin, cout, 5, padding=pad), *norm, nn.ReLU(inplace=True), nn.MaxPool2d(2))

        self.conv1 = block(in_channels, 32)
        self.conv2 = block(32, 64)
        self.fc1 = nn.Sequential(nn.Linear(64 * side[0] * side[1], hidden), nn.ReLU(inplace=True))
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.fc(self.fc1(torch.flatten(self.conv2(self.conv1(x)), 1)))


class DNN(nn.Module):
    """Two-layer MLP (PFLlib's DNN): flatten -> Linear(in, hidden) -> ReLU -> Linear(hidden, C)."""

    def __init__(self, in_features: int, num_classes: int = 10, hidden: int = 100):
        super().__init__()
        self.fc1 = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(inplace=True))
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.fc(self.fc1(x))


class FastText(nn.Module):
    """fastText (Joulin et al., EACL 2017): mean of token embeddings (EmbeddingBag) -> linear classifier.
    Input: int64 token ids, N x L, padded with ``padding_idx``."""

    def __init__(self, vocab_size: int, num_classes: int, hidden: int = 32, padding_idx: int = 0):
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, hidden, mode="mean", padding_idx=padding_idx)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.fc(self.embedding(x))


def resnet18(in_channels: int, num_classes: int) -> nn.Module:
    """torchvision's ResNet-18 with ``num_classes`` outputs (ImageNet stem kept, as the FedALA paper and
    PFLlib use it on 32x32/64x64 inputs); the first convolution takes ``in_channels``."""
    from torchvision.models import resnet18 as tv_resnet18

    m = tv_resnet18(weights=None, num_classes=num_classes)
    if in_channels != 3:
        m.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return m


MODELS = ("CNN", "BNCNN", "DNN", "fastText", "ResNet18")


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, feature_dim: int = 512,
                vocab_size: int = 80) -> nn.Module:
    """Model ``name`` for data of ``input_shape`` (C,H,W images or D vectors) and ``num_classes``.
    ``auto`` picks the CNN for images and the DNN for vectors."""
    image = len(input_shape) == 3
    if name == "auto":
        name = "CNN" if image else "DNN"
    if name in ("CNN", "BNCNN", "ResNet18") and not image:
        raise ValueError(f"-m {name} needs image data (C,H,W) but the split holds vectors of shape "
                         f"{list(input_shape)}; use -m DNN")
    if name in ("CNN", "BNCNN"):
        return FedAvgCNN(input_shape[0], num_classes, tuple(input_shape[1:]), hidden=feature_dim,
                         batch_norm=name == "BNCNN")
    if name == "DNN":
        n = 1
        for s in input_shape:
            n *= s
        return DNN(n, num_classes)
    if name == "fastText":
        return FastText(vocab_size, num_classes)
    if name == "ResNet18":
        return resnet18(input_shape[0], num_classes)
    raise ValueError(f"unknown model '{name}'; choose one of: auto, {', '.join(MODELS)}")


def set_device_layout(model: nn.Module, device: torch.device) -> nn.Module:
    """Lay ``model``'s 4-d (convolution) weights out channels-last on a CPU, in place: oneDNN's
    channels-last convolution and pooling kernels are several times faster there than the default
    layout's (docs/performance.md). Elsewhere the default layout stays. The function is the same either
    way; every later in-place update and copy keeps the layout, and a copy of the model inherits it."""
    if device.type == "cpu" and any(p.dim() == 4 for p in model.parameters()):
        model.to(memory_format=torch.channels_last)
    return model
