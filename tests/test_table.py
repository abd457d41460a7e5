"""scripts/run/table.py: mean ± std over seeds of synthetic result files against hand-computed values, the
best-entry marks, the warnings, and the reproduction command (parsed back into the same configuration)."""
import csv
import io
import json
import math
import shlex
from pathlib import Path

import numpy as np
import pytest

from scripts.run import table
from utils.results import RunRecorder

BASE_CONFIG = {"dataset": "Digits", "algorithm": "FedAvg", "ala": False, "global_rounds": 2,
               "local_learning_rate": 0.05, "batch_size": 10, "goal": "t", "seed": 0, "results_dir": "x"}


def write_run(out: Path, algo: str, run: int, acc, auc=None, round_time=(1.0, 1.0), label=None, stem=None,
              rounds=None, clients=None, status=None, round_bytes=None, benign=None, **config):
    """One synthetic result file (h5 + sidecar) written by the library's own RunRecorder."""
    cfg = {**BASE_CONFIG, "algorithm": algo, "global_rounds": len(acc) - 1, **config}
    meta = {"config": cfg, "run": run, "seed": cfg["seed"] + run, "label": label or algo}
    rec = RunRecorder(stem or f"{cfg['dataset']}_{label or algo}_{cfg['goal']}_{run}", meta, out)
    auc = auc if auc is not None else [0.5 + a / 2 for a in acc]
    for i, a in enumerate(acc):
        summary = {"test_acc": a, "test_auc": auc[i], "train_loss": 2.0 - a}
        if clients is not None:
            summary["client_test_acc"] = clients[i]
        if benign is not None:  # --attack: the benign clients' accuracy beside every client's
            summary["benign_test_acc"] = benign[i]
        rec.add(i if rounds is None else rounds[i], summary)
    rec.round_time = list(round_time)
    if round_bytes is not None:
        rec.round_bytes = {k: list(v) for k, v in round_bytes.items()}
    rec.save()
    if status is not None:  # how the run ended, as main.py records it
        meta = json.loads(rec.json_path.read_text())
        rec.json_path.write_text(json.dumps({**meta, "status": status, "status_reason": f"{status} here"}))
    return rec.h5_path


