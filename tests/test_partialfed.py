"""PartialFed: the relaxed composition by hand, whole layers loaded, the held-out slice (never trained on,
the only data the choice is scored on), the direction the choice moves, and what it learns on an IID and a
pathological split (most layers global there, the classifier local here)."""
import math

import numpy as np
import pytest
import torch
from torch import nn

import main
from cli import parse_config
from conftest import cli
import flcore.clients.clientpartial as cp
from flcore.registry import get_server_class
from flcore.trainmodel.parts import layer_groups
from utils.data_utils import load_split
from utils.personal_aggregation import compose_by_layer, layer_of, mix_by_layer
from utils.results import read_h5
from runtime import client_steps


def make_server(root, *flags, algo="PartialFed"):
    cfg = parse_config(cli(root, root, "-algo", algo, "--executor", "sequential", *flags))
    return get_server_class(algo)(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root))


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def perturbed(model, seed, scale=0.1):
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in state(model).items()}


def same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


# ---- the composition -----------------------------------------------------------------------------
def test_mix_by_layer_by_hand():
    layer = {"a.weight": 0, "a.bias": 0, "b.weight": 1}
    local = {"a.weight": torch.tensor([1.0, 2.0]), "a.bias": torch.tensor([3.0]), "b.weight": torch.tensor([5.0])}
    glob = {"a.weight": torch.tensor([10.0, 20.0]), "a.bias": torch.tensor([30.0]), "b.weight": torch.tensor([50.0]),
            "extra": torch.tensor([7.0])}
    w = torch.tensor([[0.25, 0.75], [1.0, 0.0]], requires_grad=True)
    mixed = mix_by_layer(local, glob, layer, w)
    assert torch.allclose(mixed["a.weight"], torch.tensor([3.25, 6.5]))  # 0.25 * 10 + 0.75 * 1, ...
    assert torch.allclose(mixed["a.bias"], torch.tensor([9.75]))
    assert torch.equal(mixed["b.weight"], torch.tensor([50.0])) and torch.equal(mixed["extra"], torch.tensor([7.0]))
    (grad,) = torch.autograd.grad(mixed["a.weight"].sum() + mixed["b.weight"].sum(), w)
    assert torch.allclose(grad, torch.tensor([[30.0, 3.0], [50.0, 5.0]]))  # the summed entries of each source


def test_layer_of_maps_nested_modules_buffers_to_their_own_module():
    """Buffers go with the parameters of their own module (its full dotted path), also two levels down."""
    groups = [["block.conv.weight", "block.conv.bias"], ["block.bn.weight", "block.bn.bias"], ["fc.weight"]]
    names = ["block.conv.weight", "block.conv.bias", "block.bn.weight", "block.bn.bias", "block.bn.running_mean",
             "block.bn.num_batches_tracked", "fc.weight", "other.running_var"]
    assert layer_of(names, groups) == {"block.conv.weight": 0, "block.conv.bias": 0, "block.bn.weight": 1,
                                       "block.bn.bias": 1, "block.bn.running_mean": 1,
                                       "block.bn.num_batches_tracked": 1, "fc.weight": 2}

def test_a_gumbel_draw_of_zero_gives_finite_noise(monkeypatch):
    """torch.rand can return exactly 0; u is floored at 1e-10 so -log(-log u) stays finite (about -3.14)
    and the sample is still a one-hot row with the relaxation's gradient."""
    from utils.personal_aggregation import gumbel_straight_through

    monkeypatch.setattr(torch, "rand", lambda shape, generator=None: torch.zeros(shape))
    logits = torch.tensor([[0.3, -0.2], [0.0, 1.0]], requires_grad=True)
    out = gumbel_straight_through(logits, 1.0, torch.Generator())
    assert torch.isfinite(out).all() and out.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    out[:, 0].sum().backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0


def test_gumbel_noise_is_added_as_minus_log_minus_log_u(monkeypatch):
    """u = (0.1, 0.9) on equal logits: Gumbel noise -log(-log u) = (-0.834, 2.250), so the second entry is
    drawn, and the relaxation at tau 2 is softmax of the noise / 2, by hand."""
    from utils.personal_aggregation import gumbel_straight_through

    monkeypatch.setattr(torch, "rand", lambda shape, generator=None: torch.tensor([[0.1, 0.9]]))
    logits = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    out = gumbel_straight_through(logits, 2.0, torch.Generator())
    assert out.tolist() == [[0.0, 1.0]]
    g = [-math.log(-math.log(0.1)), -math.log(-math.log(0.9))]
    p1 = 1 / (1 + math.exp((g[0] - g[1]) / 2))  # the relaxation's weight on the drawn entry
    out[0, 1].backward()  # d soft_1 / d logit_1 = p1 (1 - p1) / tau
    assert logits.grad[0, 1].item() == pytest.approx(p1 * (1 - p1) / 2, rel=1e-6)

