"""FedAMP: HeurFedAMP's attention by hand, the collapse warning, and which model is evaluated (the trained
personalised model w_i, not the cloud model u_i the client starts from)."""
import copy
import math
from types import SimpleNamespace

import torch

import main
from cli import parse_config
from conftest import cli
from flcore.registry import get_server_class
from flcore.servers.serveramp import FedAMPServer, heur_attention, pairwise_cosine
from utils.data_utils import load_split
from utils.results import read_h5
from runtime import loop
from runtime import client_steps


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedAMP", "--executor", "sequential", *flags))
    return get_server_class("FedAMP")(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root))


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def far_apart(server, scale):
    g = torch.Generator().manual_seed(0)
    return [{k: v + scale * torch.randn(v.shape, generator=g) for k, v in state(server.global_model).items()}
            for _ in server.clients]


# ---- HeurFedAMP's attention ---------------------------------------------------------------------------
def test_heur_attention_matches_a_hand_computation():
    # Three clients; a parameter vector split over two entries, plus a buffer the similarity ignores.
    # w_0 = (1, 0), w_1 = (1, 1), w_2 = (0, 2): cos(0,1) = cos(1,2) = 1/sqrt(2), cos(0,2) = 0.
    vecs = [(1.0, 0.0), (1.0, 1.0), (0.0, 2.0)]
    states = [{"a": torch.tensor([x]), "b": torch.tensor([y]), "running": torch.tensor([100.0 * i])}
              for i, (x, y) in enumerate(vecs)]
    xi_ii, sigma = 0.4, 2.0
    fake = SimpleNamespace(cfg=SimpleNamespace(amp_kernel="heur"), client_states=states, param_keys=["a", "b"],
                           xi_ii=xi_ii, sigma=sigma)
    xi = FedAMPServer.attention(fake)
    e = math.exp(sigma / math.sqrt(2))  # exp(σ cos) for the pairs at 45 degrees; exp(σ·0) = 1
    expected = [[xi_ii, (1 - xi_ii) * e / (e + 1), (1 - xi_ii) / (e + 1)],
                [(1 - xi_ii) / 2, xi_ii, (1 - xi_ii) / 2],
                [(1 - xi_ii) / (e + 1), (1 - xi_ii) * e / (e + 1), xi_ii]]
    assert torch.allclose(xi, torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(xi.sum(1), torch.ones(3, dtype=torch.float64))
    assert torch.allclose(xi.diagonal(), torch.full((3,), xi_ii, dtype=torch.float64))


def test_heur_attention_edge_cases_and_cosine_by_hand():
    one = heur_attention(torch.ones(1, 1, dtype=torch.float64), 0.3, 5.0)
    assert torch.equal(one, torch.ones(1, 1, dtype=torch.float64))  # a single client keeps all its weight
    two = heur_attention(torch.tensor([[1.0, 0.2], [0.2, 1.0]], dtype=torch.float64), 0.3, 5.0)
    assert torch.allclose(two, torch.tensor([[0.3, 0.7], [0.7, 0.3]], dtype=torch.float64))  # the other: 1 - ξ_ii
    # vectors shorter than 1, and a zero vector (orthogonal to everything, itself included)
    states = [{"a": torch.tensor([0.3, 0.4])}, {"a": torch.tensor([0.0, 0.5])}, {"a": torch.tensor([0.0, 0.0])}]
    cos = pairwise_cosine(states, ["a"])
    want = torch.tensor([[1.0, 0.8, 0.0], [0.8, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=cos.dtype)
    torch.testing.assert_close(cos, want, atol=1e-7, rtol=0)


def test_documented_defaults_of_each_kernel(digits_root):
    heur, euclid = make_server(digits_root), make_server(digits_root, "--amp_kernel", "euclid")
    assert (heur.sigma, heur.xi_ii, euclid.sigma) == (1000.0, 0.8, 0.1)  # -sg and --xi_ii's help


def test_heur_is_the_default_and_euclid_stays_reachable(digits_root, tmp_path, capsys):
    heur = make_server(digits_root)
    assert heur.cfg.amp_kernel == "heur" and heur.sigma > 0 and 0 < heur.xi_ii < 1
    euclid = make_server(digits_root, "--amp_kernel", "euclid", "-sg", "0.5", "-alk", "0.1")
    euclid.client_states = far_apart(euclid, 0.001)  # ||w_i - w_j||^2 about 0.4
    keys = euclid.param_keys
    w = torch.stack([torch.cat([s[k].reshape(-1).double() for k in keys]) for s in euclid.client_states])
    d2 = torch.cdist(w, w) ** 2
    xi = euclid.attention()
    assert math.isclose(float(xi[0, 1]), 0.1 * math.exp(-float(d2[0, 1]) / 0.5) / 0.5, rel_tol=1e-9)
    assert math.isclose(float(xi[0, 0]), 1 - float(xi[0, 1:].sum()), rel_tol=1e-9)
    # --xi_ii belongs to the heuristic rule; nonsense values get one clear line
    bad = ("-gr", "0", "--train_loss_eval", "off")
    assert main.main(cli(digits_root, tmp_path, "-algo", "FedAMP", "--amp_kernel", "euclid", "--xi_ii", "0.5", *bad)) == 2
    assert "--amp_kernel heur" in capsys.readouterr().err
    assert main.main(cli(digits_root, tmp_path, "-algo", "FedAMP", "--xi_ii", "1.5", *bad)) == 2
    assert "--xi_ii must be in [0, 1]" in capsys.readouterr().err


# ---- the collapse warning -----------------------------------------------------------------------------
def collapse_lines(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if "attention collapsed" in line]


def test_warning_fires_once_when_attention_collapses(digits_root, capsys):
    euclid = make_server(digits_root, "--amp_kernel", "euclid")  # σ = 0.1
    euclid.client_states = far_apart(euclid, 1.0)  # ||w_i - w_j||^2 >> σ: every ξ_ij ~ 0
    euclid.prepare_broadcast(euclid.clients)
    assert float((1 - euclid.xi.diagonal()).max()) < 0.01
    lines = collapse_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("WARNING: FedAMP") and "--amp_kernel heur" in lines[0]
    euclid.prepare_broadcast(euclid.clients)
    assert collapse_lines(capsys) == []  # once per run

    heur = make_server(digits_root)  # the same models: the heuristic keeps 1 - ξ_ii on the others
    heur.client_states = far_apart(heur, 1.0)
    heur.prepare_broadcast(heur.clients)
    assert collapse_lines(capsys) == []
    selfish = make_server(digits_root, "--xi_ii", "0.995")
    selfish.prepare_broadcast(selfish.clients)
    lines = collapse_lines(capsys)
    assert len(lines) == 1 and "--xi_ii" in lines[0]


def test_collapse_needs_another_client(digits_root, capsys):
    pair = make_server(digits_root, "--xi_ii", "0.995")
    pair.clients, pair.client_states = pair.clients[:2], pair.client_states[:2]
    pair.prepare_broadcast(pair.clients)
    assert len(collapse_lines(capsys)) == 1  # two clients can collapse
    alone = make_server(digits_root)
    alone.clients, alone.client_states = alone.clients[:1], alone.client_states[:1]
    alone.prepare_broadcast(alone.clients)
    assert float(alone.xi[0, 0]) == 1.0 and collapse_lines(capsys) == []  # one has no one to ignore


def extrapolation_lines(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if "ξ_ii < 0" in line]


def test_negative_self_attention_warns_once_with_the_bound(digits_root, capsys):
    # euclid on identical models: ξ_ij = α_k / σ off the diagonal, ξ_ii = 1 - (N - 1) α_k / σ.
    def euclid(alk, n=5):
        server = make_server(digits_root, "--amp_kernel", "euclid", "-sg", "1", "-alk", str(alk))
        server.clients, server.client_states = server.clients[:n], server.client_states[:n]
        server.prepare_broadcast(server.clients)
        return server

    assert float(euclid(0.25).xi[0, 0]) == 0.0 and extrapolation_lines(capsys) == []  # 1 - 4 · 0.25: not below 0
    assert extrapolation_lines(capsys) == [] and float(euclid(0.1).xi[0, 0]) > 0.5
    assert extrapolation_lines(capsys) == []
    server = euclid(0.375)  # ξ_ii = -0.5
    assert float(server.xi[0, 0]) == -0.5
    lines = extrapolation_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("WARNING: FedAMP") and "-sg/(N-1) = 0.25" in lines[0]
    server.prepare_broadcast(server.clients)
    assert extrapolation_lines(capsys) == []  # once per run
    euclid(1.5, n=2)  # ξ_ii = 1 - 1.5
    lines = extrapolation_lines(capsys)
    assert len(lines) == 1 and lines[0].endswith("-sg/(N-1) = 1")

# ---- the evaluated model is w_i -----------------------------------------------------------------------
def test_evaluation_sees_the_trained_w_i_not_the_cloud_model(digits_noniid_root):
    server = make_server(digits_noniid_root, "-jr", "0.5", "-lr", "0.1", "--train_loss_eval", "off")
    init = state(server.global_model)
    loop.run_round(server, 0)
    trained = {c.id for c in server.selected}
    assert 0 < len(trained) < len(server.clients)
    server.round_idx = 1
    loop.send(server, server.clients)  # everyone receives its next cloud model u_i and starts from it
    correct = total = 0
    for c in server.clients:
        w_i = server.client_states[c.id] if c.id in trained else init  # what it uploaded, or never trained
        evaluated = c.eval_model().state_dict()
        assert all(torch.equal(evaluated[k], w_i[k]) for k in w_i), c.id
        u_i = c.model.state_dict()  # the training start point
        assert any(not torch.equal(u_i[k], w_i[k]) for k in w_i), c.id
        reference = copy.deepcopy(server.global_model)
        reference.load_state_dict(w_i)
        with torch.no_grad():
            hits = int((reference(c.x_test).argmax(1) == c.y_test).sum())
        assert client_steps.test_metrics(c)[0] == hits
        correct, total = correct + hits, total + c.test_samples
    assert math.isclose(loop.evaluate(server)["test_acc"], correct / total)
    # the next local training starts from u_i and its result becomes the evaluated model
    c = server.clients[0]
    start = state(c.model)
    client_steps.train(c, 1)
    after = state(c.eval_model())
    assert all(torch.equal(after[k], v) for k, v in state(c.model).items())
    assert any(not torch.equal(after[k], start[k]) for k in start)


def test_full_self_attention_without_the_proximal_term_is_local(digits_noniid_root, tmp_path):
    """ξ_ii = 1 and λ = 0: u_i = w_i and plain SGD, so the curve is Local's, number for number."""
    curves = {}
    for algo, flags in (("Local", ()), ("FedAMP", ("--xi_ii", "1", "-lam", "0"))):
        assert main.main(cli(digits_noniid_root, tmp_path, "-algo", algo, "-gr", "3", "-lr", "0.1",
                             "--train_loss_eval", "off", *flags)) == 0
        curves[algo] = read_h5(tmp_path / f"Digits_{algo}_test_0.h5")
    assert list(curves["FedAMP"]["rs_test_acc"]) == list(curves["Local"]["rs_test_acc"])
    assert list(curves["FedAMP"]["rs_amp_other_weight"]) == [0.0] * 4  # recorded at rounds 0..3
