"""FedDBE: the running-mean step and MR by hand, the client's loss against a hand construction (its running
mean restarting each round), the initialization period's global mean against a reference loop (sent once;
round 0 starts from the initial model), the PRBM trained but never uploaded, and -ala (-dp: refused,
tests/test_dp_registry.py)."""
import copy

import pytest
import torch
from torch.nn import functional as F

from cli import parse_config
from conftest import cli
from flcore.clients.clientdbe import mean_regularizer, running_mean_update
from flcore.registry import get_server_class
from utils.batching import batches
from utils.data_utils import load_split
from utils.seeding import torch_gen
from runtime import loop


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedDBE", "--executor", "sequential", "-gr", "2", *flags))
    return get_server_class("FedDBE")(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root))


def test_running_mean_and_mean_regularizer_by_hand():
    r0 = torch.tensor([1.0, -2.0, 0.5])
    m = torch.tensor([3.0, 0.0, 0.5])
    r = running_mean_update(r0, m, 0.25)
    assert torch.allclose(r, torch.tensor([0.75 * 1 + 0.25 * 3, 0.75 * -2 + 0, 0.75 * 0.5 + 0.25 * 0.5]))
    g = torch.tensor([1.0, 1.0, 0.0])
    # r = (1.5, −1.5, 0.5): κ · mean ½ (r − g)² = 10 · (½·0.25 + ½·6.25 + ½·0.25) / 3 = 11.25
    assert float(mean_regularizer(r, g, 10.0)) == pytest.approx(11.25)


def test_client_loss_and_running_mean_by_hand(digits_tiny_root):
    server = make_server(digits_tiny_root, "-mo", "0.3", "-klw", "7")
    c = server.clients[0]
    m = c.model
    with torch.no_grad():
        m.prbm.normal_()
    c.global_mean = torch.randn_like(m.prbm)
    r0 = torch.randn_like(m.prbm)
    c.running_mean = r0.clone()
    x, y = c.x_train[:6], c.y_train[:6]
    loss = c.loss(x, y)
    rep = m.base(x)
    r = 0.7 * r0 + 0.3 * rep.mean(0)
    want = F.cross_entropy(m.head(rep + m.prbm), y) + 7 * (0.5 * (r - c.global_mean) ** 2).mean()
    assert torch.allclose(loss, want, atol=1e-6)
    assert torch.allclose(c.running_mean, r.detach(), atol=1e-6) and not c.running_mean.requires_grad
    # the previous running mean is a constant: the MR gradient reaches the body only through this batch
    (g_prbm,) = torch.autograd.grad(loss, [m.prbm], retain_graph=True)
    (g_hand,) = torch.autograd.grad(F.cross_entropy(m.head(rep.detach() + m.prbm), y), [m.prbm])
    assert torch.allclose(g_prbm, g_hand, atol=1e-6)
    # ... and it does reach the body: the body's gradient is the hand loss's, MR's part included
    body = list(m.base.parameters())
    mr_only = torch.autograd.grad(7 * (0.5 * (r - c.global_mean) ** 2).mean(), body, retain_graph=True)
    assert max(float(g.abs().max()) for g in mr_only) > 1e-3
    for got, hand in zip(torch.autograd.grad(loss, body), torch.autograd.grad(want, body)):
        torch.testing.assert_close(got, hand)


def test_each_round_starts_a_fresh_running_mean(digits_tiny_root, monkeypatch):
    c = make_server(digits_tiny_root).clients[0]
    c.global_mean = torch.zeros_like(c.model.prbm)
    c.running_mean = torch.full_like(c.running_mean, 5.0)  # left over from a previous round
    seen = []
    monkeypatch.setattr(c, "run_epochs", lambda *a, **k: seen.append(c.running_mean.clone()))
    c.local_update(0)
    assert len(seen) == 1 and torch.equal(seen[0], torch.zeros_like(seen[0]))


