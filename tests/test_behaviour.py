"""The behaviour harness, over the registry: every algorithm learns on an IID split, every federated one
beats Local there, and every personalised one beats FedAvg on a pathological split. New algorithms join
automatically; an algorithm known not to meet a check is marked with its measured figure and the reason
(strict: the mark must go once it does).

The bars are fixed numbers, FedAvg's and Local's figures measured at this scale, not recomputed from this
run's FedAvg: a bug shared by the base (and so by FedAvg) cannot lower its own bar, and FedAvg's and Local's
own figures are checked against them. Each algorithm runs with the harness's flags (FLAGS, which put a few
on FedAvg's footing) and, where those differ, at its own defaults as well.

Scale: -lr 0.1, the Digits splits of conftest (IID: 5 clients, ``digits_root``; pathological: 6 clients with
2 classes each, ``digits_noniid_root``), 5 rounds on the IID split and 3 on the pathological one, one seed,
torch at one thread in this process (pinned here), so a figure does not depend on the machine's thread count.
Three rounds suffice on the pathological split: there FedAvg's one model is far behind what a client's own
two classes allow (FedAvg 0.455 after 3 rounds, the personalised algorithms 0.545 to 0.998), while on the IID
split 3 rounds would leave Local (0.567) and several federated algorithms below the bar of "learns", so it
keeps 5. The runs use the sequential executor: the fork executor gives the same numbers
(tests/test_executors.py checks every algorithm) at the cost of its workers, and the checks are about what an
algorithm learns, not where its clients live. Measured with torch 2.14.1 on an AVX-512
CPU: FedAvg 0.8956 IID (5 rounds) and 0.4554 pathological (3 rounds), Local 0.8022 IID; another CPU's
vector kernels may round differently, hence the tolerance on FedAvg's and Local's own checks."""
import numpy as np
import pytest
import torch

import main
from conftest import cli, reading_shared
from flcore.registry import ALGORITHMS, get_server_class
from utils.results import read_h5
from runtime import loop

ROUNDS = {"iid": "5", "pat": "3"}  # rounds of a run on each split (module docstring)
# Measured final accuracies (module docstring); Local's is 361 of the 450 IID test samples, FedAvg's 403, and
# FedAvg's 204 of the 448 pathological ones.
FEDAVG_IID, FEDAVG_PAT, LOCAL_IID = 403 / 450, 204 / 448, 361 / 450
IID_BAR = 0.8 * FEDAVG_IID  # "learns": 80 % of FedAvg's IID figure
TOLERANCE = 0.02  # FedAvg's and Local's own figures on another CPU (9 of the 450 IID test samples)
# Flags that put an algorithm on FedAvg's footing at the harness's -lr 0.1: APPLE's core rate is 2 x -lr
# (0.01 at the default -lr, the official code's), so 0.1 x brings it back to the official 0.01 instead of
# 0.2 with momentum 0.9, which diverges; a Per-FedAvg step uses two batches, so -ls 2 gives it FedAvg's
# number of optimizer steps per round. FedCP's MMD kernel widths (10 to 50, the official code's) are far wider
# than Digits' feature distances (features of norm about 2), so its default λ 5 holds the extractor where it
# was received; PFLlib's λ 1 lets it learn. Each of them also runs at its defaults ("<algo>-defaults").
FLAGS: dict = {"APPLE": ("--core_lr_scale", "0.1"), "Per-FedAvg": ("-ls", "2"), "FedCP": ("-lam", "1")}
APPLE_IID = ("0.124 after 5 rounds (0.524 at round 3, then train loss 2.07 -> 10.0): on IID data every core is "
             "alike, so p's gradients are alike too and grow every p_ij together until the scaled-up mix diverges "
             "(servers/serverapple.py)")
GPFL_SCALE = ("GPFL's Conditional Valve adds a LayerNorm-ed β of norm about sqrt(512) = 22.6 to features of norm "
              "about 2 on Digits, which drowns the per-sample signal (samples differ from their mean by 0.47): one "
              "IID client alone reaches 0.39 after 4 epochs at λ = μ = 0 (FedAvg's model 0.72)")
