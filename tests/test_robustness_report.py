"""scripts/experiments/robustness_report.py: cells from a hand-made export."""

import json

import pytest

from scripts.experiments import robustness_report
from utils.errors import FLError


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


def conv_entry(algo, attack, rule, seed, last, krum_f=None, asr=None, status="finished", scale=None):
    return {"algorithm": algo, "attack": attack, "scale": scale, "aggregator": rule, "krum_f": krum_f, "seed": seed,
            "status": status, "benign_acc": [0.1, last], "asr": asr, "goal": "g", "cpu_s": 1800.0}


def test_converged_cells_are_numbers_only_with_every_seed(tmp_path):
    sweep = tmp_path / "s.json"
    sweep.write_text('{"grids": [{"-algo": ["FedAvg"], "--attack": ["alie"], "--aggregator": ["mean", "krum"]},'
                     '{"-algo": ["FedAvg"], "--attack": ["alie"], "--aggregator": ["krum"], "--krum_f": ["2"]},'
                     '{"-algo": ["FedAvg"], "--attack": ["backdoor"]}, {"-algo": ["FedAvg"]},'
                     '{"-algo": ["Local"]}, {"-algo": ["FedAvg"], "--attack": ["ipm"], "--attack_scale": ["100"]}]}')
    cells = robustness_report.planned_cells(sweep)
    assert cells == [("FedAvg", "alie", "mean"), ("FedAvg", "alie", "krum"), ("FedAvg", "alie", "krum f=2"),
                     ("FedAvg", "backdoor", "mean"), ("FedAvg", "none", "mean"), ("Local", "none", "-"),
                     ("FedAvg", "ipm (ε = 100)", "mean")]
    runs = [conv_entry("FedAvg", "alie", "mean", s, v) for s, v in ((0, 0.5), (1, 0.7), (2, 0.6))]
    runs += [conv_entry("FedAvg", "alie", "krum", s, 0.4) for s in (0, 1)]  # two of three seeds
    runs += [conv_entry("FedAvg", "alie", "krum", s, 0.2, krum_f=2) for s in (0, 1, 2)]
    runs += [conv_entry("FedAvg", "backdoor", "mean", s, 0.8, asr=a) for s, a in ((0, 0.9), (1, 1.0), (2, 0.95))]
    runs += [conv_entry("Local", "none", "mean", s, 0.9) for s in (0, 1, 2)]
    text = robustness_report.converged_markdown(runs, cells, 3, 3 * 3600.0)
    got = cells_of(text)
    head = [c.strip() for c in text.splitlines()[0].strip("|").split("|")][2:]
    assert head == ["mean", "krum", "krum f=2"]
    assert got[("FedAvg", "alie")] == ["60.0 ± 8.2", "pending (2/3)", "20.0 ± 0.0"]  # 50 60 70: sqrt(200/3)
    assert got[("FedAvg", "backdoor")] == ["80.0 ± 0.0 / ASR 95.0 ± 4.1", "", ""]  # 90 95 100: sqrt(50/3)
    assert got[("FedAvg", "none")] == ["pending (0/3)", "", ""]
    assert got[("Local", "none")] == ["90.0 ± 0.0", "", ""]
    assert got[("FedAvg", "ipm (ε = 100)")][0] == "pending (0/3)"
    assert [r for r in got if r[0] in ("FedAvg", "Local")][:3] == [("FedAvg", "none"), ("FedAvg", "alie"),
                                                                   ("FedAvg", "backdoor")]
    assert "4 of 7 cells complete (14 ended runs, 7.00 CPU-hours" in text and "3.00 CPU-hours spent" in text


def test_benign_curve_by_hand():
    import numpy as np

    acc = np.array([[1.0, 0.5, 0.0], [0.5, 0.5, 0.5]])
    # clients 0 and 2 benign (client 1 malicious), test counts 10 and 30: (10 x 1 + 30 x 0) / 40, then 0.5
    assert robustness_report.benign_curve(acc, [10, 20, 30], [1]).tolist() == [0.25, 0.5]


