"""DLG / iDLG's outer loop (``dlg.reconstruct``), by hand: L-BFGS replaced by a stand-in that reports how many
iterations each call ran and moves the dummy by one per call, and the matching loss measured after each chunk
scripted, so chunking, the iteration count, the history, the cheapest dummy kept and every stopping rule
(tolerance, NaN, a non-finite dummy, no progress, a stall) can be checked against values written down here."""
import math

import pytest
import torch
from torch import nn

from utils import dlg
from utils.seeding import torch_gen


class StandIn:
    """Records its settings and each call's iteration budget; a call runs ``runs.pop(0)`` iterations (all of
    its budget when the script is empty) and adds 1 to the dummy (or makes it infinite when told to)."""

    made: list = []

    def __init__(self, params, **settings):
        self.x, self.variables = params[0], len(params)
        self.settings = settings
        self.param_groups = [{"max_iter": settings["max_iter"]}]
        self.state = {self.x: {}}
        self.budgets, self.runs, self.blow_up = [], [], set()
        StandIn.made.append(self)

    def step(self, closure):
        budget = self.param_groups[0]["max_iter"]
        self.budgets.append(budget)
        ran = self.runs.pop(0) if self.runs else budget
        with torch.no_grad():
            self.x.add_(float("inf") if len(self.budgets) in self.blow_up else 1.0)
        self.state[self.x]["n_iter"] = self.state[self.x].get("n_iter", 0) + ran


def attack(monkeypatch, losses, runs=(), blow_up=(), method="idlg", **options):
    """Run reconstruct with the stand-in, the losses after each chunk taken from ``losses``."""
    StandIn.made = []
    script = list(losses)
    measured = []

    def scripted(model, params, names, target, x, y, clip=None):
        measured.append(float(x.detach().flatten()[0]))
        return torch.tensor(script.pop(0), dtype=torch.float64)

    original = StandIn.__init__

    def init(self, params, **settings):
        original(self, params, **settings)
        self.runs, self.blow_up = list(runs), set(blow_up)

    monkeypatch.setattr(StandIn, "__init__", init)
    monkeypatch.setattr(torch.optim, "LBFGS", StandIn)
    monkeypatch.setattr(dlg, "_matching_loss", scripted)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    target = {k: torch.ones_like(v) for k, v in model.named_parameters()}
    start = torch.randn((1, 1, 2, 2), generator=torch_gen(0, 0, "d"))
    rec = dlg.reconstruct(model, target, (1, 2, 2), 1, 3, method=method, labels=torch.tensor([1]),
                          generator=torch_gen(0, 0, "d"), **options)
    return rec, StandIn.made[0], start, measured


def test_the_optimiser_is_the_dlg_codes_lbfgs(monkeypatch):
    _, opt, _, _ = attack(monkeypatch, [5.0], iters=7, chunk=7)
    assert opt.settings == {"lr": 1.0, "max_iter": 7, "history_size": 100, "line_search_fn": None,
                            "tolerance_grad": 1e-12, "tolerance_change": 1e-14}
    _, opt, _, _ = attack(monkeypatch, [5.0], iters=7, chunk=7, line_search="strong_wolfe")
    assert opt.settings["line_search_fn"] == "strong_wolfe"


def test_chunks_until_the_budget_is_spent_keeping_each_chunks_loss(monkeypatch):
    rec, opt, start, measured = attack(monkeypatch, [5.0, 4.0, 3.0], iters=45, chunk=20, tol=0.0, stall=100)
    assert opt.budgets == [20, 20, 5] and rec.iterations == 45 and rec.history == [5.0, 4.0, 3.0]
    assert measured == pytest.approx([float(start.flatten()[0]) + k for k in (1, 2, 3)])  # after each chunk
    assert rec.loss == 3.0 and torch.allclose(rec.x, start + 3) and rec.labels.tolist() == [1]


def test_the_cheapest_dummy_is_kept_not_the_last(monkeypatch):
    rec, opt, start, _ = attack(monkeypatch, [5.0, 2.0, 7.0], iters=60, chunk=20, tol=0.0, stall=100)
    assert rec.history == [5.0, 2.0, 7.0] and rec.loss == 2.0 and torch.allclose(rec.x, start + 2)


def test_a_chunk_that_stops_early_counts_what_it_ran(monkeypatch):
    """The second call runs 3 of its 20 iterations, the third 0 (L-BFGS found nothing to do): 23 in all, and
    the loop stops there."""
    rec, opt, _, _ = attack(monkeypatch, [5.0, 4.0, 3.0, 2.0], runs=[20, 3, 0], iters=100, chunk=20, tol=0.0,
                            stall=100)
    assert opt.budgets == [20, 20, 20] and rec.iterations == 23 and rec.history == [5.0, 4.0, 3.0]


