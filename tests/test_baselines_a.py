"""FedProx, FedAvg-C, FedProx-C, Per-FedAvg, FedRep and Ditto against hand computations and the
invariants their papers state."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

import main
from cli import parse_config
from conftest import cli
from flcore.clients import clientbase
from flcore.registry import get_server_class
from utils.batching import batches_per_epoch
from utils.data_utils import load_split
from utils.metrics import predict
from utils.proximal import anchor_of, proximal_term
from utils.results import read_h5
from utils.seeding import torch_gen
from runtime import loop
from runtime import client_steps
from utils import dp_sgd


def make_server(root, algo, *flags):
    cfg = parse_config(cli(root, root, "-algo", algo, "--executor", "sequential", *flags)).replace(device="cpu", num_classes=10)
    return get_server_class(algo)(cfg, load_split("Digits", root))


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def global_sequence(server, monkeypatch):
    """Train ``server`` and return its global model after every round (the hook is patched on the class:
    checkpoints pickle the server's own attributes)."""
    seq = []
    monkeypatch.setattr(type(server), "after_round", lambda self: seq.append(state(self.global_model)))
    loop.train(server)
    return seq


def perturb(model, seed=0, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


# ---- FedProx -------------------------------------------------------------------------------------
def test_fedprox_with_mu_zero_is_fedavg(digits_root, tmp_path):
    args = ("-gr", "2", "-lr", "0.1")
    assert main.main(cli(digits_root, tmp_path, "-algo", "FedAvg", *args)) == 0
    assert main.main(cli(digits_root, tmp_path, "-algo", "FedProx", "-mu", "0", *args)) == 0
    a = read_h5(tmp_path / "Digits_FedAvg_test_0.h5")
    b = read_h5(tmp_path / "Digits_FedProx_test_0.h5")
    for key in ("rs_test_acc", "rs_test_auc", "rs_train_loss", "rs_client_test_acc"):
        assert np.array_equal(a[key], b[key]), key


def test_fedprox_gradient_adds_mu_times_distance_to_global(digits_root):
    mu = 0.3
    server = make_server(digits_root, "FedProx", "-mu", str(mu))
    client = server.clients[0]
    loop.send(server, server.clients)
    perturb(client.model)  # as after some local steps: w != w^t
    x, y = client.x_train[:10], client.y_train[:10]
    client.model.zero_grad()
    client.loss(x, y).backward()
    ref = copy.deepcopy(client.model)
    ref.zero_grad()
    nn.functional.cross_entropy(ref(x), y).backward()
    for p, r, g in zip(client.model.parameters(), ref.parameters(), server.global_model.parameters()):
        assert torch.allclose(p.grad, r.grad + mu * (p.detach() - g.detach()), atol=1e-6)
    assert any((p.detach() - g).abs().max() > 0 for p, g in zip(client.model.parameters(),
                                                                 server.global_model.parameters()))


def test_an_anchor_taken_from_the_trained_model_itself_still_pulls_it_back():
    """FedProx's and Ditto's constructors take the anchor from the model they then train: a detached copy,
    so after a step w - a = 1 in every entry the term is mu/2 * (number of entries), its gradient mu."""
    model = nn.Linear(3, 2)
    anchor = anchor_of(model)
    assert all(not a.requires_grad for a in anchor)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    term = proximal_term(model.parameters(), anchor, 0.3)
    assert float(term.detach()) == pytest.approx(0.5 * 0.3 * 8)
    term.backward()
    for p in model.parameters():
        torch.testing.assert_close(p.grad, torch.full_like(p, 0.3))


def test_proximal_term_refuses_an_anchor_of_another_length():
    w = [torch.ones(2), torch.ones(3)]
    with pytest.raises(ValueError):
        proximal_term(w, [torch.zeros(2)], 0.1)


def test_fedprox_with_ala_anchors_to_the_global_model(digits_root):
    server = make_server(digits_root, "FedProx", "-ala", "--ala_max_epochs", "5", "-gr", "2", "-lr", "0.1")
    loop.train(server)
    client = server.clients[0]
    assert client.ala.weights is not None  # ALA ran in round 2
    glob = params(server.global_model)
    assert same(client.anchor, glob)  # the proximal anchor is the received global model ...
    assert not same(params(client.model), glob)  # ... not the ALA-initialised local model
    assert np.isfinite(loop.evaluate(server)["train_loss"])


# ---- FedAvg-C / FedProx-C ------------------------------------------------------------------------
@pytest.mark.parametrize("base,tuned", [("FedAvg", "FedAvg-C"), ("FedProx", "FedProx-C")])
def test_fine_tuned_variant_keeps_the_federated_trajectory(digits_root, base, tuned, monkeypatch):
    flags = ("-gr", "2", "-lr", "0.1")
    ref = global_sequence(make_server(digits_root, base, *flags), monkeypatch)
    server = make_server(digits_root, tuned, *flags)
    seq = global_sequence(server, monkeypatch)
    assert len(seq) == len(ref) == 2
    for a, b in zip(ref, seq):
        assert all(torch.equal(a[k], b[k]) for k in a)
    client = server.clients[0]  # fine-tuning happened at every evaluation, on a copy
    assert client.tuned is not None and not same(params(client.tuned), params(client.model))
    assert same(params(client.model), params(server.global_model))


@pytest.mark.parametrize("decay,round_idx,rate", [((), 0, 0.05), ((), 3, 0.05), (("-ld", "-ldg", "0.5"), 3, 0.05 / 8)])
def test_fine_tuning_is_fte_epochs_of_sgd_on_a_copy(digits_root, decay, round_idx, rate):
    """At the rate of the round being evaluated (-ld decays it as it decays training's)."""
    lr, bs = 0.05, 10
    server = make_server(digits_root, "FedAvg-C", "-fte", "2", "-lr", str(lr), "-lbs", str(bs), *decay)
    server.round_idx = round_idx
    loop.send(server, server.clients)
    client = server.clients[1]
    before, batch_state = params(client.model), client.batch_gen.get_state()
    tuned = client.eval_model()
    ref = copy.deepcopy(client.model)
    gen = torch_gen(0, 0, "fine-tune", 1)
    for _ in range(2):
        perm = torch.randperm(client.train_samples, generator=gen)
        for i in range(0, client.train_samples, bs):
            idx = perm[i:i + bs]
            ref.zero_grad()
            nn.functional.cross_entropy(ref(client.x_train[idx]), client.y_train[idx]).backward()
            with torch.no_grad():
                for p in ref.parameters():
                    p -= rate * p.grad
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(params(tuned), params(ref)))
    assert same(params(client.model), before)  # the federated model is untouched ...
    assert torch.equal(client.batch_gen.get_state(), batch_state)  # ... and so is the batch stream
    assert client.eval_model() is tuned  # one fine-tuning per broadcast


# ---- Per-FedAvg ----------------------------------------------------------------------------------
def test_perfedavg_meta_gradient_is_first_order_maml(digits_root):
    alpha = 0.1
    server = make_server(digits_root, "Per-FedAvg", "-lr", str(alpha))
    client = server.clients[0]
    client.alpha = alpha
    x, y = client.x_train[:20], client.y_train[:20]
    client.model.zero_grad()
    client.meta_loss(x, y).backward()
    # by hand: w' = w - α ∇f(w; D), gradient of f(·; D') at w'
    inner = copy.deepcopy(client.model)
    nn.functional.cross_entropy(inner(x[:10]), y[:10]).backward()
    with torch.no_grad():
        for p in inner.parameters():
            p -= alpha * p.grad
    inner.zero_grad()
    nn.functional.cross_entropy(inner(x[10:]), y[10:]).backward()
    for p, q in zip(client.model.parameters(), inner.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)


def test_perfedavg_training_step_updates_w_with_beta(digits_root, monkeypatch):
    alpha, beta, bs = 0.1, 0.02, 5
    client = make_server(digits_root, "Per-FedAvg", "-lr", str(alpha), "-bt", str(beta),
                         "-lbs", str(bs)).clients[0]
    w0 = copy.deepcopy(client.model)
    idx = torch.arange(2 * bs)
    # exactly one step, on a known batch pair: the batches run_epochs draws (utils.batching.batches) replaced
    monkeypatch.setattr(clientbase, "batches", lambda *args, **kwargs: iter([idx]))
    client_steps.train(client, 0)
    # by hand: w' = w - α ∇f(w; D), then w ← w - β ∇f(w'; D')
    x, y = client.x_train[idx], client.y_train[idx]
    inner = copy.deepcopy(w0)
    nn.functional.cross_entropy(inner(x[:bs]), y[:bs]).backward()
    with torch.no_grad():
        for p in inner.parameters():
            p -= alpha * p.grad
    inner.zero_grad()
    nn.functional.cross_entropy(inner(x[bs:]), y[bs:]).backward()
    for p, p0, q in zip(client.model.parameters(), w0.parameters(), inner.parameters()):
        assert torch.allclose(p.detach(), p0.detach() - beta * q.grad, atol=1e-6)


@pytest.mark.parametrize("dp", [False, pytest.param(True, marks=pytest.mark.optional_deps("opacus"))])
def test_perfedavg_meta_steps_take_batches_of_twice_lbs(digits_root, dp):
    bs = 7
    client = make_server(digits_root, "Per-FedAvg", "-lbs", str(bs), *(("-dp",) if dp else ())).clients[1]
    sizes = []
    name = "dp_meta_step" if dp else "meta_loss"
    real = getattr(client, name)
    setattr(client, name, lambda x, y: (sizes.append(len(x)), real(x, y))[1])
    client_steps.train(client, 0)
    n = client.train_samples
    assert sizes == [2 * bs] * (n // (2 * bs)) + ([n % (2 * bs)] if n % (2 * bs) else [])
    assert len(sizes) == client.steps_per_round()


@pytest.mark.optional_deps("opacus")
def test_perfedavg_dp_meta_step_is_the_fo_maml_step_on_the_two_releases(digits_root, monkeypatch):
    # The releases themselves are DP-SGD's (tests/test_privacy.py); here each is replaced by the exact batch
    # gradient, which leaves the step's composition: w' = w - α g(w; D), then w ← w - β g(w'; D').
    alpha, beta = 0.1, 0.03
    client = make_server(digits_root, "Per-FedAvg", "-dp", "-lr", str(alpha), "-bt", str(beta)).clients[0]
    for group in client.optimizer.param_groups:
        group["lr"] = beta
    seen = []

    def exact(c, objective, optimizer, x, y):
        seen.append(len(x))
        loss = objective(x, y)
        for p, g in zip(client.model.parameters(), torch.autograd.grad(loss, list(client.model.parameters()))):
            p.grad = g
        return loss.detach()

    monkeypatch.setattr(dp_sgd, "dp_backward", exact)
    x, y = client.x_train[:12], client.y_train[:12]
    w0 = copy.deepcopy(client.model)
    client.dp_meta_step(x, y)
    inner = copy.deepcopy(w0)
    nn.functional.cross_entropy(inner(x[:6]), y[:6]).backward()
    with torch.no_grad():
        for p in inner.parameters():
            p -= alpha * p.grad
    inner.zero_grad()
    nn.functional.cross_entropy(inner(x[6:]), y[6:]).backward()
    assert seen == [6, 6]
    for p, p0, q in zip(client.model.parameters(), w0.parameters(), inner.parameters()):
        torch.testing.assert_close(p.detach(), p0.detach() - beta * q.grad, atol=1e-6, rtol=1e-5)
    assert not same(params(client.model), params(w0))


# -dp: a clip no per-sample gradient reaches and negligible noise, so the release is the batch gradient.
@pytest.mark.parametrize("dp,atol,rtol", [((), 1e-6, 1e-5), pytest.param(("-dp", "--dp_clip", "1000", "-dps", "1e-9"), 1e-5,
                                                                   1e-4, marks=pytest.mark.optional_deps("opacus"))])
def test_perfedavg_personalisation_is_one_step_on_a_copy(digits_root, dp, atol, rtol):
    alpha, bs = 0.05, 10
    server = make_server(digits_root, "Per-FedAvg", "-lr", str(alpha), "-lbs", str(bs), *dp)
    loop.send(server, server.clients)
    client = server.clients[2]
    before = params(client.model)
    tuned = client.eval_model()
    idx = torch.randperm(client.train_samples, generator=torch_gen(0, 0, "fine-tune", 2))[:bs]
    ref = copy.deepcopy(client.model)
    nn.functional.cross_entropy(ref(client.x_train[idx]), client.y_train[idx]).backward()
    for p, q in zip(tuned.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach() - alpha * q.grad, atol=atol, rtol=rtol)
    assert not same(params(tuned), before) and same(params(client.model), before)


# ---- FedRep --------------------------------------------------------------------------------------
def test_fedrep_head_phase_freezes_body_then_body_phase_freezes_head(digits_root):
    server = make_server(digits_root, "FedRep", "-pls", "2", "-lr", "0.1")
    client = server.clients[0]
    phases = []
    run = client.run_epochs

    def spy(epochs, *args, **kwargs):
        before = (params(client.model.base), params(client.model.head))
        out = run(epochs, *args, **kwargs)
        phases.append((epochs, before, (params(client.model.base), params(client.model.head))))
        return out

    client.run_epochs = spy
    client_steps.train(client, 0)
    (e_head, (b0, h0), (b1, h1)), (e_body, (b2, h2), (b3, h3)) = phases
    assert (e_head, e_body) == (2, 1)
    assert same(b0, b1) and not same(h0, h1)  # head epochs: body frozen
    assert same(h2, h3) and not same(b2, b3)  # body epochs: head frozen
    assert all(p.requires_grad for p in client.model.parameters())  # flags restored


def test_fedrep_heads_stay_local_and_only_bodies_are_averaged(digits_root):
    server = make_server(digits_root, "FedRep", "-pls", "1", "-lr", "0.1")
    loop.send(server, server.clients)
    loop.train_clients(server, server.clients)
    heads = [params(c.model.head) for c in server.clients]
    uploads = loop.receive(server, server.clients)
    body_keys = set(server.global_model.base.state_dict())
    assert all(set(u.state) == body_keys for u in uploads) and "fc.weight" not in body_keys
    server.aggregate(uploads)
    loop.send(server, server.clients)
    for c, h in zip(server.clients, heads):
        assert same(params(c.model.head), h)  # the server never overwrites a head
        assert same(params(c.model.base), params(server.global_model.base))
    assert not same(heads[0], heads[1])


def test_fedrep_with_ala_adapts_body_layers_under_the_local_head(digits_root):
    server = make_server(digits_root, "FedRep", "-ala", "--ala_max_epochs", "5", "-pls", "1", "-gr", "2",
                         "-lr", "0.1")
    client = server.clients[0]
    assert client.ala.names == ["base.fc1.0.weight", "base.fc1.0.bias"]
    loop.train(server)  # the final broadcast ran ALA
    glob = server.global_model.base
    assert client.ala.weights is not None
    assert same(params(client.model.base.conv1), params(glob.conv1))  # lower layers: global
    assert not same(params(client.model.base.fc1), params(glob.fc1))  # top body layer: blended
    assert not same(params(client.model.head), params(server.clients[1].model.head))


# ---- Ditto ---------------------------------------------------------------------------------------
def personal_distance(root, lam):
    server = make_server(root, "Ditto", "-mu", str(lam), "-lr", "0.01")
    loop.send(server, server.clients)
    client = server.clients[0]
    client_steps.train(client, 0)
    v, w_global = params(client.pmodel), params(server.global_model)
    return float(torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(v, w_global))))


