"""scripts/hetero_report.py: the one-model column comes from the quick protocol's export, and only from runs
made on the same split as the heterogeneous rows."""
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import hetero_report  # noqa: E402


def run(acc, seed=0, split="h1"):
    return {"run": seed, "test_acc": acc, "rounds": list(range(len(acc))), "split_hash": split, "mb_up": 1.0,
            "mb_down": 1.0, "cpu_s": 1.0}


def test_one_model_cells_come_from_quick_runs_on_the_same_split():
    hetero = {"splits": {"S": {"FD": {"runs": [run([0.1, 0.2])]}, "Local": {"runs": [run([0.1, 0.3])]}}}}
    quick = {"splits": {"S": {
        "FD": {"runs": [run([0.2, 0.5, 0.4], 0), run([0.2, 0.7, 0.7], 1)]},     # best 50, 70; last 40, 70
        "Local": {"runs": [run([0.9, 0.9], 0, split="h2")]},                     # another split: left out
        "FedAvg": {"runs": [run([0.3, 0.4], 0)]}}}}
    cells = hetero_report.shared_model_cells(quick, hetero)
    assert cells == {"FD": ("60.00 ± 10.00", "55.00 ± 15.00"), "FedAvg": ("40.00", "40.00")}  # bold dropped
    mixed = {"splits": {"S": {"FD": {"runs": [run([0.1]), run([0.1], 1, split="h2")]}}}}
    assert hetero_report.shared_model_cells(quick, mixed) == {}  # heterogeneous runs on two splits: nothing
    assert hetero_report.shared_model_cells({}, hetero) == {}
