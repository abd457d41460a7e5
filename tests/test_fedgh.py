"""FedGH: the uploaded class-averaged representations against per-class means taken by hand, the server's
header steps against a hand-written loop, what crosses the wire (no body, no model entry; only the header
goes down), -ala, and -slr's bound."""
import pytest
import torch
from torch import nn

import main
from cli import parse_config
from conftest import cli
from flcore.prototypes import class_means
from flcore.registry import get_server_class
from flcore.servers.servergh import train_header
from utils.comm import payload_bytes
from utils.data_utils import load_split
from utils.errors import FLError
from runtime import loop


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedGH", "--executor", "sequential", "-nc", "3", "-lbs", "20",
                                "-lr", "0.1", "--train_loss_eval", "off", *flags))
    return get_server_class("FedGH")(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root, 3))


def state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def uploads_of_round(server, t=0):
    seen = []
    receive = loop.receive
    loop.receive = lambda srv, clients: seen.extend(receive(srv, clients)) or seen
    try:
        loop.run_round(server, t)
    finally:
        loop.receive = receive
    return seen


def test_class_means_by_hand():
    feats = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0], [0.0, 1.0]])
    y = torch.tensor([2, 0, 2, 0, 2])
    means, labels = class_means(feats, y, 4)
    assert labels.tolist() == [0, 2]
    assert torch.allclose(means, torch.tensor([[5.0, 6.0], [2.0, 3.0]]))  # (3+7)/2, (4+8)/2; (1+5+0)/3, (2+6+1)/3


def test_uploaded_representations_are_the_class_means_of_the_trained_body(digits_tiny_root):
    server = make_server(digits_tiny_root)
    uploads = uploads_of_round(server)
    assert sorted(u.id for u in uploads) == [0, 1, 2]
    for u in uploads:
        c = server.clients[u.id]
        with torch.no_grad():
            feats = c.model.base.eval()(c.x_train)  # the body as trained this round, every training sample
        classes = sorted(set(c.y_train.tolist()))
        assert u.extras["labels"].tolist() == classes
        for row, k in zip(u.extras["reps"], classes):
            rows = [feats[i] for i in range(len(c.y_train)) if int(c.y_train[i]) == k]
            assert torch.allclose(row, sum(rows) / len(rows), atol=1e-5), (u.id, k)


def reference_header(head: nn.Linear, pairs, lr):
    """Softmax regression by hand: W -= lr (softmax(W r + b) - e_y) r^T, b -= lr (softmax(W r + b) - e_y)."""
    w, b = head.weight.detach().clone().double(), head.bias.detach().clone().double()
    for r, y in pairs:
        r = r.double()
        err = torch.softmax(w @ r + b, 0)
        err[y] -= 1
        w, b = w - lr * torch.outer(err, r), b - lr * err
    return w, b


def test_header_steps_follow_the_hand_loop():
    torch.manual_seed(0)
    head = nn.Linear(3, 4)
    reps, labels = torch.randn(5, 3), torch.tensor([1, 3, 0, 1, 2])
    w, b = reference_header(head, list(zip(reps, labels)), 0.7)
    train_header(head, reps, labels, 0.7)
    assert torch.allclose(head.weight.double(), w, atol=1e-6) and torch.allclose(head.bias.double(), b, atol=1e-6)


def test_server_trains_its_header_on_every_pair_by_client_id(digits_tiny_root):
    from flcore.clients.clientbase import Upload

    server = make_server(digits_tiny_root, "-slr", "0.5")
    head = server.global_model.head
    g = torch.Generator().manual_seed(1)
    d = head.in_features
    a = Upload(2, 10, None, {"reps": torch.randn(2, d, generator=g), "labels": torch.tensor([4, 7])})
    b = Upload(0, 10, None, {"reps": torch.randn(1, d, generator=g), "labels": torch.tensor([9])})
    pairs = list(zip(b.extras["reps"], b.extras["labels"])) + list(zip(a.extras["reps"], a.extras["labels"]))
    w, bias = reference_header(head, pairs, 0.5)
    body = {k: v.clone() for k, v in server.global_model.base.state_dict().items()}
    server.aggregate([a, b])  # arrival order does not matter: client 0's pairs go first
    assert torch.allclose(head.weight.double(), w, atol=1e-6) and torch.allclose(head.bias.double(), bias, atol=1e-6)
    assert all(torch.equal(v, server.global_model.base.state_dict()[k]) for k, v in body.items())


def test_no_body_is_uploaded_and_only_the_header_goes_down(digits_tiny_root):
    server = make_server(digits_tiny_root)
    uploads = uploads_of_round(server)
    for u in uploads:
        assert u.state is None and set(u.extras) == {"reps", "labels"}
        assert payload_bytes(u) == payload_bytes(u.extras) + 8  # class means, labels, the weight
        params = list(server.clients[u.id].model.parameters())
        assert not any(t.shape == p.shape and torch.equal(t, p) for t in u.extras.values() for p in params)
    head_bytes = payload_bytes(server.global_model.head)
    assert payload_bytes(server.broadcast(server.clients[0])) == head_bytes
    assert server.bytes_down == 3 * head_bytes
    loop.send(server, server.select_clients())  # every client takes the global header over its own body
    glob = server.global_model.head.state_dict()
    bodies = [c.model.base.state_dict() for c in server.clients]
    for c in server.clients:
        assert all(torch.equal(v, glob[k]) for k, v in c.model.head.state_dict().items())
    assert any(not torch.equal(v, bodies[1][k]) for k, v in bodies[0].items())  # the bodies stay each client's


def test_ala_adapts_the_received_header(digits_tiny_root, tmp_path):
    server = make_server(digits_tiny_root, "-ala")
    c = server.clients[0]
    assert c.ala.names == ["head.weight", "head.bias"]
    loop.run_round(server, 0)
    calls = []
    c.ala.adaptive_local_aggregation = lambda glob, target, x, y: calls.append((state(glob), state(target)))
    server.round_idx = 1
    loop.send(server, server.select_clients())
    (received, target), = calls  # the global header under the client's own body
    assert all(torch.equal(received[f"head.{k}"], v) for k, v in server.global_model.head.state_dict().items())
    assert all(torch.equal(received[k], v) for k, v in target.items() if k.startswith("base."))
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "FedGH", "-ala", "-gr", "2", "-nc", "3",
                         "--executor", "sequential")) == 0


def test_server_rate_must_be_positive(digits_tiny_root):
    cfg = parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedGH", "-slr", "0.01"))
    assert cfg.server_learning_rate == 0.01
    with pytest.raises(FLError, match="-slr 0 is out of range"):
        parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedGH", "-slr", "0"))