def test_ditto_personal_model_is_pulled_toward_the_global_model(digits_root):
    d = [personal_distance(digits_root, lam) for lam in (0, 1, 100)]
    assert d[0] > d[1] > d[2] > 0, d


def test_ditto_records_global_accuracy_apart(digits_root):
    server = make_server(digits_root, "Ditto", "-lr", "0.1", "-gr", "1")
    loop.train(server)
    summary = loop.evaluate(server)
    correct = sum(int((predict(server.global_model, c.x_test, 1000).argmax(1) == c.y_test).sum())
                  for c in server.clients)
    total = sum(c.test_samples for c in server.clients)
    assert summary["global_test_acc"] == pytest.approx(correct / total)
    assert summary["global_test_acc"] != summary["test_acc"]  # the personal models are evaluated
    assert all(c.model.training for c in server.clients)  # w goes back to training mode after its evaluation
    client = server.clients[0]
    assert same(client.anchor, params(server.global_model))
    assert not same(params(client.pmodel), params(server.global_model))


@pytest.mark.parametrize("counts, expect", [([(1, 1), (0, 0), (0, 0), (0, 0), (0, 0)], 1.0),
                                            ([(3, 4), (1, 6), (0, 0), (0, 2), (0, 0)], 4 / 12)])
def test_ditto_global_accuracy_pools_the_clients_counts(digits_root, monkeypatch, counts, expect):
    """The global model's accuracy is Σ correct / Σ test samples over the clients (4 / 12 here, not the mean
    of the clients' own accuracies), also when the clients hold one test sample in all."""
    server = make_server(digits_root, "Ditto")
    for client, count in zip(server.clients, counts):
        monkeypatch.setattr(client, "received_test_metrics", lambda count=count: count)
    assert server.extra_metrics() == {"global_test_acc": pytest.approx(expect)}