FML_HALF = ("the paper's α = 0.5 gives the evaluated local model half of the label loss (the rest is KL to a meme "
            "model that starts elsewhere): 0.680 after 5 rounds")
PFEDME = ("0.709 after 5 rounds on one machine and 0.773 on another (an AVX512 CPU), at the same commit and one "
          "torch thread, with or without the optional packages (FedAvg 0.896): its evaluated θ_i trails FedAvg at "
          "this scale")
APPLE_DEFAULTS = ("the core rate 2 x -lr = 0.2 with momentum 0.9 diverges: train loss 2.12 -> 10.3 -> 52.8 by round 3, "
                  "then NaN (the run stops)")
FEDCP_DEFAULTS = ("0.104 after 5 rounds: λ 5 on MMD kernels of width 10 to 50 holds the extractor where it was "
                  "received (train loss 2.30 -> 2.25)")
PERAVG_DEFAULTS = "0.489 after 5 rounds at -ls 1 (half of FedAvg's optimizer steps: a step uses two batches)"
# On the pathological split (3 rounds) every personalised algorithm beats FedAvg's 0.455, GPFL (0.5625) and
# Per-FedAvg at its defaults (0.545) included: after 5 rounds they did not (0.513 and 0.576 against 0.623).
# Known failures whose outcome depends on the machine (measured on two): recorded, not strict.
STRADDLING = {("pFedMe", "iid", "harness")}
KNOWN = {  # (algorithm, check, setting) -> its measured figure and why it fails today
    ("APPLE", "iid", "harness"): APPLE_IID,
    ("APPLE", "local", "harness"): APPLE_IID,
    ("FML", "iid", "harness"): FML_HALF + " of the required 0.716",
    ("FML", "local", "harness"): FML_HALF + " against Local's 0.802",
    ("FedAMP", "local", "harness"): "0.756 against Local's 0.802: HeurFedAMP keeps ξ_ii = 0.8 of each client's own "
                                    "model in the model it starts from, so on IID data it learns (above the 0.716 "
                                    "bar) but federates too little in 5 rounds to beat training alone",
    ("FedFomo", "local", "harness"): "0.791 against Local's 0.802: it learns (above the 0.716 bar); it trains on 80 % "
                                     "of each client's data (the other 20 % is the validation holdout its weights "
                                     "are computed on, --val_ratio 0.2), Local on all of it",
    ("FedMTL", "local", "harness"): "0.8022, exactly Local's 361 of 450: the pull toward the mean (λ1 0.01) is too "
                                    "weak to federate in 5 rounds",
    ("GPFL", "iid", "harness"): GPFL_SCALE + "; 5 rounds give 0.711 of the required 0.716",
    ("GPFL", "local", "harness"): GPFL_SCALE + "; 0.711 against Local's 0.802",
    ("Per-FedAvg", "local", "harness"): "0.784 against Local's 0.802 at -ls 2 (FedAvg's step count): it learns "
                                        "(above the 0.716 bar) but its evaluated model, the meta-model after one "
                                        "personalisation step, falls behind training alone in 5 rounds",
    ("pFedMe", "iid", "harness"): PFEDME + "; the figure depends on the machine and straddles the required 0.716",
    ("pFedMe", "local", "harness"): PFEDME + " against Local's 0.802",
    # At the defaults the harness's FLAGS replace (module comment above FLAGS):
    ("APPLE", "iid", "defaults"): APPLE_DEFAULTS,
    ("APPLE", "local", "defaults"): APPLE_DEFAULTS,
    ("FedCP", "iid", "defaults"): FEDCP_DEFAULTS,
    ("FedCP", "local", "defaults"): FEDCP_DEFAULTS,
    ("Per-FedAvg", "iid", "defaults"): PERAVG_DEFAULTS + " of the required 0.716",
    ("Per-FedAvg", "local", "defaults"): PERAVG_DEFAULTS + " against Local's 0.802",
}
_RUNS: dict = {}
_GAPS: dict = {}  # (algorithm, split, flags) -> evaluated_and_global at the run's final evaluation


