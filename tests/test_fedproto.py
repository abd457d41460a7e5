"""FedProto: prototypes are the per-class means of the representations, the server's count-weighted
per-class mean by hand, the regulariser and the nearest-prototype classifier by hand, no weights on
the wire (and the bytes counted are the prototypes'), -ala and -dp refused."""
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import main
from cli import parse_config
from conftest import cli
from flcore.prototypes import NearestPrototype, aggregate_prototypes, class_prototypes, prototype_pull, representations
from flcore.registry import get_server_class
from utils.data_utils import load_split
from runtime import loop


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedProto", "--executor", "sequential", "-lr", "0.1",
                                "-lbs", "20", *flags))
    return get_server_class("FedProto")(cfg.replace(num_classes=10), load_split("Digits", root))


def test_class_prototypes_by_hand():
    f = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [0.0, -1.0]])
    y = torch.tensor([0, 2, 0, 2])
    protos, counts = class_prototypes(f, y, 4)
    assert counts == {0: 2, 2: 2}
    assert torch.equal(protos[0], torch.tensor([3.0, 4.0])) and torch.equal(protos[2], torch.tensor([1.5, 1.5]))


def test_server_aggregation_by_hand():
    # class 0 held by both clients (1 and 2 samples), class 1 by the first only
    protos = [{0: torch.tensor([1.0, 0.0]), 1: torch.tensor([0.0, 2.0])}, {0: torch.tensor([4.0, 3.0])}]
    counts = [{0: 1, 1: 3}, {0: 2}]
    agg = aggregate_prototypes(protos, counts)
    assert sorted(agg) == [0, 1]
    assert torch.allclose(agg[0], torch.tensor([3.0, 2.0])) and torch.allclose(agg[1], torch.tensor([0.0, 2.0]))


def test_uploads_are_the_class_means_of_the_trained_body_and_carry_no_weights(digits_tiny_root, monkeypatch):
    server = make_server(digits_tiny_root)
    seen = []
    receive = loop.receive
    monkeypatch.setattr(loop, "receive", lambda srv, clients: seen.append(receive(srv, clients)) or seen[-1])
    before = [{k: t.clone() for k, t in c.model.base.state_dict().items()} for c in server.clients]
    loop.run_round(server, 0)
    uploads = seen[0]
    d = server.clients[0].model.head.in_features
    for c, start in zip(server.clients, before):  # the prototypes below are of a body that has trained
        assert any(not torch.equal(t, start[k]) for k, t in c.model.base.state_dict().items())
    for u in uploads:
        c = server.clients[u.id]
        assert u.state is None and set(u.extras) == {"protos", "counts"}
        # reference: the trained body on the whole training split in one plain forward, averaged per class
        c.model.eval()
        with torch.no_grad():
            reps = list(c.model.base(c.x_train))
        labels = c.y_train.tolist()
        for k in set(labels):
            members = [r for r, lab in zip(reps, labels) if lab == k]
            assert u.extras["counts"][k] == len(members)
            assert torch.allclose(u.extras["protos"][k], torch.stack(members).mean(0), atol=1e-5)
        assert sorted(u.extras["protos"]) == sorted(set(labels))
    # what crossed the wire: d floats per class held, one number (its count) per class, and each upload's
    # weight (a number)
    classes = sum(len(u.extras["protos"]) for u in uploads)
    assert server.bytes_up == classes * (4 * d + 8) + 8 * len(uploads)
    # the server's prototypes are the count-weighted means of the uploads (a reference loop), and everyone
    # receives them
    expected = {}
    for k in {k for u in uploads for k in u.extras["protos"]}:
        held = [(u.extras["counts"][k], u.extras["protos"][k]) for u in uploads if k in u.extras["protos"]]
        expected[k] = sum(n * p for n, p in held) / sum(n for n, _ in held)
    assert sorted(server.global_protos) == sorted(expected)
    for k, p in expected.items():
        torch.testing.assert_close(server.global_protos[k], p)
    server.bytes_down = 0
    loop.send(server, server.select_clients())
    assert server.bytes_down == len(server.clients) * len(expected) * 4 * d
    for c in server.clients:
        assert all(torch.equal(c.global_protos[k], server.global_protos[k]) for k in expected)


