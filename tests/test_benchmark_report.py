"""scripts/experiments/benchmark_report.py: the export of real result files and its merging, and both protocols' tables,
the flatness check and the rank correlation computed from hand-made exports whose values are worked out by
hand."""
import json

import numpy as np
import pytest

from scripts.experiments import benchmark_report as br


def run(acc, rounds=None, up=2.0, down=3.0, s=0.5, cpu=10.0, seed=0, split="h1"):
    rounds = list(range(len(acc))) if rounds is None else rounds
    return {"run": seed, "status": "finished", "commit": "x", "split_hash": split, "rounds": rounds, "test_acc": acc, "mb_up": up,
            "mb_down": down, "s_per_round": s, "cpu_s": cpu}


def test_flatness_is_the_best_gained_after_the_first_80_percent_of_rounds():
    # rounds 0..10: the best up to round 8 is 0.60 (round 5), the best overall 0.63 (round 9): 3 points;
    # a second seed that peaked early gained nothing: the mean is 1.5
    rising = run([0.1, 0.2, 0.3, 0.4, 0.5, 0.60, 0.55, 0.58, 0.59, 0.63, 0.62])
    early = run([0.1, 0.9, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.85, 0.8])
    assert br.flatness({"runs": [rising]}) == pytest.approx(3.0)
    assert br.flatness({"runs": [early]}) == pytest.approx(0.0)
    assert br.flatness({"runs": [rising, early]}) == pytest.approx(1.5)
    # a run that diverged in round 2 has no last 20 % of rounds: left out, and a row of such runs has none
    diverged = {**run([0.1, 0.5, 0.1]), "status": "diverged"}
    assert br.flatness({"runs": [rising, diverged]}) == pytest.approx(3.0)
    assert np.isnan(br.flatness({"runs": [diverged]}))


def test_spearman_by_hand():
    # ours orders A > B > C > D; PFLlib's values order C > D > B > A -> ascending ranks (4,3,2,1) vs
    # (1,2,4,3): d = 3, 1, -2, -2, sum d^2 = 18, rho = 1 - 6 * 18 / (4 * (16 - 1)) = -0.8
    ours = {"A": 90.0, "B": 80.0, "C": 70.0, "D": 60.0, "only-here": 50.0}
    theirs = {"A": 1.0, "B": 2.0, "C": 4.0, "D": 3.0, "only-there": 9.0}
    rho, n = br.spearman(ours, theirs)
    assert n == 4 and rho == pytest.approx(-0.8)
    assert br.ranks({"a": 3.0, "b": 5.0, "c": 3.0}) == {"a": 2.5, "b": 1.0, "c": 2.5}


def test_converged_table_by_hand():
    """Two algorithms over two seeds: best/last mean ± population std, the PFLlib cell, the bold best,
    bytes and seconds means, the flatness column and the summary lines."""
    rounds = list(range(6))  # the last 20 % of 5 rounds: round 5 alone
    data = {"splits": {"FMNIST_pat_s2000": {
        "FedAvg": {"command": "c1", "runs": [run([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], rounds, 2.0, 4.0, 1.0, 3600.0),
                                             run([0.1, 0.2, 0.3, 0.4, 0.5, 0.4], rounds, 4.0, 6.0, 2.0, 3600.0)]},
        "FedALA": {"command": "c2", "runs": [run([0.5, 0.9, 0.9, 0.9, 0.9, 0.9], rounds, 1.0, 1.0, 1.0, None)]}}}}
    board = {"rows": {"FedAvg": {"pat": [80.41, 0.08]}, "FedALA": {"pat": [99.57, 0.01]},
                      "FedRep": {"pat": [99.0, 0.1]}}}
    text, s = br.converged_markdown(data, board, "FMNIST_pat_s2000")
    lines = text.splitlines()
    # FedAvg: best 60 and 50 -> 55.00 ± 5.00, last 60 and 40 -> 50.00 ± 10.00; still rising: seed 0 gained
    # 60 - 50 = 10 points in round 5, seed 1 nothing -> 5.00; MB 3.00 / 5.00; s/round 1.50
    assert lines[2] == "| FedAvg | 55.00 ± 5.00 | 50.00 ± 10.00 | 80.41 ± 0.08 | 5.00 | 3.00 / 5.00 | 1.50 | 2 |"
    assert lines[3] == "| FedALA | **90.00** | **90.00** | 99.57 ± 0.01 | 0.00 | 1.00 / 1.00 | 1.00 | 1 |"  # one seed: no ±
    assert s["common"] == 2 and np.isnan(s["spearman"])  # fewer than three in common: no correlation
    assert s["cpu_hours"] == pytest.approx(2.0) and s["cpu_missing"] == 1
    summary = br.summary_markdown("FMNIST_pat_s2000", s)
    assert "FedALA 0.00, FedAvg 5.00: does NOT hold" in summary and "2.00 CPU-hours over 3 runs" in summary
    assert summary.endswith("the CPU seconds are each run's own): not recorded 3.")
    data["splits"]["FMNIST_pat_s2000"]["FedAvg"]["runs"][0]["executor"] = "fork"
    data["splits"]["FMNIST_pat_s2000"]["FedALA"]["runs"][0]["executor"] = "sequential"
    s = br.converged_markdown(data, board, "FMNIST_pat_s2000")[1]
    assert br.summary_markdown("FMNIST_pat_s2000", s).endswith("fork 1, not recorded 1, sequential 1.")
    # a row whose every run diverged has no still-rising figure
    data["splits"]["FMNIST_pat_s2000"]["pFedMe"] = {"command": "c3", "runs": [
        {**run([0.1, 0.3], [0, 1], 1.0, 1.0, 1.0, 5.0), "status": "diverged"}]}
    row = br.converged_markdown(data, board, "FMNIST_pat_s2000")[0].splitlines()[-1]
    assert row == "| pFedMe | 30.00 | 30.00 | - | - | 1.00 / 1.00 | 1.00 | 1 |"


