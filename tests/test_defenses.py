"""Bulyan, centered clipping and norm bounding (--aggregator bulyan|cclip|normclip, plugins/aggregators.py) against
numbers worked out by hand and a reference loop written here; the round's f; cclip's center across rounds
and in the server's saved state; the option's refusals."""
import copy
import math

import numpy as np
import pytest
import torch

import main
from conftest import cli, opened, plugin
from flcore.clients.clientbase import Upload
from flcore.servers import serverbase
from test_executors import build
from plugins import aggregators as robust
from runtime import checkpoint
from runtime import loop

T = torch.float64


def test_bulyan_by_hand():
    """n = 7, f = 1 (n = 4f + 3): θ = 5, β = 3. Values a..h = 0, 1, 2, 4, 5, 9, 40, squared distances in 1-D.
    Krum over the pool, each time the n' - f - 2 nearest: pool of 7, 4 nearest: a 1+4+16+25 = 46, b 1+1+9+16 =
    27, c 4+1+4+9 = 18, d 1+4+9+16 = 30, e 1+9+16+16 = 42, g 154, h 4926 -> c. Pool a b d e g h, 3 nearest:
    a 42, b 1+9+16 = 26, d 1+9+16 = 26, e 33, g 105, h 3482 -> b (tie with d: lower index). Pool a d e g h, 2
    nearest: a 41, d 1+16 = 17, e 1+16 = 17, g 41 -> d. Pool a e g h, 1 nearest: a 25, e 16, g 16, h 961 -> e.
    Pool a g h, 0 nearest: all 0 -> a. Chosen c b d e a = 2 1 4 5 0, median 2, distances 0 1 2 3 2: the three
    closest are c, b and d (d chosen before a), mean (2 + 1 + 4) / 3."""
    x = torch.tensor([[0.0], [1.0], [2.0], [4.0], [5.0], [9.0], [40.0]], dtype=T)
    assert robust.bulyan(x, 1).tolist() == [pytest.approx(7 / 3)]
    assert robust.bulyan_sizes(7, 1) == (5, 3)
    assert robust.bulyan_sizes(5, 2) == (1, 1)  # n < 4f + 3: β floored at 1
    with pytest.raises(ValueError, match="n > 2f"):
        robust.bulyan_sizes(4, 2)


def reference_bulyan(x: np.ndarray, f: int) -> np.ndarray:
    """Bulyan by plain loops: Krum on the pool (n' - f - 2 nearest, at least 0), then per coordinate the
    β values closest to the chosen ones' median."""
    n = len(x)
    pool, chosen = list(range(n)), []
    for _ in range(n - 2 * f):
        k = max(len(pool) - f - 2, 0)
        scores = []
        for i in pool:
            d = sorted(float(((x[i] - x[j]) ** 2).sum()) for j in pool if j != i)
            scores.append(sum(d[:k]))
        best = min(range(len(pool)), key=lambda p: (scores[p], pool[p]))
        chosen.append(pool.pop(best))
    beta = max(n - 4 * f, 1)
    out = []
    for c in range(x.shape[1]):
        vals = [x[i, c] for i in chosen]
        med = float(np.median(vals))
        order = sorted(range(len(vals)), key=lambda p: (abs(vals[p] - med), p))
        out.append(np.mean([vals[p] for p in order[:beta]]))
    return np.array(out)


@pytest.mark.parametrize("n,f", [(7, 1), (11, 2), (20, 4), (20, 2), (6, 2)])
def test_bulyan_matches_a_reference_loop(n, f):
    x = np.random.default_rng(n * 10 + f).normal(size=(n, 4))
    x[: f] *= 30  # f far-away uploads
    got = robust.bulyan(torch.tensor(x), f).numpy()
    assert np.allclose(got, reference_bulyan(x, f), rtol=0, atol=1e-12)


@pytest.mark.parametrize("n, f, seed, high, d", [(7, 1, 8, 3, 64), (11, 2, 13, 3, 64), (21, 2, 23, 3, 64),
                                                (20, 1, 21, 3, 64), (20, 1, 2, 2, 3), (21, 2, 5, 2, 3)])
def test_bulyan_breaks_ties_as_the_reference_loop_does(n, f, seed, high, d):
    """Small integer values: Krum scores and distances to the median tie often; ties go to the lower index
    in the pool, then to the earlier chosen. (A sort that is not stable breaks them otherwise: on a CPU
    torch's happens to keep the order up to 16 values, so θ = n - 2f of 17 or more is what shows it; the
    0/1 cases tie Krum's scores where the choice changes the result.)"""
    x = np.random.default_rng(seed).integers(0, high, size=(n, d)).astype(np.float64)
    assert np.array_equal(robust.bulyan(torch.tensor(x), f).numpy(), reference_bulyan(x, f))


