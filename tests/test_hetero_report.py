"""scripts/experiments/hetero_report.py: one table per split of the heterogeneous export; its one-model column comes
from the quick protocol's export, else from the one-model export, and only from runs made on the same split as the
heterogeneous rows."""
import json

import pytest

from scripts.experiments import hetero_report


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


# Two splits: "F" whose one-model runs are the quick protocol's, "C" whose are the one-model sweep's. Cells by hand:
# C, different models: FD best 40, 30 -> 35 ± 5, last 40, 30 -> 35 ± 5; Local 50 (bold: the column's best).
# C, one model: FD best 30, 50 -> 40 ± 10, last 20, 40 -> 30 ± 10 (the quick runs of C are on another split,
# so the one-model export's); Local's one-model runs are on another split too: "-".
# F, one model: FD 60 from the quick export, which wins over the one-model export's 10 on the same split.
HETERO = {"splits": {
    "F": {"FD": {"runs": [run([0.1, 0.2])]}},
    "C": {"FD": {"runs": [run([0.2, 0.4], 0, "c1"), run([0.3, 0.3], 1, "c1")]},
          "Local": {"runs": [run([0.5], 0, "c1")]}}}}
QUICK = {"splits": {"F": {"FD": {"runs": [run([0.5, 0.6], 0)]}},
                    "C": {"FD": {"runs": [run([0.9], 0, "other")]}}}}
ONE = {"splits": {"F": {"FD": {"runs": [run([0.1], 0)]}},
                  "C": {"FD": {"runs": [run([0.1, 0.3, 0.2], 0, "c1"), run([0.2, 0.5, 0.4], 1, "c1")]},
                        "Local": {"runs": [run([0.6, 0.7], 0, "c2")]}}}}
FD_WIRE = "per-label mean logits, up and down (C x C numbers at most)"  # README's table


def test_each_split_takes_the_quick_export_first_then_the_one_model_export():
    assert hetero_report.shared_model_cells(QUICK, HETERO, "C", ONE) == {"FD": ("40.00 ± 10.00", "30.00 ± 10.00")}
    assert hetero_report.shared_model_cells(QUICK, HETERO, "F", ONE) == {"FD": ("60.00", "60.00")}
    assert hetero_report.shared_model_cells(QUICK, HETERO, "C") == {}  # no one-model export: nothing on C
    with pytest.raises(ValueError, match="holds 2 splits"):
        hetero_report.shared_model_cells(QUICK, HETERO)


def test_one_table_per_split_with_its_own_one_model_source():
    text = hetero_report.hetero_markdown(HETERO, QUICK, ONE)
    f, c = text.split("\n\n**C**\n\n")
    assert f.startswith("**F**\n\n| algorithm |")
    assert f"| FD | 20.00 | 20.00 | 60.00 | 60.00 | {FD_WIRE} | 1.00 / 1.00 | 1 | 1 |" in f.splitlines()
    assert f.endswith("One model: docs/benchmarks/quick.json.")
    rows = c.splitlines()
    assert rows[2:4] == ["| Local | **50.00** | **50.00** | - | - | nothing | 1.00 / 1.00 | 1 | 1 |",
                         f"| FD | 35.00 ± 5.00 | 35.00 ± 5.00 | 40.00 ± 10.00 | 30.00 ± 10.00 | {FD_WIRE} | 1.00 / 1.00 "
                         f"| 1 | 2 |"]
    assert rows[4] == ""  # a blank line ends the table
    # 3 runs of 1 CPU-s; the one-model column's 2 runs (FD's; Local's are on another split), 2 CPU-s
    assert rows[5] == ("2 algorithms, 3 runs (1 or 2 seeds each), 0.001 CPU-hours in all (the sweep's records: user "
                       "+ system time of each run and its worker processes). One model: "
                       "docs/benchmarks/hetero_one.json; its 2 runs for this column took 0.001 CPU-hours.")


def test_the_report_reads_both_exports_and_a_missing_one_model_export_leaves_its_column_empty(tmp_path, monkeypatch,
                                                                                              capsys):
    (tmp_path / "hetero.json").write_text(json.dumps(HETERO))
    (tmp_path / "quick.json").write_text(json.dumps(QUICK))
    (tmp_path / "one.json").write_text(json.dumps(ONE))
    monkeypatch.setattr(hetero_report.report, "QUICK_EXPORT", tmp_path / "quick.json")
    flags = ["--from-export", "--print", "--export", str(tmp_path / "hetero.json")]
    assert hetero_report.main([*flags, "--one-export", str(tmp_path / "one.json")]) == 0
    assert "| FD | 35.00 ± 5.00 | 35.00 ± 5.00 | 40.00 ± 10.00 | 30.00 ± 10.00 |" in capsys.readouterr().out
    assert hetero_report.main([*flags, "--one-export", str(tmp_path / "absent.json")]) == 0
    out = capsys.readouterr().out
    assert "| FD | 35.00 ± 5.00 | 35.00 ± 5.00 | - | - |" in out and "One model: no runs on this split." in out
