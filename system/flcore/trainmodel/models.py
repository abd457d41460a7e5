"""Models, sized from the split's config (input shape, class count, modality), and the head/base contract.

Contract: every model's classifier is the attribute ``fc`` and ``forward`` returns raw logits (no
log-softmax), so ``parts.split_head`` can cut any model into a feature extractor and a head, and the
loss is always cross-entropy on logits. Helpers that cut models into layers, head and body live beside
this file in ``parts.py``; the text models in ``text_models.py``.

``-m`` takes PFLlib's names (``MODEL_SPECS``; ``ALIASES`` adds the class names). ``build_model`` reads the
split's config: its ``modality`` ("image" C x H x W, "text" int64 token ids L, "vector" D, "series"
C x 1 x T), ``vocab_size`` and ``default_model`` (what ``-m auto`` picks). The torchvision models are
built with ``weights=None``; their first convolution takes the split's C channels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from flcore.trainmodel.names import ALIASES, MODELS  # noqa: F401 - re-exported
from flcore.trainmodel.text_models import BiLSTM, FastText, LSTMNet, TextCNN, TransformerClassifier
from utils.errors import FLError

IMAGE, TEXT, VECTOR, SERIES = "image", "text", "vector", "series"
MODALITIES = (IMAGE, TEXT, VECTOR, SERIES)
FEATURE_DIM = 512  # -fd's default (PFLlib's); models that -fd does not size refuse any other value


class ModelError(FLError, ValueError):
    """A model that cannot take the split's data, or an unknown model: one line saying what would work."""


# ---- small models of PFLlib's models.py, on the head contract -----------------------------------------------
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


class SmallCNN(nn.Module):
    """A plain CNN of ``depth`` blocks (3x3 convolution with 'same' padding, ``width`` * 2^i channels in block
    i -> ReLU -> 2x2 max-pool) -> fc1 (flat -> ``hidden``, ReLU) -> fc. ``-m CNN1`` (one block of 16) and
    ``-m CNN3`` (three blocks, 32-64-128) are the shallow and the deep neighbours of the 4-layer CNN in the
    heterogeneous-model presets (``assign.PRESETS``); ``-fd`` sets ``hidden``. Every side of 8 or more works."""

    def __init__(self, shape: tuple[int, int, int], num_classes: int, depth: int, width: int, hidden: int = 512):
        super().__init__()
        blocks, cin = [], shape[0]
        for i in range(depth):
            cout = width * 2 ** i
            blocks += [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            cin = cout
        self.features = nn.Sequential(*blocks)
        self.fc1 = nn.Sequential(nn.Linear(_flat(self.features, shape), hidden), nn.ReLU(inplace=True))
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.fc(self.fc1(torch.flatten(self.features(x), 1)))


class MclrLogistic(nn.Module):
    """Multinomial logistic regression (PFLlib's Mclr_Logistic, ``-m MLR``): flatten -> fc. Convex."""

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.fc = nn.Linear(in_features, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(x, 1))


class DNN(nn.Module):
    """Two-layer MLP (PFLlib's DNN): flatten -> Linear(in, hidden) -> ReLU -> Linear(hidden, C). Hidden
    width 100 (PFLlib: 100 on MNIST/Cifar10, 20 on every other dataset)."""

    def __init__(self, in_features: int, num_classes: int = 10, hidden: int = 100):
        super().__init__()
        self.fc1 = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(inplace=True))
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.fc(self.fc1(x))


class FedAvgMLP(DNN):
    """PFLlib's FedAvgMLP: flatten -> Linear(in, 200) -> ReLU -> fc (PFLlib's ``fc2``). One hidden layer of
    200, as PFLlib has it (the FedAvg paper's 2NN has two)."""

    def __init__(self, in_features: int, num_classes: int = 10, hidden: int = 200):
        super().__init__(in_features, num_classes, hidden)


