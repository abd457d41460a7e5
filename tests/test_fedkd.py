"""FedKD against hand computations: the SVD compression keeps the stated energy with the fewest singular
values and loses exactly the dropped ones, the threshold follows T(t) = Ts + (Te - Ts) (t + 1) / R, the
upload is the factors (fewer bytes than the mentee), the server's global mentee and every client's copy stay
equal, the adaptive distillation losses match the paper's formulas with each model trained by its own loss,
and the flags' bounds."""
import pytest
import torch
from torch.nn import functional as F

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientkd import (adaptive_kd_losses, compress_state, decompress, energy_threshold,
                                    hidden_and_logits, shared_entries, svd_compress)
from flcore.trainmodel.parts import head_of
from flcore.registry import get_server_class
from utils.comm import payload_bytes
from utils.data_utils import load_split
from utils.errors import FLError
from runtime import loop
from runtime import client_steps


def build(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedKD", "--executor", "sequential", "-lr", "0.1",
                                "-lbs", "20", "-nc", "3", "-gr", "4", *flags))
    data = load_split("Digits", root, 3, "cpu")
    return get_server_class("FedKD")(cfg.replace(num_classes=data.num_classes), data, 0, None)


@pytest.mark.parametrize("energy", [0.5, 0.9, 0.95, 0.98, 1.0])
def test_svd_keeps_the_energy_with_the_fewest_values(energy):
    g = torch.Generator().manual_seed(0)
    m = torch.randn(12, 7, generator=g, dtype=torch.float64) @ torch.diag(torch.tensor([8., 4, 2, 1, .5, .2, .1],
                                                                                    dtype=torch.float64))
    m = m @ torch.linalg.qr(torch.randn(7, 7, generator=g, dtype=torch.float64))[0]
    sigma2 = torch.linalg.svdvals(m).square()
    u, s, v = svd_compress(m, energy)
    k = len(s)
    assert u.shape == (12, k) and v.shape == (k, 7)
    total = float(sigma2.sum())
    assert float(sigma2[:k].sum()) / total >= energy - 1e-12
    assert k == 1 or float(sigma2[:k - 1].sum()) / total < energy  # minimal k
    error = float(((u * s) @ v - m).square().sum())  # Frobenius² of what is dropped
    assert error == pytest.approx(float(sigma2[k:].sum()), rel=1e-9, abs=1e-12)


def test_zero_matrix_keeps_nothing():
    u, s, v = svd_compress(torch.zeros(4, 3), 0.95)
    assert len(s) == 0 and torch.equal((u * s) @ v, torch.zeros(4, 3))


def test_threshold_schedule_by_hand():
    """Rounds counted from 1 (the official code's (1 + t) / R): round 0 of 10 is a tenth of the way, the
    last round is at T_end."""
    assert energy_threshold(0.95, 0.98, 0, 10) == pytest.approx(0.953)
    assert energy_threshold(0.95, 0.98, 4, 10) == pytest.approx(0.965)
    assert energy_threshold(0.95, 0.98, 9, 10) == pytest.approx(0.98)
    assert energy_threshold(0.6, 0.9, 1, 3) == pytest.approx(0.8)
    assert energy_threshold(0.9, 0.9, 3, 10) == pytest.approx(0.9)


def test_upload_is_the_factors_at_the_rounds_threshold(digits_tiny_root):
    server = build(digits_tiny_root, "-Ts", "0.6", "-Te", "0.9")
    c = server.clients[0]
    loop.send(server, [c])
    server.round_idx = 2
    start = {k: v.clone() for k, v in c.global_mentee.state_dict().items()}
    client_steps.train(c, 2)
    up = c.upload()
    assert up.state is None
    energy = 0.825  # T(2) with R = 4 rounds: 0.6 + 0.3 * 3 / 4
    dense = 0
    factored = 0
    for k, v in c.model.state_dict().items():
        delta = v - start[k]
        entry = up.extras["update"][k]
        dense += delta.numel() * delta.element_size()
        if isinstance(entry, tuple):
            factored += 1
            want = svd_compress(delta.reshape(delta.shape[0], -1), energy)
            assert len(entry[1]) == len(want[1])
            torch.testing.assert_close((entry[0] * entry[1]) @ entry[2], (want[0] * want[1]) @ want[2])
        else:
            torch.testing.assert_close(entry, delta)
    assert factored >= 3  # the CNN's two conv kernels and its hidden layer at least
    assert payload_bytes(up) < dense / 3