def test_ditto_personal_step_by_hand(digits_root):
    """One batch holding the client's whole training split: v <- v - η (∇F(v) + λ (v - w^t)), by hand."""
    server = make_server(digits_root, "Ditto", "-mu", "0.7", "-lr", "0.05", "-lbs", "100000")
    loop.send(server, server.clients)
    client = server.clients[0]
    perturb(client.pmodel)  # v apart from w^t (in round 0 both are the common initialisation)
    ref, anchor = copy.deepcopy(client.pmodel), [a.clone() for a in client.anchor]
    assert not same(params(ref), anchor)
    client_steps.train(client, 0)
    grads = torch.autograd.grad(nn.functional.cross_entropy(ref(client.x_train), client.y_train),
                                list(ref.parameters()))
    expect = [p - 0.05 * (g + 0.7 * (p - a)) for p, g, a in zip(ref.parameters(), grads, anchor)]
    assert all(torch.allclose(p, e, atol=1e-6) for p, e in zip(client.pmodel.parameters(), expect))


def test_ditto_personal_model_follows_the_schedule_and_trains_in_training_mode(digits_tiny_root):
    server = make_server(digits_tiny_root, "Ditto", "-lr", "0.1", "-ld", "-ldg", "0.5", "-m", "BNCNN")
    loop.send(server, server.clients)
    client = server.clients[0]
    client.pmodel.eval()  # as an evaluation could leave it
    stats = {k: v.clone() for k, v in client.pmodel.state_dict().items() if "running_mean" in k}
    client_steps.train(client, 3)
    assert [g["lr"] for g in client.poptimizer.param_groups] == [pytest.approx(0.1 * 0.5 ** 3)]
    assert stats and all(not torch.equal(client.pmodel.state_dict()[k], v) for k, v in stats.items())


