"""FedPer and LG-FedAvg (the part-sharing split): exactly the shared entries cross the wire, by name;
the server averages them by sample weight (by hand); the local part never changes on receipt; local
training is FedAvg's on the whole model; -ala adapts only the received part; -dp runs with epsilon > 0."""
import copy

import numpy as np
import pytest
import torch

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientbase import Upload
from flcore.registry import get_server_class
from utils.data_utils import load_split
from utils.errors import FLError
from utils.results import read_h5
from runtime import loop
from runtime import client_steps

SHARED = {"FedPer": "base.", "LG-FedAvg": "head."}
LOCAL = {"FedPer": "head.", "LG-FedAvg": "base."}


def make_server(root, algo, *flags):
    cfg = parse_config(cli(root, root, "-algo", algo, "--executor", "sequential", *flags))
    return get_server_class(algo)(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root))


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("algo", ["FedPer", "LG-FedAvg"])
def test_upload_is_exactly_the_shared_entries(algo, digits_root):
    server = make_server(digits_root, algo, "-lr", "0.1")
    client = server.clients[0]
    assert client.personal_keys == (LOCAL[algo],)
    client_steps.train(client, 0)
    up = client.upload()
    model = state(client.model)
    want = sorted(k for k in model if k.startswith(SHARED[algo]))
    assert want and sorted(up.state) == want and up.weight == client.train_samples
    assert all(torch.equal(up.state[k], model[k]) for k in want)


@pytest.mark.parametrize("algo", ["FedPer", "LG-FedAvg"])
def test_aggregate_is_the_sample_weighted_mean_of_the_shared_entries(algo, digits_root):
    server = make_server(digits_root, algo)
    before = state(server.global_model)
    shared = [k for k in before if k.startswith(SHARED[algo])]
    ups = [Upload(0, 1.0, {k: torch.full_like(before[k], 1.0) for k in shared}),
           Upload(1, 3.0, {k: torch.full_like(before[k], 5.0) for k in shared})]
    server.aggregate(ups)
    after = state(server.global_model)
    for k, v in after.items():
        if k in shared:  # (1 * 1 + 3 * 5) / 4
            assert torch.equal(v, torch.full_like(v, 4.0)), k
        else:  # the global local part is never touched
            assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("algo", ["FedPer", "LG-FedAvg"])
def test_receive_replaces_only_the_shared_part(algo, digits_root):
    server = make_server(digits_root, algo, "-lr", "0.1")
    client = server.clients[2]
    client_steps.train(client, 0)
    mine = state(client.model)
    with torch.no_grad():
        for p in server.global_model.parameters():
            p.add_(1.0)
    glob = state(server.global_model)
    client.receive(server.global_model, participating=True)
    got = state(client.model)
    for k in got:
        assert torch.equal(got[k], glob[k] if k.startswith(SHARED[algo]) else mine[k]), k


@pytest.mark.parametrize("algo", ["FedPer", "LG-FedAvg"])
def test_first_round_training_is_fedavgs_on_the_whole_model(algo, digits_root):
    """From the common initialisation, a client's first local training is FedAvg's, tensor for tensor
    (the split only renames ``fc`` to ``head``): the whole model trains, body and head."""
    ours = make_server(digits_root, algo, "-lr", "0.1")
    ref = make_server(digits_root, "FedAvg", "-lr", "0.1")
    a, b = ours.clients[1], ref.clients[1]
    start = state(a.model)
    client_steps.train(a, 0)
    client_steps.train(b, 0)
    got, want = list(state(a.model).values()), list(state(b.model).values())
    assert len(got) == len(want) and all(torch.equal(x, y) for x, y in zip(got, want))
    assert all(not torch.equal(v, start[k]) for k, v in state(a.model).items())  # every part moved


def test_fedper_with_ala_adapts_the_body_under_the_local_head(digits_root):
    server = make_server(digits_root, "FedPer", "-ala", "--ala_max_epochs", "5", "-gr", "2", "-lr", "0.1")
    client = server.clients[0]
    assert client.ala.names and all(n.startswith("base.") for n in client.ala.names)
    loop.run_round(server, 0)
    loop.run_round(server, 1)
    head = state(client.model.head)
    server.round_idx = 2
    loop.send(server, server.clients)  # the second receipt after training: ALA runs
    assert client.ala.weights is not None
    assert all(torch.equal(v, state(client.model.head)[k]) for k, v in head.items())  # the head stays
    glob, got = state(server.global_model.base), state(client.model.base)
    top = {n[len("base."):] for n in client.ala.names}
    assert all(torch.equal(got[k], glob[k]) for k in got if k not in top)  # lower body: global
    assert any(not torch.equal(got[k], glob[k]) for k in top)  # top of the body: blended


def test_lg_fedavg_with_ala_adapts_the_received_head(digits_root, tmp_path):
    server = make_server(digits_root, "LG-FedAvg", "-ala", "--ala_max_epochs", "5", "-lr", "0.1")  # -p 2 tensors
    assert server.clients[0].ala.names == ["head.weight", "head.bias"]
    assert make_server(digits_root, "LG-FedAvg", "-ala", "--ala_layers", "1").clients[0].ala.names == \
        ["head.weight", "head.bias"]
    with pytest.raises(FLError, match="receives only its head, which has 1 layer"):
        make_server(digits_root, "LG-FedAvg", "-ala", "--ala_layers", "2")  # would reach into the local base
    with pytest.raises(FLError, match="receives only its head, which has 2 parameter tensors"):
        make_server(digits_root, "LG-FedAvg", "-ala", "-p", "3")
    assert main.main(cli(digits_root, tmp_path, "-algo", "LG-FedAvg", "-ala", "-gr", "2", "-lr", "0.1")) == 0


@pytest.mark.optional_deps("opacus")
@pytest.mark.parametrize("algo", ["FedPer", "LG-FedAvg"])
def test_dp_runs_with_positive_epsilon(algo, digits_root, tmp_path):
    assert main.main(cli(digits_root, tmp_path, "-algo", algo, "-gr", "2", "-lr", "0.1", "-dp", "-dps", "1.0")) == 0
    h5 = read_h5(tmp_path / f"Digits_{algo}_test_0.h5")
    assert 0 < h5["rs_dp_epsilon_max"][1] < h5["rs_dp_epsilon_max"][2]
    assert np.all(np.isfinite(h5["rs_train_loss"]))


def test_parts_are_copies_not_shared_tensors(digits_root):
    """The received shared part is copied into the client's own tensors (no aliasing with the server)."""
    server = make_server(digits_root, "FedPer")
    client = server.clients[0]
    client.receive(server.global_model)
    g = copy.deepcopy(state(server.global_model))
    with torch.no_grad():
        next(client.model.base.parameters()).add_(1.0)
    assert all(torch.equal(v, state(server.global_model)[k]) for k, v in g.items())