def test_export_holds_each_runs_curve_and_command(digits_tiny_root, tmp_path):
    import main
    from conftest import cli

    out = tmp_path / "res"
    assert main.main(cli(digits_tiny_root, out, "-gr", "2", "-lr", "0.1", "--executor", "sequential", "-t", "2")) == 0
    data = br.write_export(str(out), tmp_path / "export.json", "benchmark_converged.json")
    assert json.loads((tmp_path / "export.json").read_text()) == data
    assert data["protocol"].startswith("docs/benchmark.md, Protocol B")
    entry = data["splits"]["Digits"]["FedAvg"]
    assert "-pv" not in entry["command"] and "-t 2" in entry["command"] and "-gr 2" in entry["command"]
    import h5py

    for i, r in enumerate(entry["runs"]):
        with h5py.File(out / f"Digits_FedAvg_test_{i}.h5", "r") as f:
            assert r["run"] == i and r["rounds"] == [0, 1, 2]
            assert np.allclose(r["test_acc"], f["rs_test_acc"][()], atol=1e-6)
            assert r["mb_up"] == pytest.approx(np.mean(f["rs_bytes_up"][()]) / 1e6, abs=1e-4)
        sidecar = json.loads((out / f"Digits_FedAvg_test_{i}.json").read_text())
        assert r["split_hash"] == sidecar["split"]["config_hash"] and len(r["split_hash"]) == 16
        assert r["cpu_s"] is None  # not run by a sweep
        assert r["executor"] == "sequential" == sidecar["config"]["executor"]


def test_a_run_without_a_timed_round_exports_null_seconds_and_shows_a_dash(digits_tiny_root, tmp_path, monkeypatch):
    """A run that stopped after its round-0 evaluation (one that diverged in its first round) timed no
    round: its seconds are JSON null, not NaN (which strict JSON readers refuse), and its cell is "-"."""
    import main
    from conftest import cli
    from runtime import client_steps
    from utils.errors import Diverged

    def diverge(client, round_idx):
        raise Diverged(f"client {client.id}: training loss became nan")

    monkeypatch.setattr(client_steps, "train", diverge)
    out = tmp_path / "res"
    assert main.main(cli(digits_tiny_root, out, "-gr", "3", "--executor", "sequential")) == 2
    data = br.write_export(str(out), tmp_path / "export.json", "benchmark_converged.json")
    json.loads((tmp_path / "export.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the export"))
    r, = data["splits"]["Digits"]["FedAvg"]["runs"]
    assert r["rounds"] == [0] and r["s_per_round"] is None
    assert r["mb_up"] is None and r["mb_down"] is None  # no round: no bytes either (not 0, which is a value)
    timed = run([0.1, 0.5], up=2.0, down=3.0, s=2.0)
    board = {"rows": {}}
    untimed = dict(run([0.1]), s_per_round=None, mb_up=None, mb_down=None)
    for runs, mb, seconds in (([untimed], "-", "-"), ([untimed, timed], "2.00 / 3.00", "2.00")):
        table = br.converged_markdown({"splits": {"FMNIST_pat_s2000": {"A": {"command": "c", "runs": runs}}}},
                                      board, "FMNIST_pat_s2000")[0]
        assert table.splitlines()[2].split(" | ")[-3:-1] == [mb, seconds]
    # the quick table's timing run likewise: one that reproduces seed 0 but timed no round shows "-"
    quick = {"splits": {"S": {"FedAvg": {"command": "c", "runs": [untimed],
                                         "timing": {"test_acc": untimed["test_acc"], "s_per_round": None}}}}}
    text, problems = br.quick_markdown(quick)
    assert text.splitlines()[2].split(" | ")[-2] == "-" and problems == []


