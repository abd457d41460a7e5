"""scripts/run/benchmark.py runs the executors side by side and reports consistent figures (a smoke test of
the figures' bookkeeping, not a timing test: speed is reported by the script, docs/performance.md)."""
import json

import pytest


def test_benchmark_compares_executors(digits_root, tmp_path):
    from scripts.run import benchmark
    from utils.data_utils import load_split

    n_train = sum(len(c.y_train) for c in load_split("Digits", digits_root, None, "cpu").clients)
    out = tmp_path / "bench.json"
    res = benchmark.main_benchmark(["-data", "Digits", "--dataset_root", str(digits_root), "-dev", "cpu",
                                    "-algo", "FedAvg", "-gr", "2", "--ref_seconds", "0.2", "--json", str(out),
                                    "--executors", "sequential,fork", "--workers", "2"])
    assert json.loads(out.read_text())["runs"][1]["rounds"] == json.loads(json.dumps(res["runs"][1]["rounds"],
                                                                                     default=float))
    seq, fork = res["runs"]
    assert (seq["executor"], seq["workers"], fork["executor"], fork["workers"]) == ("sequential", 0, "fork", 2)
    for run in res["runs"]:
        rounds = run["rounds"]
        assert [r["round"] for r in rounds] == [0, 1]
        for r in rounds:
            phases = sum(r[k] for k in benchmark.PHASES)
            assert 0 < phases <= r["wall"] * 1.001  # the phases are parts of the round's wall time
            assert r["samples"] == n_train  # every client, one epoch
            assert r["reference"] > 0
        samples = sum(r["samples"] for r in rounds)
        assert run["train_samples_per_s"] == pytest.approx(samples / sum(r["train"] for r in rounds))
        assert [c["round"] for c in run["curve"]] == [0, 1, 2]  # evaluations after rounds 0..2
        assert run["steady_round_s"] == pytest.approx(rounds[1]["wall"])  # --steady_from 1: round 1 only
    assert fork["vs_first"] == pytest.approx(fork["steady_round_s"] / seq["steady_round_s"])
    assert fork["same_curve_as_first"]  # the executors give the same numbers
    assert all(m > 0 for m in fork["peak_rss_workers_mb"])
    assert res["train_mflop_per_sample"] > res["eval_mflop_per_sample"] > 0  # backward costs more


def test_benchmark_sets_up_as_main_does(digits_root):
    """The split is loaded and checked by main's own set-up: a class count the split does not have is the
    same one-line error as main.py's, before anything runs."""
    from scripts.run import benchmark
    from utils.errors import FLError

    with pytest.raises(FLError, match="-ncl 3 but split 'Digits' has 10 classes"):
        benchmark.main_benchmark(["-data", "Digits", "--dataset_root", str(digits_root), "-dev", "cpu",
                                  "-algo", "FedAvg", "-gr", "1", "-ncl", "3"])