@pytest.fixture(scope="module")
def roots(digits_root, digits_noniid_root):
    return {"iid": digits_root, "pat": digits_noniid_root}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Torch at one thread while this module runs, whatever ran before it (see the module docstring)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def curve(algo: str, split: str, setting: str, roots, tmp_path_factory) -> np.ndarray:
    """The run's accuracy series (rounds 0 to ROUNDS[split]): ``run_series``'s ``rs_test_acc``."""
    return run_series(algo, split, setting, roots, tmp_path_factory)["rs_test_acc"]


def run_series(algo: str, split: str, setting: str, roots, tmp_path_factory) -> dict:
    """The run's recorded series, each (algorithm, split, setting) run once per test process (a run that
    stops with an error, e.g. a NaN loss, fails every check that reads it). Every run also keeps what
    ``evaluated_and_global`` measures at its final evaluation (``_GAPS``)."""
    flags = FLAGS.get(algo, ()) if setting == "harness" else ()
    key = (algo, split, flags)
    reading_shared(harness_runs(algo))
    if key not in _RUNS:
        out = tmp_path_factory.mktemp(f"behaviour_{split}")
        argv = cli(roots[split], out, "-algo", algo, "-gr", ROUNDS[split], "-lr", "0.1", "--executor", "sequential",
                   *flags)
        evaluate = loop.evaluate

        def evaluate_and_compare(server):
            summary = evaluate(server)
            if server.round_idx == server.cfg.global_rounds:  # the final evaluation, after its broadcast:
                _GAPS[key] = evaluated_and_global(server)  # read after it, so the run's figures are untouched
            return summary

        loop.evaluate = evaluate_and_compare  # the loop looks it up at each call; restored below
        try:
            ok = main.main(argv) == 0
        finally:
            loop.evaluate = evaluate
        _RUNS[key] = read_h5(out / f"Digits_{algo}_test_0.h5") if ok else None
    assert _RUNS[key] is not None, f"{algo} ({setting}) stopped with an error on the {split} split"
    return _RUNS[key]


def shared_run(item) -> str:
    """The harness runs a check reads (tests/conftest.py's ``regroup``): ``harness_runs`` of its algorithm
    (FedAvg's for the check of the bars' sources)."""
    return harness_runs(item.callspec.params["algo"] if hasattr(item, "callspec") else "FedAvg")


def harness_runs(algo: str) -> str:
    """The name of an algorithm's harness runs, both settings and both splits, so the test process that
    takes its checks trains each once; Local's go with FedAvg's, as the check of the bars' sources reads both."""
    return f"behaviour-{'FedAvg' if algo == 'Local' else algo}"


def cases(algos, check: str) -> list:
    """One case per algorithm at the harness's flags, and one at its defaults where FLAGS changes them."""
    out = []
    for algo in algos:
        for setting in ("harness", "defaults") if algo in FLAGS else ("harness",):
            why = KNOWN.get((algo, check, setting))
            out.append(pytest.param(algo, setting, id=algo if setting == "harness" else f"{algo}-defaults",
                                    marks=[pytest.mark.xfail(reason=why, strict=(algo, check, setting)
                                                             not in STRADDLING)] if why else []))
    return out


@pytest.mark.quick
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_algorithm_learns(algo, roots, tmp_path_factory):
    """The quick tier (``python3 -m pytest -m quick``, for a researcher who has just added an algorithm):
    every registered algorithm's IID run of the harness (its flags, 5 rounds, sequential executor) finishes,
    records every round with a finite train loss and learns: its best accuracy is above 0.3 (chance is 0.1).
    The best, not the last: APPLE at the harness's flags reaches 0.52 after 3 rounds and then diverges (its
    known figure, APPLE_IID), which the checks below report. In the full suite it reads the run those checks
    read (``shared_run`` puts them in one test process), so the run is trained once; the fork executor's numbers
    for every algorithm are tests/test_executors.py's ``test_fork_matches_sequential``."""
    run = run_series(algo, "iid", "harness", roots, tmp_path_factory)
    assert list(run["rs_round"]) == list(range(int(ROUNDS["iid"]) + 1))
    assert np.all(np.isfinite(run["rs_train_loss"])), run["rs_train_loss"]
    assert max(run["rs_test_acc"]) > 0.3, run["rs_test_acc"]


