"""FedNova (servers/serverfednova.py) against hand computations and reference loops: ||a_i||_1 against the
paper's closed forms and against PyTorch's own SGD on a loss of constant gradient; the server's update on two
hand-made uploads whose step counts differ (and where FedAvg's differs); a round on unequal clients against
the update recomputed from their trained models; FedAvg's numbers when every client takes the same steps; the
local solver (momentum, proximal term, a fresh buffer each round) against a hand-written loop; the normalised
the refused settings (a robust rule among them). Only conftest's public fixtures and the public methods
of servers and clients are used."""
import copy
import math

import pytest
import torch

from cli import parse_config
from conftest import build_server, cli
from flcore.clients.clientbase import Upload
from flcore.clients.clientfednova import a_norm
from utils.batching import batches
from utils.errors import FLError
from runtime import loop
from runtime import client_steps


@pytest.mark.parametrize("steps", [1, 2, 7, 30])
def test_a_norm_is_the_papers_closed_form(steps):
    assert a_norm(steps, 0.1) == steps  # plain SGD: a_i = [1, ..., 1]
    rho = 0.9  # momentum: ||a_i||_1 = [τ − ρ(1 − ρ^τ)/(1 − ρ)] / (1 − ρ)
    assert a_norm(steps, 0.1, rho=rho) == pytest.approx((steps - rho * (1 - rho ** steps) / (1 - rho)) / (1 - rho))
    lr, mu = 0.05, 2.0  # proximal: a_i = [(1 − α)^{τ−1}, ..., 1], α = ημ
    alpha = lr * mu
    assert a_norm(steps, lr, mu=mu) == pytest.approx((1 - (1 - alpha) ** steps) / alpha)


@pytest.mark.parametrize("rho, mu", [(0.0, 0.0), (0.9, 0.0), (0.0, 3.0), (0.5, 3.0)])
def test_a_norm_is_what_pytorchs_sgd_does(rho, mu):
    """With the same gradient g at every step (a linear loss gᵀx) the steps move x by −η ||a_i||_1 g, for
    momentum and the proximal term alone and together (the case the paper gives no closed form for)."""
    lr, steps = 0.1, 6
    g = torch.tensor([1.0, -2.0, 0.5])
    x = torch.zeros(3, requires_grad=True)
    anchor = x.detach().clone()
    opt = torch.optim.SGD([x], lr=lr, momentum=rho)
    for _ in range(steps):
        opt.zero_grad()
        (g @ x + 0.5 * mu * ((x - anchor) ** 2).sum()).backward()
        opt.step()
    assert torch.allclose(anchor - x.detach(), lr * a_norm(steps, lr, rho, mu) * g, rtol=1e-5)


def shifted(state: dict, delta: float) -> dict:
    """``state`` with every floating entry moved by ``delta``."""
    return {k: v + delta if v.is_floating_point() else v for k, v in state.items()}


def test_two_clients_with_different_step_counts_by_hand(digits_tiny_root, tmp_path):
    """Client 1: 1 sample, τ = 2, x_1 = x + 0.2; client 2: 3 samples, τ = 6, x_2 = x − 0.1. So p = (1/4,
    3/4), d = (−0.1, 0.1/6), τ_eff = 1/4·2 + 3/4·6 = 5 and x ← x − 5(−0.025 + 0.0125) = x + 0.0625, where
    FedAvg gives x + 0.05 − 0.075 = x − 0.025."""
    server = build_server(digits_tiny_root, tmp_path, "-algo", "FedNova")
    x = copy.deepcopy(server.global_model.state_dict())
    uploads = [Upload(1, 1.0, shifted(x, 0.2), {"a_norm": 2.0}), Upload(2, 3.0, shifted(x, -0.1), {"a_norm": 6.0})]
    server.aggregate(uploads)
    for k, v in server.global_model.named_parameters():
        assert torch.allclose(v.detach(), x[k] + 0.0625, atol=1e-6), k
    fedavg = build_server(digits_tiny_root, tmp_path, "-algo", "FedAvg")
    fedavg.aggregate(uploads)
    for k, v in fedavg.global_model.named_parameters():
        assert torch.allclose(v.detach(), x[k] - 0.025, atol=1e-6), k


