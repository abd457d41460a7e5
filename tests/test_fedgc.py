"""FedGC: the server's corrected step on toy embeddings against a hand computation (negatives only from
clients that lack the anchor's class), the local softmax over a client's own classes (other rows get no
gradient), the round's wiring (upload = body + own rows; the corrected rows come back), -ala runs
(-dp is refused: tests/test_dp_registry.py)."""
import math

import pytest
import torch
from torch.nn import functional as F

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientgc import GCModel
from flcore.registry import get_server_class
from flcore.servers.servergc import corrected, gc_regulariser
from utils.data_utils import load_split
from runtime import loop
from runtime import client_steps


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedGC", "--executor", "sequential", "-nc", "3", *flags))
    return get_server_class("FedGC")(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root, 3))


def test_corrected_step_by_hand():
    # client 0 holds classes {0, 2}, client 1 holds {1, 2}; embeddings in R^3
    w0 = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    w1 = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]])
    classes = [torch.tensor([0, 2]), torch.tensor([1, 2])]
    e = math.e
    # anchor (0, class 0) = [1,0,0], a.a = 1: negatives are client 1's rows (dots 0 and 0.5)
    z0 = e + 1 + math.exp(0.5)
    # anchor (1, class 1) = [0,1,0], a.a = 1: negatives are client 0's rows (dots 0 and 0)
    z1 = e + 2
    # class 2 is held by both clients: its anchors have no negatives and add nothing
    reg = (math.log(z0) - 1) + (math.log(z1) - 1)
    assert float(gc_regulariser([w0, w1], classes)) == pytest.approx(reg, rel=1e-6)
    step = 0.3
    new0, new1 = corrected([w0, w1], classes, step)
    # d Reg / d W_n = p_{m,n} a_m over the anchors m that have n as a negative (anchors held fixed)
    want0 = w0 - step * torch.tensor([[0.0, 1 / z1, 0.0], [0.0, 1 / z1, 0.0]])
    want1 = w1 - step * torch.tensor([[1 / z0, 0.0, 0.0], [math.exp(0.5) / z0, 0.0, 0.0]])
    assert torch.allclose(new0, want0, atol=1e-6) and torch.allclose(new1, want1, atol=1e-6)


def test_local_softmax_over_own_classes(digits_noniid_root):
    client = make_server(digits_noniid_root).clients[0]
    m = client.model
    own = client.own
    assert len(own) == 2 and torch.equal(m.classes.nonzero().flatten(), own)
    x, y = client.x_train[:8], client.y_train[:8]
    loss = client.loss(x, y)
    z = m.base(x) @ m.head.weight[own].T  # the softmax over this client's classes only
    want = F.cross_entropy(z, torch.searchsorted(own, y))
    assert float(loss.detach()) == pytest.approx(float(want.detach()), rel=1e-6)
    (g,) = torch.autograd.grad(loss, [m.head.weight])
    others = torch.ones(10, dtype=torch.bool)
    others[own] = False
    assert torch.equal(g[others], torch.zeros_like(g[others])) and g[own].abs().sum() > 0


def test_round_uploads_own_rows_and_receives_them_corrected(digits_noniid_root, monkeypatch):
    server = make_server(digits_noniid_root, "-lam", "2.0", "-lr", "0.05")
    seen = []
    receive = loop.receive
    monkeypatch.setattr(loop, "receive", lambda srv, cs: seen.extend(receive(srv, cs)) or seen)
    loop.run_round(server, 0)
    assert sorted(u.id for u in seen) == [0, 1, 2]
    for u in seen:
        assert set(u.state) == {k for k in server.global_model.state_dict() if k.startswith("base.")}
        assert torch.equal(u.extras["classes"], server.clients[u.id].own)
    up = {u.id: u.extras for u in seen}
    ids = sorted(up)
    want = corrected([up[i]["embeddings"] for i in ids], [up[i]["classes"] for i in ids], 2.0 * 0.05)
    assert any(not torch.equal(w, up[i]["embeddings"]) for i, w in zip(ids, want))  # the step moved them
    for i, w in zip(ids, want):
        assert torch.equal(server.embeddings[i][1], w)
    server.round_idx = 1
    loop.send(server, server.select_clients())
    for i in ids:
        c = server.clients[i]
        assert torch.equal(c.model.head.weight[c.own], server.embeddings[i][1])


@pytest.mark.parametrize("lam", [0.0, 1.0])
def test_server_step_is_lambda_times_the_decayed_rate(digits_noniid_root, monkeypatch, lam):
    server = make_server(digits_noniid_root, "-lam", str(lam), "-lr", "0.05", "-ld", "-ldg", "0.5")
    seen = []
    receive = loop.receive
    monkeypatch.setattr(loop, "receive", lambda srv, cs: seen.extend(receive(srv, cs)) or seen)
    loop.run_round(server, 2)
    up = {u.id: u.extras for u in seen}
    ids = sorted(up)
    step = lam * 0.05 * 0.5 ** 2  # λ · lr decayed for round 2
    want = corrected([up[i]["embeddings"] for i in ids], [up[i]["classes"] for i in ids], step)
    for i, w in zip(ids, want):
        assert torch.equal(server.embeddings[i][0], up[i]["classes"])  # the classes stay with them
        assert torch.equal(server.embeddings[i][1], w if lam else up[i]["embeddings"])
    stored = {i: e.clone() for i, (_, e) in server.embeddings.items()}
    server.aggregate([])  # a round nobody uploaded in: no further step
    assert all(torch.equal(server.embeddings[i][1], e) for i, e in stored.items())


def test_embeddings_start_as_the_classifier_and_the_class_mask_stays_out_of_the_state():
    """GCModel takes the split model's classifier weights as its class embeddings (a copy; its bias is
    dropped), and ``classes`` is a buffer outside the state: the state is the body and the embeddings."""
    torch.manual_seed(0)
    split = torch.nn.Module()
    split.base = torch.nn.Linear(4, 3)
    split.head = torch.nn.Linear(3, 5)
    with torch.no_grad():
        split.head.weight.copy_(torch.arange(15.0).reshape(5, 3))
    m = GCModel(split)
    assert torch.equal(m.head.weight, torch.arange(15.0).reshape(5, 3)) and m.head.bias is None
    assert m.head.weight.data_ptr() != split.head.weight.data_ptr()
    assert sorted(m.state_dict()) == ["base.bias", "base.weight", "head.weight"]
    assert torch.equal(m.classes, torch.ones(5, dtype=torch.bool))


def test_uploaded_embeddings_hold_no_graph(digits_noniid_root):
    server = make_server(digits_noniid_root)
    c = server.clients[0]
    loop.send(server, [c])
    client_steps.train(c, 0)
    rows = c.upload().extras["embeddings"]
    assert not rows.requires_grad and rows.grad_fn is None
    assert torch.equal(rows, c.model.head.weight.detach()[c.own])


def test_ala_runs(digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "FedGC", "-ala", "-gr", "2", "-nc", "3",
                         "--executor", "sequential")) == 0
    assert "ALA adapts 2 tensor(s) (last 2 tensor(s), -p): base.fc1.0.weight, base.fc1.0.bias" in capsys.readouterr().out