def csv_rows(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.fixture
def two_algos(tmp_path):
    # FedAvg: best 0.5/0.6/0.7 (mean 60, std sqrt(200/3)), last 0.4/0.6/0.5; FedALA: best 0.8/0.9, last 0.8/0.7
    write_run(tmp_path, "FedAvg", 0, [0.1, 0.5, 0.4], round_time=(1.0, 2.0))
    write_run(tmp_path, "FedAvg", 1, [0.1, 0.3, 0.6], round_time=(2.0, 2.0))
    write_run(tmp_path, "FedAvg", 2, [0.1, 0.7, 0.5], round_time=(3.0, 3.0))
    write_run(tmp_path, "FedALA", 0, [0.1, 0.8, 0.8], round_time=(4.0, 4.0))
    write_run(tmp_path, "FedALA", 1, [0.1, 0.9, 0.7], round_time=(4.0, 6.0))
    return tmp_path


def test_means_and_stds_match_hand_computation(two_algos):
    warnings = []
    text = table.build_table([str(two_algos)], ["algorithm"], ["best", "last", "auc", "target", "time", "seeds"],
                             "csv", target=0.6, warn=warnings.append)
    rows = {r["algorithm"]: r for r in csv_rows(text)}
    avg, ala = rows["FedAvg"], rows["FedALA"]
    assert float(avg["best_mean"]) == pytest.approx(60.0)
    assert float(avg["best_std"]) == pytest.approx(math.sqrt(((50 - 60) ** 2 + 0 + (70 - 60) ** 2) / 3), rel=1e-5)
    assert float(avg["last_mean"]) == pytest.approx(50.0)
    assert float(avg["last_std"]) == pytest.approx(math.sqrt(200 / 3), rel=1e-5)
    assert float(ala["best_mean"]) == pytest.approx(85.0) and float(ala["best_std"]) == pytest.approx(5.0)
    assert float(ala["last_mean"]) == pytest.approx(75.0) and float(ala["last_std"]) == pytest.approx(5.0)
    # AUC = 0.5 + acc / 2 at every evaluation: best AUC = 50 + best acc / 2 (in %)
    assert float(avg["auc_mean"]) == pytest.approx(80.0)
    # rounds to 60 %: FedAvg seed 0 never (0.5 max), seed 1 at round 2, seed 2 at round 1; FedALA at round 1
    assert (float(avg["target_mean"]), float(avg["target_std"]), avg["target_reached"]) == (1.5, 0.5, "2")
    assert (float(ala["target_mean"]), ala["target_reached"]) == (1.0, "2")
    # seconds per round: the mean of each run's round times, then over seeds
    assert float(avg["time_mean"]) == pytest.approx(np.mean([1.5, 2.0, 3.0]))
    assert float(ala["time_mean"]) == pytest.approx(np.mean([4.0, 5.0]))
    assert (avg["seeds"], ala["seeds"]) == ("3", "2")
    # best entry per column: accuracies and AUC highest (FedALA), rounds and seconds lowest
    assert set(ala["best_in"].split(";")) == {"best", "last", "auc", "target"}
    assert avg["best_in"] == "time"
    # rows in registry order (FedAvg is registered before FedALA), not alphabetical
    assert [r["algorithm"] for r in csv_rows(text)] == ["FedAvg", "FedALA"]


def test_markdown_and_latex_mark_the_best(two_algos):
    cols = ["best", "last", "time", "seeds"]
    md = table.build_table([str(two_algos)], ["algorithm"], cols, "md", warn=lambda m: None).splitlines()
    assert md[0] == "| algorithm | best acc (%) | last acc (%) | s/round | seeds |"
    assert md[2] == "| FedAvg | 60.00 ± 8.16 | 50.00 ± 8.16 | **2.17** | 3 |"
    assert md[3] == "| FedALA | **85.00 ± 5.00** | **75.00 ± 5.00** | 4.50 | 2 |"
    tex = table.build_table([str(two_algos)], ["algorithm"], cols, "latex", warn=lambda m: None)
    assert r"FedALA & $\mathbf{85.00 \pm 5.00}$ & $\mathbf{75.00 \pm 5.00}$ & $4.50$ & 2 \\" in tex
    assert r"best acc (\%)" in tex and tex.startswith(r"\begin{tabular}{lrrrr}")


def test_seed_count_warning(two_algos):
    warnings = []
    table.build_table([str(two_algos)], ["algorithm"], ["best"], "md", warn=warnings.append)
    assert warnings == ["rows average different numbers of seeds: FedAvg 3, FedALA 2"]
    write_run(two_algos, "FedALA", 2, [0.1, 0.8, 0.8])
    warnings = []
    table.build_table([str(two_algos)], ["algorithm"], ["best"], "md", warn=warnings.append)
    assert warnings == []


def test_differing_keys_warned_unless_grouped(tmp_path):
    for run in (0, 1):
        write_run(tmp_path, "FedAvg", run, [0.1, 0.5], local_learning_rate=0.05)
        write_run(tmp_path, "FedProx", run, [0.1, 0.5], local_learning_rate=0.1, mu=0.01)
        write_run(tmp_path, "Ditto", run, [0.1, 0.5], local_learning_rate=0.1, mu=0.1)
    warnings = []
    table.build_table([str(tmp_path)], ["algorithm"], ["best"], "md", warn=warnings.append)
    assert len(warnings) == 1 and "rows differ in keys that are not grouped: local_learning_rate" in warnings[0]
    warnings = []
    table.build_table([str(tmp_path)], ["algorithm", "local_learning_rate"], ["best"], "md", warn=warnings.append)
    assert warnings == []
    # an algorithm's own flag (mu of FedProx and of Ditto) is not compared between algorithms
    warnings = []
    table.build_table([str(tmp_path / "*FedProx*.h5"), str(tmp_path / "*Ditto*.h5")], ["algorithm"], ["best"], "md",
                      warn=warnings.append)
    assert warnings == []
    # within one row: two learning rates averaged into one mean
    write_run(tmp_path, "FedAvg", 2, [0.1, 0.5], local_learning_rate=0.2, goal="u")
    write_run(tmp_path, "FedProx", 2, [0.1, 0.5], local_learning_rate=0.1, mu=0.01)
    warnings = []
    table.build_table([str(tmp_path)], ["algorithm"], ["best"], "md", warn=warnings.append)
    assert any(w.startswith("FedAvg averages runs that differ in local_learning_rate (0.05, 0.2)") for w in warnings)


def test_group_by_any_key_and_ala_label(tmp_path):
    for run in (0, 1):
        write_run(tmp_path, "FedAvg", run, [0.1, 0.5 + run / 10], dataset="A")
        write_run(tmp_path, "FedAvg", run, [0.1, 0.3], dataset="B")
        write_run(tmp_path, "FedAvg", run, [0.1, 0.9], dataset="A", ala=True, label="FedAvg+ALA")
    rows = csv_rows(table.build_table([str(tmp_path)], ["algorithm", "dataset"], ["best"], "csv", warn=print))
    got = {(r["algorithm"], r["dataset"]): float(r["best_mean"]) for r in rows}
    assert got == {("FedAvg", "A"): pytest.approx(55.0), ("FedAvg", "B"): pytest.approx(30.0),
                   ("FedAvg+ALA", "A"): pytest.approx(90.0)}
    with pytest.raises(table.TableError, match="no config key 'nonsense'"):
        table.build_table([str(tmp_path)], ["nonsense"], ["best"], "md")


def test_incomplete_runs_left_out_with_a_warning(tmp_path):
    write_run(tmp_path, "FedAvg", 0, [0.1, 0.5, 0.6])
    write_run(tmp_path, "FedAvg", 1, [0.1, 0.9], global_rounds=2)  # stopped after its round-1 evaluation
    warnings = []
    rows = csv_rows(table.build_table([str(tmp_path)], ["algorithm"], ["best"], "csv", warn=warnings.append))
    assert rows[0]["seeds"] == "1" and float(rows[0]["best_mean"]) == pytest.approx(60.0)
    assert len(warnings) == 1 and "incomplete (last evaluation: round 1 of 2" in warnings[0]
    rows = csv_rows(table.build_table([str(tmp_path)], ["algorithm"], ["best"], "csv", incomplete=True,
                                      warn=lambda m: None))
    assert rows[0]["seeds"] == "2"
    # the sidecar's status: a diverged run is a result (counted, with a warning), an interrupted one is not
    write_run(tmp_path, "FedAvg", 2, [0.1, 0.3], global_rounds=2, status="diverged")
    write_run(tmp_path, "FedAvg", 3, [0.1, 0.9], global_rounds=2, status="interrupted")
    warnings = []
    rows = csv_rows(table.build_table([str(tmp_path)], ["algorithm"], ["best"], "csv", warn=warnings.append))
    assert rows[0]["seeds"] == "2" and float(rows[0]["best_mean"]) == pytest.approx(45.0)
    assert sum("diverged (diverged here)" in w for w in warnings) == 1
    assert sum("status interrupted); left out" in w for w in warnings) == 1


def test_inputs_globs_json_and_errors(two_algos, capsys):
    assert table.main([str(two_algos / "*FedALA*.json"), "--format", "csv", "--columns", "best,seeds"]) == 0
    rows = csv_rows(capsys.readouterr().out)
    assert [(r["algorithm"], r["seeds"]) for r in rows] == [("FedALA", "2")]
    assert table.main([str(two_algos / "nothing*.h5")]) == 2
    assert "no result files match" in capsys.readouterr().err
    assert table.main([str(two_algos), "--columns", "target"]) == 2


def test_reproduction_command_parses_back_to_the_config():
    import cli
    import main

    cfg = cli.parse_config(["-data", "Digits", "-algo", "FedProx", "-mu", "0.1", "-lr", "0.05", "-ala", "-gr", "7",
                             "-go", "x", "--executor", "sequential", "--no-progress", "--seed", "3"]).to_dict()
    cmd = table.reproduce_command(cfg, [1, 2])
    assert cmd.startswith("python system/main.py -data Digits -algo FedProx -gr 7 ")
    argv = shlex.split(cmd)[2:]
    assert argv[-4:] == ["-pv", "1", "-t", "3"]
    again = cli.parse_config(argv).to_dict()
    skip = table.NOT_IN_COMMAND | {"prev", "times"}
    assert {k: v for k, v in again.items() if k not in skip} == {k: v for k, v in cfg.items() if k not in skip}
    assert (again["prev"], again["times"]) == (1, 3)


def test_bytes_per_round_when_recorded(tmp_path):
    write_run(tmp_path, "FedAvg", 0, [0.1, 0.5, 0.6], round_bytes={"up": [1e6, 3e6], "down": [2e6, 2e6]})
    write_run(tmp_path, "FedAvg", 1, [0.1, 0.5, 0.6], round_bytes={"up": [1e6, 1e6], "down": [1e6, 1e6]})
    rows = csv_rows(table.build_table([str(tmp_path)], ["algorithm"], ["comm"], "csv", warn=print))
    assert float(rows[0]["comm_mean"]) == pytest.approx(np.mean([4.0, 2.0]))  # MB per round, up + down
    other = tmp_path / "old"
    write_run(other, "FedAvg", 0, [0.1, 0.5, 0.6])
    md = table.build_table([str(other)], ["algorithm"], ["best", "comm"], "md", drop_unrecorded=True, warn=print)
    assert "MB/round" not in md


def write_series(path: Path, **series) -> None:
    """Add series to a written result file (what --val_ratio, -nnc and the fairness figures record)."""
    import h5py

    with h5py.File(path, "a") as f:
        for key, values in series.items():
            f.create_dataset(key, data=np.asarray(values, dtype=np.float64))


def test_selected_column_is_the_test_accuracy_at_the_best_validation_round(tmp_path):
    """Run 0: validation best at round 1 (0.6; test 0.5), test best 0.7 at round 2; run 1: validation ties at
    rounds 1 and 2 (the first counts: test 0.4). selected = mean(50, 40) = 45 beside best mean(70, 80) = 75."""
    write_series(write_run(tmp_path, "FedAvg", 0, [0.1, 0.5, 0.7]), rs_val_acc=[0.2, 0.6, 0.55])
    write_series(write_run(tmp_path, "FedAvg", 1, [0.1, 0.4, 0.8]), rs_val_acc=[0.2, 0.5, 0.5])
    row = csv_rows(table.build_table([str(tmp_path)], ["algorithm"], ["best", "last", "selected"], "csv"))[0]
    assert float(row["selected_mean"]) == pytest.approx(45.0)
    assert float(row["selected_std"]) == pytest.approx(5.0)
    assert float(row["best_mean"]) == pytest.approx(75.0) and float(row["last_mean"]) == pytest.approx(75.0)


def test_new_client_and_fairness_columns(tmp_path, capsys):
    """new: the rs_new_test_acc entry; worst / p10 / spread: the last evaluation's values, in %."""
    path = write_run(tmp_path, "FedAvg", 0, [0.1, 0.5, 0.7])
    write_series(path, rs_new_round=[2], rs_new_test_acc=[0.42], rs_test_acc_min=[0.0, 0.2, 0.3],
                 rs_test_acc_p10=[0.0, 0.25, 0.35], rs_test_acc_std=[0.1, 0.2, 0.15])
    row = csv_rows(table.build_table([str(tmp_path)], ["algorithm"], ["new", *table.FAIRNESS], "csv"))[0]
    assert [float(row[f"{c}_mean"]) for c in ("new", "worst", "p10", "spread")] == pytest.approx([42, 30, 35, 15])
    assert table.main([str(tmp_path), "--fairness"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert "new-client acc (%)" in head and "worst client (%)" in head and "acc at best val" not in head


def test_a_tie_in_every_row_is_not_bold(tmp_path):
    """Both rows last at 50.00 (not bold); best 60 vs 55 (FedAvg bold); auc ties as shown too."""
    write_run(tmp_path, "FedAvg", 0, [0.1, 0.6, 0.5], auc=[0.5, 0.9, 0.9])
    write_run(tmp_path, "FedALA", 0, [0.1, 0.55, 0.5], auc=[0.5, 0.9, 0.9000001])
    md = table.build_table([str(tmp_path)], ["algorithm"], ["best", "last", "auc"]).splitlines()
    assert md[2] == "| FedAvg | **60.00** | 50.00 | 90.00 |"
    assert md[3] == "| FedALA | 55.00 | 50.00 | 90.00 |"


def test_with_an_attack_the_accuracies_are_the_benign_clients(tmp_path):
    attacked = table.read_run(write_run(tmp_path, "FedAvg", 0, [0.1, 0.5, 0.4], benign=[0.2, 0.7, 0.6],
                                        attack="signflip"))
    assert (table.run_metrics(attacked, None)["best"], table.run_metrics(attacked, None)["last"]) == (70.0, 60.0)
    clean = table.read_run(write_run(tmp_path, "FedALA", 0, [0.1, 0.5, 0.4]))
    assert table.run_metrics(clean, None)["last"] == 40.0
