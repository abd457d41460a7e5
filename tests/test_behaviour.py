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
# Flags without which 5 rounds cannot show learning (as tests/test_algorithms.py): Per-FedAvg's β.
FLAGS = {"Per-FedAvg": ("-bt", "0.1")}
KNOWN = {  # (algorithm, check) -> why it fails today
    ("APPLE", "iid"): "APPLE's core models barely move at its defaults (core gradient scaled by p_ii ~ 1/N)",
    ("Per-FedAvg", "iid"): "Per-FedAvg's meta steps learn slowly at this scale",
    ("Per-FedAvg", "pat"): "Per-FedAvg's meta steps learn slowly at this scale",
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


def test_traditional_algorithms_are_declared():
    assert {a for a in ALGORITHMS if not get_server_class(a).personalized} == {"FedAvg", "FedProx", "SCAFFOLD"}


@pytest.mark.parametrize("algo", sorted(set(ALGORITHMS) - {"Local"}))
def test_no_algorithm_is_local_in_disguise(algo, roots, tmp_path_factory):
    for split in ("iid", "pat"):
        if not np.array_equal(curve(algo, split, roots, tmp_path_factory), curve("Local", split, roots, tmp_path_factory)):
            return
    pytest.fail(f"{algo} gives Local's accuracy curve on both splits")
