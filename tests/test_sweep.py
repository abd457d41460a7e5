"""scripts/run/sweep.py: one result name per configuration, refusal of two jobs on one name, skipping complete
jobs, resuming an interrupted one (killed with SIGKILL) from its checkpoint, failures reported without
stopping the others."""
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import REPO
from scripts.run import sweep
from flcore.registry import ALGORITHMS
from utils import fileio


def base(root, *extra):
    return ["-data", "Digits", "--dataset_root", str(root), "-dev", "cpu", "--executor", "sequential", *extra]


def test_equal_configurations_refused_with_one_line(tmp_path, capsys):
    # 0.1 and 0.10 parse to one configuration: the second job would overwrite the first one's file
    rc = sweep.main([*base(tmp_path, "-gr", "2"), "--grid", "-lr=0.1,0.10", "--out", str(tmp_path), "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith("error: two jobs would write Digits_FedAvg_sweep-") and "remove one" in err[0]
    assert not list(tmp_path.iterdir())  # nothing ran
    assert sweep.main([*base(tmp_path, "-gr", "2"), "--grid", "-lr=0.1,0.1", "--dry-run"]) == 2
    assert capsys.readouterr().err.startswith("error: two jobs would write")
    # one point in two grids of a file (e.g. after --grid overrides a key in both) is one job
    jobs, _ = sweep.build_jobs(base(tmp_path, "-gr", "2"), [{"-lr": ["0.1"]}, {"-lr": ["0.1"]}], [0], "t", tmp_path)
    assert len(jobs) == 1


def test_names_unique_per_configuration(tmp_path):
    jobs, invalid = sweep.build_jobs(base(tmp_path, "-gr", "2"), [{"-lr": ["0.05", "0.1"]}], [0, 1], "t", tmp_path)
    assert invalid == [] and len({j.stem for j in jobs}) == 4
    assert [j.stem.rsplit("_", 1)[1] for j in jobs] == ["0", "1", "0", "1"]
    # one job per run index: -pv i -t i+1
    assert [(j.argv[j.argv.index("-pv") + 1], j.argv[j.argv.index("-t") + 1]) for j in jobs[:2]] == [("0", "1"),
                                                                                                      ("1", "2")]
    goals = [j.argv[j.argv.index("-go") + 1] for j in jobs]
    assert goals[0] == goals[1] != goals[2] == goals[3] and goals[0].startswith("t-")

    def goal(*flags):
        (job,), _ = sweep.build_jobs([*base(tmp_path, "-gr", "2"), *flags], [{}], [0], "t", tmp_path)
        return job.argv[job.argv.index("-go") + 1]

    # the hash covers the effective configuration: spelling and run-only settings do not change it
    assert goal("-lr", "0.1") == goal("--local_learning_rate", "0.10") == goals[2]
    assert goal("-lr", "0.1", "--executor", "fork", "--workers", "2") == goals[2]
    assert goal("-lr", "0.1", "-lbs", "20") != goals[2]
    assert goal("-lr", "0.1", "-gr", "3") != goals[2]  # more rounds are another result, not an overwrite
    assert goal("-lr", "0.1", "-lbs", "10") == goals[2]  # the default given explicitly


def test_a_new_flag_at_its_default_keeps_names(tmp_path, monkeypatch):
    import cli

    (job,), _ = sweep.build_jobs(base(tmp_path, "-gr", "2"), [{}], [0], "t", tmp_path)
    original = cli.base_parser

    def with_new_flag():
        p = original()
        p.add_argument("--new_flag", type=int, default=7)
        return p

    monkeypatch.setattr(cli, "base_parser", with_new_flag)
    (same,), _ = sweep.build_jobs(base(tmp_path, "-gr", "2"), [{}], [0], "t", tmp_path)
    (other,), _ = sweep.build_jobs(base(tmp_path, "-gr", "2", "--new_flag", "8"), [{}], [0], "t", tmp_path)
    assert same.stem == job.stem != other.stem


def test_grid_values_all_and_boolean_flags(tmp_path):
    jobs, _ = sweep.build_jobs(base(tmp_path), [{"-algo": ["all"]}], [0], "t", tmp_path)
    assert [j.argv[j.argv.index("-algo") + 1] for j in jobs] == list(ALGORITHMS)
    jobs, _ = sweep.build_jobs(base(tmp_path), [{"-algo": ["FedAvg"], "-ala": ["true", "false"]}], [0], "t", tmp_path)
    assert ["-ala" in j.argv for j in jobs] == [True, False] and "_FedAvg+ALA_" in jobs[0].stem
    with pytest.raises(sweep.SweepError, match="takes no value"):
        sweep.build_jobs(base(tmp_path), [{"-ala": ["maybe"]}], [0], "t", tmp_path)
    with pytest.raises(sweep.SweepError, match="set by the sweep"):
        sweep.build_jobs([*base(tmp_path), "-go", "x"], [{}], [0], "t", tmp_path)
    # a grid point main.py refuses is listed, the others still become jobs
    jobs, invalid = sweep.build_jobs(base(tmp_path), [{"-lr": ["0.1", "-1"]}], [0], "t", tmp_path)
    assert len(jobs) == 1 and len(invalid) == 1 and invalid[0][1].startswith("-lr -1 is out of range: it takes [1e-30, 1e30]")


def _write_h5(path: Path, rounds):
    with h5py.File(path, "w") as f:
        f.create_dataset("rs_round", data=np.asarray(rounds, dtype=float))


def test_complete_means_the_last_evaluation_is_round_gr(tmp_path):
    job = sweep.Job(["-gr", "2"], "s", tmp_path, 2)
    assert not sweep.is_complete(job)
    _write_h5(job.h5, [0, 1])
    assert not sweep.is_complete(job)
    _write_h5(job.h5, [0, 1, 2])
    assert sweep.is_complete(job)
    # stopped early (-ab) or diverged: complete by the sidecar's status; interrupted or failed: not
    job = sweep.Job(["-gr", "9", "-ab"], "a", tmp_path, 9)
    _write_h5(job.h5, [0, 1, 2])
    for status, complete in (("running", False), ("interrupted", False), ("failed", False), ("finished", True),
                             ("diverged", True)):
        job.h5.with_suffix(".json").write_text(json.dumps({"status": status}))
        assert sweep.is_complete(job) == complete, status


def test_failures_reported_and_the_others_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sweep.Job, "command", lambda self: [sys.executable, "-c", self.argv[0]])
    ok = sweep.Job([f"open({str(tmp_path / 'ran')!r}, 'w')"], "ok", tmp_path, 1)
    bad = sweep.Job(["import sys; print('boom'); sys.exit(3)"], "bad", tmp_path, 1)
    failures = sweep.run_jobs([bad, ok], workers=1, progress=False)
    assert [(j.stem, code) for j, code in failures] == [("bad", 3)]
    assert (tmp_path / "ran").exists()  # the job after the failed one still ran
    err = capsys.readouterr().err
    assert "FAILED (exit code 3)" in err and str(bad.log) in err and "boom" in bad.log.read_text()
    assert re.search(r"\n# exit 3, \d+\.\d CPU-s$", bad.log.read_text().rstrip())


def test_a_job_running_elsewhere_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep.Job, "command", lambda self: [sys.executable, "-c", "pass"])
    job = sweep.Job([], "busy", tmp_path, 1)
    job.log.parent.mkdir()
    with open(job.log, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert sweep.run_job(job, False) == (75, "running in another process")
    assert sweep.run_job(job, False)[0] == 0


def test_runtime_failure_gives_nonzero_exit_with_command_and_log(digits_tiny_root, tmp_path, capsys):
    # -nc 99 passes flag parsing but the 5-client split refuses it when the job loads it
    rc = sweep.main([*base(digits_tiny_root, "-gr", "1", "-nc", "99"), "--out", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1
    log = next((tmp_path / "logs").glob("*.log"))
    assert f"log: {log}" in err and "failed (exit 2): python" in err and "-nc 99" in err
    assert "asks for more clients" in log.read_text()


def _wait_for(path: Path, proc, timeout=300.0):
    end = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, "the job ended before its first checkpoint"
        assert time.time() < end, f"no {path.name} after {timeout} s"
        time.sleep(0.02)


def test_skip_complete_and_resume_killed(digits_tiny_root, tmp_path, capsys):
    flags = base(digits_tiny_root, "-gr", "3", "-lr", "0.1")
    args = [*flags, "--seeds", "0,1", "--out", str(tmp_path), "--no-progress"]
    jobs, _ = sweep.build_jobs(flags, [{}], [0, 1], "sweep", tmp_path)
    done, killed = jobs
    # job 1 is killed (SIGKILL) right after its first checkpoint (after round 0)
    proc = subprocess.Popen(killed.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        _wait_for(killed.ckpt, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert killed.h5.exists() and not sweep.is_complete(killed)
    assert sweep.main(args) == 0
    assert "2 jobs, 0 complete (skipped), 2 to run" in capsys.readouterr().err
    log = killed.log.read_text()
    assert log.count("# ") == 2 and " resume: " in log  # one attempt, started from the checkpoint
    assert "resuming " + killed.ckpt.name + " after round" in log
    assert "round    0 |" not in log  # round 0 was evaluated before the kill and is not rerun
    with h5py.File(killed.h5, "r") as f:
        assert list(f["rs_round"][()]) == [0, 1, 2, 3]
    assert sweep.is_complete(done) and not killed.ckpt.exists() and not done.ckpt.exists()
    # each job's CPU time (the child's own: importing torch alone takes more than a CPU-second), one attempt
    for job in jobs:
        assert sweep.cpu_seconds(job) > 1.0
        assert json.loads(job.log.with_suffix(".cpu.json").read_text())["attempts"] == 1
        logged = re.search(r"# exit 0, (\d+\.\d) CPU-s$", job.log.read_text().rstrip())
        assert logged and abs(float(logged.group(1)) - sweep.cpu_seconds(job)) <= 0.06  # .1f vs .2f rounding
    # a second sweep runs nothing: files and logs untouched
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()}
    assert sweep.main(args) == 0
    assert "2 jobs, 2 complete (skipped), 0 to run" in capsys.readouterr().err
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()} == before


def test_checkpoint_interval_from_the_file_or_the_command_line(tmp_path, capsys):
    """A job's ``--checkpoint_every`` is the command line's, else the file's ``checkpoint_every``, else 1;
    it stays out of the result name (the same job whatever the interval), and a bad value is one line."""
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({"base": base(tmp_path, "-gr", "2"), "checkpoint_every": 5, "out": str(tmp_path)}))

    def interval(*extra):
        assert sweep.main(["--config", str(spec), *extra, "--dry-run"]) == 0
        line = capsys.readouterr().out.strip().splitlines()[0]
        words = line.split()
        return int(words[words.index("--checkpoint_every") + 1]), words[words.index("-go") + 1]

    (every_file, goal_file), (every_cli, goal_cli) = interval(), interval("--checkpoint-every", "3")
    assert (every_file, every_cli) == (5, 3) and goal_file == goal_cli
    jobs, _ = sweep.build_jobs(base(tmp_path, "-gr", "2"), [{}], [0], "t", tmp_path)
    assert jobs[0].argv[jobs[0].argv.index("--checkpoint_every") + 1] == "1"
    assert sweep.main(["--config", str(spec), "--checkpoint-every", "0", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    for bad in (True, 2.0, "2"):  # the file's value is a JSON integer: true is not one round
        spec.write_text(json.dumps({"base": base(tmp_path, "-gr", "2"), "checkpoint_every": bad}))
        assert sweep.main(["--config", str(spec), "--dry-run"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "'checkpoint_every' is a" in err and "not a int" in err, err


@pytest.mark.optional_deps("opacus")
def test_every_sweep_file_of_the_docs_builds_its_jobs_and_the_reports_find_them():
    """The docs' experiments are sweep files: each builds its jobs with no grid point main.py refuses, and the
    report scripts name the runs they read from the sweep's own jobs (the FIGURES panels of docs/privacy.md
    are found among them)."""
    from scripts.experiments import privacy_experiments

    scripts = Path(sweep.__file__).resolve().parents[1] / "experiments"  # the sweep files
    for path in sorted(scripts.glob("*.json")):
        spec = sweep.load_config_file(path)
        jobs, invalid = sweep.build_jobs([str(a) for a in spec.get("base", [])], spec.get("grids", [{}]),
                                         spec.get("seeds", [0]), spec.get("tag", "sweep"), Path("out"),
                                         spec.get("per_algorithm"))
        assert jobs and invalid == [], (path.name, invalid[:1])
    names = {(s, a, g) for s, a, g, _ in privacy_experiments.runs()}
    assert len(names) == 13
    assert {(s, a, g) for panels in privacy_experiments.FIGURES.values() for s, a, g, _, _ in panels} <= names


def test_runs_held_by_the_export_are_not_rerun(tmp_path, monkeypatch, capsys):
    """A sweep file's ``export`` (or ``--export``): a run it holds as finished or diverged is complete even
    with no result file (a fresh clone); an interrupted one, another seed or another configuration is not."""
    jobs, _ = sweep.build_jobs(base(tmp_path, "-gr", "2"), [{"-algo": ["FedAvg", "Local"]}], [0, 1, 2], "t",
                               tmp_path)
    fedavg = [j for j in jobs if j.grid_point["-algo"] == "FedAvg"]
    goal = fedavg[0].argv[fedavg[0].argv.index("-go") + 1]
    export = tmp_path / "export.json"
    export.write_text(json.dumps({"splits": {"Digits": {"FedAvg": {
        "command": f"python system/main.py -data Digits -algo FedAvg -gr 2 -go {goal} -pv 0 -t 3",
        "runs": [{"run": 0, "status": "finished"}, {"run": 1, "status": "diverged"},
                 {"run": 2, "status": "interrupted"}]}}}}))
    exported = sweep.exported_runs(export)
    assert [sweep.is_complete(j, exported) for j in jobs] == [True, True, False, False, False, False]
    ran = []
    monkeypatch.setattr(sweep, "run_job", lambda job, *a: (ran.append(job.stem), (0, ""))[1])
    assert sweep.run_jobs(jobs, 1, progress=False, exported=exported) == []
    assert sorted(ran) == sorted(j.stem for j in jobs[2:])
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({"base": base(tmp_path, "-gr", "2"), "grids": [{"-algo": ["FedAvg", "Local"]}],
                                "seeds": [0, 1, 2], "tag": "t", "out": str(tmp_path), "export": str(export)}))
    assert sweep.main(["--config", str(spec), "--dry-run"]) == 0
    states = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert states == ["[exported]", "[exported]"] + ["[new]"] * 4
    export.write_text(json.dumps({"splits": {"Digits": {"FedAvg": {  # an index that is not an int counts not
        "command": f"python system/main.py -go {goal}", "runs": [{"run": True, "status": "finished"},
                                                               {"run": "1", "status": "finished"}]}}}}))
    assert sweep.exported_runs(export) == frozenset()
    export.write_text("{not json")
    assert sweep.main(["--config", str(spec), "--dry-run"]) == 2
    assert "cannot read the export" in capsys.readouterr().err


def test_runs_held_by_a_runs_list_export_are_not_rerun(tmp_path):
    """The converged robustness export's form: a top-level ``runs`` list, each entry naming its ``goal`` and run
    index ``seed``. Ended runs count; an unfinished one, one without a goal or with a non-integer index does not."""
    jobs, _ = sweep.build_jobs(base(tmp_path, "-gr", "2"), [{"-algo": ["FedAvg"]}], [0, 1, 2], "t", tmp_path)
    goal = jobs[0].key[0]
    export = tmp_path / "export.json"
    export.write_text(json.dumps({"split": "Digits", "runs": [
        {"goal": goal, "seed": 0, "status": "finished"}, {"goal": goal, "seed": 2, "status": "diverged"},
        {"goal": goal, "seed": 1, "status": "interrupted"}, {"seed": 1, "status": "finished"},
        {"goal": goal, "seed": "1", "status": "finished"}, {"goal": goal, "seed": True, "status": "finished"}]}))
    exported = sweep.exported_runs(export)
    assert exported == {(goal, 0), (goal, 2)}
    assert [sweep.is_complete(j, exported) for j in jobs] == [True, False, True]
    export.write_text(json.dumps({"runs": {"goal": goal}}))
    with pytest.raises(sweep.SweepError, match="cannot read the export"):
        sweep.exported_runs(export)


def test_the_converged_robustness_sweep_resumes_from_its_committed_export():
    """Every run the committed export holds is one of the sweep file's jobs (their names did not drift)."""
    spec = fileio.read_json(REPO / "scripts" / "experiments" / "robustness_converged.json")
    jobs, _ = sweep.build_jobs(spec["base"], spec["grids"], spec["seeds"], spec["tag"], Path("out"),
                               spec.get("per_algorithm"))
    exported = sweep.exported_runs(REPO / spec["export"])
    assert len(exported) >= 100 and exported <= {j.key for j in jobs}


def test_an_algorithms_resolved_default_stays_out_of_the_name(tmp_path):
    """SCAFFOLD's -slr 1 is its own default, resolved after parsing: the name is the one it had when the
    default lived in SCAFFOLD's parser (the hash without that key), and another -slr is another name."""
    flags = base(tmp_path, "-gr", "2", "-algo", "SCAFFOLD")
    (job,), _ = sweep.build_jobs(flags, [{}], [0], "t", tmp_path)
    cfg, _ = sweep.parse_job_flags([*flags, "-go", "t"])
    assert cfg.server_learning_rate == 1.0
    defaults = {a.dest: a.default for a in sweep.job_parser(flags).flags if a.option_strings}
    without = {k: v for k, v in cfg.to_dict().items() if k != "server_learning_rate"}
    assert job.key == (f"t-{sweep.config_hash(without, defaults)}", 0)
    (other,), _ = sweep.build_jobs([*flags, "-slr", "0.5"], [{}], [0], "t", tmp_path)
    assert other.key[0] != job.key[0]
