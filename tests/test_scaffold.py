"""SCAFFOLD against a hand-written reference: the corrected local steps, option II for c_i, the server's
unweighted model step and its c update over all N clients."""
import math

import torch
from torch.func import functional_call

from cli import parse_config
from conftest import cli
from flcore.registry import get_server_class
from utils.data_utils import load_split
from runtime import loop
from runtime import client_steps


def build(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "SCAFFOLD", "--executor", "sequential", "-lr", "0.05",
                                "-lbs", "32", *flags))
    data = load_split("Digits", root, None, "cpu")
    return get_server_class("SCAFFOLD")(cfg.replace(num_classes=data.num_classes), data, 0, None)


def random_like(params: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: 0.01 * torch.randn(p.shape, generator=g) for k, p in params.items()}


def test_local_steps_and_control_variate_follow_the_paper(digits_root):
    server = build(digits_root)
    c0, x = server.clients[0], {k: p.detach().clone() for k, p in server.global_model.named_parameters()}
    server.c = random_like(x, 1)
    c0.c_i = random_like(x, 2)
    c_i_old = {k: v.clone() for k, v in c0.c_i.items()}
    batch_state = c0.batch_gen.get_state()
    loop.send(server, [c0])
    client_steps.train(c0, 0)
    up = c0.upload()

    # Reference: K plain steps y <- y - lr (grad f(y; batch) - c_i + c) over the client's own batches.
    lr, bs, n = 0.05, 32, c0.train_samples
    gen = torch.Generator().set_state(batch_state)
    y = {k: v.clone() for k, v in x.items()}
    steps = 0
    for i in range(0, n, bs):
        if i == 0:
            perm = torch.randperm(n, generator=gen)
        idx = perm[i:i + bs]
        p = {k: v.clone().requires_grad_(True) for k, v in y.items()}
        loss = torch.nn.functional.cross_entropy(functional_call(c0.model, p, (c0.x_train[idx],)), c0.y_train[idx])
        grads = torch.autograd.grad(loss, list(p.values()))
        y = {k: y[k] - lr * (g - c_i_old[k] + server.c[k]) for k, g in zip(y, grads)}
        steps += 1
    assert steps == math.ceil(n / bs) == c0.steps_per_round()
    for k, p in c0.model.named_parameters():
        torch.testing.assert_close(p.detach(), y[k], atol=1e-5, rtol=1e-4)
    for k in x:  # option II: c_i+ = c_i - c + (x - y) / (K lr); the upload carries the change
        want = c_i_old[k] - server.c[k] + (x[k] - y[k]) / (steps * lr)
        torch.testing.assert_close(c0.c_i[k], want, atol=1e-4, rtol=1e-3)
        torch.testing.assert_close(up.extras["dc"][k], want - c_i_old[k], atol=1e-4, rtol=1e-3)


def test_server_steps_by_the_unweighted_mean_and_spreads_dc_over_all_clients(digits_root):
    server = build(digits_root, "-slr", "0.5")
    x = {k: v.clone() for k, v in server.global_model.state_dict().items()}
    c_before = random_like(x, 3)
    server.c = {k: v.clone() for k, v in c_before.items()}
    chosen = server.clients[:2]
    loop.send(server, chosen)
    loop.train_clients(server, chosen)
    uploads = loop.receive(server, chosen)
    assert uploads[0].weight != uploads[1].weight  # the clients' sizes differ, the mean must ignore them
    server.aggregate(uploads)
    n_clients = len(server.clients)
    assert n_clients == 5
    for k, v in server.global_model.state_dict().items():
        mean = (uploads[0].state[k] + uploads[1].state[k]) / 2
        torch.testing.assert_close(v, x[k] + 0.5 * (mean - x[k]))
        dc = uploads[0].extras["dc"][k] + uploads[1].extras["dc"][k]
        torch.testing.assert_close(server.c[k], c_before[k] + dc / n_clients)
