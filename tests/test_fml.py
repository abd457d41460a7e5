"""FML against hand computations: the mutual losses on fixed logits (and their gradients: each model's KL
target is the other's detached prediction), with both KL weights 0 two independent CE trainings (a
reference loop), the meme model averaged as FedAvg and the local model never uploaded; -ala runs."""
import pytest
import torch
from torch.func import functional_call

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientfml import mutual_losses
from flcore.registry import get_server_class
from utils.aggregate import weighted_average
from utils.data_utils import load_split
from runtime import loop
from runtime import client_steps


def build(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FML", "--executor", "sequential", "-lr", "0.1", "-lbs", "20",
                                "-nc", "3", *flags))
    data = load_split("Digits", root, 3, "cpu")
    return get_server_class("FML")(cfg.replace(num_classes=data.num_classes), data, 0, None)


def softmax(v):
    e = [pow(2.718281828459045, a) for a in v]
    return [a / sum(e) for a in e]


def test_losses_by_hand_on_fixed_logits():
    import math

    local = torch.tensor([[1.0, 0.0, -1.0]], requires_grad=True)
    meme = torch.tensor([[0.0, 2.0, 0.5]], requires_grad=True)
    y = torch.tensor([0])
    a, b = 0.3, 0.8
    p, q = softmax([1.0, 0.0, -1.0]), softmax([0.0, 2.0, 0.5])
    ce_local, ce_meme = -math.log(p[0]), -math.log(q[0])
    kl_q_p = sum(qi * math.log(qi / pi) for pi, qi in zip(p, q))  # KL(p_meme || p_local)
    kl_p_q = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))  # KL(p_local || p_meme)
    got_local, got_meme = mutual_losses(local, meme, y, a, b)
    assert float(got_local.detach()) == pytest.approx(a * ce_local + (1 - a) * kl_q_p, rel=1e-5)
    assert float(got_meme.detach()) == pytest.approx(b * ce_meme + (1 - b) * kl_p_q, rel=1e-5)
    # One backward of the sum: the local logits get only L_local's gradient, the meme's only L_meme's.
    (got_local + got_meme).backward()
    ref_local = local.detach().clone().requires_grad_(True)
    ref_meme = meme.detach().clone().requires_grad_(True)
    mutual_losses(ref_local, meme.detach(), y, a, b)[0].backward()
    mutual_losses(local.detach(), ref_meme, y, a, b)[1].backward()
    torch.testing.assert_close(local.grad, ref_local.grad)
    torch.testing.assert_close(meme.grad, ref_meme.grad)


def test_zero_kl_weights_are_two_independent_ce_trainings(digits_tiny_root):
    server = build(digits_tiny_root, "-al", "1", "-bt", "1")
    c = server.clients[0]
    start = {"local": dict(c.local.named_parameters()), "meme": dict(server.global_model.named_parameters())}
    start = {m: {k: v.detach().clone() for k, v in s.items()} for m, s in start.items()}
    batch_state = c.batch_gen.get_state()
    loop.send(server, [c])
    client_steps.train(c, 0)
    gen = torch.Generator().set_state(batch_state)
    perm = torch.randperm(c.train_samples, generator=gen)
    for which, model in (("local", c.local), ("meme", c.model)):
        w = dict(start[which])
        for i in range(0, c.train_samples, 20):
            idx = perm[i:i + 20]
            p = {k: v.clone().requires_grad_(True) for k, v in w.items()}
            loss = torch.nn.functional.cross_entropy(functional_call(model, p, (c.x_train[idx],)), c.y_train[idx])
            grads = torch.autograd.grad(loss, list(p.values()))
            w = {k: w[k] - 0.1 * g for k, g in zip(w, grads)}
        for k, v in model.named_parameters():
            torch.testing.assert_close(v.detach(), w[k], atol=1e-5, rtol=1e-4)


def test_meme_is_averaged_and_the_local_model_stays(digits_tiny_root):
    server = build(digits_tiny_root)
    loop.send(server, server.clients)
    for c in server.clients:
        client_steps.train(c, 0)
    uploads = [c.upload() for c in server.clients]
    for c, u in zip(server.clients, uploads):
        assert set(u.state) == set(c.model.state_dict())
        for v in c.local.state_dict().values():
            assert not any(torch.equal(v, t) for t in u.state.values())
    server.aggregate(uploads)
    want = weighted_average([u.state for u in uploads], [c.train_samples for c in server.clients])
    for k, v in server.global_model.state_dict().items():
        torch.testing.assert_close(v, want[k])
    assert server.clients[0].eval_model() is server.clients[0].local


def test_ala_runs_onto_the_meme(digits_tiny_root, tmp_path):
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "FML", "-ala", "-gr", "2", "-nc", "3",
                         "--executor", "sequential", "-lr", "0.1")) == 0


def test_client_objective_weights_each_model_by_its_own_parameter(digits_tiny_root):
    server = build(digits_tiny_root, "-al", "0.2", "-bt", "0.7")  # unequal, so a swap shows
    c = server.clients[0]
    x, y = c.x_train[:6], c.y_train[:6]
    with torch.no_grad():
        lo, me = c.local(x), c.model(x)
        p, q = lo.softmax(1), me.softmax(1)
        kl_q_p = (q * (q.log() - p.log())).sum(1).mean()  # KL(p_meme || p_local)
        kl_p_q = (p * (p.log() - q.log())).sum(1).mean()
        ce = torch.nn.functional.cross_entropy
        want = 0.2 * ce(lo, y) + 0.8 * kl_q_p + 0.7 * ce(me, y) + 0.3 * kl_p_q
    torch.testing.assert_close(c.mutual_loss(x, y).detach(), want)


def test_both_models_follow_the_learning_rate_schedule(digits_tiny_root):
    server = build(digits_tiny_root, "-ld", "-ldg", "0.5")
    c = server.clients[0]
    loop.send(server, [c])
    client_steps.train(c, 3)
    assert [g["lr"] for g in c.mutual_optimizer.param_groups] == [pytest.approx(0.1 * 0.5 ** 3)]


def test_the_local_model_trains_in_training_mode_after_an_evaluation(digits_tiny_root):
    server = build(digits_tiny_root, "-m", "BNCNN")
    c = server.clients[0]
    loop.send(server, [c])
    c.local.eval()  # as an evaluation leaves it (the local model is the one evaluated)
    stats = {k: v.clone() for k, v in c.local.state_dict().items() if "running_mean" in k}
    assert stats
    client_steps.train(c, 0)
    assert all(not torch.equal(c.local.state_dict()[k], v) for k, v in stats.items())  # BatchNorm statistics move
