"""pFedMe, FedAMP, FedPHP, FedFomo, APPLE and PartialFed against hand computations, reference loops and the
invariants their papers state."""
import copy
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.func import functional_call

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientbase import Upload
from flcore.registry import get_server_class
from flcore.servers.serverpfedme import PFedMeServer
from utils.data_utils import load_split
from utils.personal_aggregation import (amp_attention, apple_lambda, attentive_message, fomo_affinity_step,
                                         fomo_scores, fomo_weights)
from runtime import loop
from runtime import client_steps


def make_server(root, algo, *flags):
    cfg = parse_config(cli(root, root, "-algo", algo, "--executor", "sequential", *flags)).replace(device="cpu", num_classes=10)
    return get_server_class(algo)(cfg, load_split("Digits", root))


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def perturbed(model, seed, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in state(model).items()}


# ---- pFedMe --------------------------------------------------------------------------------------
def test_pfedme_server_mixes_plain_mean_with_beta():
    glob = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        glob.weight.copy_(torch.tensor([[1.0, 2.0]]))
    uploads = [Upload(0, 1, {"weight": torch.tensor([[3.0, 4.0]])}),
               Upload(1, 100, {"weight": torch.tensor([[5.0, 10.0]])})]
    fake = SimpleNamespace(global_model=glob, cfg=SimpleNamespace(beta=2.0, bn_stats="shared"))
    fake.load_aggregate = lambda target, state: PFedMeServer.load_aggregate(fake, target, state)
    PFedMeServer.aggregate(fake, uploads)
    # mean (unweighted) = [4, 7]; w + 2 (mean - w) = [7, 12]
    assert torch.allclose(glob.weight, torch.tensor([[7.0, 12.0]]))
    fake.cfg.beta = 1.0
    PFedMeServer.aggregate(fake, uploads)
    assert torch.allclose(glob.weight, torch.tensor([[4.0, 7.0]]))


def test_pfedme_local_update_matches_reference_loop(digits_root):
    lam, lrp, lr, K = 15.0, 0.01, 0.05, 3
    server = make_server(digits_root, "pFedMe", "-lam", str(lam), "-lrp", str(lrp), "-lr", str(lr),
                         "-K", str(K), "-lbs", "100")
    client = server.clients[0]
    client.theta.load_state_dict(perturbed(client.theta, seed=3))  # last round's θ: not where this one starts
    gen = torch.Generator()
    gen.set_state(client.batch_gen.get_state())  # the client's batch order
    model = copy.deepcopy(client.model)
    w = {k: v.detach().clone() for k, v in client.model.named_parameters()}
    theta = dict(w)  # the inner solver starts from w
    perm = torch.randperm(client.train_samples, generator=gen)
    for i in range(0, client.train_samples, 100):  # -ls 1, batches of 100
        x, y = client.x_train[perm[i:i + 100]], client.y_train[perm[i:i + 100]]
        for _ in range(K):
            th = {k: v.clone().requires_grad_(True) for k, v in theta.items()}
            loss = nn.functional.cross_entropy(functional_call(model, th, (x,)), y)
            grads = torch.autograd.grad(loss, list(th.values()))
            theta = {k: theta[k] - lrp * (g + lam * (theta[k] - w[k])) for k, g in zip(th, grads)}
        w = {k: w[k] - lr * lam * (w[k] - theta[k]) for k in w}
    client_steps.train(client, 0)
    for k, v in client.model.named_parameters():
        assert torch.allclose(v, w[k], atol=1e-5), k
    for k, v in client.theta.named_parameters():
        assert torch.allclose(v, theta[k], atol=1e-5), k
    assert client.eval_model() is client.theta



def test_pfedme_uploads_the_batchnorm_statistics_theta_tracked(digits_root):
    client = make_server(digits_root, "pFedMe", "-m", "BNCNN", "-K", "1", "-lbs", "50").clients[1]
    start = state(client.model)
    client_steps.train(client, 0)
    stats = {k: v for k, v in client.theta.state_dict().items() if "running" in k}
    assert stats and all(not torch.equal(v, start[k]) for k, v in stats.items())  # θ's statistics moved
    after = client.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in stats.items())  # and w carries them to the server

