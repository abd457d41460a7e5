"""Every model of the registry on every input shape it takes: built, one forward and one SGD step, the head
contract (``fc``, ``split_head``, ``layer_groups``); ``-m auto``; the text models' handling of padding; and
one end-to-end run on a text split written here."""
import json

import numpy as np
import pytest
import torch
from torch import nn

import main
from cli import parse_config
from conftest import cli
from flcore.trainmodel.models import MODEL_SPECS, Digit5CNN, HARCNN, ModelError, build_model, modality_of
from flcore.trainmodel.parts import head_of, layer_groups, split_head
from utils.results import read_h5

IMG8, IMG28, IMG32, TEXT, VEC, SERIES = (1, 8, 8), (1, 28, 28), (3, 32, 32), (16,), (20,), (9, 1, 128)
GRAY32, GRAY64 = (1, 32, 32), (1, 64, 64)  # the first convolution of a torchvision model re-made for 1 channel
MODALITY = {IMG8: "image", (3, 8, 8): "image", IMG28: "image", IMG32: "image", GRAY32: "image", GRAY64: "image", TEXT: "text", VEC: "vector",
            SERIES: "series"}
VOCAB, FD = 50, 32  # tiny text models: -fd 32 (the Transformer's 8 heads divide it)
# The big torchvision models on one shape each (32x32, AlexNet's smallest is 63), batch 2.
ZOO = {
    "MLR": [IMG8, IMG28, IMG32, VEC, SERIES], "DNN": [IMG8, IMG28, IMG32, VEC, SERIES],
    "FedAvgMLP": [IMG8, IMG32, VEC, SERIES], "CNN": [IMG8, IMG28, IMG32], "CNN1": [IMG8, IMG32],
    "CNN3": [IMG8, IMG28], "BNCNN": [IMG8, IMG32],
    "LeNet": [IMG28, IMG32], "Digit5CNN": [IMG8, (3, 8, 8)], "ResNet10": [IMG8, IMG32], "ResNet18": [IMG28],
    "ResNet34": [IMG32], "AlexNet": [GRAY64], "MobileNet": [GRAY32], "GoogleNet": [GRAY32],
    "fastText": [TEXT], "TextCNN": [TEXT], "LSTM": [TEXT], "BiLSTM": [TEXT], "Transformer": [TEXT],
    "AmazonMLP": [VEC], "HARCNN": [SERIES],
}
# The paper's "layers" (parts.layer_groups), counted by hand from each architecture; a normalisation layer
# joins the layer below it, a residual stage is one layer.
LAYERS = {
    "MLR": 1, "DNN": 2, "FedAvgMLP": 2, "CNN": 4, "BNCNN": 4, "CNN1": 3, "CNN3": 5,  # convs, fc1, fc
    "LeNet": 4,  # conv, conv, bottleneck (+ its BatchNorm1d), fc
    "Digit5CNN": 6,  # conv1..conv3 (+ BN each), linear.fc1 (+bn4), linear.fc2 (+bn5), fc
    "ResNet10": 6, "ResNet18": 6, "ResNet34": 6,  # stem, layer1..layer4, fc
    "AlexNet": 8,  # 5 convolutions, 2 hidden Linear, fc
    "fastText": 3, "TextCNN": 5, "LSTM": 3,  # the 2-layer LSTM is one module: one layer
    "BiLSTM": 5,  # embedding, forward LSTM, backward LSTM, fc1, fc
    "Transformer": 10,  # embedding, 2 x (attention in-proj, out-proj, linear1, linear2 + both LayerNorms), fc
    "AmazonMLP": 4, "HARCNN": 5,  # conv1, conv2, and the head's three Linear
}
CASES = [(name, shape) for name, shapes in ZOO.items() for shape in shapes]


def make(name, shape, classes=5):
    torch.manual_seed(0)
    fd = FD if MODEL_SPECS[name].sized_by_fd and MODALITY[shape] == "text" else 512
    return build_model(name, shape, classes, feature_dim=fd, config={"modality": MODALITY[shape], "vocab_size": VOCAB})


def inputs(shape, n=3):
    g = torch.Generator().manual_seed(1)
    if MODALITY[shape] == "text":
        x = torch.randint(1, VOCAB, (n, *shape), generator=g)
        x[0, 10:] = 0  # one right-padded text
        return x
    return torch.randn(n, *shape, generator=g)


def test_the_zoo_covers_every_registered_model_and_each_modality_it_takes():
    assert set(ZOO) == set(MODEL_SPECS)
    for name, spec in MODEL_SPECS.items():
        assert set(spec.data) == {MODALITY[s] for s in ZOO[name]}, name


