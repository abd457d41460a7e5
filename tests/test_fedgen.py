"""FedGen: the generator's loss on a toy ensemble by hand, the generator learns on the server only, the
client objective with its schedule, round 0 = FedAvg's, -lf shares only the head, -ala runs, -dp refused."""
import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientbase import Upload
from flcore.clients.clientgen import Generator, generated_weight
from flcore.registry import get_server_class
from flcore.servers.servergen import generator_loss
from utils.data_utils import load_split
from utils.results import read_h5
from runtime import loop
from runtime import client_steps


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedGen", "--executor", "sequential", "-lr", "0.1",
                                "-se", "5", *flags))
    data = load_split("Digits", root, None, "cpu")
    return get_server_class("FedGen")(cfg.replace(num_classes=data.num_classes), data, 0, None)


def state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_generator_loss_on_a_toy_ensemble_matches_a_hand_computation():
    heads = [nn.Linear(2, 3), nn.Linear(2, 3)]
    with torch.no_grad():
        heads[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        heads[0].bias.copy_(torch.tensor([0.0, 0.5, -1.0]))
        heads[1].weight.copy_(torch.tensor([[-1.0, 2.0], [0.5, 0.0], [0.0, -1.0]]))
        heads[1].bias.zero_()
    shares = torch.tensor([[0.25, 1.0, 0.0], [0.75, 0.0, 1.0]])  # a_k(y): client 0 holds 1/4 of label 0
    z = torch.tensor([[1.0, 2.0], [0.0, -1.0], [3.0, 1.0]])
    eps = torch.tensor([[0.0], [1.0], [0.5]])
    y = torch.tensor([0, 1, 2])
    eta = 0.3
    teacher = 0.0
    for i in range(3):
        logits = [sum(shares[k, y[i]].item() * (sum(heads[k].weight[c, j].item() * z[i, j].item() for j in range(2))
                                                 + heads[k].bias[c].item()) for k in range(2)) for c in range(3)]
        teacher += (math.log(sum(math.exp(v) for v in logits)) - logits[int(y[i])]) / 3
    prod = 0.0
    for i in range(3):
        for j in range(3):
            d_eps = (eps[i, 0].item() - eps[j, 0].item()) ** 2
            d_z = (abs(z[i, 0].item() - z[j, 0].item()) + abs(z[i, 1].item() - z[j, 1].item())) / 2
            prod += d_eps * d_z / 9
    want = teacher + eta * math.exp(-prod)
    assert generator_loss(z, eps, y, heads, shares, eta).item() == pytest.approx(want, rel=1e-6)


def test_the_generator_learns_on_the_server_only(digits_root):
    server = make_server(digits_root)
    loop.send(server, server.clients)
    assert all(c.generator is None for c in server.clients)  # round 0: nothing trained yet
    loop.run_round(server, 0)
    assert server.gen_rounds == 1
    counts = sum(torch.bincount(c.y_train, minlength=10).float() for c in server.clients)
    torch.testing.assert_close(server.label_dist, counts / counts.sum())
    server.round_idx = 1
    loop.send(server, server.clients)
    g_server = state(server.generator)
    c0 = server.clients[0]
    assert c0.generator is not server.generator
    g_client = state(c0.generator)
    for k, v in g_client.items():
        assert torch.equal(v, g_server[k])
    held = {id(p) for g in c0.optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in held or p.requires_grad for p in c0.generator.parameters())
    loop.train_clients(server, server.clients)
    for k, v in state(c0.generator).items():  # client training leaves both copies as they were
        assert torch.equal(v, g_client[k])
    for k, v in state(server.generator).items():
        assert torch.equal(v, g_server[k])
    uploads = loop.receive(server, server.clients)
    server.aggregate(uploads)
    assert server.gen_rounds == 2
    moved = [k for k, v in server.generator.named_parameters() if not torch.equal(v.detach(), g_server[k])]
    assert moved == [k for k, _ in server.generator.named_parameters()]
    assert all(p.grad is not None for p in server.generator.parameters())


def test_client_objective_and_its_schedule(digits_root):
    assert generated_weight(10.0, 0) == 10.0 and generated_weight(10.0, 2) == pytest.approx(10 * 0.98 ** 2)
    assert generated_weight(10.0, 10 ** 4) == 1e-4
    server = make_server(digits_root, "--generative_alpha", "3.0", "--gen_batch_size", "6")
    loop.run_round(server, 0)
    c0 = server.clients[0]
    server.round_idx = 1
    loop.send(server, [c0])
    c0.alpha = generated_weight(3.0, 1)
    x, y = c0.x_train[:5], c0.y_train[:5]
    gen = torch.Generator().set_state(c0.gen_stream.get_state())
    got = c0.loss(x, y)
    y_gen = torch.multinomial(server.label_dist, 6, replacement=True, generator=gen)
    eps = torch.rand(6, server.cfg.noise_dim, generator=gen)
    with torch.no_grad():
        z = server.generator.eval()(eps, y_gen)
    want = F.cross_entropy(c0.model(x), y) + 3.0 * 0.98 * F.cross_entropy(c0.model.head(z), y_gen)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    assert (got - F.cross_entropy(c0.model(x), y)).item() > 0.1  # the generated term is there
    before = {k: v.clone() for k, v in c0.model.base.state_dict().items()}
    client_steps.train(c0, 1)  # the run takes the round's weight itself
    assert c0.alpha == pytest.approx(3.0 * 0.98)
    assert any(not torch.equal(v, before[k]) for k, v in c0.model.base.state_dict().items())


def run(root, out, *flags, algo="FedGen", rounds="2"):
    own = ("-se", "5") if algo == "FedGen" else ()
    assert main.main(cli(root, out, "-algo", algo, "-gr", rounds, "-lr", "0.1", *own, *flags)) == 0
    (h5,) = out.glob(f"Digits_{algo}*_test_0.h5")  # FedGen+ALA with -ala
    return read_h5(h5)


def test_round_zero_is_fedavg_and_later_rounds_are_not(digits_tiny_root, tmp_path):
    fedavg = run(digits_tiny_root, tmp_path / "avg", algo="FedAvg", rounds="2")
    fedgen = run(digits_tiny_root, tmp_path / "gen", rounds="2")
    assert np.array_equal(fedavg["rs_train_loss"][:2], fedgen["rs_train_loss"][:2])
    assert not np.array_equal(fedavg["rs_train_loss"][2], fedgen["rs_train_loss"][2])


def test_lf_shares_only_the_head(digits_root):
    server = make_server(digits_root, "-lf")
    base0 = state(server.global_model.base)
    loop.run_round(server, 0)
    uploads = loop.receive(server, server.clients)
    assert all(set(u.state) == {"head.weight", "head.bias"} for u in uploads)
    assert server.clients[0].personal_keys == ("base.",)
    for k, v in state(server.global_model.base).items():
        assert torch.equal(v, base0[k])
    server.round_idx = 1
    loop.send(server, server.clients)
    a, b = server.clients[0].model, server.clients[1].model
    assert torch.equal(a.head.weight, server.global_model.head.weight)
    assert not torch.equal(a.base.fc1[0].weight, b.base.fc1[0].weight)  # bodies stay local


def test_ala_runs(digits_tiny_root, tmp_path):
    h5 = run(digits_tiny_root, tmp_path, "-ala", rounds="3")
    assert np.all(np.isfinite(h5["rs_train_loss"])) and h5["rs_train_loss"][-1] < h5["rs_train_loss"][0]


@pytest.mark.parametrize("flags, words", [
    pytest.param(("-dp",), "FedGen is refused: it uploads each client's label counts", marks=pytest.mark.optional_deps("opacus")),
    (("-ala", "-lf"), "with -lf only the head is global"),
    (("-nd", "0"), "FedGen needs -nd, -hd and --gen_batch_size >= 1"),
    (("-glr", "0"), "FedGen needs -glr > 0"),
])
def test_bad_flags_end_with_one_line(flags, words, digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "FedGen", "-gr", "0", *flags)) == 2
    assert words in capsys.readouterr().err


