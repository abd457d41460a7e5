"""FedRoD: the balanced softmax by hand (absent classes included), each head's gradient against a hand
construction, absent classes' generic-head rows left alone by local training, the personalized
prediction = generic + personal logits, the upload (body + generic head, never the personal head) and its
sample-weighted mean, -ala on the received part (-dp: tests/test_dp_registry.py)."""
import math

import pytest
import torch
from torch.nn import functional as F

from cli import parse_config
from conftest import cli
from flcore.clients.clientbase import Upload
from flcore.clients.clientrod import balanced_softmax_loss
from flcore.registry import get_server_class
from utils.data_utils import load_split
from runtime import loop
from runtime import client_steps


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedRoD", "--executor", "sequential", *flags))
    return get_server_class("FedRoD")(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root))


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_balanced_softmax_by_hand():
    z = torch.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]], requires_grad=True)
    y = torch.tensor([0, 2])
    counts = torch.tensor([2.0, 0.0, 1.0])  # class 1 absent
    loss = balanced_softmax_loss(z, y, counts.log())
    # p(y|x) = n_y e^{z_y} / sum_c n_c e^{z_c}
    p0 = 2 * math.exp(1.0) / (2 * math.exp(1.0) + 0 + 1 * math.exp(0.5))
    p1 = 1 * math.exp(3.0) / (2 * math.exp(0.0) + 0 + 1 * math.exp(3.0))
    assert float(loss.detach()) == pytest.approx(-(math.log(p0) + math.log(p1)) / 2, rel=1e-6)
    (g,) = torch.autograd.grad(loss, z)
    assert torch.isfinite(g).all() and torch.equal(g[:, 1], torch.zeros(2))  # the absent class: no gradient
    # d/dz_c = (q_c - [c = y]) / B with q the prior-shifted softmax
    q = torch.tensor([[p0, 0.0, 1 - p0], [1 - p1, 0.0, p1]])
    want = (q - F.one_hot(y, 3).float()) / 2
    assert torch.allclose(g, want, atol=1e-6)


def test_each_head_gets_its_own_objectives_gradient(digits_noniid_root):
    client = make_server(digits_noniid_root).clients[0]
    m = client.model
    x, y = client.x_train[:8], client.y_train[:8]
    loss = client.loss(x, y)
    names = [n for n, _ in m.named_parameters()]
    got = dict(zip(names, torch.autograd.grad(loss, list(m.parameters()))))
    # Hand construction: the generic part sees only the balanced softmax of h_G(phi(x)) ...
    counts = torch.bincount(client.y_train, minlength=10).float()
    generic = F.cross_entropy(m.head(m.base(x)) + counts.log(), y)
    gen_params = [p for n, p in m.named_parameters() if not n.startswith("phead.")]
    for (n, _), g in zip([(n, p) for n, p in m.named_parameters() if not n.startswith("phead.")],
                         torch.autograd.grad(generic, gen_params)):
        assert torch.allclose(got[n], g, atol=1e-6), n
    # ... the personal head only the cross-entropy of the summed logits, at fixed features and generic logits.
    with torch.no_grad():
        f = m.base(x)
        zg = m.head(f)
    personal = F.cross_entropy(zg + m.phead(f), y)
    for (n, _), g in zip([(n, p) for n, p in m.named_parameters() if n.startswith("phead.")],
                         torch.autograd.grad(personal, list(m.phead.parameters()))):
        assert torch.allclose(got[n], g, atol=1e-6), n
    assert len(counts.nonzero()) == 2  # a pathological client: eight classes absent


def test_absent_classes_rows_of_the_generic_head_stay(digits_noniid_root):
    """Under the balanced softmax a class the client has no sample of gets no gradient, so local SGD
    leaves its generic-head row alone (plain cross-entropy would push it down), while the present
    classes' rows and the personal head move."""
    client = make_server(digits_noniid_root, "-lr", "0.1").clients[0]
    present = torch.bincount(client.y_train, minlength=10) > 0
    before = state(client.model)
    client_steps.train(client, 0)
    after = state(client.model)
    for k in ("head.weight", "head.bias"):
        assert torch.equal(after[k][~present], before[k][~present]), k
        assert not torch.equal(after[k][present], before[k][present]), k
    assert not torch.equal(after["phead.weight"], before["phead.weight"])


def test_personalized_prediction_is_generic_plus_personal_logits(digits_noniid_root):
    server = make_server(digits_noniid_root, "-lr", "0.1")
    client = server.clients[1]
    client_steps.train(client, 0)
    m = client.eval_model()
    x = client.x_test[:5]
    with torch.no_grad():
        f = m.base(x)
        assert torch.allclose(m(x), m.head(f) + m.phead(f))
        assert not torch.allclose(m(x), m.head(f))


def test_upload_and_aggregate(digits_noniid_root):
    server = make_server(digits_noniid_root, "-lr", "0.1")
    client = server.clients[0]
    client_steps.train(client, 0)
    up = client.upload()
    model = state(client.model)
    assert sorted(up.state) == sorted(k for k in model if k.startswith(("base.", "head.")))
    assert not any(k.startswith("phead.") for k in up.state)
    before = state(server.global_model)
    shared = list(up.state)
    server.aggregate([Upload(0, 2.0, {k: torch.full_like(before[k], 3.0) for k in shared}),
                      Upload(1, 6.0, {k: torch.full_like(before[k], -1.0) for k in shared})])
    after = state(server.global_model)
    for k, v in after.items():  # (2 * 3 + 6 * -1) / 8 = 0; the server's personal head never moves
        assert torch.equal(v, torch.zeros_like(v) if k in shared else before[k]), k


def test_ala_adapts_the_received_part_under_the_personal_head(digits_noniid_root):
    server = make_server(digits_noniid_root, "-ala", "--ala_layers", "2", "--ala_max_epochs", "5", "-gr", "2", "-lr", "0.1")
    client = server.clients[0]
    assert client.ala.names[-2:] == ["head.weight", "head.bias"]
    assert len(client.ala.names) == 4 and client.ala.names[0].startswith("base.")
    loop.run_round(server, 0)
    loop.run_round(server, 1)
    mine = state(client.model.phead)
    server.round_idx = 2
    loop.send(server, server.clients)
    assert client.ala.weights is not None
    assert all(torch.equal(v, state(client.model.phead)[k]) for k, v in mine.items())
    glob, got = state(server.global_model), state(client.model)
    assert all(torch.equal(got[k], glob[k]) for k in glob if not k.startswith("phead.") and k not in client.ala.names)
    assert any(not torch.equal(got[k], glob[k]) for k in client.ala.names)