def test_merge_keeps_old_runs_and_lets_new_ones_replace_theirs():
    old = {"splits": {"S": {"FedAvg": {"command": "old", "runs": [run([0.1], seed=0), run([0.2], seed=1)]},
                            "Local": {"command": "l", "runs": [run([0.3])]}}}}
    new = {"splits": {"S": {"FedAvg": {"command": "new", "runs": [run([0.9], seed=1), run([0.8], seed=2)],
                                       "timing": {"s_per_round": 1.0}}},
                      "T": {"Ditto": {"command": "d", "runs": [run([0.5])]}}}}
    merged = br.merge_exports(old, new)
    fedavg = merged["splits"]["S"]["FedAvg"]
    assert [(r["run"], r["test_acc"]) for r in fedavg["runs"]] == [(0, [0.1]), (1, [0.9]), (2, [0.8])]
    assert fedavg["command"] == "new" and fedavg["timing"] == {"s_per_round": 1.0}
    assert merged["splits"]["S"]["Local"] == old["splits"]["S"]["Local"]
    assert merged["splits"]["T"]["Ditto"]["runs"][0]["test_acc"] == [0.5]
    assert old["splits"]["S"]["FedAvg"]["command"] == "old"  # the inputs are not changed


def test_export_folds_new_results_into_the_committed_one(digits_tiny_root, tmp_path):
    import main
    from conftest import cli

    out = tmp_path / "res"
    assert main.main(cli(digits_tiny_root, out, "-gr", "1", "-lr", "0.1", "--executor", "sequential")) == 0
    export = tmp_path / "quick.json"
    export.write_text(json.dumps({"splits": {"Digits": {"Local": {"command": "kept", "runs": [run([0.5])]}}}}))
    data = br.write_export(str(out), export, "benchmark_zoo.json", timing=str(out))
    entries = data["splits"]["Digits"]
    assert entries["Local"]["command"] == "kept" and len(entries["FedAvg"]["runs"]) == 1
    assert entries["FedAvg"]["timing"]["test_acc"] == entries["FedAvg"]["runs"][0]["test_acc"]
    with pytest.raises(br.table.TableError):
        br.write_export(str(tmp_path / "none"), tmp_path / "absent.json", "benchmark_zoo.json")


def test_quick_table_by_hand():
    """Best/last over seeds, MB means, the timing run's seconds only where it reproduces seed 0."""
    a0, a1 = run([0.2, 0.5, 0.4], up=1.0, down=2.0, seed=0), run([0.2, 0.7, 0.7], up=3.0, down=4.0, seed=1)
    b0 = run([0.3, 0.6, 0.6], seed=0)
    data = {"splits": {"S": {
        "Local": {"command": "c", "runs": [b0], "timing": {"test_acc": [0.3, 0.6, 0.61], "s_per_round": 9.0}},
        "FedAvg": {"command": "c", "runs": [a0, a1], "timing": {"test_acc": a0["test_acc"], "s_per_round": 0.25}},
        "Ditto": {"command": "c", "runs": [b0]}}}}
    text, problems = br.quick_markdown(data)
    lines = text.splitlines()
    # registry order FedAvg, Local, Ditto; FedAvg: best 50, 70 -> 60.00 ± 10.00; last 40, 70 -> 55.00 ± 15.00
    assert lines[2] == "| FedAvg | 60.00 ± 10.00 | 55.00 ± 15.00 | 2.00 / 3.00 | 0.25 | 2 |"
    assert lines[3] == "| Local | 60.00 | **60.00** | 2.00 / 3.00 | - | 1 |"  # timing curve differs at round 2
    assert lines[4] == "| Ditto | 60.00 | **60.00** | 2.00 / 3.00 | - | 1 |"
    assert problems == ["Local: the timing run's seed 0 does not reproduce the accuracy run's curve",
                        "Ditto: no timing run"]