def test_global_mentee_stays_in_sync_and_bytes_up_drop(digits_tiny_root):
    server = build(digits_tiny_root)
    for t in range(2):
        loop.run_round(server, t)
    model_bytes = payload_bytes(server.global_model)
    assert 0 < server.bytes_up < 3 * model_bytes / 3  # round 1's three uploads: under one mentee's bytes
    assert 0 < server.bytes_down < 3 * model_bytes / 3
    server.round_idx = 2
    loop.send(server, server.select_clients())
    server.aggregate([])  # a round without uploads: the next broadcast carries no update again
    loop.send(server, server.select_clients())
    glob = server.global_model.state_dict()
    for c in server.clients:
        for k, v in c.global_mentee.state_dict().items():
            torch.testing.assert_close(v, glob[k], atol=1e-6, rtol=0)
        for k, v in c.model.state_dict().items():  # the mentee restarts from the global mentee
            torch.testing.assert_close(v, glob[k], atol=1e-6, rtol=0)
        assert any(not torch.equal(v, glob[k]) for k, v in c.mentor.state_dict().items())


def test_adaptive_losses_by_hand():
    torch.manual_seed(0)
    t_logits = torch.randn(4, 3, requires_grad=True)
    s_logits = torch.randn(4, 3, requires_grad=True)
    t_hidden = torch.randn(4, 5, requires_grad=True)
    s_hidden = torch.randn(4, 5, requires_grad=True)
    w_h = torch.nn.Linear(5, 5, bias=False)
    y = torch.tensor([0, 2, 1, 2])
    ce_t, ce_s = F.cross_entropy(t_logits, y), F.cross_entropy(s_logits, y)
    pt, ps = F.softmax(t_logits, 1), F.softmax(s_logits, 1)
    kl_t = (ps * (ps.log() - pt.log())).sum() / 4  # KL(p_s || p_t), batch mean
    kl_s = (pt * (pt.log() - ps.log())).sum() / 4
    mse = (t_hidden - w_h(s_hidden)).square().mean()
    w = 1 / (ce_t + ce_s)
    lt, ls = adaptive_kd_losses(t_logits, s_logits, t_hidden, s_hidden, w_h, y)
    assert float(lt.detach()) == pytest.approx(float((ce_t + w * (kl_t + mse)).detach()), rel=1e-5)
    assert float(ls.detach()) == pytest.approx(float((ce_s + w * (kl_s + mse)).detach()), rel=1e-5)
    # The mentor's logits get only L_t's gradient, with the weight held constant.
    (lt + ls).backward()
    ref = t_logits.detach().clone().requires_grad_(True)
    ce = F.cross_entropy(ref, y)
    lp = F.log_softmax(ref, 1)
    (ce + float(w.detach()) * (ps.detach() * (ps.detach().log() - lp)).sum() / 4).backward()
    torch.testing.assert_close(t_logits.grad, ref.grad)
    ref_s = s_logits.detach().clone().requires_grad_(True)  # and the mentee's only L_s's
    ls_ref = F.log_softmax(ref_s, 1)
    (F.cross_entropy(ref_s, y) + float(w.detach()) * (pt.detach() * (pt.detach().log() - ls_ref)).sum() / 4).backward()
    torch.testing.assert_close(s_logits.grad, ref_s.grad)
    # W_h learns from the hidden loss once (the mentee's side), weighted as it is.
    w_ref = torch.nn.Linear(5, 5, bias=False)
    w_ref.weight.data.copy_(w_h.weight.detach())
    (float(w.detach()) * (t_hidden.detach() - w_ref(s_hidden.detach())).square().mean()).backward()
    torch.testing.assert_close(w_h.weight.grad, w_ref.weight.grad)
    # The hidden loss reaches each hidden state once: H_t toward W_h H_s held fixed, H_s through W_h toward
    # H_t held fixed (by hand: d/dH mean (H - T)² = 2 (H - T) / numel).
    n, mapped = t_hidden.numel(), w_h(s_hidden).detach()
    torch.testing.assert_close(t_hidden.grad, float(w.detach()) * 2 * (t_hidden.detach() - mapped) / n)
    torch.testing.assert_close(s_hidden.grad, float(w.detach()) * 2 * (mapped - t_hidden.detach()) / n @ w_h.weight.detach())


