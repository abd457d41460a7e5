"""FedPCL: the prototype-wise contrastive loss against a hand computation, the padding of a client's
local prototypes with the global ones, uploads that are prototypes of normalised representations and no
weights, the first round that only collects prototypes, evaluation by the nearest own prototype, -ala and
-dp refused, -tau's bound."""
import math

import pytest
import torch

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientpcl import pcl_loss, prototype_contrastive_loss
from flcore.prototypes import NearestPrototype
from flcore.registry import get_server_class
from utils.data_utils import load_split
from utils.errors import FLError
from runtime import loop


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedPCL", "--executor", "sequential", "-lr", "0.1",
                                "-lbs", "20", *flags))
    return get_server_class("FedPCL")(cfg.replace(num_classes=10), load_split("Digits", root))


def hand_ce(z, y, protos, tau):
    """-log(exp(z·P_y/τ) / Σ_c exp(z·P_c/τ)) over the prototypes given ({class: vector}), by loops."""
    s = {c: sum(a * b for a, b in zip(z, p)) / tau for c, p in protos.items()}
    return -(s[y] - math.log(sum(math.exp(v) for v in s.values())))


def test_contrastive_loss_by_hand():
    tau = 0.5
    z = torch.nn.functional.normalize(torch.tensor([[3.0, 4.0], [1.0, -1.0], [0.0, 2.0]]), dim=1)
    y = torch.tensor([0, 2, 1])  # class 1 has no global prototype: the third sample skips L_g
    g = {0: [0.5, 0.5], 2: [-0.2, 0.9]}
    locals_ = [{0: [1.0, 0.0], 1: [0.0, 1.0], 2: [0.3, -0.3]}, {0: [0.6, 0.8], 1: [-1.0, 0.0], 2: [0.0, -1.0]}]

    def table(protos):
        t, k = torch.zeros(3, 2), torch.zeros(3, dtype=torch.bool)
        for c, p in protos.items():
            t[c], k[c] = torch.tensor(p), True
        return t, k

    zl, yl = z.tolist(), y.tolist()
    l_g = (hand_ce(zl[0], 0, g, tau) + hand_ce(zl[1], 2, g, tau)) / 2
    l_p = sum(sum(hand_ce(zl[i], yl[i], p, tau) for i in range(3)) / 3 for p in locals_) / 2
    gt, gk = table(g)
    tables = [table(p) for p in locals_]
    got = pcl_loss(z, y, gt, gk, [t for t, _ in tables], [k for _, k in tables], tau)
    assert got.item() == pytest.approx(l_g + l_p, rel=1e-5)
    assert prototype_contrastive_loss(z, y, gt, gk, tau).item() == pytest.approx(l_g, rel=1e-5)
    # no prototype for any sample's class: nothing to contrast
    assert prototype_contrastive_loss(z, y, gt, torch.zeros(3, dtype=torch.bool), tau).item() == 0.0


def test_rounds_upload_normalised_prototypes_only_and_pad_with_the_global_ones(digits_tiny_root, monkeypatch):
    server = make_server(digits_tiny_root)
    seen = []
    receive = loop.receive
    monkeypatch.setattr(loop, "receive", lambda srv, clients: seen.append(receive(srv, clients)) or seen[-1])
    before = {k: v.clone() for k, v in server.clients[0].model.state_dict().items()}
    loop.run_round(server, 0)
    c = server.clients[0]
    # the first round only collects prototypes: nothing to contrast with yet, the model is untouched
    assert all(torch.equal(before[k], v) for k, v in c.model.state_dict().items())
    loop.run_round(server, 1)
    assert any(not torch.equal(before[k], v) for k, v in c.model.state_dict().items())
    for u in seen[1]:
        c = server.clients[u.id]
        assert u.state is None and set(u.extras) == {"protos", "counts"}
        c.model.eval()
        with torch.no_grad():
            z = torch.nn.functional.normalize(c.model(c.x_train), dim=1)
        for k, p in u.extras["protos"].items():
            assert torch.allclose(p, z[c.y_train == k].mean(0), atol=1e-5)
            assert u.extras["counts"][k] == int((c.y_train == k).sum())
    # every client receives the global prototypes and each client's last upload; a class a client lacks
    # is contrasted against the global prototype in its place
    loop.send(server, server.select_clients())
    c = server.clients[1]
    assert sorted(c.client_protos) == [0, 1, 2, 3, 4]
    lacking = [k for k in server.global_protos if k not in c.client_protos[3]]
    assert lacking, "the tiny split gives client 3 fewer classes than all"
    _, _, tables, known = c.prototype_tables(next(iter(c.global_protos.values())).shape[0])
    for k in lacking:
        assert known[3][k] and torch.equal(tables[3][k], server.global_protos[k])
    held = next(iter(c.client_protos[3]))
    assert torch.equal(tables[3][held], server.client_protos[3][held])


def test_evaluation_is_the_nearest_own_prototype(digits_tiny_root):
    server = make_server(digits_tiny_root)
    loop.run_round(server, 0)
    c = server.clients[2]
    m = c.eval_model()
    assert isinstance(m, NearestPrototype) and m.normalize and m.base is c.model.base
    assert m.known.tolist() == [k in c.protos for k in range(10)]
    c.model.eval()
    with torch.no_grad():
        z = torch.nn.functional.normalize(c.model(c.x_test), dim=1)
    classes = sorted(c.protos)
    dists = torch.stack([((z - c.protos[k]) ** 2).sum(1) for k in classes], 1)
    expected = torch.tensor(classes)[dists.argmin(1)]
    with torch.no_grad():
        assert torch.equal(m(c.x_test).argmax(1), expected)


@pytest.mark.parametrize("flag", ["-ala", pytest.param("-dp", marks=pytest.mark.optional_deps("opacus"))])
def test_ala_and_dp_are_refused(flag, digits_tiny_root, capsys):
    assert main.main(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedPCL", "-gr", "1", flag)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err and "FedPCL" in err, err


def test_tau_must_be_positive(digits_tiny_root):
    assert parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedPCL", "-tau", "0.01")).tau == 0.01
    with pytest.raises(FLError, match="-tau > 0"):
        parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedPCL", "-tau", "0"))


def test_client_loss_contrasts_normalised_representations_with_padded_tables(digits_tiny_root):
    server = make_server(digits_tiny_root, "-tau", "0.5")
    c = server.clients[0]
    x, y = c.x_train[:3], [0, 1, 1]
    d = c.model(x).shape[1]
    g = torch.Generator().manual_seed(0)
    u0, u1, a, b = (torch.nn.functional.normalize(torch.randn(d, generator=g), dim=0) for _ in range(4))
    # client 3 lacks class 0, client 0 lacks class 1: each is contrasted with the global prototype there
    c.receive({"global": {0: u0, 1: u1}, "locals": {3: {1: b}, 0: {0: a}}})
    with torch.no_grad():
        z = torch.nn.functional.normalize(c.model(x), dim=1).tolist()
        got = c.loss(x, torch.tensor(y)).item()
    l_g = sum(hand_ce(z[i], y[i], {0: u0.tolist(), 1: u1.tolist()}, 0.5) for i in range(3)) / 3
    l_p = sum(sum(hand_ce(z[i], y[i], {k: v.tolist() for k, v in p.items()}, 0.5) for i in range(3)) / 3
              for p in ({0: a, 1: u1}, {0: u0, 1: b})) / 2
    assert got == pytest.approx(l_g + l_p, rel=1e-5)
