"""Robust aggregators (--aggregator, plugins/aggregators.py) against numbers computed by hand, the geometric median
against a brute-force minimiser, and the option on a real server."""
import numpy as np
import pytest
import torch
from scipy.optimize import minimize

import main
from conftest import cli, opened
from test_executors import build
from plugins import aggregators as robust
from runtime import loop

# Five uploads: a 2-vector and an integer counter, with unequal sample weights.
W = [[1.0, 10.0], [2.0, -3.0], [9.0, 0.0], [4.0, 5.0], [-6.0, 7.0]]
N = [4, 6, 8, 2, 10]
WEIGHTS = [1, 2, 3, 4, 5]
STATES = [{"w": torch.tensor(w), "n": torch.tensor(n)} for w, n in zip(W, N)]


def test_median_and_trimmed_mean_by_hand():
    med = robust.aggregate(STATES, WEIGHTS, "median")
    assert med["w"].tolist() == [2.0, 5.0]  # sorted columns: -6 1 [2] 4 9 and -3 0 [5] 7 10
    # the counter: rounded weighted mean (4 + 12 + 24 + 8 + 50) / 15 = 6.53 -> 7, in its own dtype
    assert med["n"].item() == 7 and med["n"].dtype == torch.long
    even = robust.aggregate(STATES[:4], WEIGHTS[:4], "median")["w"]
    assert even.tolist() == [3.0, 2.5]  # 1 2 | 4 9 and -3 0 | 5 10: the two middle values' mean
    trimmed = robust.aggregate(STATES, WEIGHTS, "trimmed_mean", trim_frac=0.2)["w"]  # k = 1 off each end
    assert torch.allclose(trimmed, torch.tensor([7 / 3, 4.0]))  # (1 + 2 + 4) / 3, (0 + 5 + 7) / 3
    assert torch.equal(robust.aggregate(STATES, WEIGHTS, "trimmed_mean", trim_frac=0.0)["w"],
                       torch.tensor(W).mean(0))  # nothing trimmed: the unweighted mean


def test_median_and_trimmed_mean_ignore_the_weights_and_the_mean_uses_them():
    other = [5, 4, 3, 2, 1]
    for rule in ("median", "trimmed_mean"):
        assert torch.equal(robust.aggregate(STATES, WEIGHTS, rule)["w"], robust.aggregate(STATES, other, rule)["w"])
    # (1 + 4 + 27 + 16 - 30) / 15, (10 - 6 + 20 + 35) / 15
    assert torch.allclose(robust.aggregate(STATES, WEIGHTS, "mean")["w"], torch.tensor([18 / 15, 59 / 15]))