def test_centered_clipping_by_hand():
    """Rows (3, 4), (0, 0), (0, 1) around 0 with τ = 1: (3, 4) has norm 5 and becomes (0.6, 0.8), the others
    are within τ; v = ((0.6, 0.8) + (0, 0) + (0, 1)) / 3 = (0.2, 0.6). A second iteration from there: (2.8, 3.4)
    has norm sqrt(19.4) and is scaled by 1/sqrt(19.4); (-0.2, -0.6) and (-0.2, 0.4) are within τ."""
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0], [0.0, 1.0]], dtype=T)
    zero = torch.zeros(2, dtype=T)
    assert np.allclose(robust.centered_clip(x, zero, 1.0, 1).numpy(), [0.2, 0.6])
    r = math.sqrt(19.4)
    want = [0.2 + (2.8 / r - 0.4) / 3, 0.6 + (3.4 / r - 0.2) / 3]
    assert np.allclose(robust.centered_clip(x, zero, 1.0, 2).numpy(), want)
    # a large τ clips nothing: the unweighted mean, whatever the center
    assert np.allclose(robust.centered_clip(x, torch.tensor([5.0, -5.0], dtype=T), 100.0, 1).numpy(), [1.0, 5 / 3])


def test_norm_clip_by_hand():
    """Rows (3, 4), (0, 1), (6, 8): norms 5, 1, 10, median 5, so (6, 8) becomes (3, 4); weights 1, 1, 2:
    ((3, 4) + (0, 1) + 2 (3, 4)) / 4. With M = 1: (0.6, 0.8), (0, 1), (0.6, 0.8)."""
    x = torch.tensor([[3.0, 4.0], [0.0, 1.0], [6.0, 8.0]], dtype=T)
    w = torch.tensor([1.0, 1.0, 2.0], dtype=T)
    assert np.allclose(robust.norm_clip(x, w).numpy(), [9 / 4, 13 / 4])
    assert np.allclose(robust.norm_clip(x, w, 1.0).numpy(), [(0.6 + 1.2) / 4, (0.8 + 1 + 1.6) / 4])
    # even n: the median norm is the mean of the two middle ones, (1 + 5) / 2 = 3
    assert np.allclose(robust.norm_clip(x[:2], w[:2]).numpy(), [(1.8 + 0) / 2, (2.4 + 1) / 2])


def test_norm_clip_scales_updates_shorter_than_one():
    """Norms 0.5 and 0.1, bound 0.2: the first scaled by 0.2 / 0.5, the second kept; their mean."""
    x = torch.tensor([[0.3, 0.4], [0.06, 0.08]], dtype=T)
    got = robust.norm_clip(x, torch.ones(2, dtype=T), 0.2)
    assert torch.allclose(got, torch.tensor([(0.12 + 0.06) / 2, (0.16 + 0.08) / 2], dtype=T), rtol=0, atol=1e-15)


def test_centered_rules_act_on_updates_and_keep_integer_entries():
    """aggregate() with a reference: the rules see upload - reference, and add the reference back."""
    ref = {"w": torch.tensor([10.0, 10.0]), "n": torch.tensor(3)}
    states = [{"w": ref["w"] + torch.tensor(d), "n": torch.tensor(c)} for d, c in
              (([3.0, 4.0], 1), ([0.0, 0.0], 2), ([0.0, 1.0], 3))]
    got = robust.aggregate(states, [1, 1, 1], "cclip", reference=ref, tau=1.0, iters=1)
    assert np.allclose(got["w"].numpy(), [10.2, 10.6]) and got["n"].item() == 2
    got = robust.aggregate(states, [1, 1, 1], "cclip", reference=ref, center=torch.tensor([0.2, 0.6], dtype=T),
                           tau=1.0, iters=1)
    assert np.allclose(got["w"].numpy(), np.array([10.2, 10.6]) + robust.centered_clip(
        torch.tensor([[2.8, 3.4], [-0.2, -0.6], [-0.2, 0.4]], dtype=T), torch.zeros(2, dtype=T), 1.0, 1).numpy())
    got = robust.aggregate(states, [1, 1, 2], "normclip", reference=ref, norm_bound=1.0)
    assert np.allclose(got["w"].numpy(), [10.15, 10.7])  # (0.6 + 0 + 2 x 0) / 4, (0.8 + 0 + 2 x 1) / 4


