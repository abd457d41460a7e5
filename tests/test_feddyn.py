"""FedDyn against hand computations: the regulariser's gradient (autograd of the written-out objective),
the local steps and the client state update, the server's h and model update on toy states, -ala and -dp."""

import numpy as np
import pytest
import torch
from torch.func import functional_call

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientbase import Upload
from flcore.clients.clientdyn import dyn_penalty_grad
from flcore.registry import get_server_class
from flcore.servers.serverdyn import dyn_server_step
from utils.data_utils import load_split
from runtime import loop
from runtime import client_steps


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedDyn", "--executor", "sequential", *flags))
    return get_server_class("FedDyn")(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root))


def randn_like(params: dict, seed: int, scale: float = 0.05) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: scale * torch.randn(p.shape, generator=g) for k, p in params.items()}


def test_regulariser_gradient_is_minus_state_plus_alpha_distance():
    shapes = {"w": torch.empty(3, 2), "b": torch.empty(2)}
    theta = {k: t.requires_grad_(True) for k, t in randn_like(shapes, 1, 1.0).items()}
    state, anchor = randn_like(theta, 2, 1.0), randn_like(theta, 3, 1.0)
    alpha = 0.3
    # the objective's regulariser written out: -<g, θ> + (α/2) ||θ - θ^{t-1}||² (squared norm)
    reg = sum(-(state[k] * theta[k]).sum() + alpha / 2 * torch.linalg.vector_norm(theta[k] - anchor[k]) ** 2
              for k in theta)
    auto = torch.autograd.grad(reg, list(theta.values()))
    hand = dyn_penalty_grad(theta, state, anchor, alpha)
    for (k, want), got in zip(hand.items(), auto):
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(want, -state[k] + alpha * (theta[k].detach() - anchor[k]))


def test_local_steps_and_state_update_follow_the_paper(digits_root):
    alpha, lr, bs = 0.5, 0.05, 32
    server = make_server(digits_root, "-al", str(alpha), "-lr", str(lr), "-lbs", str(bs))
    c0 = server.clients[0]
    loop.send(server, [c0])
    anchor = {k: p.detach().clone() for k, p in server.global_model.named_parameters()}
    c0.grad_state = randn_like(anchor, 4)
    state_old = {k: v.clone() for k, v in c0.grad_state.items()}
    batch_state = c0.batch_gen.get_state()
    client_steps.train(c0, 0)

    # Reference: SGD on CE + the written-out regulariser, by autograd, over the client's own batches.
    gen = torch.Generator().set_state(batch_state)
    n = c0.train_samples
    perm = torch.randperm(n, generator=gen)
    theta = {k: v.clone() for k, v in anchor.items()}
    for i in range(0, n, bs):
        idx = perm[i:i + bs]
        p = {k: v.clone().requires_grad_(True) for k, v in theta.items()}
        loss = torch.nn.functional.cross_entropy(functional_call(c0.model, p, (c0.x_train[idx],)), c0.y_train[idx])
        loss = loss + sum(-(state_old[k] * p[k]).sum() + alpha / 2 * ((p[k] - anchor[k]) ** 2).sum() for k in p)
        grads = torch.autograd.grad(loss, list(p.values()))
        theta = {k: theta[k] - lr * g for k, g in zip(theta, grads)}
    for k, p in c0.model.named_parameters():
        torch.testing.assert_close(p.detach(), theta[k], atol=1e-5, rtol=1e-4)
        # ∇L_k(θ_k^t) = ∇L_k(θ_k^{t-1}) - α (θ_k^t - θ^{t-1})
        want = state_old[k] - alpha * (theta[k] - anchor[k])
        torch.testing.assert_close(c0.grad_state[k], want, atol=1e-5, rtol=1e-4)
    assert set(c0.upload().state) == set(c0.model.state_dict())  # the state stays on the client