def test_a_round_on_unequal_clients_is_the_normalised_update(digits_tiny_root, tmp_path):
    """A whole round (5 clients, 37-98 samples, -lbs 20: τ_i = ceil(n_i / 20) differ), recomputed from the
    clients' trained models: x + τ_eff Σ p_i (x_i − x) / τ_i, not FedAvg's Σ p_i x_i."""
    server = build_server(digits_tiny_root, tmp_path, "-algo", "FedNova")
    x = copy.deepcopy(server.global_model.state_dict())
    loop.run_round(server, 0)
    n = [c.train_samples for c in server.clients]
    tau = [math.ceil(m / 20) for m in n]
    assert len(set(tau)) > 1, tau
    p = [m / sum(n) for m in n]
    tau_eff = sum(pi * ti for pi, ti in zip(p, tau))
    new = server.global_model.state_dict()
    gap = 0.0
    for k, _ in server.global_model.named_parameters():
        trained = [c.model.state_dict()[k] for c in server.clients]
        expected = x[k] + tau_eff * sum(pi * (xi - x[k]) / ti for pi, xi, ti in zip(p, trained, tau))
        assert torch.allclose(new[k], expected, atol=1e-6), k
        gap = max(gap, float((expected - sum(pi * xi for pi, xi in zip(p, trained))).abs().max()))
    assert gap > 1e-4  # FedAvg's update is another


def test_equal_step_counts_give_fedavgs_numbers(digits_root, tmp_path):
    """Every client of the IID split takes the same number of steps: FedNova is FedAvg over two rounds."""
    models = {}
    for algo in ("FedAvg", "FedNova"):
        server = build_server(digits_root, tmp_path, "-algo", algo)
        assert len({c.steps_per_round() for c in server.clients}) == 1
        for t in range(2):
            loop.run_round(server, t)
        models[algo] = server.global_model.state_dict()
    for k, v in models["FedAvg"].items():
        assert torch.allclose(models["FedNova"][k].float(), v.float(), atol=1e-6), k


def test_the_local_solver_is_momentum_sgd_on_the_proximal_loss(digits_tiny_root, tmp_path):
    """Round 1 of a client (after a round 0 that filled the momentum buffer) against a hand-written heavy-ball
    loop on cross-entropy + (μ/2)||x − x^t||² over the same batches, from an empty buffer; its uploaded
    ||a_i||_1 is ``a_norm`` of its steps."""
    rho, mu, lr = 0.9, 0.5, 0.1
    server = build_server(digits_tiny_root, tmp_path, "-algo", "FedNova", "-rho", str(rho), "-mu", str(mu))
    loop.run_round(server, 0)
    client = server.clients[0]
    client.receive(server.global_model, True)
    model = copy.deepcopy(client.model)
    anchor = [p.detach().clone() for p in model.parameters()]
    gen = torch.Generator()
    gen.set_state(client.batch_gen.get_state())
    buffers = [torch.zeros_like(p) for p in model.parameters()]
    steps = 0
    for idx in batches(client, 1, generator=gen):
        loss = torch.nn.functional.cross_entropy(model(client.x_train[idx]), client.y_train[idx])
        grads = torch.autograd.grad(loss, list(model.parameters()))
        with torch.no_grad():
            for p, g, b, a in zip(model.parameters(), grads, buffers, anchor):
                b.mul_(rho).add_(g + mu * (p - a))
                p.sub_(lr * b)
        steps += 1
    client_steps.train(client, 1)
    for (k, mine), theirs in zip(client.model.named_parameters(), model.parameters()):
        assert torch.allclose(mine, theirs, atol=1e-5), k
    assert steps == client.steps_per_round()
    assert client.upload().extras["a_norm"] == pytest.approx(a_norm(steps, lr, rho, mu))


@pytest.mark.parametrize("flags, message", [
    (("-rho", "1"), "-rho must be in [0, 1)"),
    (("-rho", "-0.5"), "-rho must be in [0, 1)"),
    (("-mu", "-0.1"), "-mu must be >= 0"),
    (("-mu", "20", "-lr", "0.1"), "-mu x -lr < 1"),
    (("-mu", "15", "-lr", "0.1"), "-mu x -lr < 1"),
    (("-mu", "10", "-lr", "0.1"), "-mu x -lr < 1"),  # exactly 1: the proximal step lands on x^t
    pytest.param(("-dp", "--dp_level", "client"), "--dp_level client: FedNova is refused",
                 marks=pytest.mark.optional_deps("opacus")),
    (("--aggregator", "median"), "--aggregator: FedNova cannot take it: its server rescales every update"),
])
def test_refused_settings_say_why(flags, message, tmp_path):
    with pytest.raises(FLError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        parse_config(cli(tmp_path, tmp_path, "-algo", "FedNova", *flags))


@pytest.mark.parametrize("flags", [("-rho", "0"), ("-rho", "0.99"), ("-mu", "9", "-lr", "0.1")])
def test_settings_inside_the_bounds_are_taken(flags, tmp_path):
    cfg = parse_config(cli(tmp_path, tmp_path, "-algo", "FedNova", *flags))
    assert (cfg.rho, cfg.mu) == (float(flags[1]) if flags[0] == "-rho" else 0.0,
                                 float(flags[1]) if flags[0] == "-mu" else 0.0)
