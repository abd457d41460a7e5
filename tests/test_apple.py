"""APPLE's optimiser against a hand-written reference: momentum SGD on the core model (rate -lr times
--core_lr_scale, gradient p_ii ∇_θ̃ L) and on p (rate -dlr), one optimizer per round, the proximal term
μ λ(r) ||p - p^0||^2; its flags; and the same numbers with clients parked off the device."""
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call

import main
from cli import parse_config
from conftest import cli
from flcore.registry import get_server_class
from utils.data_utils import load_split
from utils.results import read_h5
from runtime import loop
from runtime import client_steps


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "APPLE", "--executor", "sequential", *flags))
    return get_server_class("APPLE")(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root))


def perturbed(state, seed, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in state.items()}


def reference_round(client, cores, p, p0, *, lr, plr, beta, mu, lam, batch_size):
    """One round of local training written out: the client's batches (from a copy of its stream), the loss
    CE(Σ_j p_j θ_j) + μ λ ||p - p0||^2 by autograd on plain tensors, and the momentum rule
    v <- β v + g (v = g at the round's first step), w <- w - rate v, for the own core θ_i and for p."""
    own = client.id
    theta = {k: v.detach().clone() for k, v in cores[own].items()}
    p = p.detach().clone()
    v_theta, v_p = None, None
    gen = torch.Generator()
    gen.set_state(client.batch_gen.get_state())
    perm = torch.randperm(client.train_samples, generator=gen)
    for start in range(0, client.train_samples, batch_size):
        idx = perm[start:start + batch_size]
        x, y = client.x_train[idx], client.y_train[idx]
        th = {k: t.clone().requires_grad_(True) for k, t in theta.items()}
        pp = p.clone().requires_grad_(True)
        mix = {k: sum(pp[j] * (th[k] if j == own else cores[j][k]) for j in range(len(cores))) for k in th}
        loss = nn.functional.cross_entropy(functional_call(client.model, mix, (x,)), y)
        loss = loss + mu * lam * ((pp - p0) ** 2).sum()
        grads = torch.autograd.grad(loss, [*th.values(), pp])
        g_theta, g_p = dict(zip(th, grads[:-1])), grads[-1]
        v_theta = g_theta if v_theta is None else {k: beta * v_theta[k] + g_theta[k] for k in g_theta}
        v_p = g_p if v_p is None else beta * v_p + g_p
        theta = {k: theta[k] - lr * v_theta[k] for k in theta}
        p = p - plr * v_p
    return theta, p


def prepared(root, *flags):
    """A server whose clients hold distinct cores, and one client that has received them."""
    server = make_server(root, "-lbs", "100", "-mu", "0.4", "-gr", "10", "-L", "1", "-dlr", "0.002", *flags)
    init = {k: v.detach().clone() for k, v in server.global_model.state_dict().items()}
    server.cores = [perturbed(init, seed=j) for j in range(len(server.clients))]
    for c, core in zip(server.clients, server.cores):
        c.model.load_state_dict(core)
    loop.send(server, server.clients)
    return server, server.clients[1]


# Default (the official code's momentum 0.9, core rate 2 x -lr), PFLlib's plain SGD at N x -lr (5 clients),
# and a decayed round (-ld: both rates times 0.5^3).
CASES = {
    "official": ((), dict(beta=0.9, lr=0.005 * 2, plr=0.002)),
    "pfllib": (("--sgd_momentum", "0", "--core_lr_scale", "5"), dict(beta=0.0, lr=0.005 * 5, plr=0.002)),
    "decay": (("-ld", "-ldg", "0.5"), dict(beta=0.9, lr=0.005 * 2 * 0.125, plr=0.002 * 0.125)),
}


@pytest.mark.parametrize("case", CASES)
def test_one_round_is_momentum_sgd_on_the_scaled_core_gradient_and_on_p(case, digits_root):
    flags, rates = CASES[case]
    server, client = prepared(digits_root, *flags)
    rnd = 3
    lam = (math.cos(math.pi * rnd / 10) + 1) / 2  # cosine λ(r) over -L 1 of 10 rounds
    with torch.no_grad():
        client.p += torch.tensor([0.03, -0.02, 0.01, 0.0, 0.02])  # p off p^0: the proximal pull acts
    cores = [{k: v.detach().clone() for k, v in (client.model.state_dict() if j == client.id else c).items()}
             for j, c in enumerate(server.cores)]
    keys = [k for k, _ in client.model.named_parameters()]
    cores = [{k: c[k] for k in keys} for c in cores]
    assert client.train_samples > 200  # three batches of 100: the momentum enters the 2nd and 3rd steps
    theta, p = reference_round(client, cores, client.p, client.p0, mu=0.4, lam=lam, batch_size=100, **rates)
    client_steps.train(client, rnd)
    got = dict(client.model.named_parameters())
    for k in keys:
        torch.testing.assert_close(got[k].detach(), theta[k], atol=2e-6, rtol=1e-4)
    torch.testing.assert_close(client.p, p, atol=1e-6, rtol=1e-5)
    assert not torch.equal(p, client.p0)