def test_ala_runs_onto_the_mentee(digits_tiny_root, tmp_path):
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "FedKD", "-ala", "-gr", "2", "-nc", "3",
                         "--executor", "sequential", "-lr", "0.1")) == 0


def test_server_applies_the_sample_weighted_mean_of_the_updates(digits_tiny_root):
    from flcore.clients.clientbase import Upload

    server = build(digits_tiny_root)
    start = {k: v.clone() for k, v in server.global_model.state_dict().items()}
    # constant updates: rank 1, so the SVD at any threshold reproduces them and the mean exactly
    ups = [Upload(i, w, None, {"update": {k: torch.full_like(v, d) for k, v in start.items()}})
           for i, (w, d) in enumerate([(10, 1.0), (30, 5.0)])]
    server.round_idx = 1
    server.aggregate(ups)
    for k, v in server.global_model.state_dict().items():  # (10 * 1 + 30 * 5) / 40 = 4, not (1 + 5) / 2
        torch.testing.assert_close(v, start[k] + 4.0, atol=2e-3, rtol=0)  # float32 SVD
    c = server.clients[0]
    server.prepare_broadcast([c])  # as every broadcast: the pending update is handed over first
    c.receive(server.broadcast(c))
    for k, v in c.global_mentee.state_dict().items():
        torch.testing.assert_close(v, start[k] + 4.0, atol=2e-3, rtol=0)  # float32 SVD


def test_server_compresses_the_mean_update_at_the_rounds_threshold(digits_tiny_root):
    from flcore.clients.clientbase import Upload

    server = build(digits_tiny_root, "-Ts", "0.6", "-Te", "0.9", "-gr", "3")
    key = max((k for k, v in server.global_model.state_dict().items() if v.dim() >= 2),
              key=lambda k: server.global_model.state_dict()[k].numel())
    # T(t) = 0.6 + 0.3 (t + 1) / 3: 0.7 in round 0, 0.8 in round 1. Singular values √a and √b with a + b = 1: the
    # first alone holds a of the energy, kept alone when a >= T(t). Round 0, a = 0.75: one kept (Ts and Te
    # swapped give 0.8: both); round 1, a = 0.82: one kept (Te and t swapped give 0.85, R and t 1.8: both).
    for t, a in ((0, 0.75), (1, 0.82)):
        start = {k: v.clone() for k, v in server.global_model.state_dict().items()}
        m = torch.zeros(start[key].shape[0], start[key][0].numel())
        m[0, 0], m[1, 1] = a ** 0.5, (1 - a) ** 0.5
        server.round_idx = t
        server.aggregate([Upload(0, 10, None, {"update": {key: m.reshape(start[key].shape)}})])
        kept = torch.zeros_like(m)
        kept[0, 0] = a ** 0.5
        for k, v in server.global_model.state_dict().items():
            torch.testing.assert_close(v, start[k] + (kept.reshape(v.shape) if k == key else 0), atol=1e-5, rtol=0)


@pytest.mark.parametrize("flags, ok", [
    (("-Ts", "0.9", "-Te", "0.9"), True), (("-Ts", "0.5", "-Te", "1"), True), (("-mlr", "0.01"), True),
    (("-Ts", "0", "-Te", "0.9"), False), (("-Ts", "0.95", "-Te", "0.9"), False), (("-Ts", "0.9", "-Te", "1.01"), False),
    (("-mlr", "0"), False)])
def test_thresholds_and_mentee_rate_bounds(flags, ok, digits_tiny_root):
    args = cli(digits_tiny_root, digits_tiny_root, "-algo", "FedKD", *flags)
    if ok:
        parse_config(args)
    else:
        with pytest.raises(FLError, match="FedKD needs"):
            parse_config(args)


def test_threshold_of_a_one_round_run_is_t_end():
    assert energy_threshold(0.6, 0.9, 0, 1) == pytest.approx(0.9)  # (0 + 1) / 1: the one round is the last
    assert energy_threshold(0.6, 0.9, 0, 2) == pytest.approx(0.75)


