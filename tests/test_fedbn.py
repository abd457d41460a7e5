"""FedBN: BatchNorm layers (parameters and statistics) never leave a client, everything else is FedAvg's
sample-weighted mean; BatchNorm found by module type (ResNet-18's downsample.1 included); models without
BatchNorm, and -dp, refused; -ala runs."""
from types import SimpleNamespace

import pytest
import torch

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientbase import Upload
from flcore.clients.clientbn import bn_prefixes
from flcore.registry import get_server_class
from flcore.servers.serverbn import FedBNServer
from flcore.trainmodel.models import build_model
from utils.data_utils import load_split
from utils.errors import FLError
from runtime import loop


def build(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedBN", "--executor", "sequential", "-lr", "0.1", *flags))
    data = load_split("Digits", root, None, "cpu")
    return get_server_class("FedBN")(cfg.replace(num_classes=data.num_classes), data, 0, None)


def is_bn_name(name: str) -> bool:
    """The hand list for torchvision's ResNet-18: bn1 / bn2 of every block and the stem, and the
    BatchNorm of each downsample shortcut (index 1 of the Sequential)."""
    return ".bn" in f".{name}" or ".downsample.1." in name


def test_bn_entries_found_by_type_on_resnet18_and_bncnn():
    resnet = build_model("ResNet18", (3, 32, 32), 10)
    prefixes = bn_prefixes(resnet)
    keys = list(resnet.state_dict())
    found = {k for k in keys if k.startswith(prefixes)}
    assert found == {k for k in keys if is_bn_name(k)}
    assert "layer2.0.downsample.1.running_mean" in found  # the entry a 'bn' substring filter misses
    assert len(found) == 20 * 5  # 20 BatchNorm layers: weight, bias, running mean / var, batch count
    cnn = build_model("BNCNN", (1, 8, 8), 10)
    assert bn_prefixes(cnn) == ("conv1.1.", "conv2.1.")
    assert bn_prefixes(build_model("CNN", (1, 8, 8), 10)) == ()


def test_aggregate_averages_only_non_bn_entries(digits_tiny_root):
    server = build(digits_tiny_root)
    glob = server.global_model.state_dict()
    bn_before = {k: v.clone() for k, v in glob.items() if k.startswith(("conv1.1.", "conv2.1."))}
    uploads = []
    for cid, (weight, fill) in enumerate([(1.0, 1.0), (3.0, 5.0)]):
        state = server.clients[cid].upload().state
        assert not [k for k in state if k.startswith(("conv1.1.", "conv2.1."))]  # BN entries never sent
        uploads.append(Upload(cid, weight, {k: torch.full_like(v, fill) for k, v in state.items()}))
    server.aggregate(uploads)
    after = server.global_model.state_dict()
    for k, v in after.items():
        if k in bn_before:  # never averaged: as the server started
            assert torch.equal(v, bn_before[k]), k
        else:  # (1 * 1 + 3 * 5) / 4 = 4
            assert torch.allclose(v.float(), torch.full_like(v.float(), 4.0)), k


def test_clients_keep_their_bn_and_receive_the_rest(digits_tiny_root):
    server = build(digits_tiny_root)
    loop.run_round(server, 0)
    c = server.clients[1]
    own = {k: v.clone() for k, v in c.model.state_dict().items()}
    bn = [k for k in own if k.startswith(c.personal_keys)]
    assert len(bn) == 10 and all(k.startswith(("conv1.1.", "conv2.1.")) for k in bn)
    assert not torch.equal(own["conv1.1.running_mean"], server.global_model.state_dict()["conv1.1.running_mean"])
    loop.send(server, server.clients)
    glob = server.global_model.state_dict()
    for k, v in c.model.state_dict().items():
        assert torch.equal(v, own[k] if k in bn else glob[k]), k
    # Clients' BN layers differ from each other (each trained on its own data).
    assert not torch.equal(c.model.state_dict()["conv1.1.weight"], server.clients[2].model.state_dict()["conv1.1.weight"])


def test_one_round_equals_a_hand_fedavg_over_non_bn_entries(digits_tiny_root):
    server = build(digits_tiny_root)
    loop.run_round(server, 0)
    states = [c.model.state_dict() for c in server.clients]
    n = torch.tensor([c.train_samples for c in server.clients], dtype=torch.float64)
    for k, v in server.global_model.state_dict().items():
        if k.startswith(("conv1.1.", "conv2.1.")):
            continue
        want = sum(w * s[k].double() for w, s in zip(n / n.sum(), states))
        torch.testing.assert_close(v.double(), want, atol=1e-6, rtol=1e-5)


def test_model_without_batch_norm_is_refused(digits_tiny_root):
    with pytest.raises(FLError, match="-m BNCNN or -m ResNet18"):
        build(digits_tiny_root, "-m", "CNN")
    assert main.main(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedBN", "-m", "DNN", "-gr", "1")) == 2


def test_auto_model_is_bncnn(digits_tiny_root):
    assert bn_prefixes(build(digits_tiny_root).global_model) == ("conv1.1.", "conv2.1.")


def test_dp_is_refused(digits_tiny_root):
    with pytest.raises(FLError, match="-dp"):
        parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedBN", "-dp"))


def test_ala_runs_and_leaves_bn_alone(digits_tiny_root, tmp_path):
    server = build(digits_tiny_root, "-ala", "-p", "0")
    loop.run_round(server, 0)
    loop.run_round(server, 1)  # the second broadcast runs ALA on every layer
    c = server.clients[0]
    own = {k: v.clone() for k, v in c.model.state_dict().items() if k.startswith(c.personal_keys)}
    loop.send(server, server.clients)
    for k, v in own.items():
        assert torch.equal(c.model.state_dict()[k], v), k
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "FedBN", "-ala", "-gr", "2", "-lr", "0.1")) == 0