def test_runs_on_another_split_of_the_same_name_are_named():
    entries = {"FedAvg": {"runs": [run([0.5], seed=0), run([0.5], seed=1, split="h2")]},
               "Local": {"runs": [run([0.5], seed=0), run([0.5], seed=1)]}}
    assert br.split_problems("S", entries) == ["S: FedAvg seed 1 ran on another split of that name "
                                               "(config hash h2, not h1)"]
    assert br.split_problems("S", {"Local": entries["Local"]}) == []
    _, problems = br.quick_markdown({"splits": {"S": entries}})
    assert problems[0].startswith("S: FedAvg seed 1 ran on another split")


def test_print_writes_no_file(tmp_path, capsys):
    export = tmp_path / "export.json"
    export.write_text(json.dumps({"splits": {"FMNIST_pat_s2000": {
        "FedAvg": {"command": "c", "runs": [run([0.1, 0.5, 0.6]), run([0.2, 0.4, 0.7], seed=1)]}}}}))
    doc, figures = tmp_path / "doc.md", tmp_path / "img"
    br.main(["--protocol", "converged", "--from-export", "--export", str(export), "--print", "--doc", str(doc),
             "--figures", str(figures)])
    assert "| FedAvg | 65.00 ± 5.00 |" in capsys.readouterr().out  # best 60 and 70
    assert not doc.exists() and not figures.exists()


def test_ablation_variants_are_rows_of_their_own(digits_tiny_root, tmp_path):
    """Runs of one split and algorithm that differ in a flag are one variant each, labelled by that flag
    (runs of one variant, seeds apart, stay together); the rows give their cells, statuses and commands."""
    import main
    from conftest import cli

    out = tmp_path / "res"
    for lr in ("0.1", "0.2"):
        assert main.main(cli(digits_tiny_root, out, "-gr", "1", "-lr", lr, "--executor", "sequential",
                             "-go", f"lr{lr}", "-t", "2" if lr == "0.1" else "1")) == 0
    data = br.write_export(str(out), tmp_path / "a.json", "benchmark_ablations.json", by_variant=True)
    entries = data["splits"]["Digits"]
    # labelled by every setting apart from the sweep's base (-m CNN -gr 100 -lr 0.005 --train_loss_eval off)
    same = "global_rounds=1 model=auto train_loss_eval=full"
    lr1, lr2 = (f"FedAvg {same.replace('model', f'local_learning_rate={lr} model')}" for lr in ("0.1", "0.2"))
    assert sorted(entries) == [lr1, lr2]
    assert [len(entries[lr1]["runs"]), len(entries[lr2]["runs"])] == [2, 1]
    # the label depends on the run alone: an export written with other labels (here a bare "FedAvg" for the
    # 0.1 runs) merged with new runs of the 0.2 variant keeps both variants, each once
    (tmp_path / "b.json").write_text(json.dumps({"splits": {"Digits": {"FedAvg": entries[lr1]}}}))
    assert main.main(cli(digits_tiny_root, tmp_path / "res2", "-gr", "1", "-lr", "0.2", "--executor", "sequential",
                         "-go", "lr0.2")) == 0
    merged = br.write_export(str(tmp_path / "res2"), tmp_path / "b.json", "benchmark_ablations.json",
                             by_variant=True)["splits"]["Digits"]
    assert sorted(merged) == [lr1, lr2] and merged[lr1]["runs"] == entries[lr1]["runs"]
    # one run exported twice under two labels is kept once
    (tmp_path / "c.json").write_text(json.dumps({"splits": {"Digits": {"FedAvg": entries[lr1], "x": entries[lr1]}}}))
    assert list(br.write_export(None, tmp_path / "c.json", "benchmark_ablations.json",
                                by_variant=True)["splits"]["Digits"]) == [lr1]
    hand = {"splits": {"s": {"A x=1": {"command": "c1", "runs": [run([0.1, 0.5, 0.4], cpu=4.0),
                                                                 run([0.2, 0.6, 0.7], cpu=None, seed=1)]},
                             "A x=2": {"command": "c2", "runs": [dict(run([0.3, 0.2]), status="diverged")]}}}}
    lines = br.ablations_markdown(hand).splitlines()
    # best 50 and 70, last 40 and 70; still rising: seed 0's best came by round 1 (0), seed 1's at round 2,
    # 10 points above its best up to round 1.6 (60): 5.00; the diverged run has no last rounds to judge
    assert lines[2] == "| s | A x=1 | 60.00 ± 10.00 | 55.00 ± 15.00 | 5.00 | finished 2 | 4 | `c1` |"
    assert lines[3] == "| s | A x=2 | 30.00 | 20.00 | - | diverged 1 | 10 | `c2` |"