def test_momentum_restarts_every_round(digits_root):
    server, client = prepared(digits_root)
    client_steps.train(client, 0)
    assert not client.optimizer.state  # nothing of the round's momentum is kept
    # nor any autograd state on p: a plain tensor between rounds, so nothing outside training builds a graph
    assert not client.p.requires_grad and client.p.grad is None
    loop.send(server, server.clients)
    keys = [k for k, _ in client.model.named_parameters()]
    cores = [{k: (dict(client.model.named_parameters()) if j == client.id else c)[k].detach().clone() for k in keys}
             for j, c in enumerate(server.cores)]
    lam = (math.cos(math.pi * 1 / 10) + 1) / 2
    theta, p = reference_round(client, cores, client.p, client.p0, beta=0.9, lr=0.01, plr=0.002, mu=0.4, lam=lam,
                               batch_size=100)
    client_steps.train(client, 1)
    for k, v in client.model.named_parameters():
        torch.testing.assert_close(v.detach(), theta[k], atol=2e-6, rtol=1e-4)
    torch.testing.assert_close(client.p, p, atol=1e-6, rtol=1e-5)


def test_a_federation_of_one_mixes_only_its_own_core(digits_root):
    """No other cores (one client): θ̃ = p_ii θ_i, with nothing added for the absent others."""
    server, client = prepared(digits_root)
    client.stacks = {}
    with torch.no_grad():
        client.p.copy_(torch.tensor([0.1, 0.6, 0.1, 0.1, 0.1]))
    own = dict(client.model.named_parameters())
    got = client.mixed()
    for k in client.keys:
        torch.testing.assert_close(got[k], 0.6 * own[k], rtol=0, atol=0)


def test_core_rate_and_momentum_defaults_follow_the_official_code(digits_root):
    cfg = parse_config(cli(digits_root, digits_root, "-algo", "APPLE"))
    assert cfg.sgd_momentum == 0.9 and cfg.local_learning_rate * cfg.core_lr_scale == pytest.approx(0.01)
    assert (cfg.dr_learning_rate, cfg.mu, cfg.L) == (0.001, 0.1, 0.1)


@pytest.mark.parametrize("flags, words", [
    (("--sgd_momentum", "1"), "--sgd_momentum < 1"),
    (("--sgd_momentum", "-0.1"), "--sgd_momentum < 1"),
    (("--core_lr_scale", "0"), "--core_lr_scale > 0"),
    (("-dlr", "-0.001"), "-dlr >= 0"),
    (("-mu", "-0.1"), "-mu >= 0"),
    (("-L", "1.1"), "0 <= -L <= 1"),
    (("-L", "-0.1"), "0 <= -L <= 1"),
    pytest.param(("-dp",), "drop -dp", marks=pytest.mark.optional_deps("opacus")),
])
def test_bad_flags_end_with_one_line(flags, words, digits_root, tmp_path, capsys):
    assert main.main(cli(digits_root, tmp_path, "-algo", "APPLE", "-gr", "1", *flags)) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("flags", [("-dlr", "0", "-mu", "0", "-L", "0", "--sgd_momentum", "0"), ("-L", "1")])
def test_flags_at_their_bounds_are_accepted(flags, digits_root):
    """p frozen, no pull, no momentum, and λ(r) over all rounds (PFLlib's settings) are valid runs."""
    parse_config(cli(digits_root, digits_root, "-algo", "APPLE", *flags))  # its check_config raises FLError


@pytest.mark.parametrize("mode", ["cpu", "disk"])
def test_parked_clients_give_the_same_run(mode, digits_tiny_root, tmp_path):
    flags = ("-algo", "APPLE", "-gr", "3", "-jr", "0.4", "-lbs", "20", "--executor", "sequential")
    runs = []
    for sub, extra in (("live", ()), ("parked", ("--client_state", mode))):
        assert main.main(cli(digits_tiny_root, tmp_path / sub, *flags, *extra)) == 0
        runs.append(read_h5(tmp_path / sub / "Digits_APPLE_test_0.h5"))
    for key in runs[0]:
        if key != "rs_round_time":
            assert np.array_equal(runs[0][key], runs[1][key], equal_nan=True), key