# Five points in the plane: squared distances a-b 1, a-c 4, a-d 18, a-e 100, b-c 5, b-d 13, b-e 81, c-d 10,
# c-e 104, d-e 58.
POINTS = [[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [3.0, 3.0], [10.0, 0.0]]


def test_krum_scores_by_hand():
    x = torch.tensor(POINTS, dtype=torch.float64)
    # f = 1: the n - f - 2 = 2 nearest of each point: a 1+4, b 1+5, c 4+5, d 10+13, e 58+81
    assert robust.krum_scores(x, 1).tolist() == [5.0, 6.0, 9.0, 23.0, 139.0]
    # f = 0: its 3 nearest
    assert robust.krum_scores(x, 0).tolist() == [23.0, 19.0, 19.0, 41.0, 239.0]
    with pytest.raises(ValueError, match="more than 2f"):
        robust.krum_scores(x, 2)  # n = 5 <= 2f + 2
    with pytest.raises(ValueError, match="more than 2f"):
        robust.krum_scores(x[:4], 1)  # n = 2f + 2 exactly: Blanchard et al.'s n > 2f + 2 fails


def test_trimmed_mean_needs_a_value_left_after_trimming():
    """2k < n: at n = 2k + 1 one value is left (the median), at n = 2k none, which is refused."""
    x = torch.tensor([[3.0], [1.0], [2.0]], dtype=torch.float64)
    assert robust.trimmed_mean(x, 1).tolist() == [2.0]
    for n, k in ((2, 1), (4, 2)):
        with pytest.raises(ValueError, match="leaves none"):
            robust.trimmed_mean(torch.ones(n, 2, dtype=torch.float64), k)


def test_krum_picks_one_upload_and_multikrum_averages_the_best_with_their_weights():
    states = [{"w": torch.tensor(p)} for p in POINTS]
    assert robust.aggregate(states, WEIGHTS, "krum", krum_f=1)["w"].tolist() == POINTS[0]
    # Multi-Krum keeps n - f = 4 (a, b, c, d), weighted 1, 2, 3, 4: (0 + 2 + 0 + 12) / 10, (0 + 0 + 6 + 12) / 10
    assert torch.allclose(robust.aggregate(states, WEIGHTS, "multikrum", krum_f=1)["w"], torch.tensor([1.4, 1.8]))
    # with f = 0 it keeps everyone: FedAvg
    assert torch.allclose(robust.aggregate(states, WEIGHTS, "multikrum", krum_f=0)["w"],
                          robust.aggregate(states, WEIGHTS, "mean")["w"])



def test_krum_ties_go_to_the_lower_index():
    """24 uploads alternating between -1 and +1: every Krum score is 11 x 0 + 12 x 4 = 48 - 4 = 44 (f = 0: the
    n - 2 = 22 nearest others), a 24-way tie (with f = 10 too: 11 x 0 + 1 x 4). Krum takes upload 0 (at -1),
    Multi-Krum with f = 10 the first 14, weighted 1..14: (-1 + 2 - 3 + ... + 14) / 105 = 7 / 105."""
    x = torch.tensor([[-1.0], [1.0]] * 12, dtype=torch.float64)
    assert robust.krum_scores(x, 0).tolist() == [44.0] * 24
    assert robust.krum_select(x, 0, 3) == [0, 1, 2]
    states = [{"w": row.clone()} for row in x]
    assert robust.aggregate(states, list(range(1, 25)), "krum")["w"].tolist() == [-1.0]
    assert robust.krum_scores(x, 10).tolist() == [4.0] * 24
    assert robust.aggregate(states, list(range(1, 25)), "multikrum", krum_f=10)["w"].tolist() == [pytest.approx(7 / 105)]


def weiszfeld(pts, w, steps):
    """Reference: the weighted mean, then ``steps`` Weiszfeld steps z <- sum_i (w_i / d_i) x_i / sum_i (w_i / d_i)."""
    w = np.asarray(w, dtype=float) / np.sum(w)
    z = w @ pts
    path = [z]
    for _ in range(steps):
        b = w / np.linalg.norm(pts - z, axis=1)
        z = b @ pts / b.sum()
        path.append(z)
    return path


@pytest.mark.parametrize("scale", [1.0, 0.1])  # |z| about 4 and about 0.4: the step is relative to max(1, |z|)
def test_geometric_median_starts_at_the_weighted_mean_and_stops_when_a_step_is_small(scale):
    pts = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 3.0], [5.0, 5.0]]) * scale
    w = [1.0, 2.0, 3.0, 4.0]
    path = weiszfeld(pts, w, 6)
    x, wt = torch.tensor(pts), torch.tensor(w, dtype=torch.float64)
    assert np.allclose(robust.geometric_median(x, wt, max_iter=0).numpy(), path[0])
    assert np.allclose(path[0], np.array([2.8, 2.9]) * scale)  # (0 + 8 + 0 + 20) / 10, (0 + 0 + 9 + 20) / 10
    assert np.allclose(robust.geometric_median(x, wt, max_iter=2).numpy(), path[2])
    # a tolerance between the 3rd and the 4th step's length (relative to max(1, |z|)): it stops after the 4th
    moves = [np.linalg.norm(b - a) / max(1.0, np.linalg.norm(b)) for a, b in zip(path, path[1:])]
    assert moves[3] < moves[2]
    tol = (moves[2] + moves[3]) / 2
    assert np.allclose(robust.geometric_median(x, wt, tol=tol, max_iter=100).numpy(), path[4], rtol=0, atol=1e-12)