def test_compose_by_layer_moves_batchnorm_statistics_with_their_layer():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    layer = layer_of(list(model.state_dict()), layer_groups(model))  # BatchNorm joins the layer below it
    assert layer["1.running_mean"] == layer["1.num_batches_tracked"] == layer["0.weight"] == 0
    local = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    glob = {k: torch.ones_like(v) for k, v in model.state_dict().items()}
    mixed = compose_by_layer(local, glob, layer, [False, True])
    assert all(int(mixed[k].max()) == 0 for k in mixed if not k.startswith("2."))
    assert all(int(mixed[k].min()) == 1 for k in mixed if k.startswith("2."))


def test_choice_is_per_layer(digits_root):
    server = make_server(digits_root)
    client = server.clients[0]
    local = perturbed(client.model, seed=7)
    client.model.load_state_dict(local)
    client.train_time = [0.0]  # has trained before (but holds no slice out): the set choice applies as is
    client.logits = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    glob = state(server.global_model)
    client.receive(server.global_model, participating=True)
    got = state(client.model)
    for layer, names in enumerate(layer_groups(client.model)):
        source = glob if layer % 2 == 0 else local
        assert all(torch.equal(got[n], source[n]) for n in names), names


def test_the_choice_starts_at_the_prior_and_ties_load_the_global_layer(digits_root):
    client = make_server(digits_root, "--strategy_prior", "0.7").clients[0]
    probs = torch.softmax(client.logits, dim=1)  # (load global, keep local) per layer
    torch.testing.assert_close(probs[:, 0], torch.full((len(probs),), 0.7), rtol=0, atol=1e-6)
    client.logits = torch.zeros_like(client.logits)
    assert client.from_global() == [True] * len(probs)


def test_temperature_decays_once_per_participation(digits_root, monkeypatch):
    """The Gumbel temperature is --tau at a client's first participation, times --tau_decay per later one."""
    server = make_server(digits_root, "--tau", "4", "--tau_decay", "0.5")
    client = server.clients[0]
    seen = []
    real = cp.gumbel_straight_through
    monkeypatch.setattr(cp, "gumbel_straight_through", lambda lg, tau, gen: seen.append(tau) or real(lg, tau, gen))
    for participations in (1, 3):
        client.train_time = [0.0] * participations
        client.held_out = torch.arange(5)
        seen.clear()
        client.learn_strategy(server.global_model)
        assert seen and set(seen) == {4 * 0.5 ** (participations - 1)}, seen
        # the learnt logits are kept as a plain tensor: no graph (a checkpoint or a parked client copies them)
        assert not client.logits.requires_grad and client.logits.grad_fn is None


def test_at_least_one_sample_is_trained_on(digits_root):
    """ceil(--strategy_percent · n) held out, at most n - 1 (a share near 1 would leave nothing to train)."""
    client = make_server(digits_root, "--strategy_percent", "0.999").clients[0]
    n = client.train_samples
    assert math.ceil(0.999 * n) == n  # the cap applies
    assert client.held_out_count() == n - 1
    assert client.steps_per_round() == client.cfg.local_epochs  # each epoch one batch: the one sample trained on
    client = make_server(digits_root, "--strategy_percent", "0.3").clients[0]
    assert client.held_out_count() == math.ceil(0.3 * client.train_samples)


def test_learned_choice_takes_whole_layers(digits_root):
    server = make_server(digits_root, "--strategy_percent", "0.5", "--strategy_prior", "0.5")
    client = server.clients[1]
    client_steps.train(client, 0)
    local, glob = state(client.model), perturbed(server.global_model, seed=2)
    server.global_model.load_state_dict(glob)
    before = client.logits.clone()
    client.receive(server.global_model, participating=True)
    assert not torch.equal(client.logits, before)  # the strategy was trained
    got = state(client.model)
    for names, from_global in zip(layer_groups(client.model), client.from_global()):
        source = glob if from_global else local
        assert all(torch.equal(got[n], source[n]) for n in names), names


# ---- the held-out slice --------------------------------------------------------------------------
def poisoned(client, idx):
    """The client with the samples ``idx`` replaced by noise and another label."""
    g = torch.Generator().manual_seed(0)
    client.x_train, client.y_train = client.x_train.clone(), client.y_train.clone()
    client.x_train[idx] = torch.randn(client.x_train[idx].shape, generator=g)
    client.y_train[idx] = (client.y_train[idx] + 1) % 10
    return client


