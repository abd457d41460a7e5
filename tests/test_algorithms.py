"""Every registered algorithm, for free: 2 rounds on a tiny Digits split must learn, write its results and
repeat itself exactly with the same seed."""
import numpy as np
import pytest

import main
from conftest import cli
from flcore.registry import ALGORITHMS
from utils.results import read_h5

pytestmark = pytest.mark.quick  # the quick tier: every registered algorithm, once per seed

FLAGS = {"FedCP": ("-lam", "1")}  # FedCP's default λ 5 holds Digits' small features in place: see test_behaviour.py


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_algorithm_learns_and_is_deterministic(algo, digits_root, tmp_path):
    runs = []
    for sub in ("a", "b"):
        out = tmp_path / sub
        flags = ("-algo", algo, "-gr", "2", "-lr", "0.1", *FLAGS.get(algo, ()))
        assert main.main(cli(digits_root, out, *flags)) == 0
        runs.append(read_h5(out / f"Digits_{algo}_test_0.h5"))
    a, b = runs
    assert np.all(np.isfinite(a["rs_train_loss"]))
    assert a["rs_test_acc"][-1] > 0.3, a["rs_test_acc"]  # chance is 0.1
    for key in a:
        if key != "rs_round_time":
            assert np.array_equal(a[key], b[key], equal_nan=True), key
