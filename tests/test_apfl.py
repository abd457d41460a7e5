"""APFL against hand computations: α's gradient is <v - w, ∇f(v̄)> (autograd through the mixture), one
round of local steps follows Algorithm 1 with the adaptive α (a reference loop), α stays in [0, 1], the
personalised model is α v + (1 - α) w, α = 0 held fixed is FedAvg; -ala runs (-dp: tests/test_dp_registry.py)."""
import math

import numpy as np
import torch
from torch.func import functional_call

import main
from cli import parse_config
from conftest import cli
from flcore.registry import get_server_class
from utils.data_utils import load_split
from utils.results import read_h5
from runtime import loop
from runtime import client_steps

SEQ = ("--executor", "sequential")


def build(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "APFL", *SEQ, *flags))
    data = load_split("Digits", root, None, "cpu")
    return get_server_class("APFL")(cfg.replace(num_classes=data.num_classes), data, 0, None)


def perturb(model, seed: int, scale: float = 0.05) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def test_alpha_gradient_is_the_inner_product_of_v_minus_w_and_the_mixture_gradient(digits_tiny_root):
    c = build(digits_tiny_root, "-al", "0.3").clients[0]
    perturb(c.vmodel, 1)
    x, y = c.x_train[:16], c.y_train[:16]
    for p in [*c.model.parameters(), *c.vmodel.parameters(), c.mixer.alpha]:
        p.grad = None
    c.joint_loss(x, y).backward()
    # Hand: the gradient of f at the mixed point v̄ = α v + (1 - α) w, taken on plain tensors.
    w = {k: p.detach() for k, p in c.model.named_parameters()}
    v = {k: p.detach() for k, p in c.vmodel.named_parameters()}
    mix = {k: (0.3 * v[k] + 0.7 * w[k]).requires_grad_(True) for k in v}
    loss = torch.nn.functional.cross_entropy(functional_call(c.vmodel, mix, (x,)), y)
    g_mix = dict(zip(mix, torch.autograd.grad(loss, list(mix.values()))))
    want_alpha = sum((v[k] - w[k]).flatten() @ g_mix[k].flatten() for k in v)
    torch.testing.assert_close(c.mixer.alpha.grad[0], want_alpha, atol=1e-6, rtol=1e-4)
    assert abs(float(want_alpha)) > 1e-4  # not vacuous
    for k, p in c.vmodel.named_parameters():  # ∇_v f(v̄) = α ∇f(v̄)
        torch.testing.assert_close(p.grad, 0.3 * g_mix[k], atol=1e-7, rtol=1e-4)
    w_req = {k: t.clone().requires_grad_(True) for k, t in w.items()}
    lw = torch.nn.functional.cross_entropy(functional_call(c.model, w_req, (x,)), y)
    g_w = dict(zip(w_req, torch.autograd.grad(lw, list(w_req.values()))))
    for k, p in c.model.named_parameters():  # w moves by its own loss only
        torch.testing.assert_close(p.grad, g_w[k], atol=1e-7, rtol=1e-4)


