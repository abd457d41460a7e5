"""Every registered algorithm, for free: 2 rounds on a small Digits split must learn and write its results
(the quick tier, ``python3 -m pytest -m quick``: each algorithm once), and a run repeats itself exactly with
the same seed (on the tiny split, in the full suite: both runs in this process, so a run that draws from a
random state it did not seed, which the first run moved on, differs; tests/test_executors.py checks that the fork
workers give these numbers)."""
import numpy as np
import pytest

import main
from conftest import cli
from flcore.registry import ALGORITHMS
from utils.results import read_h5

FLAGS = {"FedCP": ("-lam", "1")}  # FedCP's default λ 5 holds Digits' small features in place: see test_behaviour.py


@pytest.mark.quick
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_algorithm_learns(algo, digits_root, tmp_path):
    flags = ("-algo", algo, "-gr", "2", "-lr", "0.1", *FLAGS.get(algo, ()))
    assert main.main(cli(digits_root, tmp_path, *flags)) == 0
    a = read_h5(tmp_path / f"Digits_{algo}_test_0.h5")
    assert list(a["rs_round"]) == [0, 1, 2]
    assert np.all(np.isfinite(a["rs_train_loss"]))
    assert a["rs_test_acc"][-1] > 0.3, a["rs_test_acc"]  # chance is 0.1


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_algorithm_is_deterministic(algo, digits_tiny_root, tmp_path):
    runs = []
    for sub in ("a", "b"):
        out = tmp_path / sub
        flags = ("-algo", algo, "-gr", "2", "-lr", "0.1", "--executor", "sequential", *FLAGS.get(algo, ()))
        assert main.main(cli(digits_tiny_root, out, *flags)) == 0
        runs.append(read_h5(out / f"Digits_{algo}_test_0.h5"))
    a, b = runs
    assert len(a["rs_round"]) == 3
    for key in a:
        if key != "rs_round_time":
            assert np.array_equal(a[key], b[key], equal_nan=True), key
