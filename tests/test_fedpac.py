"""FedPAC: the classifier-combination weights solve the quadratic program (KKT conditions, and a
brute-force grid on 3 clients), the feature statistics by hand, a round's heads, body and centroids
against a reference computation, -ala runs on the body, -dp refused."""
import itertools
import math

import numpy as np
import pytest
import torch

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientpac import feature_statistics
from flcore.prototypes import aggregate_prototypes
from flcore.registry import get_server_class
from flcore.servers.serverpac import combination_weights
from utils.data_utils import load_split
from runtime import loop
from runtime import client_steps


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedPAC", "--executor", "sequential", "-lr", "0.1",
                                "-lbs", "20", *flags))
    return get_server_class("FedPAC")(cfg.replace(num_classes=10), load_split("Digits", root))


def qp_matrix(v, hs, i):
    """diag(v) + D_i with D_i[j, j'] = Σ_k (H_i[k] - H_j[k])·(H_i[k] - H_j'[k]), by loops."""
    m = len(v)
    p = np.diag(v.double().numpy())
    for j, jj in itertools.product(range(m), range(m)):
        p[j, jj] += sum(float((hs[i][k] - hs[j][k]) @ (hs[i][k] - hs[jj][k])) for k in range(hs.shape[1]))
    return p


CASES = {  # (v, H) of 3 clients with 2 classes in 2 dimensions
    "interior": (torch.tensor([0.5, 0.8, 1.1]), torch.tensor([[[0.2, 0.1], [0.3, 0.0]], [[0.4, 0.3], [0.1, 0.2]],
                                                          [[0.0, 0.2], [0.5, 0.1]]])),
    "boundary": (torch.tensor([0.02, 0.05, 0.04]), torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.1, 0.1], [0.0, 0.9]],
                                                             [[-2.0, 3.0], [2.0, -1.0]]])),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("i", [0, 1, 2])
def test_weights_solve_the_quadratic_program(case, i):
    v, hs = CASES[case]
    alpha = combination_weights(v, hs, i)
    p = qp_matrix(v, hs, i)
    assert alpha.min() >= 0 and alpha.sum() == pytest.approx(1.0, abs=1e-12)
    # KKT of min α^T P α on the simplex: (Pα)_j equals the multiplier where α_j > 0 and is no smaller elsewhere
    grad = p @ alpha
    lam = alpha @ grad
    support = alpha > 1e-9
    assert np.allclose(grad[support], lam, rtol=1e-6, atol=1e-9)
    assert np.all(grad[~support] >= lam - 1e-9)
    # brute force: no point of a 0.005 grid on the simplex does better
    best = min(a @ p @ a for a in (np.array([x, y, 1 - x - y]) for x in np.arange(0, 1.0001, 0.005)
                                     for y in np.arange(0, 1.0001 - x, 0.005)))
    assert alpha @ p @ alpha <= best + 1e-12
    if case == "boundary" and i != 1:  # the optimum lies on the simplex's boundary: one weight exactly 0
        assert (alpha == 0).sum() == 1 and alpha[2 - i] == 0


def test_weights_without_any_spread_are_a_point_of_the_simplex():
    """Clients with zero variance and equal H make every α optimal (G = 0, nothing to rescale): the
    weights are still finite and sum to 1, and a lone participant gets weight 1."""
    v, hs = torch.zeros(3), torch.ones(3, 2, 2)
    alpha = combination_weights(v, hs, 1)
    assert np.isfinite(alpha).all() and alpha.min() >= 0 and alpha.sum() == pytest.approx(1.0, abs=1e-12)
    assert combination_weights(torch.zeros(1), torch.ones(1, 2, 2), 0).tolist() == [1.0]


def test_a_variance_rounded_below_zero_counts_as_zero():
    """v >= 0 in exact arithmetic, but float rounding can leave a client with no spread slightly below
    zero: it is read as 0, not turned into NaN weights."""
    v, hs = CASES["interior"]
    low = combination_weights(torch.tensor([-1e-7, 0.8, 1.1]), hs, 0)
    assert np.isfinite(low).all()
    assert np.allclose(low, combination_weights(torch.tensor([0.0, 0.8, 1.1]), hs, 0), atol=1e-12)


def test_feature_statistics_by_hand():
    f = torch.tensor([[1.0, 0.0], [3.0, 2.0], [0.0, 4.0], [2.0, 2.0]], dtype=torch.float64)
    y = torch.tensor([0, 0, 2, 1])
    v, h = feature_statistics(f, y, 4)
    p = [0.5, 0.25, 0.25, 0.0]
    mu = [[2.0, 1.0], [2.0, 2.0], [0.0, 4.0], [0.0, 0.0]]
    second = [(1 + 13) / 2, 8.0, 16.0, 0.0]  # mean squared norm per class
    want_v = (sum(p[k] * second[k] for k in range(4)) - sum(p[k] ** 2 * (mu[k][0] ** 2 + mu[k][1] ** 2)
                                                             for k in range(4))) / 4
    assert float(v) == pytest.approx(want_v)
    assert torch.allclose(h, torch.tensor([[p[k] * m for m in mu[k]] for k in range(4)], dtype=torch.float64))