def test_a_malformed_result_file_is_left_out_with_one_warning_line(tmp_path, capsys):
    import json

    import h5py
    import numpy as np

    def run(stem, sidecar, series=None):
        (tmp_path / f"{stem}.json").write_text(sidecar if isinstance(sidecar, str) else json.dumps(sidecar))
        if series is not None:
            with h5py.File(tmp_path / f"{stem}.h5", "w") as f:
                for k, v in series.items():
                    f[k] = np.asarray(v)

    good = {"label": "FedAvg", "seed": 0, "run": 0, "status": "finished",
            "config": {"attack": "signflip", "aggregator": "median"}}
    run("a_good", good, {"rs_test_acc": [0.5, 0.25], "rs_benign_test_acc": [0.5, 0.75]})
    run("b_not_json", "{not json")
    run("c_a_list", "[1, 2]")
    run("d_no_h5", good)
    run("e_no_series", good, {"rs_round": [0, 1]})
    run("f_running", {**good, "status": "running"})  # not ended: left out without a word
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a_good.cpu.json").write_text('{"cpu_s": 12.5}')
    entries = robustness_report.read_results(tmp_path)
    assert entries == [{"algorithm": "FedAvg", "attack": "signflip", "aggregator": "median", "seed": 0,
                        "status": "finished", "benign_acc": [0.5, 0.75], "all_acc": [0.5, 0.25],
                        "malicious_clients": [], "cpu_s": 12.5}]
    warnings = capsys.readouterr().err.strip().splitlines()
    assert [w.split(" left out")[0] for w in warnings] == [
        "warning: b_not_json.json", "warning: c_a_list.json", "warning: d_no_h5.json", "warning: e_no_series.json"]


def test_the_cpu_total_adds_a_fresh_folders_attempts_once(tmp_path):
    """The export's total plus what the folder's CPU records gained since the last export: a fresh folder
    (the export's own folder gone) adds all of its records, an export repeated adds nothing, a record that grew
    adds its growth, a new run adds its own; figures not marked counted (the export failed to write) count
    again at the next export."""
    logs = tmp_path / "logs"

    def export(earlier, written=True, to=tmp_path / "export.json"):
        total, now = robustness_report.cpu_total(tmp_path, to, earlier)
        if written:
            robustness_report.mark_counted(tmp_path, to, now)
        return total

    assert export(100.0) == 100.0 and export(None) is None and not logs.exists()
    logs.mkdir()
    (logs / "a.cpu.json").write_text('{"cpu_s": 10.0}')
    (logs / "b.cpu.json").write_text('{"cpu_s": 2.5}')
    assert export(100.0, written=False) == 112.5  # the export failed: nothing marked
    assert export(100.0) == 112.5
    assert export(112.5) == 112.5
    assert export(None, to=tmp_path / "preview.json") == 12.5  # another export counts on its own
    assert export(112.5) == 112.5
    (logs / "a.cpu.json").write_text('{"cpu_s": 14.0}')
    (logs / "c.cpu.json").write_text('{"cpu_s": 1.0}')
    assert export(112.5) == 117.5
    assert export(None) == 0.0
    (logs / "b.cpu.json").write_text('{"cpu_s": 2.0}')  # started over: all of it is new
    assert export(117.5) == 119.5
    robustness_report.counted_file(tmp_path, tmp_path / "export.json").write_text('{"a": "14"}')
    with pytest.raises(FLError, match="CPU seconds per run"):
        robustness_report.cpu_total(tmp_path, tmp_path / "export.json", 117.5)


