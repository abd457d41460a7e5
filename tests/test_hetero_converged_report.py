"""scripts/experiments/hetero_report.py --converged: the rows of clients with different models at convergence, from a
hand-made export whose numbers are worked out by hand. A row's accuracies appear only once every seed of the
sweep file has ended (finished or diverged), else "pending"; its one-model column comes from Protocol B's
export only where that ran on the split of the heterogeneous runs."""


from conftest import REPO
from scripts.experiments import hetero_report

ROUNDS = list(range(6))  # the last 20 % of rounds 0-5: round 5 alone


def run(acc, seed, status="finished", cpu=10.0, split="hP"):
    return {"run": seed, "status": status, "split_hash": split, "rounds": list(range(len(acc))), "test_acc": acc,
            "cpu_s": cpu}


CONFIG = {"grids": [{"-algo": ["FedProto", "Local", "FD"], "-data": ["P", "D"]}], "seeds": [0, 1, 2]}
HETERO = {"splits": {"P": {
    # best 90, 80, 85 -> 85.00 ± 4.08 (population std: sqrt((25 + 25 + 0) / 3)); last 90, 80, 70 -> 80.00 ± 8.16;
    # still rising: seed 0 gained 90 - 80 = 10 points in round 5, the others nothing -> 3.33; CPU 110 a run
    "FD": {"runs": [run([0.5, 0.6, 0.7, 0.8, 0.8, 0.9], 0, cpu=100.0), run([0.5, 0.6, 0.7, 0.8, 0.8, 0.8], 1, cpu=110.0),
                    run([0.5, 0.6, 0.7, 0.85, 0.7, 0.7], 2, cpu=120.0),
                    run([0.99] * 6, 3, cpu=1000.0)]},  # a seed the sweep file does not name: left out
    # two seeds ended, the third still running: no accuracy, however close the two seeds are
    "Local": {"runs": [run([0.9] * 6, 0, cpu=50.0), run([0.9] * 6, 1, cpu=70.0), run([0.9] * 3, 2, "running")]},
    # seed 0 diverged in round 1 (best and last 20): it has ended, so the cell is complete; best and last
    # 20, 50, 60 -> 43.33 ± 17.00 (deviations -23.33, 6.67, 16.67: sqrt(866.67 / 3)); still rising over
    # seeds 1 and 2 only: 0.00; the diverged run has no CPU record
    "FedProto": {"runs": [run([0.1, 0.2], 0, "diverged", cpu=None), run([0.5] * 6, 1, cpu=40.0),
                          run([0.6] * 6, 2, cpu=50.0)]}}}}
ONE_MODEL = {"splits": {
    "P": {"FD": {"runs": [run([0.9] * 6, 0), run([0.8, 0.95, 0.9, 0.9, 0.9, 0.9], 1)]},  # 92.50 ± 2.50, 90.00 ± 0.00
          "Local": {"runs": [run([0.7] * 6, 0, split="hOther")]}},  # another split of the name P: not shown
    "D": {"FD": {"runs": [run([0.6] * 6, 0, split="hD")]}}}}


def table_rows(text, split):
    """{algorithm: cells} of one split's table in the markdown."""
    block = text.split(f"**{split}**", 1)[1].split("\n\n", 2)[1]
    rows = [line.strip("| ").split(" | ") for line in block.splitlines()[2:]]
    return {cells[0]: cells[1:] for cells in rows}


def test_converged_rows_by_hand():
    text = hetero_report.converged_markdown(HETERO, ONE_MODEL, CONFIG)
    p = table_rows(text, "P")
    assert list(p) == ["Local", "FD", "FedProto"]  # registry order, not the sweep file's
    # FD: 85.00 - 92.50 = -7.50 points of best accuracy with different models
    assert p["FD"] == ["85.00 ± 4.08", "80.00 ± 8.16", "92.50 ± 2.50", "90.00 ± 0.00", "-7.50", "3.33", "110",
                       "3 of 3"]
    assert p["Local"] == ["pending", "pending", "-", "-", "-", "-", "60", "2 of 3"]
    assert p["FedProto"] == ["43.33 ± 17.00", "43.33 ± 17.00", "-", "-", "-", "0.00", "45", "3 of 3"]
    # no run has ended on D: every row pending, the one-model figure shown (nothing to compare hashes with)
    d = table_rows(text, "D")
    assert d["FD"] == ["pending", "pending", "60.00 ± 0.00", "60.00 ± 0.00", "-", "-", "-", "0 of 3"]
    assert d["Local"][:2] == ["pending", "pending"] and d["Local"][2] == "-"
    # 2 of 6 cells; 3 + 2 + 3 runs ended; 100 + 110 + 120 + 50 + 70 + 40 + 50 = 540 CPU-s = 0.150 CPU-hours
    assert text.endswith("2 of 6 cells complete (3 seeds ended each), 8 of 18 runs ended, 0.150 CPU-hours in all "
                         "(the sweep's records: user + system time of each ended run); 1 ended run without a record.")


def test_one_model_column_needs_the_split_of_the_heterogeneous_runs():
    moved = {"splits": {"P": {"FD": {"runs": [run([0.9] * 6, 0, split="hOther")]}}}}
    p = table_rows(hetero_report.converged_markdown(HETERO, moved, CONFIG), "P")
    assert p["FD"][2:5] == ["-", "-", "-"]


def test_sweep_cells_and_ended_runs():
    config = {"grids": [{"-algo": ["A", "B"], "-data": ["S"]}, {"-algo": ["B", "C"], "-data": ["S", "T"]}],
              "seeds": [0, 2]}
    assert hetero_report.sweep_cells(config) == (["S", "T"], ["A", "B", "C"], [0, 2])
    entry = {"runs": [run([0.1], 2), run([0.1], 0, "interrupted"), run([0.1], 1)]}
    assert [r["run"] for r in hetero_report.ended_runs(entry, [0, 2])] == [2]
    assert hetero_report.ended_runs(None, [0]) == []


def test_no_run_ended_yet_gives_the_export_as_it_stands(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    assert hetero_report.converged_data(str(results), tmp_path / "none.json", False) == {"splits": {}}
    assert "no complete result files" in capsys.readouterr().err
    assert hetero_report.converged_data(str(results), tmp_path / "none.json", True) == {"splits": {}}


def test_the_sweep_file_owes_both_splits_every_algorithm_three_seeds():
    import json

    config = json.loads((REPO / "scripts" / "experiments" / hetero_report.CONVERGED_CONFIG).read_text())
    splits, algorithms, seeds = hetero_report.sweep_cells(config)
    assert splits == ["FMNIST_pat_s1200", "FMNIST_dir0.1_s1200"] and seeds == [0, 1, 2]
    quick = json.loads((REPO / "scripts" / "experiments" / "benchmark_hetero.json").read_text())
    assert sorted(algorithms) == sorted(quick["grids"][0]["-algo"])
    assert all(a in config["base"] for a in ("--client_models", "HtFE-cnn", "150", "0.005"))
    assert config["export"] == "docs/benchmarks/hetero_converged.json"
