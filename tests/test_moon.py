"""MOON: the contrastive loss by hand, the local objective against an independent formula, -mu 0 = FedAvg
exactly, -dp's per-sample path on the contrastive objective, and -ala."""
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientmoon import contrastive_loss
from flcore.registry import get_server_class
from utils.data_utils import load_split
from utils.results import read_h5
from runtime import loop
from runtime import client_steps
from utils import dp_sgd


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "MOON", "--executor", "sequential", "-lr", "0.1", *flags))
    data = load_split("Digits", root, None, "cpu")
    return get_server_class("MOON")(cfg.replace(num_classes=data.num_classes), data, 0, None)


def test_contrastive_loss_matches_a_hand_computation():
    # sample 0: z = (1, 0), z_glob = (1, 1), z_prev = (0, 1): cos+ = 1/sqrt(2), cos- = 0
    # sample 1: z = (0, 2), z_glob = (0, -1), z_prev = (3, 4): cos+ = -1, cos- = 4/5
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    z_glob = torch.tensor([[1.0, 1.0], [0.0, -1.0]])
    z_prev = torch.tensor([[0.0, 1.0], [3.0, 4.0]])
    tau = 0.5
    by_hand = []
    for pos, neg in ((1 / math.sqrt(2), 0.0), (-1.0, 0.8)):
        e_pos, e_neg = math.exp(pos / tau), math.exp(neg / tau)
        by_hand.append(-math.log(e_pos / (e_pos + e_neg)))
    got = contrastive_loss(z, z_glob, z_prev, tau)
    assert got.item() == pytest.approx(sum(by_hand) / 2, rel=1e-6)
    # representations with more than one axis are compared flattened
    assert contrastive_loss(z.view(2, 1, 2), z_glob.view(2, 2, 1), z_prev, tau).item() == pytest.approx(got.item())


def test_local_objective_and_the_models_it_contrasts(digits_root):
    server = make_server(digits_root, "-mu", "2.0", "-tau", "0.7")
    c0 = server.clients[0]
    loop.send(server, [c0])
    x, y = c0.x_train[:9], c0.y_train[:9]
    # before the client has trained: no negative pair, plain cross-entropy
    assert c0.prev_model is None
    assert c0.loss(x, y).item() == pytest.approx(F.cross_entropy(c0.model(x), y).item(), rel=1e-6)
    client_steps.train(c0, 0)
    trained = {k: v.clone() for k, v in c0.model.state_dict().items()}
    for k, v in c0.prev_model.state_dict().items():  # w_i^{t-1}: the model right after its training
        assert torch.equal(v, trained[k])
    server.aggregate([c.upload() for c in server.clients[:1]] + [server.clients[1].upload()])
    loop.send(server, [c0])
    for k, v in c0.global_model.state_dict().items():  # w^t: the global model as received
        assert torch.equal(v, server.global_model.state_dict()[k])
    assert not any(p.requires_grad for p in c0.global_model.parameters())
    assert not any(p.requires_grad for p in c0.prev_model.parameters())
    # independent formula: explicit norms and a two-way softmax
    def rep(model):
        return model.base(x).flatten(1)
    z, zg, zp = rep(c0.model), rep(server.global_model).detach(), rep(c0.prev_model).detach()
    cos = lambda a, b: (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))  # noqa: E731
    pos, neg = cos(z, zg) / 0.7, cos(z, zp) / 0.7
    l_con = -torch.log(torch.exp(pos) / (torch.exp(pos) + torch.exp(neg))).mean()
    want = F.cross_entropy(c0.model(x), y) + 2.0 * l_con
    got = c0.loss(x, y)
    assert l_con.item() > 0.01  # the test would not notice a missing term otherwise
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    g_got = torch.autograd.grad(got, list(c0.model.parameters()))
    g_want = torch.autograd.grad(want, list(c0.model.parameters()))
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    client_steps.train(c0, 1)  # the next training replaces the previous model
    for k, v in c0.prev_model.state_dict().items():
        assert torch.equal(v, c0.model.state_dict()[k])
    assert not torch.equal(c0.prev_model.state_dict()["head.weight"], trained["head.weight"])


def run(root, out, *flags, algo="MOON"):
    assert main.main(cli(root, out, "-algo", algo, "-gr", "3", "-lr", "0.1", *flags)) == 0
    (h5,) = out.glob(f"Digits_{algo}*_test_0.h5")  # MOON+ALA with -ala
    return read_h5(h5)


def test_mu_zero_is_fedavg_exactly(digits_tiny_root, tmp_path):
    fedavg = run(digits_tiny_root, tmp_path / "avg", algo="FedAvg")
    moon0 = run(digits_tiny_root, tmp_path / "m0", "-mu", "0")
    moon = run(digits_tiny_root, tmp_path / "m", "-mu", "5")
    for key in ("rs_test_acc", "rs_train_loss", "rs_test_auc"):
        assert np.array_equal(fedavg[key], moon0[key]), key
    # the contrastive term does act from the second round on (round 0's model is the common start)
    assert np.array_equal(fedavg["rs_train_loss"][:2], moon["rs_train_loss"][:2])
    assert not np.array_equal(fedavg["rs_train_loss"][2:], moon["rs_train_loss"][2:])


@pytest.mark.optional_deps("opacus")
def test_dp_gradient_of_the_contrastive_objective_without_noise_or_clipping(digits_root):
    """The frozen global and previous models are constants of the per-sample gradient: with sigma 0 and no
    clipping, DP-SGD's gradient is the plain batch gradient of MOON's objective."""
    server = make_server(digits_root, "-dp", "-dps", "0.5")
    c0 = server.clients[0]
    loop.send(server, [c0])
    client_steps.train(c0, 0)
    server.aggregate([c.upload() for c in server.clients[:2]])
    loop.send(server, [c0])
    c0.dp.sigma, c0.dp.clip = 0.0, 1e9
    x, y = c0.x_train[:7], c0.y_train[:7]
    want = torch.autograd.grad(c0.loss(x, y), list(c0.model.parameters()))
    dp_sgd.dp_backward(c0, c0.loss, c0.optimizer, x, y)
    for p, w in zip(c0.model.parameters(), want):
        torch.testing.assert_close(p.grad, w, atol=1e-6, rtol=1e-4)
    assert all(p.grad is None for p in c0.global_model.parameters())
    assert all(p.grad is None for p in c0.prev_model.parameters())


@pytest.mark.optional_deps("opacus")
def test_dp_and_ala_runs(digits_tiny_root, tmp_path):
    dp = run(digits_tiny_root, tmp_path / "dp", "-dp", "-dps", "1.0")
    assert dp["rs_dp_epsilon_max"][-1] > 0 and np.all(np.isfinite(dp["rs_test_acc"]))
    ala = run(digits_tiny_root, tmp_path / "ala", "-ala")
    assert np.all(np.isfinite(ala["rs_train_loss"])) and ala["rs_train_loss"][-1] < ala["rs_train_loss"][0]


def test_bad_flags_end_with_one_line(digits_tiny_root, tmp_path, capsys):
    for flags in (("-tau", "0"), ("-mu", "-1")):
        assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "MOON", "-gr", "0", *flags)) == 2
        assert "MOON needs -mu >= 0 and -tau > 0" in capsys.readouterr().err