def test_a_converged_export_that_fails_to_write_leaves_its_cpu_seconds_to_the_next(tmp_path, capsys):
    """The CPU figures an export's total took in are marked counted only once the export is written: an export
    that cannot be written (its folder is a file) marks nothing, and the next export counts them once."""
    spec = json.loads(robustness_report.CONVERGED["sweep"].read_text())
    split = spec["base"][spec["base"].index("-data") + 1]
    (tmp_path / "data" / split).mkdir(parents=True)
    (tmp_path / "data" / split / "config.json").write_text('{"test_samples": [10, 10]}')
    (tmp_path / "results" / "logs").mkdir(parents=True)
    (tmp_path / "results" / "logs" / "a.cpu.json").write_text('{"cpu_s": 7.5}')
    (tmp_path / "blocked").write_text("a file, not a folder")
    flags = ["--converged", "--print", "--results", str(tmp_path / "results"), "--dataset_root", str(tmp_path / "data")]
    assert robustness_report.main(flags + ["--export", str(tmp_path / "blocked" / "export.json")]) == 2
    assert not list((tmp_path / "results" / "logs").glob("exported_cpu*"))
    export = tmp_path / "export.json"
    assert robustness_report.main(flags + ["--export", str(export)]) == 0
    assert robustness_report.main(flags + ["--export", str(export)]) == 0
    assert json.loads(export.read_text())["cpu_s_all_attempts"] == 7.5
    capsys.readouterr()


def test_a_closed_sweep_names_its_incomplete_cells_cut_and_the_export_keeps_it(tmp_path, capsys):
    """``--close``: the cells the sweep left incomplete read "cut (k/3)" (never a number, never "pending"), the
    footnote counts them, and the export keeps the mark for every later export and ``--from-export``."""
    cells = [("FedAvg", "none", "mean"), ("FedAvg", "none", "krum"), ("FedAvg", "alie", "mean")]
    runs = [conv_entry("FedAvg", None, "mean", s, 0.5) for s in (0, 1, 2)]
    runs += [conv_entry("FedAvg", None, "krum", 0, 0.9)]  # one seed of three, then the budget ran out
    got = cells_of(robustness_report.converged_markdown(runs, cells, 3, None, closed=True))
    assert got[("FedAvg", "none")] == ["50.0 ± 0.0", "cut (1/3)"] and got[("FedAvg", "alie")] == ["cut (0/3)", ""]
    closed = robustness_report.converged_markdown(runs, cells, 3, 3600.0, closed=True)
    assert "2 cells of the cut rule are cut" in closed and "1.00 CPU-hours spent by the sweep, unfinished" in closed
    open_ = robustness_report.converged_markdown(runs, cells, 3, None)
    assert "pending (1/3)" in open_ and "cut (" not in open_ and "are cut" not in open_

    spec = json.loads(robustness_report.CONVERGED["sweep"].read_text())
    split = spec["base"][spec["base"].index("-data") + 1]
    (tmp_path / "data" / split).mkdir(parents=True)
    (tmp_path / "data" / split / "config.json").write_text('{"test_samples": [10, 10]}')
    (tmp_path / "results").mkdir()
    export = tmp_path / "export.json"
    flags = ["--converged", "--print", "--results", str(tmp_path / "results"), "--dataset_root",
             str(tmp_path / "data"), "--export", str(export)]
    assert robustness_report.main(flags) == 0
    assert json.loads(export.read_text())["closed"] is False and "cut (0/3)" not in capsys.readouterr().out
    assert robustness_report.main(flags + ["--close"]) == 0
    assert json.loads(export.read_text())["closed"] is True and "cut (0/3)" in capsys.readouterr().out
    for again in (flags, [*flags, "--from-export"]):  # the mark stays without the flag
        assert robustness_report.main(again) == 0
        assert "cut (0/3)" in capsys.readouterr().out and json.loads(export.read_text())["closed"] is True
    export.write_text(export.read_text().replace('"closed": true', '"closed": "yes"'))  # only true closes
    assert robustness_report.main([*flags, "--from-export"]) == 0 and "pending (0/3)" in capsys.readouterr().out
