"""Models, sized from the split's config (input shape, class count), and the head/base contract.

Contract: every model's classifier is the attribute ``fc`` and ``forward`` returns raw logits (no
log-softmax), so ``split_head`` can cut any model into a feature extractor and a head, and the loss is
always cross-entropy on logits.
"""
from __future__ import annotations

import copy

import torch
from torch import nn


class FedAvgCNN(nn.Module):
    """The 4-layer CNN of McMahan et al. (AISTATS 2017) as PFLlib sizes it: conv 5x5 (32) -> pool ->
    conv 5x5 (64) -> pool -> fc 512 -> fc C. The flattened size follows the input: 1024 for 28x28,
    1600 for 32x32. Inputs too small for two unpadded 5x5 convolutions (the 8x8 Digits) use 'same'
    padding (2), giving 256 for 8x8, so the default model fits every bundled dataset."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, hw: tuple[int, int] = (28, 28),
                 hidden: int = 512):
        super().__init__()
        pad = 0 if min(hw) >= 16 else 2
        side = [s for s in hw]
        for _ in range(2):
            side = [(s + 2 * pad - 4) // 2 for s in side]
        self.conv1 = nn.Sequential(nn.Conv2d(in_channels, 32, 5, padding=pad), nn.ReLU(inplace=True),
                                   nn.MaxPool2d(2))
        self.conv2 = nn.Sequential(nn.Conv2d(32, 64, 5, padding=pad), nn.ReLU(inplace=True), nn.MaxPool2d(2))
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


class BaseHeadSplit(nn.Module):
    """``head(base(x))``: the same network cut at its classifier, for algorithms that treat the feature
    extractor (``base``) and the classifier (``head``) differently (FedRep, FedPer, ...). Parameter names
    become ``base.*`` and ``head.*``."""

    def __init__(self, base: nn.Module, head: nn.Module):
        super().__init__()
        self.base, self.head = base, head

    def forward(self, x):
        return self.head(self.base(x))


def split_head(model: nn.Module) -> BaseHeadSplit:
    """A copy of ``model`` cut into base and head at its ``fc`` attribute (the contract above)."""
    if not isinstance(getattr(model, "fc", None), nn.Module):
        raise TypeError(f"{type(model).__name__} has no classifier attribute 'fc'; cannot split its head")
    base = copy.deepcopy(model)
    head = base.fc
    base.fc = nn.Identity()
    return BaseHeadSplit(base, head)


MODELS = ("CNN", "DNN", "fastText", "ResNet18")


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, feature_dim: int = 512,
                vocab_size: int = 80) -> nn.Module:
    """Model ``name`` for data of ``input_shape`` (C,H,W images or D vectors) and ``num_classes``.
    ``auto`` picks the CNN for images and the DNN for vectors."""
    image = len(input_shape) == 3
    if name == "auto":
        name = "CNN" if image else "DNN"
    if name in ("CNN", "ResNet18") and not image:
        raise ValueError(f"-m {name} needs image data (C,H,W) but the split holds vectors of shape "
                         f"{list(input_shape)}; use -m DNN")
    if name == "CNN":
        return FedAvgCNN(input_shape[0], num_classes, tuple(input_shape[1:]), hidden=feature_dim)
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


def set_memory_format(model: nn.Module, memory_format: str, device: torch.device) -> nn.Module:
    """Lay ``model``'s 4-d (convolution) weights out as ``--memory_format`` says, in place; ``auto`` is
    channels-last on a CPU (oneDNN's channels-last convolutions and pooling are several times faster
    there than its default layout's; measured in docs/performance.md) and contiguous elsewhere. The
    function is the same either way; every later in-place update and copy keeps the layout, and a model
    copied from this one (``copy.deepcopy``) inherits it."""
    if memory_format == "auto":
        memory_format = "channels_last" if device.type == "cpu" else "contiguous"
    fmt = torch.channels_last if memory_format == "channels_last" else torch.contiguous_format
    if any(p.dim() == 4 for p in model.parameters()):
        model.to(memory_format=fmt)
    return model


def layer_groups(model: nn.Module) -> list[list[str]]:
    """Parameter names grouped into the paper's "layers", bottom to top: a layer is a module that owns
    parameters directly (conv, linear, norm), except that a residual block (anything with a
    ``downsample`` attribute, i.e. torchvision's BasicBlock/Bottleneck) counts as one layer."""
    groups: list[list[str]] = []
    claimed: set[str] = set()
    for mname, mod in model.named_modules():
        prefix = f"{mname}." if mname else ""
        if hasattr(mod, "downsample"):
            names = [prefix + n for n, _ in mod.named_parameters()]
        else:
            names = [prefix + n for n, _ in mod.named_parameters(recurse=False)]
        names = [n for n in names if n not in claimed]
        if names:
            groups.append(names)
            claimed.update(names)
    order = {n: i for i, (n, _) in enumerate(model.named_parameters())}
    groups.sort(key=lambda g: order[g[0]])
    return groups