def test_generator_shape_follows_its_flags_and_leaves_the_model_mode_alone():
    """[ε, onehot(y)] (noise + classes) -> hidden -> BatchNorm -> ReLU -> the classifier's input size, sized
    on one sample without changing the model's train/eval mode."""
    model = nn.Module()
    model.base = nn.Sequential(nn.Flatten(), nn.Linear(12, 7), nn.Dropout(0.5))
    cfg = SimpleNamespace(noise_dim=5, hidden_dim=9)
    for training in (True, False):
        model.train(training)
        gen = Generator.for_model(cfg, model, torch.randn(1, 3, 4), num_classes=3)
        assert model.base.training is training
    first, bn, act = gen.body
    assert (first.in_features, first.out_features) == (5 + 3, 9)
    assert isinstance(bn, nn.BatchNorm1d) and bn.num_features == 9 and isinstance(act, nn.ReLU)
    assert (gen.out.in_features, gen.out.out_features) == (9, 7)


def test_generator_training_matches_a_reference_loop_over_two_rounds(digits_tiny_root):
    """train_generator against an independent loop: -se Adam steps (weight decay 1e-2, lr -glr · 0.98^r in
    the r-th round it trains, one optimizer across rounds) on the ensemble of the uploaded heads weighted by
    hand-computed label shares a_k(y) = n_k(y) / Σ_j n_j(y), plus the diversity term, in train mode, then
    left in eval mode. Two uploads with unequal heads; label 1 is held by one sample of one client only."""
    server = make_server(digits_tiny_root, "-se", "3", "-glr", "0.01", "--diversity_weight", "0.5")
    glob = server.global_model.state_dict()
    g = torch.Generator().manual_seed(5)
    heads_w = [glob["head.weight"] + 0.3 * torch.randn(glob["head.weight"].shape, generator=g) for _ in range(2)]
    heads_b = [glob["head.bias"] + 0.3 * torch.randn(glob["head.bias"].shape, generator=g) for _ in range(2)]
    counts = [torch.tensor([3.0, 1.0, 0, 2, 0, 0, 0, 0, 0, 4]), torch.tensor([1.0, 0, 0, 6, 5, 0, 0, 0, 0, 0])]
    uploads = [Upload(i, 10.0, {**glob, "head.weight": heads_w[i], "head.bias": heads_b[i]},
                      extras={"label_counts": counts[i]}) for i in range(2)]
    # a_k(y) by hand: totals [4, 1, 0, 8, 5, 0, 0, 0, 0, 4]
    shares = torch.tensor([[3 / 4, 1.0, 0, 2 / 8, 0, 0, 0, 0, 0, 1.0], [1 / 4, 0, 0, 6 / 8, 1.0, 0, 0, 0, 0, 0]])
    p_y = torch.tensor([4.0, 1, 0, 8, 5, 0, 0, 0, 0, 4]) / 22

    ref = copy.deepcopy(server.generator)
    opt = torch.optim.Adam(ref.parameters(), lr=1.0, weight_decay=1e-2)
    stream = torch.Generator()
    stream.set_state(server.gen_stream.get_state())
    drawn = set()
    for r in range(2):
        for group in opt.param_groups:
            group["lr"] = 0.01 * 0.98 ** r
        ref.train()
        for _ in range(3):
            eps, y, z = ref.sample(p_y, 32, stream)
            drawn |= set(y.tolist())
            logits = sum(shares[k, y][:, None] * (z @ heads_w[k].T + heads_b[k]) for k in range(2))
            d_eps = ((eps[:, None] - eps[None]) ** 2).sum(-1) / eps.shape[1]
            d_z = (z[:, None] - z[None]).abs().sum(-1) / z.shape[1]
            loss = F.cross_entropy(logits, y) + 0.5 * torch.exp(-(d_eps * d_z).mean())
            opt.zero_grad()
            loss.backward()
            opt.step()
        server.train_generator(uploads)
        assert not server.generator.training
        torch.testing.assert_close(server.label_dist, p_y)
        for k, v in ref.state_dict().items():
            got = server.generator.state_dict()[k]
            # float32 sums in another order: Adam's step (lr 0.01 · m / sqrt(v)) carries them to 1e-5 here
            torch.testing.assert_close(got, v, atol=1e-4, rtol=1e-4,
                                       msg=f"round {r}: {k}: largest difference {float((got - v).abs().max()):.3g}")
    assert 1 in drawn  # the share of a label held by a single sample was used


def test_the_generator_is_moved_to_the_server_device(digits_tiny_root, monkeypatch):
    moved = []
    to = Generator.to
    monkeypatch.setattr(Generator, "to", lambda self, *a, **k: moved.append((a, k)) or to(self, *a, **k))
    server = make_server(digits_tiny_root)
    assert ((server.device,), {}) in moved


def test_lf_averages_the_uploaded_heads_by_samples(digits_tiny_root, monkeypatch):
    """-lf: the global head becomes the sample-weighted mean of the uploaded heads (unequal weights)."""
    server = make_server(digits_tiny_root, "-lf", "-se", "1")
    seen = []
    receive = loop.receive
    monkeypatch.setattr(loop, "receive", lambda srv, cs: seen.append(receive(srv, cs)) or seen[-1])
    loop.run_round(server, 0)
    uploads = seen[0]
    w = [float(u.weight) for u in uploads]
    assert len(set(w)) > 1
    for k in ("weight", "bias"):
        want = sum(wi * u.state[f"head.{k}"] for wi, u in zip(w, uploads)) / sum(w)
        torch.testing.assert_close(getattr(server.global_model.head, k).detach(), want)
