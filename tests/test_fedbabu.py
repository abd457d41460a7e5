"""FedBABU: the head never changes during federated training (the common initial one on every client and
on the server), only the body is uploaded, the evaluated model is the received one fine-tuned whole for
-fte epochs (against a reference loop), evaluating never changes the federated run (with -dp too), and
-dp counts the fine-tune's steps; -ala adapts the body."""
import copy
import math

import pytest
import torch
from torch.nn import functional as F

import main
from cli import parse_config
from conftest import cli
from flcore.registry import get_server_class
from utils.data_utils import load_split
from utils.errors import FLError
from utils.seeding import torch_gen
from runtime import loop
from plugins import dp_sample


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedBABU", "--executor", "sequential", *flags))
    return get_server_class("FedBABU")(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root))


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_head_never_changes_during_federated_training(digits_noniid_root):
    server = make_server(digits_noniid_root, "-lr", "0.1", "-fte", "1")
    head0, base0 = state(server.global_model.head), state(server.global_model.base)
    for t in range(3):
        loop.run_round(server, t)
        for c in server.clients:
            assert same(state(c.model.head), head0), (t, c.id)
        assert same(state(server.global_model.head), head0)
    assert not same(state(server.global_model.base), base0)  # the body did learn
    up = server.clients[0].upload()
    assert up.state and all(k.startswith("base.") for k in up.state)  # the head is never sent


def test_evaluated_model_is_the_received_one_fine_tuned(digits_noniid_root):
    server = make_server(digits_noniid_root, "-lr", "0.05", "-fte", "2")
    loop.run_round(server, 0)
    server.round_idx = 1
    loop.send(server, server.clients)
    client = server.clients[3]
    start = copy.deepcopy(client.model)
    gen_state = client.batch_gen.get_state()
    tuned = client.eval_model()
    assert same(state(client.model), state(start)) and torch.equal(client.batch_gen.get_state(), gen_state)
    # Reference: -fte epochs of plain SGD on the whole copy, its batches from the client's own fine-tune
    # stream, which round 0's evaluation (2 epochs, 2 permutations) used first.
    g = torch_gen(client.cfg.seed, 0, "fine-tune", client.id)
    ref = copy.deepcopy(start)
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    n, bs = client.train_samples, 10
    perms = [torch.randperm(n, generator=g) for _ in range(4)][2:]
    for perm in perms:
        for i in range(0, n, bs):
            idx = perm[i:i + bs]
            opt.zero_grad()
            F.cross_entropy(ref(client.x_train[idx]), client.y_train[idx]).backward()
            opt.step()
    got, want, before = state(tuned), state(ref), state(start)
    assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)
    assert all(not torch.equal(got[k], before[k]) for k in got)  # body and head alike are fine-tuned


@pytest.mark.parametrize("dp", [(), pytest.param(("-dp",), marks=pytest.mark.optional_deps("opacus"))], ids=["plain", "dp"])
def test_evaluation_never_changes_the_federated_run(dp, digits_noniid_root):
    runs = []
    for eg in ("1", "100"):  # every round evaluated (fine-tunes) vs round 0 only
        server = make_server(digits_noniid_root, "-lr", "0.1", "-eg", eg, "-fte", "1", "--train_loss_eval", "off", *dp)
        for t in range(3):
            loop.run_round(server, t)
        runs.append(server)
    assert same(state(runs[0].global_model), state(runs[1].global_model))
    for a, b in zip(runs[0].clients, runs[1].clients):
        assert same(state(a.model), state(b.model))


@pytest.mark.optional_deps("opacus")
def test_dp_counts_the_fine_tune_steps(digits_noniid_root):
    server = make_server(digits_noniid_root, "-lr", "0.1", "-dp", "-fte", "2", "--train_loss_eval", "off")
    loop.run_round(server, 0)  # evaluation (2 fine-tune epochs) then training (1 epoch)
    client = server.clients[0]
    per_epoch = math.ceil(client.train_samples / 10)
    assert sum(steps for _, _, steps in client.dp.history) == 3 * per_epoch
    assert dp_sample.dp_epsilon(client, 1e-5) > 0
    server.round_idx = 1
    loop.send(server, server.clients)
    tuned = client.eval_model()
    assert not same(state(tuned), state(client.model))  # the DP fine-tune did train the copy
    assert sum(steps for _, _, steps in client.dp.history) == 5 * per_epoch


@pytest.mark.optional_deps("opacus")
def test_fine_tune_streams_are_the_named_ones(digits_noniid_root):
    """The fine-tune's batches and its -dp noise come from the streams named (seed, run, "fine-tune", id)
    and (seed, run, "fine-tune-noise", id): a published -dp figure reproduces from its seed."""
    server = make_server(digits_noniid_root, "-dp", "--seed", "3")
    for c in server.clients[:2]:
        for gen, key in ((c.tune_gen, "fine-tune"), (c.tune_noise, "fine-tune-noise")):
            assert torch.equal(gen.get_state(), torch_gen(3, 0, key, c.id).get_state()), (c.id, key)


def test_ala_adapts_the_body_under_the_common_head(digits_noniid_root, tmp_path):
    server = make_server(digits_noniid_root, "-ala", "--ala_max_epochs", "3", "-lr", "0.1", "-fte", "1")
    assert server.clients[0].ala.names and all(n.startswith("base.") for n in server.clients[0].ala.names)
    assert main.main(cli(digits_noniid_root, tmp_path, "-algo", "FedBABU", "-ala", "-gr", "2", "-fte", "1")) == 0


def test_fte_zero_is_refused(digits_noniid_root):
    with pytest.raises(FLError, match="-fte must be >= 1"):
        get_server_class("FedBABU").check_config(parse_config(["-algo", "FedBABU", "-fte", "0"]))