# ---- FedAMP --------------------------------------------------------------------------------------
def test_amp_attention_rows_sum_to_one_and_favour_similar_clients():
    d2 = torch.tensor([[0.0, 0.1, 1.0], [0.1, 0.0, 2.0], [1.0, 2.0, 0.0]], dtype=torch.float64)
    xi = amp_attention(d2, alpha_k=0.2, sigma=0.5)
    assert torch.allclose(xi.sum(1), torch.ones(3, dtype=torch.float64))
    assert math.isclose(float(xi[0, 1]), 0.2 * math.exp(-0.1 / 0.5) / 0.5)
    assert math.isclose(float(xi[0, 0]), 1 - 0.4 * (math.exp(-0.2) + math.exp(-2.0)))
    assert xi[0, 1] > xi[0, 2] and xi[2, 0] > xi[2, 1]  # the closer client gets more attention
    assert torch.allclose(xi, xi.T)


def test_attentive_message_is_the_xi_weighted_sum_even_when_it_extrapolates():
    g = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(4, generator=g), "n": torch.tensor(i)} for i in range(3)]
    xi = amp_attention(torch.zeros(3, 3, dtype=torch.float64), alpha_k=0.9, sigma=1.0)  # ξ_ii = -0.8
    assert xi[0, 0] < 0
    for i in range(3):
        u = attentive_message(states, xi[i], i)
        expected = sum(float(xi[i, j]) * states[j]["w"] for j in range(3))
        assert torch.allclose(u["w"], expected, atol=1e-6)
        assert int(u["n"]) == i  # integer entries stay the client's own
    # no weight on any other client (ξ_i = e_i, s = 0): u_i is w_i itself, a copy
    u = attentive_message(states, torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64), 1)
    assert torch.equal(u["w"], states[1]["w"]) and int(u["n"]) == 1 and u["w"] is not states[1]["w"]


def test_fedamp_clients_start_from_their_cloud_model_and_are_pulled_to_it(digits_root):
    alk, sg, lam = 0.2, 1.0, 0.5
    server = make_server(digits_root, "FedAMP", "--amp_kernel", "euclid", "-alk", str(alk), "-sg", str(sg),
                         "-lam", str(lam))
    server.client_states = [perturbed(server.global_model, seed=i, scale=0.002 * (i + 1))
                            for i in range(len(server.clients))]
    loop.send(server, server.clients)
    keys = [n for n, _ in server.global_model.named_parameters()]
    flat = torch.stack([torch.cat([s[k].reshape(-1).double() for k in keys]) for s in server.client_states])
    xi = amp_attention(torch.cdist(flat, flat) ** 2, alk, sg)
    client = server.clients[1]
    for k, v in client.model.state_dict().items():
        expected = sum(float(xi[1, j]) * server.client_states[j][k] for j in range(len(server.clients)))
        assert torch.allclose(v, expected.float(), atol=1e-5), k
    # proximal term: ∂/∂w of (loss - CE) = (λ / α_k) (w - u_i)
    with torch.no_grad():
        for p in client.model.parameters():
            p.add_(0.01)
    x, y = client.x_train[:8], client.y_train[:8]
    total = torch.autograd.grad(client.loss(x, y), list(client.model.parameters()))
    ce = torch.autograd.grad(client.loss_fn(client.model(x), y), list(client.model.parameters()))
    for t, c, p, u in zip(total, ce, client.model.parameters(), client.cloud):
        assert torch.allclose(t - c, (lam / alk) * (p - u), atol=1e-5)


# ---- FedPHP --------------------------------------------------------------------------------------
def test_fedphp_momentum_grows_linearly_then_caps(digits_root):
    client = make_server(digits_root, "FedPHP", "-gr", "10", "-mu", "0.9").clients[0]
    expected = {0: 0.0, 5: 0.45, 10: 0.9, 30: 0.9}  # μ τ / (ρ R) with ρ R = 10, capped at μ
    for tau, mu in expected.items():
        client.train_time = [0.0] * tau
        assert math.isclose(client.momentum(), mu)
    # fewer than one expected participation (ρ R = 0.2 · 2, rounded to 0) counts as one: μ from the first
    for flags in (("-gr", "1"), ("-gr", "2", "-jr", "0.2")):
        client = make_server(digits_root, "FedPHP", "-mu", "0.9", *flags).clients[0]
        client.train_time = [0.0]
        assert math.isclose(client.momentum(), 0.9), flags


def test_fedphp_private_model_inherits_trained_models(digits_root):
    server = make_server(digits_root, "FedPHP", "-gr", "10", "-mu", "0.9", "-lr", "0.1")
    client = server.clients[0]
    client_steps.train(client, 0)  # first participation: μ = 0, so v = w
    assert all(torch.equal(a, b) for a, b in zip(state(client.hpm).values(), state(client.model).values()))
    v_before = state(client.hpm)
    client_steps.train(client, 1)  # second: μ = 0.9 * 1 / 10
    w = state(client.model)
    for k, v in state(client.hpm).items():
        assert torch.allclose(v, 0.91 * w[k] + 0.09 * v_before[k], atol=1e-6), k