def _flat(features: nn.Module, shape: tuple[int, ...]) -> int:
    """Size of ``features``' flattened output for one input of ``shape`` (one eval-mode pass; the module's
    mode is restored)."""
    was = features.training
    with torch.no_grad():
        n = int(torch.flatten(features.eval()(torch.zeros(1, *shape)), 1).shape[1])
    features.train(was)
    return n


def _xavier(m: nn.Linear) -> nn.Linear:
    nn.init.xavier_normal_(m.weight)
    nn.init.zeros_(m.bias)
    return m


class LeNet(nn.Module):
    """PFLlib's LeNet (from SHOT, Liang et al. ICML 2020): conv 5x5 (20) -> pool -> ReLU -> conv 5x5 (50)
    -> dropout2d 0.5 -> pool -> ReLU -> bottleneck Linear(flat, 256) -> BatchNorm1d -> dropout 0.5 -> fc.
    The flattened size follows the input (800 for 28x28); images need sides of at least 16."""

    def __init__(self, shape: tuple[int, int, int], num_classes: int, bottleneck: int = 256):
        super().__init__()
        self.conv_params = nn.Sequential(
            nn.Conv2d(shape[0], 20, 5), nn.MaxPool2d(2), nn.ReLU(),
            nn.Conv2d(20, 50, 5), nn.Dropout2d(0.5), nn.MaxPool2d(2), nn.ReLU())
        # registered bottleneck before bn, so parts.layer_groups joins the BatchNorm to the bottleneck
        self.bottleneck = _xavier(nn.Linear(_flat(self.conv_params, shape), bottleneck))
        self.bn = nn.BatchNorm1d(bottleneck)
        self.dropout = nn.Dropout(0.5)
        self.fc = _xavier(nn.Linear(bottleneck, num_classes))

    def forward(self, x):
        return self.fc(self.dropout(self.bn(self.bottleneck(torch.flatten(self.conv_params(x), 1)))))


class Digit5CNN(nn.Module):
    """PFLlib's Digit5CNN (from KD3A): three conv 5x5 (64, 64, 128) + BatchNorm + ReLU, two max-pools ->
    Linear(flat, 3072) + BN + ReLU + dropout -> Linear(3072, 2048) + BN + ReLU -> fc. flat = 8192 on
    32x32; PFLlib fixes 10 classes, here they follow the split."""

    def __init__(self, shape: tuple[int, int, int], num_classes: int):
        super().__init__()
        enc = nn.Sequential()
        for i, (cin, cout) in enumerate([(shape[0], 64), (64, 64), (64, 128)], 1):
            enc.add_module(f"conv{i}", nn.Conv2d(cin, cout, 5, padding=2))
            enc.add_module(f"bn{i}", nn.BatchNorm2d(cout))
            enc.add_module(f"relu{i}", nn.ReLU())
            if i < 3:
                enc.add_module(f"maxpool{i}", nn.MaxPool2d(3, stride=2, padding=1))
        self.encoder = enc
        self.linear = nn.Sequential()
        self.linear.add_module("fc1", nn.Linear(_flat(enc, shape), 3072))
        self.linear.add_module("bn4", nn.BatchNorm1d(3072))
        self.linear.add_module("relu4", nn.ReLU())
        self.linear.add_module("dropout", nn.Dropout())
        self.linear.add_module("fc2", nn.Linear(3072, 2048))
        self.linear.add_module("bn5", nn.BatchNorm1d(2048))
        self.linear.add_module("relu5", nn.ReLU())
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x):
        return self.fc(self.linear(torch.flatten(self.encoder(x), 1)))


class AmazonMLP(nn.Module):
    """PFLlib's AmazonMLP (from KD3A) for bag-of-words vectors: D -> 1000 -> 500 -> 100 (ReLU each) -> fc.
    PFLlib fixes D = 5000 and 2 classes; here both follow the split."""

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(in_features, 1000), nn.ReLU(), nn.Linear(1000, 500), nn.ReLU(),
                                     nn.Linear(500, 100), nn.ReLU())
        self.fc = nn.Linear(100, num_classes)

    def forward(self, x):
        return self.fc(self.encoder(x))