def test_ditto_with_ala_initialises_w_and_leaves_v(digits_root):
    server = make_server(digits_root, "Ditto", "-ala", "--ala_max_epochs", "5", "-lr", "0.1", "-gr", "1")
    loop.train(server)
    client = server.clients[0]
    v = params(client.pmodel)
    loop.send(server, server.clients)  # ALA (the client has trained) on w; v untouched
    assert client.ala.weights is not None
    assert same(params(client.pmodel), v)
    assert not same(params(client.model), params(server.global_model))
    assert same(client.anchor, params(server.global_model))


@pytest.mark.optional_deps("opacus")
def test_fine_tuning_under_dp_trains_the_copy_and_is_counted(digits_root):
    """-dp: the evaluation fine-tune is DP-SGD on the copy (it moves), each of its steps is in the accountant,
    and its noise never shifts training's stream."""
    server = make_server(digits_root, "FedAvg-C", "-dp", "-fte", "1", "-lr", "0.05")
    loop.send(server, server.clients)
    client = server.clients[0]
    steps_before = sum(s for _, _, s in client.dp.history)
    noise_before = client.dp.generator.get_state()
    tuned = client.eval_model()
    assert not same(params(tuned), params(client.model))  # the copy trained
    assert sum(s for _, _, s in client.dp.history) == steps_before + batches_per_epoch(client)
    assert torch.equal(client.dp.generator.get_state(), noise_before)  # its own noise stream