def test_prototype_pull_by_hand():
    z = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    y = torch.tensor([0, 1, 2])  # class 1 has no prototype: adds nothing
    pull = prototype_pull(z, y, {0: torch.tensor([0.0, 0.0]), 2: torch.tensor([5.0, 5.0])}, 3)
    assert pull.item() == pytest.approx((1 + 4 + 0 + 1) / 6)  # mean over 3 samples x 2 coordinates


def test_regulariser_in_the_client_loss(digits_tiny_root):
    server = make_server(digits_tiny_root, "-lam", "0.5")
    c = server.clients[0]
    d = c.model.head.in_features
    x, y = c.x_train[:4], torch.tensor([1, 1, 3, 5])  # class 5 has no global prototype: adds nothing
    c.global_protos = {1: torch.ones(d), 3: torch.arange(d, dtype=torch.float32)}
    z = c.model.base(x)
    ce = nn.functional.cross_entropy(c.model.head(z), y)
    pull = ((z[0] - 1) ** 2).sum() + ((z[1] - 1) ** 2).sum() + ((z[2] - torch.arange(d)) ** 2).sum()
    assert torch.allclose(c.loss(x, y), ce + 0.5 * pull / (4 * d), atol=1e-5)
    c.global_protos = {}
    assert torch.allclose(c.loss(x, y), ce)


def test_nearest_prototype_by_hand():
    table = torch.tensor([[0.0, 0.0], [1.0, 1.0], [9.0, 9.0]])
    model = NearestPrototype(nn.Identity(), table, torch.tensor([True, True, False]))
    scores = model(torch.tensor([[0.9, 0.8], [0.1, 0.0]]))
    near = torch.tensor([[-(0.81 + 0.64), -(0.01 + 0.04)], [-0.01, -(0.81 + 1.0)]])
    assert torch.allclose(scores[:, :2], near)
    assert torch.allclose(scores[:, 2], near.min(1).values - 30.0)  # the documented margin
    assert scores.argmax(1).tolist() == [1, 0]
    # normalize: each row scaled to unit length first ([3, 4] -> [0.6, 0.8], [0, 2] -> [0, 1])
    unit = NearestPrototype(nn.Identity(), torch.eye(2), torch.tensor([True, True]), normalize=True)
    scores = unit(torch.tensor([[3.0, 4.0], [0.0, 2.0]]))
    assert torch.allclose(scores, -torch.tensor([[0.4 ** 2 + 0.8 ** 2, 0.6 ** 2 + 0.2 ** 2], [2.0, 0.0]]))


def test_representations_are_taken_in_eval_mode_without_grad_and_restore_the_mode():
    lin = nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0], [0.0, -1.0]]))
        lin.bias.zero_()
    body = nn.Sequential(lin, nn.Dropout(0.9))  # in training mode dropout would zero most entries
    x = torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.5, -1.0]])
    for training in (True, False):
        body.train(training)
        z = representations(SimpleNamespace(amp="off", eval_batch_size=2), body, x)
        assert body.training is training
        assert not z.requires_grad and torch.equal(z, torch.tensor([[3.0, -1.0], [2.0, 0.0], [-1.5, 1.0]]))


def test_evaluation_uses_the_global_prototypes_after_the_first_round(digits_tiny_root):
    server = make_server(digits_tiny_root)
    loop.send(server, server.select_clients())
    assert server.clients[0].eval_model() is server.clients[0].model  # no prototype yet: the local head
    loop.run_round(server, 0)
    loop.send(server, server.select_clients())
    m = server.clients[0].eval_model()
    assert isinstance(m, NearestPrototype) and m.base is server.clients[0].model.base
    assert torch.equal(m.prototypes[3], server.global_protos[3])


@pytest.mark.parametrize("flag", ["-ala", pytest.param("-dp", marks=pytest.mark.optional_deps("opacus"))])
def test_ala_and_dp_are_refused(flag, digits_tiny_root, capsys):
    assert main.main(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedProto", "-gr", "1", flag)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err and "FedProto" in err, err


def test_lambda_zero_is_accepted_and_a_negative_one_refused(digits_tiny_root):
    from utils.errors import FLError

    assert parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedProto", "-lam", "0")).lamda == 0
    with pytest.raises(FLError, match="-lam >= 0"):
        parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedProto", "-lam", "-0.5"))