class HARCNN(nn.Module):
    """PFLlib's HARCNN (from jindongwang/Deep-learning-activity-recognition) for sensor series C x 1 x T:
    two conv (1x9) (32, 64) + ReLU + max-pool (1x2, stride 2) -> fc, a 3-layer MLP head (flat -> 1024 ->
    512 -> C). flat = 64 * T'' follows T: 1664 for HAR (T = 128), 3712 for PAMAP2 (T = 256)."""

    def __init__(self, shape: tuple[int, int, int], num_classes: int, kernel=(1, 9), pool=(1, 2)):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(shape[0], 32, kernel), nn.ReLU(), nn.MaxPool2d(pool, stride=2))
        self.conv2 = nn.Sequential(nn.Conv2d(32, 64, kernel), nn.ReLU(), nn.MaxPool2d(pool, stride=2))
        flat = _flat(nn.Sequential(self.conv1, self.conv2), shape)
        self.fc = nn.Sequential(nn.Linear(flat, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                                nn.Linear(512, num_classes))

    def forward(self, x):
        return self.fc(torch.flatten(self.conv2(self.conv1(x)), 1))


# ---- torchvision models (weights=None), classifier exposed as ``fc`` ------------------------------------------
def _recolour(conv: nn.Conv2d, in_channels: int) -> nn.Conv2d:
    """``conv`` taking ``in_channels`` inputs (same shape otherwise, torchvision's Kaiming init)."""
    if conv.in_channels == in_channels:
        return conv
    new = nn.Conv2d(in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                    bias=conv.bias is not None)
    nn.init.kaiming_normal_(new.weight, mode="fan_out", nonlinearity="relu")
    if new.bias is not None:
        nn.init.zeros_(new.bias)
    return new


def resnet(depth: int, in_channels: int, num_classes: int) -> nn.Module:
    """torchvision's ResNet-10/18/34 with ``num_classes`` outputs (ImageNet stem kept, as the FedALA paper and
    PFLlib use it on 32x32/64x64 inputs); the first convolution takes ``in_channels``. ResNet-10 is
    torchvision's ResNet with one BasicBlock per stage (PFLlib's resnet10)."""
    from torchvision.models import resnet18 as tv18, resnet34 as tv34
    from torchvision.models.resnet import BasicBlock, ResNet

    if depth == 10:
        m = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=num_classes)
    else:
        m = {18: tv18, 34: tv34}[depth](weights=None, num_classes=num_classes)
    m.conv1 = _recolour(m.conv1, in_channels)
    return m


def resnet18(in_channels: int, num_classes: int) -> nn.Module:
    return resnet(18, in_channels, num_classes)