@pytest.mark.parametrize("energy, k", [(0.25, 1), (0.5, 1), (0.51, 2), (0.72, 2), (0.73, 3), (0.95, 4), (1.0, 4)])
def test_rank_where_the_energy_is_reached_exactly(energy, k):
    """σ = 3, 2, 2, 1: σ² = 9, 4, 4, 1 of 18, cumulative 0.5, 0.722, 0.944, 1. Exactly half the energy is
    reached by the first value alone (reaching, not exceeding, is enough)."""
    m = torch.diag(torch.tensor([3.0, 2.0, 2.0, 1.0], dtype=torch.float64))
    u, s, v = svd_compress(m, energy)
    assert len(s) == k and u.shape == (4, k) and v.shape == (k, 4)
    assert torch.equal(s, torch.tensor([3.0, 2.0, 2.0, 1.0], dtype=torch.float64)[:k])


@pytest.mark.parametrize("shape", [(3, 1), (1, 3)])
def test_a_single_column_or_row_keeps_its_one_value(shape):
    m = torch.tensor([3.0, 4.0, 0.0]).reshape(shape)
    u, s, v = svd_compress(m, 0.9)
    assert s.tolist() == pytest.approx([5.0])
    torch.testing.assert_close((u * s) @ v, m)


def test_compress_state_factors_a_matrix_only_when_the_factors_are_smaller():
    """(U, σ, V) of a rank-r m x n matrix hold m r + r + r n numbers: rank 1 of 4 x 4 is 9 < 16 (factored),
    of 3 x 2 is 6 = 6 and of 2 x 2 is 5 > 4 (dense), rank 2 of 4 x 4 is 18 > 16 (dense). Vectors stay dense,
    a zero one too (a zero matrix keeps no factor at all)."""
    g = torch.Generator().manual_seed(1)

    def rank(r, m, n):
        return torch.randn(m, r, generator=g) @ torch.randn(r, n, generator=g)

    update = {"r1_4x4": rank(1, 4, 4), "r1_3x2": rank(1, 3, 2), "r1_2x2": rank(1, 2, 2), "r2_4x4": rank(2, 4, 4),
              "conv": rank(1, 4, 9).reshape(4, 1, 3, 3), "bias": torch.randn(4, generator=g), "zero_bias": torch.zeros(3),
              "zero": torch.zeros(3, 3)}
    out = compress_state(update, 0.999)
    factored = {k for k, e in out.items() if isinstance(e, tuple)}
    assert factored == {"r1_4x4", "conv", "zero"}
    for k in ("r1_3x2", "r1_2x2", "r2_4x4", "bias", "zero_bias"):
        assert torch.equal(out[k], update[k])
    assert [len(out[k][1]) for k in ("r1_4x4", "conv", "zero")] == [1, 1, 0]
    for k in ("r1_4x4", "conv", "zero"):
        torch.testing.assert_close(decompress(out[k], update[k].shape), update[k], atol=1e-5, rtol=0)


def test_shared_entries_are_the_parameters_and_with_buffers_the_floating_statistics():
    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    params = ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert shared_entries(m, False) == params
    assert shared_entries(m, True) == params + ["1.running_mean", "1.running_var"]  # not num_batches_tracked


def test_hidden_and_logits_leaves_no_hook_behind():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)  # the head contract: the classifier is ``fc``

        def forward(self, x):
            return self.fc(x.flatten(1))

    m = Net()
    head = head_of(m)
    before = len(head._forward_pre_hooks)
    x = torch.arange(8.0).reshape(2, 4)
    for _ in range(3):
        hidden, logits = hidden_and_logits(m, x)
    assert len(head._forward_pre_hooks) == before
    assert torch.equal(hidden, x) and torch.equal(logits, m.fc(x))


def test_the_probe_leaves_the_models_as_it_found_them(digits_tiny_root):
    """The constructor's one-sample forward (to size W_h) runs in eval mode and restores train mode: the
    BatchNorm statistics of the mentee and the mentor stay the server's initial ones."""
    server = build(digits_tiny_root, "-m", "BNCNN")
    glob = server.global_model.state_dict()
    assert any("running_mean" in k for k in glob)
    for c in server.clients:
        assert c.model.training and c.mentor.training
        for model in (c.model, c.mentor, c.global_mentee):
            for k, v in model.state_dict().items():
                assert torch.equal(v, glob[k]), k


@pytest.mark.parametrize("bn_stats", ["shared", "local"])
def test_the_upload_carries_the_batchnorm_statistics_unless_local(digits_tiny_root, bn_stats):
    server = build(digits_tiny_root, "-m", "BNCNN", "--bn_stats", bn_stats)
    c = server.clients[0]
    loop.send(server, [c])
    client_steps.train(c, 0)
    keys = [k for k, _ in c.model.named_parameters()]
    if bn_stats == "shared":
        keys += [k for k in c.model.state_dict() if k.endswith(("running_mean", "running_var"))]
    assert sorted(c.upload().extras["update"]) == sorted(keys)