@pytest.mark.parametrize("weights", [[1, 1, 1, 1, 1], [1, 2, 3, 4, 5], [5, 1, 1, 1, 20]])
def test_geometric_median_is_the_minimiser(weights):
    pts = np.array(POINTS + [[2.0, 7.0]])[1:]  # five points, not collinear
    w = np.array(weights, dtype=float)

    def cost(z):
        return float((w * np.linalg.norm(pts - z, axis=1)).sum())

    best = minimize(cost, pts.mean(0), method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 10000})
    states = [{"w": torch.tensor(p, dtype=torch.float64)} for p in pts]
    got = robust.aggregate(states, weights, "geomed")["w"].numpy()
    # Near a data point (here (3, 3)) the cost is flat and Weiszfeld's steps shrink: the cost is matched to
    # 1e-7 of its value, the point to 1e-3 (an optimum on a data point is approached, not reached).
    assert cost(got) <= best.fun * (1 + 1e-7), (cost(got), best.fun)
    assert np.allclose(got, best.x, atol=1e-3), (got, best.x)


def test_geometric_median_on_a_data_point_stays_finite():
    """With one point carrying most of the weight the median is that point: the floored distance keeps the
    iteration finite when an iterate lands on it."""
    x = torch.tensor(POINTS, dtype=torch.float64)
    z = robust.geometric_median(x, torch.tensor([100.0, 1, 1, 1, 1], dtype=torch.float64))
    assert torch.isfinite(z).all() and torch.allclose(z, x[0], atol=1e-6)
    # the start itself on a data point: two equal uploads and a third of weight 0, whose weighted mean is
    # exactly (1, 1), at distance 0 from two of them
    x = torch.tensor([[1.0, 1.0], [1.0, 1.0], [3.0, 1.0]], dtype=torch.float64)
    z = robust.geometric_median(x, torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))
    assert z.tolist() == [1.0, 1.0]


def test_median_on_a_server_is_the_coordinate_wise_median_of_the_uploads(digits_tiny_root, monkeypatch):
    server = build(digits_tiny_root, "FedAvg", "--aggregator", "median", "--train_loss_eval", "off")
    seen = []
    average = server.average_uploads
    monkeypatch.setattr(server, "average_uploads", lambda uploads: (seen.append(opened(uploads)), average(uploads)))
    loop.run_round(server, 0)
    uploads = seen[0]
    assert len(uploads) == 5
    for k, v in server.global_model.state_dict().items():
        expect = np.median(np.stack([u.state[k].numpy() for u in uploads]), axis=0)
        assert np.allclose(v.numpy(), expect, atol=1e-7), k