@pytest.mark.parametrize("name,shape", CASES, ids=[f"{n}-{'x'.join(map(str, s))}" for n, s in CASES])
def test_model_builds_trains_and_keeps_the_head_contract(name, shape):
    model = make(name, shape)
    assert model.training  # build_model's size probe leaves it in training mode
    n = 2 if name in ("ResNet34", "AlexNet", "MobileNet", "GoogleNet") else 3
    x, y = inputs(shape, n), torch.arange(n) % 5
    # the head contract: the classifier is `fc`; base + head compute the same function
    assert head_of(model) is model.fc
    split = split_head(model).eval()
    with torch.no_grad():
        assert torch.allclose(model.eval()(x), split(x), atol=1e-5)
    model.train()
    # forward: raw logits of shape N x C (not log-probabilities: they do not sum to one)
    out = model(x)
    assert out.shape == (n, 5) and torch.isfinite(out).all()
    assert not torch.allclose(out.exp().sum(1), torch.ones(n), atol=1e-3)
    # one SGD step: every parameter gets a finite gradient, and the step moves each one whose gradient is
    # not zero (a bias right before a BatchNorm can have an exactly zero gradient: the norm cancels a shift),
    # the classifier's included
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    nn.functional.cross_entropy(out, y).backward()
    for k, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), k
    moved = {k for k, p in model.named_parameters() if p.grad.abs().sum() > 0}
    assert {f"fc.{k}" for k, _ in model.fc.named_parameters()} <= moved
    opt.step()
    assert [k for k, p in model.named_parameters() if k in moved and torch.equal(p, before[k])] == []
    # layer_groups: every parameter exactly once, bottom to top, the head's parameters last
    groups = layer_groups(model)
    names = [k for g in groups for k in g]
    assert sorted(names) == sorted(k for k, _ in model.named_parameters()) and len(set(names)) == len(names)
    convs = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    assert len(groups) == LAYERS.get(name, convs + 1)  # MobileNet, GoogleNet: each convolution, then fc
    assert all(k.startswith("fc.") for k in groups[-1])
    assert all(k.startswith("head.") for k in layer_groups(split)[-1])


def test_sizes_follow_pfllib():
    assert build_model("CNN", IMG28, 10).fc1[0].in_features == 1024  # PFLlib's dim for MNIST
    assert build_model("CNN", IMG32, 10).fc1[0].in_features == 1600  # and for Cifar10
    assert make("LeNet", IMG28).bottleneck.in_features == 50 * 4 * 4  # PFLlib's LeNet feature_dim
    assert Digit5CNN(IMG32, 10).linear.fc1.in_features == 8192  # PFLlib's Digit5CNN
    assert make("HARCNN", SERIES).fc[0].in_features == 1664  # HAR, T = 128
    assert HARCNN((9, 1, 256), 6).fc[0].in_features == 3712  # PAMAP2, T = 256
    assert set(layer_groups(make("LeNet", IMG28))[2]) == {"bottleneck.weight", "bottleneck.bias", "bn.weight", "bn.bias"}
    assert make("AmazonMLP", VEC).encoder[0].in_features == 20 and make("MobileNet", IMG32).fc.in_features == 1280
    assert make("AlexNet", GRAY64).fc.in_features == 4096 and make("MLR", IMG28).fc.in_features == 784


def test_fd_is_the_text_models_width_and_the_cnns_hidden_width():
    fast = build_model("fastText", TEXT, 4, feature_dim=24, config={"modality": "text"})
    assert (fast.embedding.embedding_dim, fast.fc1.in_features, fast.fc1.out_features) == (24, 24, 24)
    assert build_model("LSTM", TEXT, 4, feature_dim=24).lstm.hidden_size == 24
    assert build_model("BiLSTM", TEXT, 4, feature_dim=24).fc1.in_features == 48
    assert build_model("TextCNN", TEXT, 4, feature_dim=24).conv1[0].in_channels == 24
    assert build_model("Transformer", TEXT, 4, feature_dim=24).fc.in_features == 24
    assert build_model("CNN", IMG8, 4, feature_dim=24).fc.in_features == 24
    with pytest.raises(ModelError, match="-fd 24: -m ResNet18 has fixed widths"):
        build_model("ResNet18", IMG32, 4, feature_dim=24)


