"""PFL-DA: the personal head's loss and gradient against the hand formula (λ ||h_i − h_g||₂), the two
phases each moving only their own parts, the upload (the global head only) and its sample-weighted mean,
the personal prediction, and -ala refused (-dp: tests/test_dp_registry.py)."""
import pytest
import torch
from torch.nn import functional as F

from cli import parse_config
from conftest import cli
from flcore.registry import get_server_class
from utils.data_utils import load_split
from utils.errors import FLError
from runtime import loop
from runtime import client_steps


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "PFL-DA", "--executor", "sequential", "-gr", "2", *flags))
    return get_server_class("PFL-DA")(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root))


def snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_personal_head_loss_and_gradient_by_hand(digits_tiny_root):
    c = make_server(digits_tiny_root, "-lam", "0.7").clients[0]
    m = c.model
    with torch.no_grad():
        for p in m.ghead.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x, y = c.x_train[:5], c.y_train[:5]
    loss = c.loss(x, y)
    diff = torch.cat([(p - q).reshape(-1) for p, q in zip(m.head.parameters(), m.ghead.parameters())]).detach()
    ce = F.cross_entropy(m.head(m.base(x)), y)
    assert float(loss.detach()) == pytest.approx(float(ce.detach()) + 0.7 * float(diff.norm()), rel=1e-6)
    got = torch.autograd.grad(loss, list(m.head.parameters()) + list(m.ghead.parameters()), allow_unused=True)
    ce_grad = torch.autograd.grad(ce, list(m.head.parameters()))
    unit = diff / diff.norm()  # d||d||/dd = d / ||d||
    sizes = [p.numel() for p in m.head.parameters()]
    for g, gce, u, p in zip(got[:2], ce_grad, unit.split(sizes), m.head.parameters()):
        assert torch.allclose(g, gce + 0.7 * u.view_as(p), atol=1e-6)
    assert all(g is None for g in got[2:])  # the global head is a constant here


def test_each_phase_moves_only_its_parts(digits_tiny_root, monkeypatch):
    server = make_server(digits_tiny_root, "-lr", "0.1")
    c = server.clients[0]
    m = c.model
    states = [snapshot(m)]
    run = c.run_epochs
    monkeypatch.setattr(c, "run_epochs", lambda *a, **k: (run(*a, **k), states.append(snapshot(m)))[0])
    client_steps.train(c, 0)
    assert len(states) == 3

    def moved(a, b, prefix):
        return any(not torch.equal(a[k], b[k]) for k in a if k.startswith(prefix))

    start, mid, end = states
    assert moved(start, mid, "head.") and not moved(start, mid, "base.") and not moved(start, mid, "ghead.")
    assert not moved(mid, end, "head.") and moved(mid, end, "base.") and moved(mid, end, "ghead.")


def test_only_the_global_head_is_uploaded_and_averaged(digits_tiny_root, monkeypatch):
    server = make_server(digits_tiny_root, "-lr", "0.1")
    seen = []
    receive = loop.receive
    monkeypatch.setattr(loop, "receive", lambda srv, cs: seen.append(receive(srv, cs)) or seen[-1])
    start = snapshot(server.global_model)
    loop.run_round(server, 0)
    uploads = seen[0]
    assert all(set(u.state) == {"ghead.weight", "ghead.bias"} for u in uploads)
    n = sum(u.weight for u in uploads)
    for k in ("ghead.weight", "ghead.bias"):
        want = sum(u.weight * u.state[k] for u in uploads) / n
        assert torch.allclose(server.global_model.state_dict()[k], want, atol=1e-6)
    for k, v in server.global_model.state_dict().items():
        if not k.startswith("ghead."):
            assert torch.equal(v, start[k]), k  # the personal parts' server copies are never touched
    c = server.clients[3]
    x = c.x_test[:4]
    assert torch.equal(c.eval_model()(x), c.model.head(c.model.base(x)))  # evaluated: the personal model


def test_ala_is_refused(digits_tiny_root):
    with pytest.raises(FLError, match="-ala"):
        parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "PFL-DA", "-ala"))