def test_local_update_never_trains_on_the_held_out_slice(digits_root):
    client = make_server(digits_root, "-lr", "0.1").clients[0]
    client_steps.train(client, 0)
    held, trained, n = client.held_out, client.trained_on, client.train_samples
    assert len(held) == math.ceil(0.2 * n) and sorted(torch.cat([held, trained]).tolist()) == list(range(n))
    assert client.steps_per_round() == math.ceil(len(trained) / 10)  # -lbs 10, one epoch of the rest
    # The same client with its held-out samples spoiled trains to the very same model ...
    other = poisoned(make_server(digits_root, "-lr", "0.1").clients[0], held)
    client_steps.train(other, 0)
    assert torch.equal(other.held_out, held) and same(state(other.model), state(client.model))
    # ... and spoiling one sample it trains on changes the model.
    third = poisoned(make_server(digits_root, "-lr", "0.1").clients[0], trained[:1])
    client_steps.train(third, 0)
    assert not same(state(third.model), state(client.model))


def learned_logits(root, spoil: str | None):
    server = make_server(root, "-lr", "0.1", "--strategy_prior", "0.5")
    client = server.clients[1]
    client_steps.train(client, 0)
    server.global_model.load_state_dict(perturbed(server.global_model, seed=3))
    if spoil is not None:
        poisoned(client, client.held_out if spoil == "held_out" else client.trained_on)
    client.receive(server.global_model, participating=True)
    return client.logits


def test_choice_is_scored_on_the_held_out_slice_only(digits_root):
    base = learned_logits(digits_root, None)
    assert torch.equal(learned_logits(digits_root, "trained_on"), base)
    assert not torch.equal(learned_logits(digits_root, "held_out"), base)


@pytest.mark.parametrize("better", ["global", "local"])
def test_choice_moves_to_the_better_model(better, digits_root):
    """A trained model against the untrained initialisation, from an even prior: every layer chooses the
    trained model's."""
    server = make_server(digits_root, "-lr", "0.1", "-ls", "3", "--strategy_prior", "0.5")
    client = server.clients[2]
    init = state(client.model)
    client_steps.train(client, 0)
    trained = state(client.model)
    if better == "global":
        server.global_model.load_state_dict(trained)
        client.model.load_state_dict(init)
    else:
        server.global_model.load_state_dict(init)
    client.receive(server.global_model, participating=True)
    assert client.from_global() == [better == "global"] * len(layer_groups(client.model)), client.logits


@pytest.mark.parametrize("flag", [("--strategy_percent", "1"), ("--strategy_percent", "-0.1"),
                                  ("--strategy_prior", "0"), ("--strategy_prior", "1"), ("--tau", "0"),
                                  ("--tau_decay", "0"), ("--tau_decay", "1.1"), ("--strategy_lr", "-1")])
def test_bad_strategy_flags_get_one_line(flag, digits_root, tmp_path, capsys):
    assert main.main(cli(digits_root, tmp_path, "-algo", "PartialFed", "-gr", "1", *flag)) == 2
    err = capsys.readouterr().err.strip()
    assert "0 <= --strategy_percent < 1 and 0 < --strategy_prior < 1" in err and len(err.splitlines()) == 1, err


def test_strategy_flags_at_their_bounds_are_accepted(digits_root):
    """No temperature decay, a frozen choice (rate 0) and nothing held out (no learning) are valid runs."""
    cfg = parse_config(cli(digits_root, digits_root, "-algo", "PartialFed", "--tau_decay", "1",
                                "--strategy_lr", "0", "--strategy_percent", "0"))
    assert (cfg.tau_decay, cfg.strategy_lr, cfg.strategy_percent) == (1.0, 0.0, 0.0)


# ---- what it learns --------------------------------------------------------------------------------
def run(root, tmp_path, algo="PartialFed"):
    """The result series of a 5-round run (-lr 0.1): accuracy and, for PartialFed, the share of the clients
    that load each layer from the global model, per evaluation (choices are made before evaluating)."""
    assert main.main(cli(root, tmp_path, "-algo", algo, "-gr", "5", "-lr", "0.1", "--executor", "sequential")) == 0
    return read_h5(tmp_path / f"Digits_{algo}_test_0.h5")


def test_iid_split_loads_most_layers_from_the_global_model(digits_root, tmp_path):
    got, local = run(digits_root, tmp_path), run(digits_root, tmp_path, "Local")
    share = got["rs_global_layer_share_by_layer"]
    assert np.allclose(got["rs_global_layer_share"], share.mean(1))
    assert share.mean(1).min() >= 0.75, share  # in every round, including the final evaluation
    assert not np.allclose(got["rs_test_acc"], local["rs_test_acc"]), (got["rs_test_acc"], local["rs_test_acc"])


def test_pathological_split_keeps_local_classifiers(digits_noniid_root, tmp_path):
    share = run(digits_noniid_root, tmp_path)["rs_global_layer_share_by_layer"]
    assert share[-1, -1] <= 1 / 6, share  # at most one of the 6 clients loads the global classifier
    assert share[-1].mean() <= 0.5, share