def test_auto_picks_the_splits_default_model_else_one_for_its_modality():
    def auto(shape, **config):
        return type(build_model("auto", shape, 3, config=config)).__name__

    assert auto(TEXT, modality="text") == "FastText"
    assert auto(SERIES, modality="series") == "HARCNN"
    assert auto(VEC, modality="vector") == "DNN" and auto(VEC) == "DNN"
    assert auto(IMG8, modality="image") == "FedAvgCNN" and auto(IMG8) == "FedAvgCNN"
    assert auto(IMG32, default_model="ResNet18") == "ResNet"
    assert auto(IMG32, default_model="MobileNetV2") == "MobileNetV2"  # an alias
    assert auto(VEC, modality="vector", default_model="AmazonMLP") == "AmazonMLP"
    # without a modality, the shape decides, or the model: C x 1 x T for HARCNN, a 1-d shape for text
    assert modality_of(SERIES) == "image" and modality_of(SERIES, name="HARCNN") == "series"
    assert modality_of(TEXT, name="LSTM") == "text" and modality_of(TEXT, name="MLR") == "vector"


def test_m_takes_pfllib_names_and_aliases_in_any_case():
    assert [parse_config(["-m", m]).model for m in ("resnet34", "MobileNetV2", "mclr_logistic", "fasttext")] == [
        "ResNet34", "MobileNet", "MLR", "fastText"]


def test_vocab_size_from_the_config_wins_over_vs():
    assert build_model("fastText", TEXT, 2, vocab_size=80).embedding.num_embeddings == 80
    assert build_model("fastText", TEXT, 2, vocab_size=80, config={"vocab_size": 50}).embedding.num_embeddings == 50


@pytest.mark.parametrize("name,shape,config,match", [
    ("CNN", TEXT, {"modality": "text"}, r"-m CNN takes image data, but the split holds text .* use -m fastText"),
    ("fastText", VEC, {"modality": "vector"}, r"-m fastText takes text data.*use -m DNN"),
    ("HARCNN", IMG8, {"modality": "image"}, "takes series data"),
    ("AmazonMLP", IMG8, {}, "takes vector data"),
    ("AlexNet", IMG32, {}, r"-m AlexNet cannot take inputs of shape \[3, 32, 32\]"),
    ("LeNet", IMG8, {}, "cannot take inputs of shape"),
    ("TextCNN", (4,), {"modality": "text"}, "widest convolution spans 5 tokens; the texts have 4"),
    ("Transformer", TEXT, {"modality": "text", "fd": 20}, "multiple of its 8 heads"),
    ("VGG", IMG8, {}, "unknown model 'VGG'; choose one of: auto, MLR"),
    ("auto", IMG8, {"modality": "audio"}, "modality 'audio' is not one of"),
    ("auto", (4, 4), {}, "neither images"),
])
def test_a_model_that_cannot_take_the_data_says_so_in_one_line(name, shape, config, match):
    config = dict(config)
    fd = config.pop("fd", 512)
    with pytest.raises(ModelError, match=match) as e:
        build_model(name, shape, 3, feature_dim=fd, config=config)
    assert "\n" not in str(e.value) and isinstance(e.value, ValueError)


def test_text_models_refuse_float_inputs():
    with pytest.raises(ValueError, match="takes int64 token ids"):
        build_model("fastText", TEXT, 2)(torch.randn(2, 16))


def test_fasttext_is_the_mean_of_the_real_tokens_through_fc1_and_fc():
    model = build_model("fastText", (4,), 3, feature_dim=8, config={"modality": "text", "vocab_size": 10})
    x = torch.tensor([[3, 5, 0, 0], [7, 1, 2, 9]])
    emb = model.embedding.weight
    means = torch.stack([(emb[3] + emb[5]) / 2, (emb[7] + emb[1] + emb[2] + emb[9]) / 4])
    assert torch.allclose(model(x), model.fc(model.fc1(means)), atol=1e-6)


@pytest.mark.parametrize("name", ["fastText", "LSTM", "BiLSTM", "Transformer"])
def test_text_models_ignore_padding(name):
    model = make(name, TEXT).eval()
    text = torch.tensor([[4, 9, 17, 23, 8]])
    padded = torch.cat([text, torch.zeros(1, 11, dtype=torch.long)], 1)
    with torch.no_grad():
        assert torch.allclose(model(text), model(padded), atol=1e-5)