class AlexNet(nn.Module):
    """torchvision's AlexNet (Krizhevsky 2014, "One weird trick") with its last Linear as ``fc``, as PFLlib
    lays it out: features -> adaptive avg-pool 6x6 -> classifier (dropout, 9216 -> 4096, ReLU, dropout,
    4096 -> 4096, ReLU) -> fc. Its stem (11x11 stride 4, three max-pools) needs sides of at least 63."""

    def __init__(self, in_channels: int, num_classes: int):
        super().__init__()
        from torchvision.models import alexnet

        tv = alexnet(weights=None, num_classes=num_classes)
        tv.features[0] = _recolour(tv.features[0], in_channels)
        self.features, self.avgpool = tv.features, tv.avgpool
        self.classifier, self.fc = tv.classifier[:-1], tv.classifier[-1]

    def forward(self, x):
        return self.fc(self.classifier(torch.flatten(self.avgpool(self.features(x)), 1)))


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 (Sandler et al., CVPR 2018) as PFLlib lays it out: features -> global
    avg-pool -> dropout 0.2 -> fc (1280 -> C)."""

    def __init__(self, in_channels: int, num_classes: int):
        super().__init__()
        from torchvision.models import mobilenet_v2

        tv = mobilenet_v2(weights=None, num_classes=num_classes)
        tv.features[0][0] = _recolour(tv.features[0][0], in_channels)
        self.features = tv.features
        self.dropout, self.fc = tv.classifier[0], tv.classifier[1]

    def forward(self, x):
        return self.fc(self.dropout(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1)))


def googlenet(in_channels: int, num_classes: int) -> nn.Module:
    """torchvision's GoogLeNet (Szegedy et al., CVPR 2015) without auxiliary classifiers, as PFLlib builds
    it; its classifier is already ``fc``."""
    from torchvision.models import googlenet as tv_googlenet

    m = tv_googlenet(weights=None, aux_logits=False, init_weights=True, num_classes=num_classes)
    m.conv1.conv = _recolour(m.conv1.conv, in_channels)
    return m


# ---- the registry -------------------------------------------------------------------------------------------
def _numel(shape) -> int:
    return math.prod(shape)


@dataclass(frozen=True)
class ModelSpec:
    build: Callable[..., nn.Module]  # (input_shape, num_classes, feature_dim, vocab_size) -> model
    data: tuple[str, ...]  # the modalities it takes
    sized_by_fd: bool = False  # whether -fd sets a width
    source: str = ""


MODEL_SPECS: dict[str, ModelSpec] = {
    "MLR": ModelSpec(lambda s, k, fd, v: MclrLogistic(_numel(s), k), (IMAGE, VECTOR, SERIES), source="PFLlib Mclr_Logistic"),
    "DNN": ModelSpec(lambda s, k, fd, v: DNN(_numel(s), k), (IMAGE, VECTOR, SERIES), source="PFLlib DNN"),
    "FedAvgMLP": ModelSpec(lambda s, k, fd, v: FedAvgMLP(_numel(s), k), (IMAGE, VECTOR, SERIES), source="PFLlib FedAvgMLP"),
    "CNN": ModelSpec(lambda s, k, fd, v: FedAvgCNN(s[0], k, tuple(s[1:]), hidden=fd), (IMAGE,), True, "PFLlib FedAvgCNN"),
    "CNN1": ModelSpec(lambda s, k, fd, v: SmallCNN(s, k, 1, 16, fd), (IMAGE,), True, "one-convolution CNN"),
    "CNN3": ModelSpec(lambda s, k, fd, v: SmallCNN(s, k, 3, 32, fd), (IMAGE,), True, "three-convolution CNN"),
    "BNCNN": ModelSpec(lambda s, k, fd, v: FedAvgCNN(s[0], k, tuple(s[1:]), hidden=fd, batch_norm=True), (IMAGE,), True,
                       "FedAvgCNN + BatchNorm (FedBN)"),
    "LeNet": ModelSpec(lambda s, k, fd, v: LeNet(s, k), (IMAGE,), source="PFLlib LeNet"),
    "Digit5CNN": ModelSpec(lambda s, k, fd, v: Digit5CNN(s, k), (IMAGE,), source="PFLlib Digit5CNN"),
    "ResNet10": ModelSpec(lambda s, k, fd, v: resnet(10, s[0], k), (IMAGE,), source="torchvision ResNet, [1,1,1,1]"),
    "ResNet18": ModelSpec(lambda s, k, fd, v: resnet(18, s[0], k), (IMAGE,), source="torchvision resnet18"),
    "ResNet34": ModelSpec(lambda s, k, fd, v: resnet(34, s[0], k), (IMAGE,), source="torchvision resnet34"),
    "AlexNet": ModelSpec(lambda s, k, fd, v: AlexNet(s[0], k), (IMAGE,), source="torchvision alexnet"),
    "MobileNet": ModelSpec(lambda s, k, fd, v: MobileNetV2(s[0], k), (IMAGE,), source="torchvision mobilenet_v2"),
    "GoogleNet": ModelSpec(lambda s, k, fd, v: googlenet(s[0], k), (IMAGE,), source="torchvision googlenet"),
    "fastText": ModelSpec(lambda s, k, fd, v: FastText(v, k, fd), (TEXT,), True, "PFLlib fastText"),
    "TextCNN": ModelSpec(lambda s, k, fd, v: TextCNN(v, k, fd, s[0]), (TEXT,), True, "PFLlib TextCNN"),
    "LSTM": ModelSpec(lambda s, k, fd, v: LSTMNet(v, k, fd), (TEXT,), True, "PFLlib LSTMNet"),
    "BiLSTM": ModelSpec(lambda s, k, fd, v: BiLSTM(v, k, fd), (TEXT,), True, "PFLlib BiLSTM_TextClassification"),
    "Transformer": ModelSpec(lambda s, k, fd, v: TransformerClassifier(v, k, fd, s[0]), (TEXT,), True,
                             "PFLlib TransformerModel"),
    "AmazonMLP": ModelSpec(lambda s, k, fd, v: AmazonMLP(_numel(s), k), (VECTOR,), source="PFLlib AmazonMLP"),
    "HARCNN": ModelSpec(lambda s, k, fd, v: HARCNN(s, k), (SERIES,), source="PFLlib HARCNN"),
}
AUTO = {TEXT: "fastText", SERIES: "HARCNN", VECTOR: "DNN", IMAGE: "CNN"}  # -m auto without a default_model


def modality_of(input_shape: tuple[int, ...], config: dict | None = None, name: str = "auto") -> str:
    """The split's modality: its config's ``modality`` when given; otherwise read from the shape (C x H x W
    is an image, D a vector), or, for a model that takes text (a 1-d shape) or series (C x 1 x T), that."""
    given = (config or {}).get("modality")
    if given is not None:
        if given not in MODALITIES:
            raise ModelError(f"the split's modality '{given}' is not one of {', '.join(MODALITIES)}")
        return given
    if len(input_shape) == 1:
        candidates = (VECTOR, TEXT)
    elif len(input_shape) == 3:
        candidates = (IMAGE, SERIES) if input_shape[1] == 1 else (IMAGE,)
    else:
        raise ModelError(f"inputs of shape {list(input_shape)} are neither images (C,H,W) nor vectors (D)")
    spec = MODEL_SPECS.get(ALIASES.get(name, name))
    return next((m for m in candidates if spec is not None and m in spec.data), candidates[0])


def resolve(name: str, input_shape: tuple[int, ...], config: dict | None = None) -> str:
    """The registered model ``-m name`` means for this split (``auto``: the config's ``default_model``,
    else by modality)."""
    if name == "auto":
        default = (config or {}).get("default_model")
        name = default if default is not None else AUTO[modality_of(input_shape, config)]
    name = ALIASES.get(name, name)
    if name not in MODEL_SPECS:
        raise ModelError(f"unknown model '{name}'; choose one of: auto, {', '.join(MODELS)}")
    return name


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, feature_dim: int = FEATURE_DIM,
                vocab_size: int = 80, config: dict | None = None) -> nn.Module:
    """Model ``name`` (``-m``) for data of ``input_shape`` and ``num_classes``, sized from the split's
    ``config`` (modality, vocab_size; see the module docstring). ``feature_dim`` is ``-fd``: the text models'
    embedding/hidden width (PFLlib's meaning) and the CNN's fc1 width. A model that cannot take the data
    raises ModelError (an FLError and a ValueError) with one line saying what would.

    >>> type(build_model("auto", (1, 28, 28), 10)).__name__
    'FedAvgCNN'
    """
    shape = tuple(int(s) for s in input_shape)
    name = resolve(name, shape, config)
    spec = MODEL_SPECS[name]
    modality = modality_of(shape, config, name)
    if modality not in spec.data:
        raise ModelError(f"-m {name} takes {'/'.join(spec.data)} data, but the split holds {modality} data of shape "
                         f"{list(shape)}; use -m {AUTO[modality]} (or -m auto)")
    if modality == SERIES and (len(shape) != 3 or shape[1] != 1):
        raise ModelError(f"-m {name} takes series of shape C x 1 x T, got {list(shape)}")
    if feature_dim != FEATURE_DIM and not spec.sized_by_fd:
        sized = ", ".join(n for n, s in MODEL_SPECS.items() if s.sized_by_fd)
        raise ModelError(f"-fd {feature_dim}: -m {name} has fixed widths; -fd sizes only {sized}")
    vocab = int((config or {}).get("vocab_size", vocab_size))
    try:
        model = spec.build(shape, num_classes, feature_dim, vocab)
        model.train()
        _probe(model, shape, modality)
    except ValueError as e:  # a builder's own check (TextCNN's text length, the Transformer's heads)
        raise ModelError(f"-m {name}: {e}") from None
    except RuntimeError as e:  # the probe: a layer's output shrank to nothing
        first = str(e).strip().splitlines()[0]
        raise ModelError(f"-m {name} cannot take inputs of shape {list(shape)} ({first}); use larger inputs "
                         f"or -m {AUTO[modality]}") from None
    return model


class ProjectedModel(nn.Module):
    """``fc(proj(body(x)))``: a model whose classifier does not take ``-fd`` features, cut below it (``body``,
    its ``fc`` replaced by the identity), then a projection ``proj`` (Linear(width, fd) + ReLU, as the
    CNN's fc1) and a new classifier ``fc`` (Linear(fd, C)), so that it exposes features of the common width
    (``build_client_model``)."""

    def __init__(self, body: nn.Module, width: int, feature_dim: int, num_classes: int):
        super().__init__()
        self.body = body
        self.proj = nn.Sequential(nn.Linear(width, feature_dim), nn.ReLU(inplace=True))
        self.fc = nn.Linear(feature_dim, num_classes)

    def forward(self, x):
        return self.fc(self.proj(self.body(x)))


def build_client_model(name: str, input_shape: tuple[int, ...], num_classes: int, feature_dim: int = FEATURE_DIM,
                       vocab_size: int = 80, config: dict | None = None) -> nn.Module:
    """``--client_models``: model ``name`` with its classifier ``fc`` a Linear(``feature_dim``, C), so every
    client's features have one width whatever its architecture. A model that ``-fd`` sizes is built at
    ``feature_dim`` (the CNNs' fc1, the text models' width); one whose classifier still takes another width
    (ResNet's 512 at another -fd, MobileNetV2's 1280, TextCNN's 300, HARCNN's MLP head) becomes a
    ``ProjectedModel``: its body, a projection to ``feature_dim`` and a new ``fc``."""
    shape = tuple(int(s) for s in input_shape)
    spec_name = resolve(name, shape, config)
    spec = MODEL_SPECS[spec_name]
    model = build_model(name, shape, num_classes, feature_dim if spec.sized_by_fd else FEATURE_DIM, vocab_size, config)
    head = model.fc
    if isinstance(head, nn.Linear) and head.in_features == feature_dim:
        return model
    model.fc = nn.Identity()
    x = torch.zeros(1, *shape, dtype=torch.long if modality_of(shape, config, spec_name) == TEXT else torch.float32)
    with torch.no_grad():
        width = int(torch.flatten(model.eval()(x), 1).shape[1])
    model.train()
    return ProjectedModel(model, width, feature_dim, num_classes)


def _probe(model: nn.Module, shape: tuple[int, ...], modality: str) -> None:
    """One eval-mode forward of a zero input, so a model too small for its inputs fails here with its shapes."""
    x = torch.zeros(1, *shape, dtype=torch.long if modality == TEXT else torch.float32)
    with torch.no_grad():
        model.eval()
        try:
            model(x)
        finally:
            model.train()


def set_device_layout(model: nn.Module, device: torch.device) -> nn.Module:
    """Lay ``model``'s 4-d (convolution) weights out channels-last on a CPU, in place: oneDNN's
    channels-last convolution and pooling kernels are several times faster there than the default
    layout's (docs/performance.md). Elsewhere the default layout stays. The function is the same either
    way; every later in-place update and copy keeps the layout, and a copy of the model inherits it."""
    if device.type == "cpu" and any(p.dim() == 4 for p in model.parameters()):
        model.to(memory_format=torch.channels_last)
    return model
