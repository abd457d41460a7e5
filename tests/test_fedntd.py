"""FedNTD against hand computations: the not-true logits drop exactly the true class, the loss on fixed
logits, the teacher is the received global model (with -ala too), β = 0 is FedAvg, and -dp's per-sample
gradients of the whole loss (teacher included) match plain autograd; the flags' bounds."""
import math

import numpy as np
import pytest
import torch

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientntd import not_true, ntd_loss
from flcore.registry import get_server_class
from utils.data_utils import load_split
from utils.errors import FLError
from utils.results import read_h5
from runtime import loop
from utils import dp_sgd


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedNTD", "--executor", "sequential", *flags))
    return get_server_class("FedNTD")(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root))


def test_not_true_drops_exactly_the_true_class():
    logits = torch.arange(12.0).reshape(3, 4)  # rows [0 1 2 3], [4 5 6 7], [8 9 10 11]
    got = not_true(logits, torch.tensor([0, 2, 3]))
    assert got.tolist() == [[1, 2, 3], [4, 5, 7], [8, 9, 10]]


def hand_ntd(local, teacher, y, tau):
    """τ² KL(q̃_g || q̃_l) per sample with plain Python, averaged over the batch (the official criterion's
    τ² keeps the gradient's scale as τ grows)."""
    total = 0.0
    for zl, zg, t in zip(local.tolist(), teacher.tolist(), y.tolist()):
        zl = [v / tau for i, v in enumerate(zl) if i != t]
        zg = [v / tau for i, v in enumerate(zg) if i != t]
        ql = [math.exp(v) / sum(math.exp(u) for u in zl) for v in zl]
        qg = [math.exp(v) / sum(math.exp(u) for u in zg) for v in zg]
        total += sum(g * math.log(g / l) for g, l in zip(qg, ql))
    return tau ** 2 * total / len(y)


def test_ntd_loss_equals_a_hand_computation():
    local = torch.tensor([[2.0, 0.5, -1.0, 0.3], [0.1, 0.2, 3.0, -0.4]])
    teacher = torch.tensor([[1.0, 1.5, 0.0, -0.2], [2.0, -1.0, 0.5, 0.7]])
    y = torch.tensor([0, 2])
    for tau in (1.0, 3.0):
        assert math.isclose(float(ntd_loss(local, teacher, y, tau)), hand_ntd(local, teacher, y, tau), rel_tol=1e-5)
    # changing the true-class logits changes nothing: the term sees the not-true classes only
    moved = local.clone()
    moved[0, 0], moved[1, 2] = -5.0, 9.0
    assert torch.equal(ntd_loss(moved, teacher, y, 1.0), ntd_loss(local, teacher, y, 1.0))


def test_client_loss_is_ce_plus_beta_ntd_against_the_received_global_model(digits_root):
    beta, tau = 0.7, 2.0
    server = make_server(digits_root, "-bt", str(beta), "-tau", str(tau))
    client = server.clients[0]
    loop.send(server, [client])
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in client.model.parameters():  # as after some local steps: local far enough from global that
            p.add_(0.2 * torch.randn(p.shape, generator=g))  # KL's two directions differ
    x, y = client.x_train[:16], client.y_train[:16]
    with torch.no_grad():
        local, teacher = client.model(x), server.global_model(x)
    ce = torch.nn.functional.cross_entropy(local, y).item()
    term = (client.loss(x, y).item() - ce) / beta
    assert math.isclose(term, hand_ntd(local, teacher, y, tau), rel_tol=1e-4)  # KL(global || local)
    assert not math.isclose(term, hand_ntd(teacher, local, y, tau), rel_tol=1e-2)  # not KL(local || global)
    assert not any(p.requires_grad for p in client.teacher.parameters())


def test_beta_zero_is_fedavg(digits_root, tmp_path):
    args = ("-gr", "2", "-lr", "0.1")
    assert main.main(cli(digits_root, tmp_path, "-algo", "FedAvg", *args)) == 0
    assert main.main(cli(digits_root, tmp_path, "-algo", "FedNTD", "-bt", "0", *args)) == 0
    a = read_h5(tmp_path / "Digits_FedAvg_test_0.h5")
    b = read_h5(tmp_path / "Digits_FedNTD_test_0.h5")
    for key in ("rs_test_acc", "rs_train_loss", "rs_test_auc"):
        assert np.array_equal(a[key], b[key]), key


def test_teacher_is_the_received_global_model_with_ala(digits_root):
    server = make_server(digits_root, "-ala", "--ala_max_epochs", "3", "-gr", "2", "-lr", "0.1", "-eg", "5")
    loop.train(server)
    client = server.clients[0]
    assert client.ala.weights is not None  # ALA ran in round 2
    loop.send(server, [client])  # the next round's start: ALA mix for the student, global model for the teacher
    glob = dict(server.global_model.named_parameters())
    assert all(torch.equal(p, glob[k].detach()) for k, p in client.teacher.named_parameters())
    assert any(not torch.equal(p.detach(), glob[k]) for k, p in client.model.named_parameters())
    assert np.isfinite(loop.evaluate(server)["train_loss"])


@pytest.mark.optional_deps("opacus")
def test_dp_per_sample_gradients_include_the_distillation_term(digits_root):
    """-dp with no noise and no clipping is plain SGD on the same loss: the per-sample machinery sees the
    teacher (an untrained client module) and the not-true gather under vmap."""
    server = make_server(digits_root, "-dp", "-dps", "1", "--dp_clip", "1e9", "-bt", "2")
    client = server.clients[0]
    loop.send(server, [client])
    with torch.no_grad():
        for p in client.model.parameters():
            p.mul_(1.1)
    client.dp.sigma = 0.0
    x, y = client.x_train[:7], client.y_train[:7]
    client.optimizer.zero_grad()
    client.loss(x, y).backward()
    want = [p.grad.clone() for p in client.model.parameters()]
    client.optimizer.zero_grad()
    dp_sgd.dp_backward(client, client.loss, client.optimizer, x, y)
    for p, w in zip(client.model.parameters(), want):
        torch.testing.assert_close(p.grad, w, atol=1e-5, rtol=1e-4)
    assert all(t.grad is None for t in client.teacher.parameters())


def test_flags_are_checked(digits_root, tmp_path, capsys):
    assert main.main(cli(digits_root, tmp_path, "-algo", "FedNTD", "-tau", "0", "-gr", "1")) == 2
    assert "-tau > 0" in capsys.readouterr().err


@pytest.mark.parametrize("flags, ok", [(("-bt", "0", "-tau", "0.01"), True), (("-bt", "-0.5"), False),
                                       (("-tau", "0"), False)])
def test_beta_and_tau_bounds_at_their_edges(flags, ok, digits_root):
    args = cli(digits_root, digits_root, "-algo", "FedNTD", *flags)
    if ok:
        parse_config(args)
    else:
        with pytest.raises(FLError, match="FedNTD needs -bt >= 0 and -tau > 0"):
            parse_config(args)