def test_local_round_follows_algorithm_1(digits_tiny_root):
    lr, bs = 0.05, 16
    server = build(digits_tiny_root, "-al", "0.6", "-lr", str(lr), "-lbs", str(bs))
    c = server.clients[2]
    loop.send(server, [c])
    perturb(c.vmodel, 2)
    w = {k: p.detach().clone() for k, p in c.model.named_parameters()}
    v = {k: p.detach().clone() for k, p in c.vmodel.named_parameters()}
    a = torch.tensor(0.6)
    gen = torch.Generator().set_state(c.batch_gen.get_state())
    client_steps.train(c, 0)
    n, steps = c.train_samples, 0
    perm = torch.randperm(n, generator=gen)
    for i in range(0, n, bs):
        idx = perm[i:i + bs]
        xb, yb = c.x_train[idx], c.y_train[idx]
        wq = {k: t.clone().requires_grad_(True) for k, t in w.items()}
        gw = torch.autograd.grad(torch.nn.functional.cross_entropy(functional_call(c.model, wq, (xb,)), yb),
                                 list(wq.values()))
        mq = {k: (a * v[k] + (1 - a) * w[k]).requires_grad_(True) for k in v}
        gm = torch.autograd.grad(torch.nn.functional.cross_entropy(functional_call(c.vmodel, mq, (xb,)), yb),
                                 list(mq.values()))
        ga = sum((v[k] - w[k]).flatten() @ g.flatten() for k, g in zip(v, gm))
        v = {k: v[k] - lr * a * g for k, g in zip(v, gm)}
        w = {k: w[k] - lr * g for k, g in zip(w, gw)}
        a = (a - lr * ga).clamp(0.0, 1.0)
        steps += 1
    assert steps == math.ceil(n / bs)
    for k, p in c.model.named_parameters():
        torch.testing.assert_close(p.detach(), w[k], atol=1e-5, rtol=1e-4)
    for k, p in c.vmodel.named_parameters():
        torch.testing.assert_close(p.detach(), v[k], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(c.mixer.alpha.detach()[0], a, atol=1e-5, rtol=1e-4)
    assert abs(float(a) - 0.6) > 1e-3  # α moved
    up = c.upload()  # only w crosses the wire
    assert all(torch.equal(up.state[k], p) for k, p in c.model.state_dict().items())


def test_alpha_is_projected_onto_the_unit_interval(digits_tiny_root):
    c = build(digits_tiny_root, "-al", "0.05", "-lr", "0.1").clients[0]
    c.mixer.alpha.grad = torch.tensor([10.0])  # α - lr g = -0.95: projected to 0
    c.after_backward()
    c.optimizer.step()
    assert abs(c.mixing_weight()) < 1e-9
    c.mixer.alpha.grad = torch.tensor([-30.0])  # 0 + 3: projected to 1
    c.after_backward()
    c.optimizer.step()
    assert abs(c.mixing_weight() - 1.0) < 1e-6


def test_alpha_off_the_interval_by_rounding_is_clamped_back(digits_tiny_root):
    # The step's a - lr * g can miss a bound by an ulp: α is clamped before its next gradient is rewritten
    # and after the round, so it is never read outside [0, 1].
    c = build(digits_tiny_root, "-al", "0.5", "-lr", "0.1").clients[0]
    for off, bound in ((1.0 + 1e-6, 1.0), (-1e-6, 0.0)):
        with torch.no_grad():
            c.mixer.alpha.fill_(off)
        c.mixer.alpha.grad = torch.zeros(1)
        c.after_backward()
        assert float(c.mixer.alpha.detach()) == bound  # already clamped, before the step
        torch.testing.assert_close(c.mixer.alpha.grad, torch.zeros(1))  # and the step then stays there

        def last_step_misses(*args, **kwargs):
            with torch.no_grad():
                c.mixer.alpha.fill_(off)
        c.run_epochs = last_step_misses
        c.local_update(0)
        assert c.mixing_weight() == bound


def test_fixed_alpha_takes_no_gradient(digits_tiny_root):
    # --no-adapt_alpha: α is a constant, so no gradient is computed for it (nor clipped with w's and v's by -dp).
    c = build(digits_tiny_root, "-al", "0.25", "--no-adapt_alpha").clients[1]
    client_steps.train(c, 0)
    assert c.mixer.alpha.grad is None and c.mixing_weight() == 0.25
    assert all(p.grad is not None for p in c.vmodel.parameters())


def test_personalised_model_has_the_personal_models_batchnorm_statistics(digits_tiny_root):
    server = build(digits_tiny_root, "-al", "0.3", "-lr", "0.1", "-m", "BNCNN")
    c = server.clients[0]
    client_steps.train(c, 0)
    moved = [b for b, m in zip(c.vmodel.buffers(), c.mixed.buffers())
             if b.is_floating_point() and not torch.equal(b, m)]
    assert moved  # v's statistics moved in training, the mixture's copy has not yet
    trained = [b.clone() for b in c.vmodel.buffers()]
    for b, vb, t in zip(c.eval_model().buffers(), c.vmodel.buffers(), trained):
        assert torch.equal(b, t) and torch.equal(vb, t)
    assert not any(torch.equal(b, m) for b, m in zip(c.model.buffers(), c.vmodel.buffers()) if b.is_floating_point())


def test_personalised_model_is_the_mixture(digits_tiny_root):
    server = build(digits_tiny_root, "-al", "0.25", "-lr", "0.1")
    loop.run_round(server, 0)
    loop.send(server, server.clients)
    c = server.clients[3]
    a = c.mixing_weight()
    mixed = dict(c.eval_model().named_parameters())
    for (k, v), w in zip(c.vmodel.named_parameters(), c.model.parameters()):
        torch.testing.assert_close(mixed[k].detach(), a * v.detach() + (1 - a) * w.detach())
    assert any(not torch.equal(v, w) for v, w in zip(c.vmodel.parameters(), c.model.parameters()))


def test_fixed_alpha_zero_is_fedavg(digits_tiny_root, tmp_path):
    common = ("-gr", "3", "-lr", "0.1", *SEQ)
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "FedAvg", *common)) == 0
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "APFL", "-al", "0", "--no-adapt_alpha", *common)) == 0
    fedavg = read_h5(tmp_path / "Digits_FedAvg_test_0.h5")
    apfl = read_h5(tmp_path / "Digits_APFL_test_0.h5")
    for key in ("rs_test_acc", "rs_train_loss"):
        assert np.array_equal(fedavg[key], apfl[key]), key
    assert np.all(apfl["rs_alpha_mean"] == 0.0)


def test_ala_runs(digits_tiny_root, tmp_path):  # -dp: tests/test_dp_registry.py
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "APFL", "-ala", "-gr", "2", "-lr", "0.1")) == 0


def test_projected_step_by_hand():
    """The batched executor's step: α takes clamp(α, 0, 1) - lr ∇α, projected onto [0, 1]; the rest plain SGD."""
    from flcore.clients.clientapfl import projected_step

    params = {"mixer.alpha": torch.tensor([1.5, -0.5, 0.9, 0.3]), "w": torch.tensor([1.0, 2.0])}
    grads = {"mixer.alpha": torch.tensor([0.8, -0.6, -1.0, 0.2]), "w": torch.tensor([0.5, -1.0])}
    new = projected_step(params, grads, {"mixer.alpha": 0.5, "w": 0.1})
    # 1.0 - 0.4 = 0.6; 0.0 + 0.3 = 0.3; 0.9 + 0.5 = 1.4 -> 1.0; 0.3 - 0.1 = 0.2
    torch.testing.assert_close(new["mixer.alpha"], torch.tensor([0.6, 0.3, 1.0, 0.2]))
    torch.testing.assert_close(new["w"], torch.tensor([0.95, 2.1]))