def test_ala_blends_the_received_shared_layers_into_the_clients_own_under_its_batchnorm(digits_tiny_root):
    """With -ala (from the second broadcast on, once the client has trained), FedBN's receive gives, by
    ALA's rule: Θ_i + (Θ − Θ_i) ⊙ W on the adapted layers (W: the weights ALA learned in that call), the
    global entries on the other shared layers, and the client's own BatchNorm entries untouched."""
    server = build(digits_tiny_root, "-ala", "-p", "2")
    loop.run_round(server, 0)
    loop.run_round(server, 1)
    c = server.clients[0]
    own = {k: v.clone() for k, v in c.model.state_dict().items()}
    glob = {k: v.clone() for k, v in server.global_model.state_dict().items()}
    assert not all(torch.equal(own[k], glob[k]) for k in c.ala.names)
    loop.send(server, server.clients)
    new, w = c.model.state_dict(), c.ala.weights
    assert set(c.ala.names) and not any(k.startswith(c.personal_keys) for k in c.ala.names)
    for k in own:
        if k.startswith(c.personal_keys):
            assert torch.equal(new[k], own[k]), k
        elif k in c.ala.names:
            assert torch.allclose(new[k], own[k] + (glob[k] - own[k]) * w[k], atol=1e-6), k
        else:
            assert torch.equal(new[k], glob[k]), k
    assert server.global_model.state_dict().keys() == glob.keys()
    assert all(torch.equal(server.global_model.state_dict()[k], v) for k, v in glob.items())  # left as it was


@pytest.mark.parametrize("shape, config, bn", [((1, 8, 8), {}, True),  # auto = the CNN: its BatchNorm twin
                                               ((9, 1, 128), {"modality": "series"}, False)])  # auto = HARCNN
def test_auto_takes_the_batchnorm_twin_only_where_auto_means_the_cnn(shape, config, bn):
    server = object.__new__(FedBNServer)
    server.cfg = SimpleNamespace(model="auto", feature_dim=512, vocab_size=80, client_models=None)
    server.data = SimpleNamespace(input_shape=shape, config=config, num_classes=6)
    if bn:
        assert bn_prefixes(server.build_model())
    else:
        with pytest.raises(FLError, match="has none"):  # HARCNN, kept, has no BatchNorm: refused, not swapped
            server.build_model()