def test_kd_loss_is_both_losses_with_the_hidden_map_from_mentee_to_mentor(digits_tiny_root):
    """The client's joint loss against a reference built from the two models' own forwards: the hidden
    state is the classifier's input (read here with a hook of the test's own), W_h maps the mentee's to
    the mentor's; value and W_h's gradient."""
    server = build(digits_tiny_root)
    c = server.clients[0]
    with torch.no_grad():  # mentor and mentee apart, so every term is nonzero
        for p in c.mentor.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x, y = c.x_train[:16], c.y_train[:16]

    def forward(model):
        seen = []
        h = model.fc.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
        out = model(x)
        h.remove()
        return seen[0].flatten(1), out

    ht, zt = forward(c.mentor)
    hs, zs = forward(c.model)
    ce_t, ce_s = F.cross_entropy(zt, y), F.cross_entropy(zs, y)
    w = 1 / float((ce_t + ce_s).detach())
    pt, ps = F.softmax(zt, 1), F.softmax(zs, 1)
    kl = (ps * (ps.log() - pt.log())).sum() / 16 + (pt * (pt.log() - ps.log())).sum() / 16
    w_ref = torch.nn.Linear(hs.shape[1], ht.shape[1], bias=False)
    w_ref.weight.data.copy_(c.W_h.weight.detach())
    mse = (ht.detach() - w_ref(hs.detach())).square().mean()
    want = ce_t + ce_s + w * (kl + 2 * mse)
    got = c.kd_loss(x, y)
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-5)
    got.backward()
    (w * mse).backward()  # W_h learns from the mentee's side of the hidden loss only
    torch.testing.assert_close(c.W_h.weight.grad, w_ref.weight.grad)


def test_both_groups_follow_the_decayed_rate_and_the_mentee_keeps_its_own(digits_tiny_root):
    """-lr 0.1, -mlr 0.02, -ld at γ 0.5: in round 2 the mentor (and W_h) step at 0.1 · 0.25, the mentee at
    0.02 · 0.25; the mentor trains in train mode even after something left it in eval mode."""
    server = build(digits_tiny_root, "-mlr", "0.02", "-ld", "-ldg", "0.5")
    c = server.clients[0]
    loop.send(server, [c])
    modes = []
    c.mentor.register_forward_pre_hook(lambda mod, args: modes.append(mod.training))
    c.mentor.eval()
    client_steps.train(c, 2)
    groups = c.kd_optimizer.param_groups
    assert groups[0]["lr"] == pytest.approx(0.025) and groups[1]["lr"] == pytest.approx(0.005)
    assert {id(p) for p in groups[0]["params"]} == {id(p) for p in [*c.mentor.parameters(), *c.W_h.parameters()]}
    assert modes and all(modes)


def test_a_single_precision_svd_that_fails_is_redone_in_double(monkeypatch):
    """LAPACK's float32 SVD can fail to converge on a finite, nearly rank-deficient update (it did on a CNN's
    fc update, 512 x 1024, in a Protocol B run); the SVD is then taken in float64 and cast back. Here the
    float32 call is made to fail: the factors are the float64 ones (σ = 3, 2, 2, 1 by hand) in float32."""
    svd = torch.linalg.svd
    calls = []

    def fails_in_float32(a, *args, **kwargs):
        calls.append(a.dtype)
        if a.dtype == torch.float32:
            raise torch.linalg.LinAlgError("failed to converge")
        return svd(a, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "svd", fails_in_float32)
    m = torch.diag(torch.tensor([3.0, 2.0, 2.0, 1.0]))
    u, s, v = svd_compress(m, 0.95)
    assert calls == [torch.float32, torch.float64]
    assert s.dtype == u.dtype == v.dtype == torch.float32
    assert s.tolist() == [3.0, 2.0, 2.0, 1.0]
    torch.testing.assert_close((u * s) @ v, m)

    def always_fails(*args, **kwargs):
        raise torch.linalg.LinAlgError("failed to converge")

    monkeypatch.setattr(torch.linalg, "svd", always_fails)
    with pytest.raises(torch.linalg.LinAlgError):  # a float64 failure is not hidden
        svd_compress(m.double(), 0.95)