def test_fedphp_loss_is_ce_plus_distillation_from_the_private_model(digits_root):
    lam, T = 0.3, 2.0
    client = make_server(digits_root, "FedPHP", "-lam", str(lam), "--kd_temperature", str(T)).clients[0]
    client.hpm.load_state_dict(perturbed(client.hpm, seed=3, scale=0.2))
    x, y = client.x_train[:16], client.y_train[:16]
    logits, teacher = client.model(x), client.hpm(x)
    soft = torch.softmax(teacher / T, 1)
    kd = -(soft * torch.log_softmax(logits, 1)).sum(1).mean()
    expected = (1 - lam) * nn.functional.cross_entropy(logits, y) + lam * kd
    assert torch.allclose(client.loss(x, y), expected, atol=1e-6)
    assert client.eval_model() is client.hpm


# ---- FedFomo -------------------------------------------------------------------------------------
def test_fomo_weights_are_zero_for_neighbours_that_raise_the_loss():
    scores = fomo_scores(1.0, [0.5, 1.5, 0.8], [1.0, 2.0, 0.5])
    # (1-0.5)/1 = 0.5, (1-1.5)/2 = -0.25, (1-0.8)/0.5 = 0.4
    assert torch.allclose(scores, torch.tensor([0.5, -0.25, 0.4], dtype=torch.float64))
    # clipped at 0, normalised by 0.9
    assert torch.allclose(fomo_weights(scores), torch.tensor([5 / 9, 0.0, 4 / 9], dtype=torch.float64))
    assert torch.equal(fomo_weights(fomo_scores(1.0, [1.2, 3.0], [1.0, 2.0])), torch.zeros(2, dtype=torch.float64))
    # a neighbour whose model equals the client's (distance 0): its distance is floored at 1e-12, so its
    # score is large and finite, 0.5 / 1e-12, not inf
    same = fomo_scores(1.0, [0.5], [0.0])
    assert torch.isfinite(same).all() and same.item() == pytest.approx(0.5e12)


def test_fomo_affinity_moves_by_the_scores_over_their_absolute_sum():
    """The official code's affinity update: the harmful neighbour loses affinity (|Σ| = 0.65)."""
    step = fomo_affinity_step(torch.tensor([0.5, -0.25, 0.4], dtype=torch.float64))
    assert torch.allclose(step, torch.tensor([0.5 / 0.65, -0.25 / 0.65, 0.4 / 0.65], dtype=torch.float64))
    # a negative sum: the signs stay (|-0.3| = 0.3)
    step = fomo_affinity_step(torch.tensor([0.1, -0.4], dtype=torch.float64))
    assert torch.allclose(step, torch.tensor([1 / 3, -4 / 3], dtype=torch.float64))
    assert torch.equal(fomo_affinity_step(torch.zeros(2, dtype=torch.float64)), torch.zeros(2, dtype=torch.float64))