@pytest.mark.parametrize("losses,chunks", [([5.0, 1e-9, 0.5], 2), ([5.0, 1e-8, 0.5], 3)])
def test_it_stops_once_the_best_loss_is_below_tol(monkeypatch, losses, chunks):
    rec, opt, _, _ = attack(monkeypatch, losses, iters=60, chunk=20, tol=1e-8, stall=100)
    assert len(opt.budgets) == chunks


def test_a_nan_loss_stops_and_is_never_kept(monkeypatch):
    rec, opt, start, _ = attack(monkeypatch, [5.0, float("nan"), 1.0], iters=60, chunk=20, tol=0.0, stall=100)
    assert len(opt.budgets) == 2 and math.isnan(rec.history[1]) and rec.loss == 5.0
    assert torch.allclose(rec.x, start + 1)


def test_a_dummy_gone_infinite_is_not_measured_and_stops_the_attack(monkeypatch):
    rec, opt, start, measured = attack(monkeypatch, [5.0, 4.0], blow_up={2}, iters=60, chunk=20, tol=0.0,
                                       stall=100)
    assert len(opt.budgets) == 2 and len(measured) == 1 and math.isnan(rec.history[1])
    assert rec.loss == 5.0 and torch.allclose(rec.x, start + 1)


@pytest.mark.parametrize("losses,chunks", [
    ([10.0, 9.995, 9.991, 9.0], 3),  # after 3 chunks the best is 0.009 below the best 2 chunks before: < 0.1 %
    ([10.0, 9.995, 9.989, 9.9895, 9.0], 4),  # 0.011 below: go on; then 9.995 - 9.989 = 0.006 < 0.1 % of 9.995
    ([10.0, 12.0, 11.0, 9.0], 3),  # no new best in two chunks: stalled
    # the fall is measured against the best two chunks before, and so is the thousandth: after chunk 5 the
    # best fell 1.0 - 0.99 = 0.01 > 0.001 (go on, though 0.01 < 0.05, a thousandth of an older best); it
    # stalls after chunk 8, two chunks without a new best
    ([100.0, 50.0, 1.0, 0.995, 0.99, 0.5, 0.5, 0.5], 8),
    # a thousandth of the older best, not of the current one: 1.0 - 0.9990005 = 0.0009995 is below 0.001 but
    # not below 0.0009990005
    ([1.0, 0.9990005, 0.9990005, 0.9990005], 3),
])
def test_it_stops_when_the_best_loss_fell_less_than_a_thousandth_over_stall_chunks(monkeypatch, losses, chunks):
    rec, opt, _, _ = attack(monkeypatch, losses, iters=1000, chunk=20, tol=0.0, stall=2)
    assert len(opt.budgets) == chunks and rec.history == losses[:chunks]


def test_the_loops_defaults():
    import inspect

    p = inspect.signature(dlg.reconstruct).parameters
    assert {k: p[k].default for k in ("method", "iters", "tol", "chunk", "stall", "line_search", "clip")} == {
        "method": "dlg", "iters": 300, "tol": 1e-8, "chunk": 20, "stall": 5, "line_search": None, "clip": None}
    assert all(p[k].kind is inspect.Parameter.KEYWORD_ONLY for k in ("method", "labels", "iters", "tol", "chunk"))


def test_idlg_optimises_the_inputs_under_the_given_labels_dlg_the_labels_too(monkeypatch):
    rec, opt, _, _ = attack(monkeypatch, [5.0], iters=20, chunk=20)
    assert opt.variables == 1 and rec.labels.tolist() == [1]
    rec, opt, _, _ = attack(monkeypatch, [5.0], iters=20, chunk=20, method="dlg")
    assert opt.variables == 2  # the given labels are iDLG's only: DLG learns soft labels


def test_a_first_chunk_that_runs_nothing_stops_the_attack_with_no_iteration(monkeypatch):
    rec, opt, _, _ = attack(monkeypatch, [5.0, 4.0], runs=[0], iters=100, chunk=20, tol=0.0, stall=100)
    assert opt.budgets == [20] and rec.iterations == 0 and rec.history == [5.0]


def test_a_nan_first_chunk_returns_the_starting_dummy_as_a_plain_tensor(monkeypatch):
    rec, opt, start, _ = attack(monkeypatch, [float("nan")], iters=100, chunk=20, tol=0.0, stall=100)
    assert rec.loss == float("inf") and torch.equal(rec.x, start) and not rec.x.requires_grad


def test_a_loss_of_exactly_zero_never_stalls(monkeypatch):
    """No fall at all from a best of 0 is not "less than a thousandth of 0": with tol 0 the budget is spent."""
    rec, opt, _, _ = attack(monkeypatch, [0.0] * 5, iters=100, chunk=20, tol=0.0, stall=2)
    assert len(opt.budgets) == 5 and rec.iterations == 100


def test_a_chunk_of_one_iteration_is_progress(monkeypatch):
    rec, opt, _, _ = attack(monkeypatch, [5.0, 4.0, 3.0], runs=[20, 1, 20], iters=41, chunk=20, tol=0.0, stall=100)
    assert opt.budgets == [20, 20, 20] and rec.iterations == 41
