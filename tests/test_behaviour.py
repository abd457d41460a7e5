"""The behaviour harness, over the registry: every algorithm learns on an IID split, every personalised
algorithm beats FedAvg on a pathological one, and none but Local produces Local's curve. New algorithms
join automatically; an algorithm known not to meet a check is marked with the reason (strict: the mark
must go once it does).

Scale: 5 rounds, -lr 0.1, the tiny Digits splits of conftest (IID: 5 clients; pathological: 6 clients
with 2 classes each), one seed. FedAvg reaches about 0.9 on the IID split and about 0.6 on the
pathological one there."""
import numpy as np
import pytest

import main
from conftest import cli
from flcore.registry import ALGORITHMS, get_server_class
from utils.results import read_h5

ROUNDS = "5"
# Flags that put an algorithm on FedAvg's footing at the harness's -lr 0.1: APPLE's core rate is 2 x -lr
# (0.01 at the default -lr, the official code's), so 0.1 x brings it back to the official 0.01 instead of
# 0.2 with momentum 0.9, which diverges; a Per-FedAvg step uses two batches, so -ls 2 gives it FedAvg's
# number of optimizer steps per round. FedCP's MMD kernel widths (10 to 50, the official code's) are far wider
# than Digits' feature distances (features of norm about 2), so its default λ 5 holds the extractor where it
# was received (train loss 2.30 -> 2.25 in 5 rounds); PFLlib's λ 1 lets it learn.
FLAGS: dict = {"APPLE": ("--core_lr_scale", "0.1"), "Per-FedAvg": ("-ls", "2"), "FedCP": ("-lam", "1")}
KNOWN = {  # (algorithm, check) -> why it fails today
    ("APPLE", "iid"): "APPLE's local path is p_ii of its round's move, so on IID data a round is about one gradient "
                      "step of the mix (5 rounds: at most about 0.70 over core rates), and p's gradient, alike for "
                      "every core, grows all p_ij together",
    ("GPFL", "iid"): "GPFL's Conditional Valve adds a LayerNorm-ed β of norm about sqrt(512) = 22.6 to features of "
                     "norm about 2 on Digits, which drowns the per-sample signal (samples differ from their mean by "
                     "0.47): one IID client alone reaches 0.39 after 4 epochs at λ = μ = 0 (FedAvg's model 0.72); "
                     "5 rounds give 0.67 of the required 0.72",
    ("GPFL", "pat"): "the same scale mismatch: 0.56 after 5 rounds against FedAvg's 0.62",
    ("FML", "iid"): "the paper's α = 0.5 gives the evaluated local model half of the label loss (the rest is KL to a "
                    "meme model that starts elsewhere): 0.68 after 5 rounds of the required 0.72, 0.91 after 10",
}
_RUNS: dict = {}


@pytest.fixture(scope="module")
def roots(digits_root, digits_noniid_root):
    return {"iid": digits_root, "pat": digits_noniid_root}


def curve(algo: str, split: str, roots, tmp_path_factory) -> np.ndarray:
    """The run's accuracy series (rounds 0..5), each (algorithm, split) run once per session."""
    if (algo, split) not in _RUNS:
        out = tmp_path_factory.mktemp(f"behaviour_{split}")
        assert main.main(cli(roots[split], out, "-algo", algo, "-gr", ROUNDS, "-lr", "0.1", *FLAGS.get(algo, ()))) == 0
        _RUNS[algo, split] = read_h5(out / f"Digits_{algo}_test_0.h5")["rs_test_acc"]
    return _RUNS[algo, split]


def known(algo: str, check: str):
    why = KNOWN.get((algo, check))
    return [pytest.mark.xfail(reason=why, strict=True)] if why else []


@pytest.mark.parametrize("algo", [pytest.param(a, marks=known(a, "iid")) for a in sorted(ALGORITHMS)])
def test_learns_on_iid_digits(algo, roots, tmp_path_factory):
    acc = curve(algo, "iid", roots, tmp_path_factory)[-1]
    fedavg = curve("FedAvg", "iid", roots, tmp_path_factory)[-1]
    assert acc >= 0.8 * fedavg, (acc, fedavg)


PERSONALIZED = sorted(a for a in ALGORITHMS if get_server_class(a).personalized)


@pytest.mark.parametrize("algo", [pytest.param(a, marks=known(a, "pat")) for a in PERSONALIZED])
def test_personalized_beats_fedavg_on_a_pathological_split(algo, roots, tmp_path_factory):
    acc = curve(algo, "pat", roots, tmp_path_factory)[-1]
    fedavg = curve("FedAvg", "pat", roots, tmp_path_factory)[-1]
    assert acc > fedavg, (acc, fedavg)


# Traditional FL: clients are evaluated on the one global model (personalized = False).
TRADITIONAL = {"FedAvg", "FedProx", "SCAFFOLD", "FedDyn", "MOON", "FedLC", "FedGen", "FedNTD", "FedCross"}


def test_traditional_algorithms_are_declared():
    assert {a for a in ALGORITHMS if not get_server_class(a).personalized} == TRADITIONAL & set(ALGORITHMS)


@pytest.mark.parametrize("algo", sorted(set(ALGORITHMS) - {"Local"}))
def test_no_algorithm_is_local_in_disguise(algo, roots, tmp_path_factory):
    for split in ("iid", "pat"):
        if not np.array_equal(curve(algo, split, roots, tmp_path_factory), curve("Local", split, roots, tmp_path_factory)):
            return
    pytest.fail(f"{algo} gives Local's accuracy curve on both splits")


def evaluated_and_global(algo: str, root) -> tuple[list[dict], dict]:
    """After two rounds on the pathological split and the next broadcast: the state of every client's
    evaluated model, and the global model's."""
    from utils.data_utils import load_split

    cfg = main.parse_config(cli(root, root, "--executor", "sequential", "-algo", algo, "-gr", "3", "-lr", "0.1",
                                "--train_loss_eval", "off", *FLAGS.get(algo, ())))
    server = get_server_class(algo)(cfg.replace(num_classes=10), load_split("Digits", root))
    for t in range(2):
        server.run_round(t)
    server.round_idx = 2
    server._send_models(server.select_clients())
    return [c.eval_model().state_dict() for c in server.clients], server.global_model.state_dict()


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_personalised_models_differ_from_the_global_model(algo, digits_noniid_root):
    """Where an algorithm personalises, what it evaluates is not the global model (compared over the
    entries both have: FedRep's clients share only the body's names with a split global model); where it
    does not (traditional FL), it is exactly the global model."""
    evaluated, glob = evaluated_and_global(algo, digits_noniid_root)
    gaps = []
    for state in evaluated:
        common = [k for k in state if k in glob and state[k].is_floating_point()]
        assert common, algo
        gaps.append(max(float((state[k] - glob[k]).abs().max()) for k in common))
    if get_server_class(algo).personalized:
        assert max(gaps) > 1e-4, (algo, gaps)
    else:
        assert max(gaps) == 0.0, (algo, gaps)