def fitted_on_validation(client) -> dict:
    """The state of a copy of ``client``'s model after 20 SGD steps (rate 0.1) on its validation split."""
    model = copy.deepcopy(client.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(20):
        opt.zero_grad()
        nn.functional.cross_entropy(model(client.x_val), client.y_val).backward()
        opt.step()
    return state(model)


def test_fomo_client_moves_only_toward_neighbours_that_help(digits_root):
    server = make_server(digits_root, "FedFomo", "-lr", "0.1")
    client = server.clients[0]
    n_all = len(server.data.clients[0].y_train)
    assert len(client.y_val) == round(0.2 * n_all) and client.train_samples == n_all - len(client.y_val)
    own = state(client.model)
    bad = perturbed(client.model, seed=1, scale=3.0)  # garbage: higher validation loss
    client.receive({3: bad})
    assert client.last_weights == {3: 0.0}
    assert client.affinity[3] == -1.0  # its score over its own absolute value
    assert all(torch.equal(v, own[k]) for k, v in state(client.model).items())  # kept as it was
    good = fitted_on_validation(client)  # surely a lower validation loss than the client's own
    client.receive({2: good, 3: bad})
    assert client.last_weights[3] == 0.0 and client.last_weights[2] == pytest.approx(1.0)
    assert all(torch.allclose(v, good[k]) for k, v in state(client.model).items())
    assert client.affinity[2] > 0 > client.affinity[3]


def test_fomo_weights_two_helpful_neighbours_by_gain_over_distance(digits_root):
    """Two neighbours that both lower the validation loss, at different distances: w_n ∝ (L_i - L_n) /
    ||θ_n - θ_i|| (losses and distances by hand, over the parameters), the model starts from Σ w_n θ_n
    and is left in training mode (scoring ran in evaluation mode)."""
    server = make_server(digits_root, "FedFomo", "-lr", "0.1")
    client = server.clients[0]
    own = state(client.model)
    good = fitted_on_validation(client)
    half = {k: (own[k] + good[k]) / 2 if own[k].is_floating_point() else own[k] for k in own}
    names = [n for n, _ in client.model.named_parameters()]

    def loss_of(sd):
        m = copy.deepcopy(client.model)
        m.load_state_dict(sd)
        m.eval()
        with torch.no_grad():
            return float(nn.functional.cross_entropy(m(client.x_val), client.y_val))

    def dist(sd):
        return math.sqrt(sum(float(((sd[k] - own[k]).double() ** 2).sum()) for k in names))

    gain = {j: (loss_of(own) - loss_of(sd)) / dist(sd) for j, sd in ((2, good), (4, half))}
    assert gain[2] > 0 and gain[4] > 0 and not math.isclose(gain[2], gain[4], rel_tol=0.05)
    want = {j: g / (gain[2] + gain[4]) for j, g in gain.items()}
    client.receive({2: good, 4: half})
    assert client.last_weights == pytest.approx(want, rel=1e-4)
    for k in names:
        ref = want[2] * good[k].double() + want[4] * half[k].double()
        assert torch.allclose(client.model.state_dict()[k].double(), ref, atol=1e-5), k
    assert client.model.training


def test_fomo_greedy_choice_follows_affinity(digits_root):
    client = make_server(digits_root, "FedFomo", "-M", "2", "--epsilon", "0").clients[0]
    client.affinity = {1: 0.5, 2: 2.0, 3: 1.0, 4: -1.0}
    assert client.choose_neighbours(0, [1, 2, 3, 4]) == [2, 3]
    assert client.choose_neighbours(0, [4]) == [4]


def test_fomo_neighbour_choice_replays_the_documented_draws(digits_root):
    """ε-greedy on the client's own stream ("fomo-neighbours", seed, run, id), replayed by an independent
    loop: tie-breakers first, then per pick a uniform u; u < ε_t = max(0, ε - t · decay) explores a
    uniformly drawn remaining candidate, otherwise the highest affinity is taken (unseen clients: 0)."""
    import numpy as np

    from utils.seeding import derive_seed

    server = make_server(digits_root, "FedFomo", "-M", "3", "--epsilon", "0.5", "--epsilon_decay", "0.1",
                         "--seed", "4")
    client = server.clients[1]
    affinity = {0: 0.4, 2: -0.3, 3: 0.0}  # client 4 unseen: affinity 0, tied with client 3
    client.affinity = dict(affinity)
    rng = np.random.default_rng(derive_seed(4, 0, "fomo-neighbours", 1))
    explored = greedy = 0
    for t, eps in zip((0, 2, 4, 6, 8), (0.5, 0.3, 0.1, 0.0, 0.0)):
        candidates = [0, 2, 3, 4]
        ties = dict(zip(candidates, rng.random(4)))
        rest, want = list(candidates), []
        for _ in range(3):
            if rng.random() < eps:
                j = rest[int(rng.integers(len(rest)))]
                explored += 1
            else:
                j = min(rest, key=lambda c: (-affinity.get(c, 0.0), ties[c]))
                greedy += 1
            rest.remove(j)
            want.append(j)
        assert client.choose_neighbours(t, candidates) == want, t
    assert explored >= 2 and greedy >= 6  # both branches ran (the draws are seeded)


# ---- APPLE ---------------------------------------------------------------------------------------
def test_apple_starts_from_the_sample_weighted_mix_of_core_models(digits_root):
    server = make_server(digits_root, "APPLE")
    n = torch.tensor([float(c.train_samples) for c in server.clients])
    assert torch.allclose(server.p0, n / n.sum()) and math.isclose(float(server.p0.sum()), 1.0, rel_tol=1e-6)
    server.cores = [perturbed(server.global_model, seed=i) for i in range(len(server.clients))]
    for c, core in zip(server.clients, server.cores):
        c.model.load_state_dict(core)
    loop.send(server, server.clients)
    client = server.clients[2]
    assert torch.equal(client.p, client.p0)
    for k, v in client.personal.named_parameters():
        expected = sum(float(server.p0[j]) * core[k] for j, core in enumerate(server.cores))
        assert torch.allclose(v, expected, atol=1e-6), k


def test_apple_relationship_gradient_is_inner_product_plus_proximal_pull(digits_root):
    mu = 0.4
    server = make_server(digits_root, "APPLE", "-mu", str(mu), "-gr", "10", "-L", "1")
    server.cores = [perturbed(server.global_model, seed=i) for i in range(len(server.clients))]
    loop.send(server, server.clients)
    client = server.clients[1]
    client.stack_others()
    client.lam = apple_lambda(3, 10, 1.0)
    with torch.no_grad():
        client.p += torch.tensor([0.05, -0.02, 0.0, 0.01, 0.03])
    client.p.requires_grad_(True)
    x, y = client.x_train[:12], client.y_train[:12]
    client.loss(x, y).backward()
    # reference: θ̃ = Σ_j p_j θ_j (own core: the client's model); the official code's proximal term
    # μ λ ||p - p0||^2 gives ∂L/∂p_j = <∇_θ̃ CE, θ_j> + 2 μ λ (p_j - p0_j)
    cores = [dict(client.model.named_parameters()) if j == client.id else server.cores[j]
             for j in range(len(server.clients))]
    p = client.p.detach()
    mix = {k: sum(p[j] * cores[j][k].detach() for j in range(len(cores))).requires_grad_(True)
           for k, _ in client.model.named_parameters()}
    ce = nn.functional.cross_entropy(functional_call(client.model, mix, (x,)), y)
    g = dict(zip(mix, torch.autograd.grad(ce, list(mix.values()))))
    expected = torch.stack([sum((g[k] * cores[j][k].detach()).sum() for k in g) for j in range(len(cores))])
    expected = expected + 2 * mu * client.lam * (p - client.p0)
    assert torch.allclose(client.p.grad, expected, atol=1e-5)


def test_apple_lambda_schedules():
    assert apple_lambda(0, 100, 0.2) == 1.0
    assert math.isclose(apple_lambda(10, 100, 0.2), 0.5)  # cos(π/2) + 1) / 2
    assert apple_lambda(20, 100, 0.2) == 0.0 and apple_lambda(99, 100, 0.2) == 0.0
    assert math.isclose(apple_lambda(10, 100, 0.2, "exponential"), 0.001 ** 0.5)
    # the schedule covers int(L R) rounds (the official code's): int(0.1 * 9) = 0 rounds, int(0.25 * 10) = 2
    assert apple_lambda(0, 9, 0.1) == 0.0 and apple_lambda(0, 9, 0.1, "exponential") == 0.0
    assert math.isclose(apple_lambda(1, 10, 0.25), 0.5) and apple_lambda(2, 10, 0.25) == 0.0


# ---- every algorithm with -ala -------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["pFedMe", "FedAMP", "FedPHP", "FedFomo", "PartialFed"])
def test_ala_initialises_the_received_model(algo, digits_root):
    fast = ("-gr", "2", "-lr", "0.1", "--ala_max_epochs", "3", "--train_loss_eval", "off", "-eg", "5")
    server = make_server(digits_root, algo, "-ala", *fast, *(("-K", "1") if algo == "pFedMe" else ()))
    loop.train(server)
    assert any(c.ala.weights is not None for c in server.clients)  # ALA ran in round 1


def test_fedamp_ala_blends_the_cloud_model_with_the_personal_model(digits_root):
    server = make_server(digits_root, "FedAMP", "-ala", "-lr", "0.1", "--ala_max_epochs", "3",
                         "--train_loss_eval", "off")
    loop.run_round(server, 0)
    client = server.clients[2]
    server.prepare_broadcast(server.clients)
    cloud = server.broadcast(client)
    twin = copy.deepcopy(client)  # the same client, but a round it dropped out of left another start
    twin.model.load_state_dict(perturbed(twin.model, seed=5))
    client.receive(copy.deepcopy(cloud), True)
    twin.receive(copy.deepcopy(cloud), True)
    def same(a, b):
        return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))

    assert same(twin.model, client.model)  # ALA blended u_i with w_i in both
    assert same(twin.personal, client.personal)  # w_i itself untouched
    assert not same(client.model, cloud) and not same(client.model, client.personal)


def test_apple_rejects_ala(digits_root, tmp_path, capsys):
    assert main.main(cli(digits_root, tmp_path, "-algo", "APPLE", "-ala")) == 2
    assert "drop -ala" in capsys.readouterr().err