def test_too_few_uploads_for_krum_is_one_clear_line(digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", "--aggregator", "krum", "--krum_f", "2")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Krum needs more than 2f + 2 = 6 uploads, got 5" in err[0], err
    assert (tmp_path / "Digits_FedAvg_test_0.h5").exists()  # the round-0 evaluation is kept


@pytest.mark.parametrize("flags", [("--krum_f", "1"), ("--trim_frac", "0.5"), ("--attack_frac", "0.2"),
                                   ("--attack", "labelflip", "--attack_scale", "2"),
                                   ("--server_opt", "adam", "-slr", "0")])
def test_bad_option_values_are_refused(flags, digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", *flags)) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def rule_inputs(n: int, f: int, notes: list) -> robust.RuleInputs:
    return robust.RuleInputs(torch.ones(n, dtype=torch.float64), f, 0.2, None, None, 10.0, 1, None, notes.append)


BULYAN = ("{n} uploads, fewer than 4f + 3 = {m} (f = {f}); its guarantee is lost and it averages {b} value(s) per "
          "coordinate")


@pytest.mark.parametrize("rule, n, f, said", [
    ("median", 1, 0, "the median of 1 upload(s) is their unweighted mean"),
    ("median", 2, 0, "the median of 2 upload(s) is their unweighted mean"),
    ("median", 3, 0, None),
    ("multikrum", 5, 0, "f = 0: Multi-Krum keeps every upload (the weighted mean)"),
    ("multikrum", 5, 1, None),
    ("bulyan", 3, 1, BULYAN.format(n=3, m=7, f=1, b=1)),  # n - 4f = -1: one value
    ("bulyan", 6, 1, BULYAN.format(n=6, m=7, f=1, b=2)),
    ("bulyan", 7, 1, None),  # n = 4f + 3: the guarantee holds
    ("bulyan", 5, 2, BULYAN.format(n=5, m=11, f=2, b=1)),
    ("bulyan", 10, 2, BULYAN.format(n=10, m=11, f=2, b=2)),
    ("bulyan", 11, 2, None),
    ("bulyan", 3, 0, None),
])
def test_a_rule_that_degenerates_says_so_with_its_numbers(rule, n, f, said):
    """The notes of the module docstring, at each side of their bounds (5 columns, so n and d differ)."""
    notes = []
    robust.RULES[rule](torch.arange(5.0 * n, dtype=torch.float64).reshape(n, 5), rule_inputs(n, f, notes))
    assert notes == ([said] if said else [])


def test_bulyan_with_n_at_2f_is_refused_without_a_note():
    notes = []
    with pytest.raises(ValueError, match="it needs n > 2f"):
        robust.RULES["bulyan"](torch.zeros(2, 3, dtype=torch.float64), rule_inputs(2, 1, notes))
    assert notes == []


def test_the_mean_rule_is_the_sample_weighted_mean():
    x = torch.tensor([[0.0, 4.0], [4.0, 0.0]], dtype=torch.float64)
    inputs = rule_inputs(2, 0, [])
    inputs.weights = torch.tensor([1.0, 3.0], dtype=torch.float64)
    assert robust.RULES["mean"](x, inputs).tolist() == [3.0, 1.0]


def test_a_bare_aggregate_call_takes_the_defaults_of_the_flags():
    """``aggregate``'s keyword defaults are a run's with the flags left out: --cclip_tau 10 and --cclip_iters 1
    (the flags' defaults, checked here too), and --krum_f left out without an attack (no malicious upload,
    f = 0)."""
    import cli

    flags = {a.dest: a.default for a in cli.base_parser().flags}
    assert (flags["cclip_tau"], flags["cclip_iters"], flags["krum_f"]) == (10.0, 1, None)
    # centered clipping from the zero center, τ = 10, one iteration: v = (min(1, 10 / 30) 30 + 0 + 0) / 3
    ref = {"w": torch.zeros(1, dtype=torch.float64)}
    states = [{"w": torch.tensor([v], dtype=torch.float64)} for v in (30.0, 0.0, 0.0)]
    assert robust.aggregate(states, [1, 1, 1], "cclip", reference=ref)["w"].item() == pytest.approx(10 / 3, abs=1e-12)
    # Krum over 0, 1, 2, 4, 9 with f = 0 scores each upload by its n - f - 2 = 3 nearest: 2 scores 1 + 4 + 4 = 9,
    # the lowest (1 scores 11, 0 21, 4 29, 9 138); with f = 1 the upload 1 would win, with f = -1 the upload 4
    states = [{"w": torch.tensor([v], dtype=torch.float64)} for v in (0.0, 1.0, 2.0, 4.0, 9.0)]
    assert robust.aggregate(states, [1] * 5, "krum")["w"].item() == 2.0


def test_integer_entries_alone_take_the_rounded_weighted_mean_under_any_rule():
    states = [{"n": torch.tensor(3)}, {"n": torch.tensor(5)}, {"n": torch.tensor(10)}]
    assert robust.aggregate(states, [1, 1, 2], "median")["n"].item() == 7  # (3 + 5 + 20) / 4


def test_a_round_of_one_upload_under_a_rule_is_that_upload():
    """-jr or drop-outs can leave one upload: every rule that takes the median's path gives it back whole,
    integer entries too (the median of one upload says so)."""
    state = {"w": torch.tensor([[1.0, -2.0]]), "b": torch.tensor([0.5]), "n": torch.tensor(7)}
    notes = []
    got = robust.aggregate([state], [3.0], "median", note=notes.append)
    assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in state.items()}
    assert notes == ["the median of 1 upload(s) is their unweighted mean"]