def test_fedavg_and_local_give_their_measured_figures(roots, tmp_path_factory):
    """The bars' sources: FedAvg and Local reach what they reached when the bars were measured."""
    assert curve("FedAvg", "iid", "harness", roots, tmp_path_factory)[-1] >= FEDAVG_IID - TOLERANCE
    assert curve("FedAvg", "pat", "harness", roots, tmp_path_factory)[-1] >= FEDAVG_PAT - TOLERANCE
    assert abs(curve("Local", "iid", "harness", roots, tmp_path_factory)[-1] - LOCAL_IID) <= TOLERANCE


@pytest.mark.parametrize("algo, setting", cases(sorted(ALGORITHMS), "iid"))
def test_learns_on_iid_digits(algo, setting, roots, tmp_path_factory):
    acc = curve(algo, "iid", setting, roots, tmp_path_factory)[-1]
    assert acc >= IID_BAR, (acc, IID_BAR)


@pytest.mark.parametrize("algo, setting", cases(sorted(set(ALGORITHMS) - {"Local"}), "local"))
def test_federated_algorithms_beat_local_on_iid_digits(algo, setting, roots, tmp_path_factory):
    """On IID data every client's neighbours hold its distribution, so federating must beat training alone
    (Local: 0.8022); an algorithm that never federates fails here."""
    acc = curve(algo, "iid", setting, roots, tmp_path_factory)[-1]
    assert acc > LOCAL_IID, (acc, LOCAL_IID)


PERSONALIZED = sorted(a for a in ALGORITHMS if get_server_class(a).declares.personalized)


@pytest.mark.parametrize("algo, setting", cases(PERSONALIZED, "pat"))
def test_personalized_beats_fedavg_on_a_pathological_split(algo, setting, roots, tmp_path_factory):
    acc = curve(algo, "pat", setting, roots, tmp_path_factory)[-1]
    assert acc > FEDAVG_PAT, (acc, FEDAVG_PAT)


# Traditional FL: clients are evaluated on the one global model. The set is each class's own declaration
# (personalized = False); the tests below check the declaration against what its clients evaluate.
TRADITIONAL = {a for a in ALGORITHMS if not get_server_class(a).declares.personalized}


def evaluated_and_global(server) -> list[float | None]:
    """Where the final evaluation of a run stands, after its broadcast: for every client, the largest gap
    between its evaluated model and the global model over the entries both have (FedRep's clients share
    only the body's names with a split global model); None for a client that shares no entry with it."""
    glob = server.global_model.state_dict()
    gaps = []
    for c in server.clients:
        state = c.eval_model().state_dict()
        common = [k for k in state if k in glob and state[k].is_floating_point()]
        gaps.append(max(float((state[k] - glob[k]).abs().max()) for k in common) if common else None)
    return gaps


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_personalised_models_differ_from_the_global_model(algo, roots, tmp_path_factory):
    """Where an algorithm personalises, what it evaluates is not the global model; where it does not
    (traditional FL), it is exactly the global model. Read at the final evaluation of the harness's run
    (after its last broadcast): a personalised algorithm's on the pathological split, a traditional one's
    on the IID split."""
    split = "iid" if algo in TRADITIONAL else "pat"
    curve(algo, split, "harness", roots, tmp_path_factory)
    gaps = _GAPS[(algo, split, FLAGS.get(algo, ()))]
    assert None not in gaps, (algo, gaps)
    if get_server_class(algo).declares.personalized:
        assert max(gaps) > 1e-4, (algo, gaps)
    else:
        assert max(gaps) == 0.0, (algo, gaps)
