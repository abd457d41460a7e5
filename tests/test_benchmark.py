"""scripts/benchmark.py runs and reports consistent figures (a smoke test of the figures' bookkeeping,
not a timing test: speed is reported by the script, docs/performance.md)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


@pytest.mark.parametrize("extra", [(), ("--engine", "batched", "--engine_workers", "2")])
def test_benchmark_reports_phases_reference_and_curve(digits_root, tmp_path, extra):
    import benchmark
    from utils.data_utils import load_split

    n_train = sum(len(c.y_train) for c in load_split("Digits", digits_root, None, "cpu").clients)
    out = tmp_path / "bench.json"
    res = benchmark.main_benchmark(["-data", "Digits", "--dataset_root", str(digits_root), "-dev", "cpu",
                                    "-algo", "FedAvg", "-gr", "2", "--ref_seconds", "0.2", "--json", str(out),
                                    *extra])
    assert json.loads(out.read_text())["rounds"] == json.loads(json.dumps(res["rounds"], default=float))
    rounds = res["rounds"]
    assert [r["round"] for r in rounds] == [0, 1]
    for r in rounds:
        phases = sum(r[k] for k in benchmark.PHASES)
        assert 0 < phases <= r["wall"] * 1.001  # the phases are parts of the round's wall time
        assert r["samples"] == n_train  # every client, one epoch
        assert r["reference"] > 0
    samples = sum(r["samples"] for r in rounds)
    assert res["train_samples_per_s"] == pytest.approx(samples / sum(r["train"] for r in rounds))
    assert len(res["train_vs_reference_per_round"]) == 2
    assert [c["round"] for c in res["curve"]] == [0, 1, 2]  # evaluations after rounds 0..2
    assert res["train_mflop_per_sample"] > res["eval_mflop_per_sample"] > 0  # backward costs more
    assert res["peak_rss_mb"] > 0