def test_lstm_reads_up_to_the_last_real_token():
    model = make("LSTM", TEXT).eval()
    x = torch.tensor([[4, 9, 17, 0, 0, 0], [5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        expect = []
        for row in ([4, 9, 17], [5, 6, 7, 8, 9, 10]):  # each text alone, unpadded, through the plain LSTM
            out, _ = model.lstm(model.embedding(torch.tensor([row])))
            expect.append(model.fc(torch.relu(out[0, -1])))
        assert torch.allclose(model(x), torch.stack(expect), atol=1e-5)


def test_bilstm_reads_forward_to_the_last_real_token_and_backward_to_the_first():
    """Against torch's packed bidirectional LSTM with the model's two directions' weights."""
    from torch.nn.utils.rnn import pack_padded_sequence

    model = make("BiLSTM", TEXT).eval()
    bi = nn.LSTM(FD, FD, bidirectional=True, batch_first=True)
    fwd, bwd = model.lstm_layer.state_dict(), model.lstm_layer_reverse.state_dict()
    bi.load_state_dict({**fwd, **{f"{k}_reverse": v for k, v in bwd.items()}})
    x = torch.tensor([[4, 9, 17, 0, 0], [5, 6, 7, 8, 9]])
    with torch.no_grad():
        packed = pack_padded_sequence(model.word_embeddings(x), torch.tensor([3, 5]), batch_first=True,
                                      enforce_sorted=False)
        _, (h, _) = bi(packed)  # 2 x N x d: forward after the last real token, backward after the first
        assert torch.allclose(model(x), model.fc(model.fc1(torch.cat([h[0], h[1]], 1))), atol=1e-5)


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # vmap's loop over LSTM / attention kernels
@pytest.mark.parametrize("name,shape", [(n, s) for n, s in CASES if n in (
    "MLR", "AmazonMLP", "HARCNN", "fastText", "TextCNN", "LSTM", "BiLSTM", "Transformer")])
def test_per_sample_gradients_of_the_dp_path_match_one_sample_at_a_time(name, shape):
    """-dp takes per-sample gradients with torch.func.vmap (utils/dp_sgd.py): the models without BatchNorm
    must not branch on their data. Without dropout (eval mode) each equals that sample's own backward pass;
    in training mode (each sample its own dropout mask) they are finite."""
    from utils.dp_sgd import _LossHolder, per_sample_gradients

    model = make(name, shape).eval()
    x, y = inputs(shape, 3), torch.tensor([0, 1, 2])
    holder = _LossHolder({"model": model}, lambda a, b: nn.functional.cross_entropy(model(a), b))
    names = [k for k, _ in holder.named_parameters()]
    grads, _ = per_sample_gradients(holder, names, x, y)
    for i in range(3):
        holder.zero_grad()
        nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        for k, p in holder.named_parameters():
            assert torch.allclose(grads[k][i], p.grad, atol=1e-5), (i, k)
    model.train()
    grads, _ = per_sample_gradients(holder, names, x, y)
    assert all(torch.isfinite(g).all() for g in grads.values())


def write_text_split(root, clients=3, length=16, vocab=VOCAB, seed=0):
    """Two classes of texts: class 0 draws its tokens from ids 1..24, class 1 from 25..49; lengths 4..16,
    right-padded with 0. int64 token ids, the split format of utils/data_utils.py."""
    rng = np.random.default_rng(seed)
    d = root / "TinyText"
    counts = {"train": [], "test": []}
    for part, n in (("train", 40), ("test", 12)):
        (d / part).mkdir(parents=True)
        for i in range(clients):
            y = rng.integers(0, 2, n).astype(np.int64)
            x = np.zeros((n, length), dtype=np.int64)
            for j, label in enumerate(y):
                k = rng.integers(4, length + 1)
                x[j, :k] = rng.integers(1, 25, k) + 24 * label
            np.savez(d / part / f"{i}.npz", x=x, y=y)
            counts[part].append(n)
    config = {"dataset": "TinyText", "num_clients": clients, "num_classes": 2, "input_shape": [length],
              "x_dtype": "int64", "modality": "text", "vocab_size": vocab, "default_model": "fastText",
              "train_samples": counts["train"], "test_samples": counts["test"], "format_version": 1}
    (d / "config.json").write_text(json.dumps(config))


def test_fedavg_learns_on_a_text_split_with_auto_fasttext(tmp_path):
    write_text_split(tmp_path)
    out = tmp_path / "out"
    argv = cli(tmp_path, out, "-gr", "2", "-ls", "3", "-lr", "0.5", "-fd", "16", "--executor", "sequential")
    argv[argv.index("Digits")] = "TinyText"
    assert main.main(argv) == 0
    meta = json.loads((out / "TinyText_FedAvg_test_0.json").read_text())
    acc = read_h5(out / "TinyText_FedAvg_test_0.h5")["rs_test_acc"]
    assert acc[-1] > 0.8, acc  # two classes with disjoint vocabularies: learnt in two rounds
    assert meta["model_built"] == "FastText" and meta["status"] == "finished"
    assert meta["model_parameters"] == VOCAB * 16 + 16 * 16 + 16 + 16 * 2 + 2