def test_a_round_combines_heads_averages_bodies_and_centroids(digits_tiny_root, monkeypatch):
    server = make_server(digits_tiny_root)
    seen = []
    receive = loop.receive
    monkeypatch.setattr(loop, "receive", lambda srv, clients: seen.append(receive(srv, clients)) or seen[-1])
    loop.run_round(server, 0)
    uploads = seen[0]
    states = [{k: t.detach().clone() for k, t in u.state.items()} for u in uploads]  # live tensors: keep them
    # the body is FedAvg's
    n = torch.tensor([u.weight for u in uploads], dtype=torch.float64)
    for k, t in server.global_model.base.state_dict().items():
        ref = sum(w * s[f"base.{k}"].double() for w, s in zip(n / n.sum(), states))
        assert torch.allclose(t.double(), ref, atol=1e-6), k
    # centroids: count-weighted per class
    classes = {k for u in uploads for k in u.extras["protos"]}
    assert sorted(server.global_protos) == sorted(classes)
    for k in classes:
        held = [(u.extras["counts"][k], u.extras["protos"][k]) for u in uploads if k in u.extras["protos"]]
        torch.testing.assert_close(server.global_protos[k], sum(c * p for c, p in held) / sum(c for c, _ in held))
    # each client's head is Σ_j α_ij head_j with α_i from the uploaded statistics; it arrives next broadcast
    v = torch.stack([u.extras["v"] for u in uploads])
    hs = torch.stack([u.extras["H"] for u in uploads])
    loop.send(server, server.select_clients())
    for i, u in enumerate(uploads):
        alpha = combination_weights(v, hs, i)
        assert np.array_equal(alpha, server.weights[u.id])
        head = server.clients[u.id].model.head.state_dict()
        for k, t in head.items():
            ref = sum(float(a) * s[f"head.{k}"].double() for a, s in zip(alpha, states))
            assert torch.allclose(t.double(), ref, atol=1e-6), k
        assert all(torch.equal(t, server.global_model.base.state_dict()[k])
                   for k, t in server.clients[u.id].model.base.state_dict().items())
    # and not every client gets the same head: the weights follow each client's own statistics
    assert len({tuple(np.round(w, 6)) for w in server.weights.values()}) > 1


def test_a_lone_upload_keeps_its_own_head(digits_tiny_root):
    """A round with one upload (the others dropped or not selected): its α is [1], so the head it gets
    back is its own, and the body is its own too."""
    server = make_server(digits_tiny_root)
    loop.send(server, server.select_clients())
    c = server.clients[2]
    client_steps.train(c, 0)
    upload = c.upload()
    state = {k: t.detach().clone() for k, t in upload.state.items()}
    server.aggregate([upload])
    assert server.weights[c.id].tolist() == [1.0] and list(server.heads) == [c.id]
    for k, t in server.heads[c.id].items():
        assert torch.equal(t, state[f"head.{k}"]), k
    for k, t in server.global_model.base.state_dict().items():
        assert torch.allclose(t, state[f"base.{k}"]), k


def test_statistics_are_of_the_received_body_before_training(digits_tiny_root):
    server = make_server(digits_tiny_root)
    loop.send(server, server.select_clients())
    c = server.clients[1]
    c.model.eval()
    with torch.no_grad():
        want = feature_statistics(c.model.base(c.x_train), c.y_train, 10)
    client_steps.train(c, 0)
    assert float(c.stats[0]) == pytest.approx(float(want[0]), rel=1e-5)
    assert torch.allclose(c.stats[1], want[1], atol=1e-6)


def test_steps_per_round_counts_head_and_body_steps(digits_tiny_root):
    """Both phases move the uploaded model (head and body are uploaded): -pls 2 head epochs and -ls 1
    body epoch of ceil(n / 20) batches each, the count the optimizer really takes in a round."""
    server = make_server(digits_tiny_root, "-pls", "2", "-ls", "1")
    loop.send(server, server.select_clients())
    c = server.clients[0]
    taken = []
    step = c._sgd_step
    c._sgd_step = lambda *a: taken.append(1) or step(*a)
    client_steps.train(c, 0)
    assert len(taken) == c.steps_per_round() == 3 * math.ceil(c.train_samples / 20)


def test_ala_runs_on_the_body(digits_tiny_root):
    server = make_server(digits_tiny_root, "-ala", "-p", "2")
    assert server.clients[0].ala.names == ["base.fc1.0.weight", "base.fc1.0.bias"]
    loop.run_round(server, 0)
    loop.run_round(server, 1)
    server.round_idx = 2
    loop.send(server, server.select_clients())
    glob = server.global_model.base.state_dict()
    for c in server.clients:  # ALA mixed the adapted tensors with the client's own; the others are copied
        body = c.model.base.state_dict()
        assert not torch.equal(body["fc1.0.weight"], glob["fc1.0.weight"])
        assert torch.equal(body["conv1.0.weight"], glob["conv1.0.weight"])


@pytest.mark.optional_deps("opacus")
def test_dp_is_refused(digits_tiny_root, capsys):
    assert main.main(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedPAC", "-gr", "1", "-dp")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "-dp" in err and "FedPAC" in err, err