def test_initialization_period_gives_the_weighted_mean_once(digits_tiny_root):
    # -ld: the initialization period trains at round 0's rate (not round 1's); --seed 3: its own stream, not the default
    flags = ("-mo", "0.3", "-ld", "-ldg", "0.5", "--seed", "3")
    server = make_server(digits_tiny_root, *flags)
    ref = make_server(digits_tiny_root, *flags)  # a reference loop over a second, identical federation
    results = [c.initial_mean() for c in ref.clients]
    # client 0's initialization period by hand: plain CE on a copy (no PRBM, no MR), batches from its own
    # "dbe-init" stream, r ← (1 − μ) r + μ mean φ(x) after each batch
    c = ref.clients[0]
    model = copy.deepcopy(server.global_model)
    opt = torch.optim.SGD(model.parameters(), lr=c.cfg.local_learning_rate)
    r = torch.zeros_like(model.prbm)
    for idx in batches(c, 1, generator=torch_gen(c.cfg.seed, 0, "dbe-init", c.id)):
        rep = model.base(c.x_train[idx])
        r = (1 - c.cfg.momentum) * r + c.cfg.momentum * rep.mean(0).detach()
        opt.zero_grad()
        F.cross_entropy(model.head(rep), c.y_train[idx]).backward()
        opt.step()
    assert torch.allclose(results[0][1], r, atol=1e-6)
    assert not any(m.requires_grad for _, m in results)  # what goes up holds no graph of the local batches
    want = sum(w * m for w, m in results) / sum(w for w, _ in results)
    assert all(w == c.train_samples for (w, _), c in zip(results, ref.clients))
    start = {k: v.clone() for k, v in server.global_model.state_dict().items()}
    loop.run_round(server, 0)
    assert torch.allclose(server.global_mean, want, atol=1e-6)
    assert all(torch.equal(c.global_mean, server.global_mean) for c in server.clients)
    assert server.payload["mean"] is not None and server.bytes_up > 0
    server.prepare_broadcast(server.clients)
    assert server.payload["mean"] is None  # sent once
    # round 0 started from the initial model (the initialization period's copies were dropped): one more
    # identical federation that skips the initialization period ends round 0 where this one did
    twin = make_server(digits_tiny_root, *flags)
    twin.global_mean = want.clone()
    twin.payload = None
    twin.prepare_broadcast = lambda p: setattr(twin, "payload", {"model": twin.global_model, "mean": want})
    assert torch.equal(twin.global_model.state_dict()["base.fc1.0.weight"], start["base.fc1.0.weight"])
    loop.run_round(twin, 0)
    for k, v in server.global_model.state_dict().items():
        assert torch.allclose(v, twin.global_model.state_dict()[k], atol=1e-6), k
    # the initialization period's means are counted as uploaded, on top of the round's models
    assert server.bytes_up - twin.bytes_up == sum(m.numel() * m.element_size() for _, m in results) > 0


def test_prbm_is_trained_but_never_uploaded(digits_tiny_root):
    server = make_server(digits_tiny_root, "-lr", "0.1")
    loop.run_round(server, 0)
    c = server.clients[1]
    assert c.model.prbm.abs().max() > 0  # trained
    up = c.upload()
    assert up.state and not [k for k in up.state if k.startswith("prbm")]
    assert set(up.state) == {k for k in c.model.state_dict() if not k.startswith("prbm")}
    assert torch.equal(server.global_model.prbm, torch.zeros_like(server.global_model.prbm))


def test_ala_runs_on_the_received_model(digits_tiny_root):
    server = make_server(digits_tiny_root, "-ala", "--ala_max_epochs", "2")
    assert server.clients[0].ala.names[-2:] == ["head.weight", "head.bias"]
    loop.run_round(server, 0)
    loop.run_round(server, 1)
    assert all(torch.isfinite(p).all() for c in server.clients for p in c.model.parameters())


def test_the_evaluated_model_adds_the_prbm_and_receiving_loads_the_global_model(digits_tiny_root):
    server = make_server(digits_tiny_root)
    c = server.clients[0]
    with torch.no_grad():
        c.model.prbm.normal_()
        for p in server.global_model.parameters():
            p.add_(0.1)
    x = c.x_train[:5]
    with torch.no_grad():
        torch.testing.assert_close(c.model(x), c.model.head(c.model.base(x) + c.model.prbm))
    c.receive({"model": server.global_model, "mean": None})
    for k, v in server.global_model.state_dict().items():
        if not k.startswith("prbm"):
            assert torch.equal(c.model.state_dict()[k], v), k