def test_cclip_center_is_the_previous_update_and_is_saved(digits_tiny_root, monkeypatch):
    """Two rounds of FedAvg with cclip (τ small enough to clip): round 1 clips around round 0's aggregate
    update (not around zero), computed here from the uploads; the center is in the server's saved state."""
    server = build(digits_tiny_root, "FedAvg", "--aggregator", "cclip", "--cclip_tau", "0.05",
                   "--train_loss_eval", "off")
    seen = []
    average = serverbase.Server.average_uploads
    monkeypatch.setattr(serverbase.Server, "average_uploads",
                        lambda self, uploads: (seen.append(opened(uploads)), average(self, uploads)))
    names = list(server.global_model.state_dict())
    flat = lambda s: torch.cat([s[k].double().reshape(-1) for k in names])  # noqa: E731
    center = torch.zeros(sum(v.numel() for v in server.global_model.state_dict().values()), dtype=T)
    for t in range(2):
        before = flat(server.global_model.state_dict())
        loop.run_round(server, t)
        x = torch.stack([flat(u.state) for u in seen[t]]) - before
        v = center.clone()
        for _ in range(1):  # one iteration, by its formula
            diff = x - v
            scale = torch.clamp(0.05 / diff.norm(dim=1), max=1.0)
            v = v + (diff * scale[:, None]).mean(0)
        assert (x - center).norm(dim=1).max() > 0.05  # the radius clips something
        after = flat(server.global_model.state_dict())
        assert torch.allclose(after, (before + v).float().double(), atol=1e-6), t
        center = after - before
        assert torch.allclose(plugin(server, "RobustAggregation").centers["model:"], center, atol=1e-6)
    saved = checkpoint.server_state(server)
    fresh = build(digits_tiny_root, "FedAvg", "--aggregator", "cclip", "--cclip_tau", "0.05",
                  "--train_loss_eval", "off")
    assert plugin(fresh, "RobustAggregation").centers == {}
    checkpoint.load_server_state(fresh, copy.deepcopy(saved))
    assert torch.equal(plugin(fresh, "RobustAggregation").centers["model:"], plugin(server, "RobustAggregation").centers["model:"])


def test_f_is_the_rounds_malicious_upload_count_unless_given(digits_tiny_root, monkeypatch):
    got = []
    real = robust.aggregate
    monkeypatch.setattr(robust, "aggregate", lambda *a, **k: got.append(a[5]) or real(*a, **k))
    server = build(digits_tiny_root, "FedAvg", "--aggregator", "bulyan", "--attack", "signflip",
                   "--attack_frac", "0.4")
    bad = plugin(server, "Attack").malicious
    state = server.global_model.state_dict()
    ups = lambda ids: [Upload(i, 1.0, {k: v.clone() for k, v in state.items()}) for i in ids]  # noqa: E731
    good = [i for i in range(5) if i not in bad]
    server.average_uploads(ups(good + bad))
    server.average_uploads(ups(good + bad[:1]))
    server.average_uploads(ups(good))
    assert got == [2, 1, 0]
    server = build(digits_tiny_root, "FedAvg", "--aggregator", "bulyan", "--attack", "signflip",
                   "--attack_frac", "0.4", "--krum_f", "1")
    server.average_uploads(ups(good + bad))
    assert got[-1] == 1


def test_bulyan_below_4f_plus_3_says_so_once(digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "2", "--aggregator", "bulyan", "--krum_f", "1")) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if "4f + 3" in ln]
    assert len(err) == 1 and "5 uploads, fewer than 4f + 3 = 7 (f = 1)" in err[0], err


@pytest.mark.parametrize("flags", [("--cclip_tau", "0", "--aggregator", "cclip"), ("--cclip_iters", "0", "--aggregator", "cclip"),
                                   ("--cclip_tau", "2"), ("--norm_bound", "1"),
                                   ("--norm_bound", "-1", "--aggregator", "normclip"),
                                   ("--aggregator", "bulyan", "--krum_f", "3"),
                                   ("--attack", "alie", "--attack_scale", "2"),
                                   ("--attack", "ipm", "--minmax_perturbation", "sign")])
def test_bad_defense_flags_are_one_line(flags, digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", *flags)) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_cclip_resumes_from_a_checkpoint_with_its_center(digits_tiny_root, tmp_path, stop_in_round, monkeypatch):
    """Killed in round 2 and resumed: the numbers of an uninterrupted run, bit for bit; the same resume with
    the center dropped from the saved state gives other numbers, so the center is what carries them."""
    from utils.results import read_h5

    flags = ("-gr", "4", "--checkpoint_every", "1", "--aggregator", "cclip", "--cclip_tau", "0.05",
             "--executor", "sequential")
    assert main.main(cli(digits_tiny_root, tmp_path / "whole", *flags)) == 0
    whole = read_h5(tmp_path / "whole" / "Digits_FedAvg_test_0.h5")["rs_test_auc"]
    for folder, drop in (("resumed", False), ("dropped", True)):
        stop_in_round(2)
        with pytest.raises(RuntimeError, match="killed"):
            main.main(cli(digits_tiny_root, tmp_path / folder, *flags))
        stop_in_round(None)
        if drop:
            load = checkpoint.load_server_state
            monkeypatch.setattr(checkpoint, "load_server_state",
                                lambda server, saved: (load(server, saved), plugin(server, "RobustAggregation").centers.clear()))
        assert main.main(cli(digits_tiny_root, tmp_path / folder, *flags, "--resume")) == 0
        got = read_h5(tmp_path / folder / "Digits_FedAvg_test_0.h5")["rs_test_auc"]
        assert len(got) == len(whole) == 5
        assert np.array_equal(got, whole) != drop, folder
