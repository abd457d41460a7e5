"""Every registered algorithm, for free: a run repeats itself exactly with the same seed (on the tiny split,
both runs in this process, so a run that draws from a random state it did not seed, which the first run moved
on, differs; tests/test_executors.py checks that the fork workers give these numbers). The quick tier, every
algorithm's run learning, is tests/test_behaviour.py's ``test_algorithm_learns``."""
import numpy as np
import pytest

import main
from conftest import cli, sequential_name, sequential_series
from flcore.registry import ALGORITHMS
from utils.results import read_h5

FLAGS = {"FedCP": ("-lam", "1")}  # FedCP's default λ 5 holds Digits' small features in place: see test_behaviour.py


def run_flags(algo: str) -> tuple:
    return ("-lr", "0.1", "-lbs", "20", "-algo", algo, "-gr", "2", "--executor", "sequential", *FLAGS.get(algo, ()))


def shared_run(item) -> str | None:
    """The run the determinism check repeats, named by its flags (tests/conftest.py's ``regroup``): it runs in
    the test process that makes tests/test_executors.py's sequential run of the same flags."""
    if item.originalname != "test_algorithm_is_deterministic":
        return None
    return sequential_name(*run_flags(item.callspec.params["algo"]))


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_algorithm_is_deterministic(algo, digits_tiny_root, tmp_path, tmp_path_factory):
    """Two runs in this process with the same seed give the same numbers. The first is this process's run
    of these flags if one was made already (tests/test_executors.py's sequential run of each algorithm has
    the same flags: conftest's ``sequential_series``), else made here; the second is made now, after it."""
    flags = run_flags(algo)
    a = sequential_series(digits_tiny_root, tmp_path_factory, *flags)
    assert main.main(cli(digits_tiny_root, tmp_path, *flags)) == 0
    b = read_h5(tmp_path / f"Digits_{algo}_test_0.h5")
    assert len(a["rs_round"]) == 3
    assert a.keys() == b.keys() - {"rs_round_time"}
    for key in a:
        assert np.array_equal(a[key], b[key], equal_nan=True), key