def test_server_step_by_hand_on_scalars():
    theta, h = {"w": torch.tensor([1.0])}, {"w": torch.tensor([0.1])}
    # two of m = 4 clients took part, uploading 2 and 4: mean 3, sum of changes (2 - 1) + (4 - 1) = 4
    new, new_h = dyn_server_step(theta, {"w": torch.tensor([3.0])}, h, {"w": torch.tensor([4.0])}, 0.5, 4)
    # h' = 0.1 - 0.5 * 4 / 4 = -0.4;  θ' = 3 - (-0.4) / 0.5 = 3.8
    assert torch.allclose(new_h["w"], torch.tensor([-0.4])) and torch.allclose(new["w"], torch.tensor([3.8]))


def test_server_aggregate_updates_h_over_all_clients_and_corrects_the_unweighted_mean(digits_root):
    alpha = 0.2
    server = make_server(digits_root, "-al", str(alpha))
    prev = {k: v.detach().clone() for k, v in server.global_model.state_dict().items()}
    h_old = randn_like(server.h, 5)
    server.h = {k: v.clone() for k, v in h_old.items()}
    states = [{k: prev[k] + d for k, d in randn_like(prev, s).items()} for s in (6, 7)]
    server.aggregate([Upload(0, 100.0, states[0]), Upload(1, 1.0, states[1])])  # weights must not count
    n = len(server.clients)
    assert n == 5
    for k, v in server.global_model.state_dict().items():
        h_new = h_old[k] - alpha * ((states[0][k] - prev[k]) + (states[1][k] - prev[k])) / n
        torch.testing.assert_close(server.h[k], h_new)
        torch.testing.assert_close(v, (states[0][k] + states[1][k]) / 2 - h_new / alpha)


def test_feddyn_with_ala_anchors_to_the_received_global_model(digits_root):
    server = make_server(digits_root, "-ala", "--ala_max_epochs", "3", "-gr", "2", "-lr", "0.1", "-eg", "5")
    loop.train(server)
    client = server.clients[0]
    assert client.ala.weights is not None  # ALA ran in round 2
    glob = dict(server.global_model.named_parameters())
    assert all(torch.equal(client.anchor[k], glob[k].detach()) for k in glob)  # the anchor is θ^{t-1} ...
    assert any(not torch.equal(p.detach(), glob[k]) for k, p in client.model.named_parameters())  # ... not ALA's mix
    assert np.isfinite(loop.evaluate(server)["train_loss"])


@pytest.mark.optional_deps("opacus")
def test_dp_adds_the_regulariser_after_clipping(digits_root):
    """With a clip norm of ~0 and no noise the data term vanishes: one step is then the regulariser's
    gradient alone, unclipped (post-processing of the private release)."""
    alpha, lr = 0.5, 0.1
    server = make_server(digits_root, "-dp", "-dps", "1", "--dp_clip", "1e-9", "-al", str(alpha), "-lr", str(lr))
    c0 = server.clients[0]
    c0.dp.sigma = 0.0
    loop.send(server, [c0])
    anchor = {k: p.detach().clone() for k, p in c0.model.named_parameters()}
    c0.grad_state = randn_like(anchor, 8)
    with torch.no_grad():
        for k, d in randn_like(anchor, 9).items():
            dict(c0.model.named_parameters())[k].add_(d)
    theta = {k: p.detach().clone() for k, p in c0.model.named_parameters()}
    c0.run_epochs(1, batch_size=c0.train_samples)  # one step
    for k, p in c0.model.named_parameters():
        want = theta[k] - lr * (alpha * (theta[k] - anchor[k]) - c0.grad_state[k])
        torch.testing.assert_close(p.detach(), want, atol=1e-6, rtol=1e-5)
        assert not torch.equal(p.detach(), theta[k])


def test_alpha_must_be_positive(digits_root, tmp_path, capsys):
    assert main.main(cli(digits_root, tmp_path, "-algo", "FedDyn", "-al", "0", "-gr", "1")) == 2
    assert "-al must be > 0" in capsys.readouterr().err
