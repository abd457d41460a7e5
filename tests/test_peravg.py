"""Per-FedAvg's step sizes against hand computations: β defaults to α (``-lr``), and with ``-ld`` the
training steps and the personalisation before evaluation use the decayed α (and β) of their round."""
import copy

import pytest
import torch
from torch import nn

from cli import parse_config
from conftest import cli
from flcore.clients import clientbase
from flcore.registry import get_server_class
from utils.data_utils import load_split
from utils.errors import FLError
from utils.seeding import torch_gen
from runtime import loop
from runtime import client_steps


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "Per-FedAvg", "--executor", "sequential", *flags))
    cfg = cfg.replace(device="cpu", num_classes=10)
    return get_server_class("Per-FedAvg")(cfg, load_split("Digits", root))


def sgd_step(model, x, y, lr):
    """A copy of ``model`` after one plain SGD step of size ``lr`` on (x, y), and the copy's gradient."""
    out = copy.deepcopy(model)
    nn.functional.cross_entropy(out(x), y).backward()
    grads = [p.grad.clone() for p in out.parameters()]
    with torch.no_grad():
        for p, g in zip(out.parameters(), grads):
            p -= lr * g
    return out


def meta_step(w0, x, y, bs, alpha, beta):
    """By hand: w' = w - α ∇f(w; D) on the first ``bs`` samples, then w - β ∇f(w'; D') on the rest."""
    inner = sgd_step(w0, x[:bs], y[:bs], alpha)
    inner.zero_grad()
    nn.functional.cross_entropy(inner(x[bs:]), y[bs:]).backward()
    return [p.detach() - beta * q.grad for p, q in zip(w0.parameters(), inner.parameters())]


def one_meta_step(client, round_idx, bs, monkeypatch):
    """Train ``client`` in round ``round_idx`` for exactly one step, on a known batch pair (the batches its
    ``run_epochs`` draws, utils.batching.batches as the client's base module calls it, replaced)."""
    idx = torch.arange(2 * bs)
    monkeypatch.setattr(clientbase, "batches", lambda *args, **kwargs: iter([idx]))
    w0 = copy.deepcopy(client.model)
    client_steps.train(client, round_idx)
    return w0, client.x_train[idx], client.y_train[idx]


def test_beta_defaults_to_the_learning_rate(digits_root, monkeypatch):
    lr, bs = 0.07, 5
    server = make_server(digits_root, "-lr", str(lr), "-lbs", str(bs))
    assert server.cfg.beta is None  # unset: β follows -lr, whatever -lr is
    client = server.clients[0]
    w0, x, y = one_meta_step(client, 0, bs, monkeypatch)
    for p, q in zip(client.model.parameters(), meta_step(w0, x, y, bs, lr, lr)):
        assert torch.allclose(p.detach(), q, atol=1e-6)


def test_bt_sets_beta_and_must_be_positive(digits_root, capsys):
    assert make_server(digits_root, "-lr", "0.1", "-bt", "0.02").clients[0].beta(0) == pytest.approx(0.02)
    assert "-bt" not in capsys.readouterr().err  # a β that is set draws no warning
    with pytest.raises(FLError, match="-bt"):
        make_server(digits_root, "-bt", "-0.1")
    # PFLlib's default -bt 0.0, which its Per-FedAvg ignores: beta = -lr, with a warning
    assert make_server(digits_root, "-lr", "0.1", "-bt", "0").clients[0].beta(0) == pytest.approx(0.1)
    assert "-bt 0 is PFLlib's default" in capsys.readouterr().err


def test_training_uses_the_decayed_alpha_and_beta_of_its_round(digits_root, monkeypatch):
    lr, bt, gamma, t, bs = 0.1, 0.04, 0.5, 2, 5
    client = make_server(digits_root, "-lr", str(lr), "-bt", str(bt), "-ld", "-ldg", str(gamma),
                         "-lbs", str(bs)).clients[0]
    w0, x, y = one_meta_step(client, t, bs, monkeypatch)
    # round 2: α = 0.1 · 0.5² = 0.025, β = 0.04 · 0.5² = 0.01
    for p, q in zip(client.model.parameters(), meta_step(w0, x, y, bs, 0.025, 0.01)):
        assert torch.allclose(p.detach(), q, atol=1e-6)


@pytest.mark.parametrize("participating", [True, False])
def test_personalisation_uses_the_decayed_alpha_of_the_evaluated_round(digits_root, participating):
    lr, gamma, t, bs, cid = 0.1, 0.5, 3, 10, 2
    server = make_server(digits_root, "-lr", str(lr), "-ld", "-ldg", str(gamma), "-lbs", str(bs))
    server.round_idx = t
    loop.send(server, server.clients if participating else [server.clients[0]])
    client = server.clients[cid]
    tuned = client.eval_model()
    idx = torch.randperm(client.train_samples, generator=torch_gen(0, 0, "fine-tune", cid))[:bs]
    x, y = client.x_train[idx], client.y_train[idx]
    # round 3: α = 0.1 · 0.5³ = 0.0125 (not the undecayed 0.1)
    ref = sgd_step(server.global_model, x, y, 0.0125)
    for p, q in zip(tuned.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    undecayed = sgd_step(server.global_model, x, y, lr)
    assert not all(torch.allclose(p, q, atol=1e-6)
                   for p, q in zip(tuned.parameters(), undecayed.parameters()))
