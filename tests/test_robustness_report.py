"""scripts/robustness_report.py: cells from a hand-made export."""
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import robustness_report  # noqa: E402


def entry(algo, attack, rule, seed, last, cpu=1.8, status="finished"):
    return {"algorithm": algo, "attack": attack, "aggregator": rule, "seed": seed, "status": status,
            "benign_acc": [0.1, last], "all_acc": [0.1, 0.0], "malicious_clients": [], "cpu_s": cpu}


def cells_of(text):
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in text.splitlines()}
    return {k: [c.strip() for c in v.strip("|").split("|")][2:] for k, v in rows.items()}


def test_cells_are_mean_and_std_of_the_last_benign_accuracy_over_seeds():
    runs = [entry("FedAvg", "signflip", "median", 0, 0.5), entry("FedAvg", "signflip", "median", 1, 0.7),
            entry("FedAvg", "none", "mean", 0, 0.9)]
    text = robustness_report.markdown(runs)
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in text.splitlines()}
    cells = [c.strip() for c in rows[("FedAvg", "signflip")].strip("|").split("|")]
    assert cells[2:] == ["-", "60.0 ± 10.0", "-", "-", "-", "-"]  # (50 + 70) / 2, population std 10
    assert [c.strip() for c in rows[("FedAvg", "none")].strip("|").split("|")][2] == "90.0 (1)"  # no spread
    assert "3 runs (seeds 0, 1; 0 diverged), 0.00 CPU-hours" in text


def test_diverged_runs_are_counted_in_their_cell_not_dropped():
    nan = float("nan")
    runs = [entry("FedAvg", "gaussian", "mean", s, 0.3 + 0.2 * s) for s in (0, 1, 2)]
    runs += [entry("FedAvg", "scaled", "mean", 0, 0.5), entry("FedAvg", "scaled", "mean", 1, nan, status="diverged"),
             entry("FedAvg", "scaled", "mean", 2, 0.7)]
    runs += [entry("FedAvg", "signflip", "mean", s, nan, status="diverged") for s in (0, 1, 2)]
    runs += [entry("FedAvg", "labelflip", "mean", 0, 0.4)]
    cells = cells_of(robustness_report.markdown(runs))
    assert cells[("FedAvg", "gaussian")][0] == "50.0 ± 16.3"  # 30, 50, 70: population std sqrt(800/3)
    assert cells[("FedAvg", "scaled")][0] == "60.0 ± 10.0 (1 diverged)"  # the NaN run is not averaged
    assert cells[("FedAvg", "signflip")][0] == "diverged"
    assert cells[("FedAvg", "labelflip")][0] == "40.0 (1)"
    assert "10 runs (seeds 0, 1, 2; 4 diverged)" in robustness_report.markdown(runs)


def test_a_rerun_replaces_its_entry_and_keeps_the_others():
    old = [entry("FedAvg", "none", "mean", 0, 0.9), entry("FedALA", "none", "mean", 0, 0.8)]
    merged = robustness_report.merge(old, [entry("FedAvg", "none", "mean", 0, 0.4)])
    assert sorted((e["algorithm"], e["benign_acc"][-1]) for e in merged) == [("FedALA", 0.8), ("FedAvg", 0.4)]
