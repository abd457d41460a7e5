"""Runs end cleanly whatever happens: the sidecar says how a run ended (finished / diverged / interrupted);
Ctrl-C and SIGTERM keep the rounds done and say how to resume; workers never outlive their server; a full
disk leaves the previous complete files; a second run on the same result name is refused while the first
writes; -gr 0 evaluates the initial model as round 0."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import main
from conftest import REPO, cli
from utils.results import read_h5

STEM = "Digits_FedAvg_test_0"


def sidecar(out, stem=STEM):
    return json.loads((out / f"{stem}.json").read_text())


def test_zero_rounds_evaluates_the_initial_model_as_round_0(digits_tiny_root, tmp_path):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "0", "--executor", "sequential")) == 0
    assert list(read_h5(tmp_path / f"{STEM}.h5")["rs_round"]) == [0]
    assert sidecar(tmp_path)["status"] == "finished"


def test_last_evaluation_is_labelled_with_the_rounds_run(digits_tiny_root, tmp_path):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "3", "-eg", "2", "--executor", "sequential")) == 0
    assert list(read_h5(tmp_path / f"{STEM}.h5")["rs_round"]) == [0, 2, 3]


def test_diverged_run_says_so_in_its_sidecar(digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "3", "-lr", "1e4", "--executor", "sequential")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training loss became" in err[0], err
    meta = sidecar(tmp_path)
    assert meta["status"] == "diverged" and "training loss became" in meta["status_reason"]
    assert meta["evaluations"] >= 1  # what was measured before is kept


def test_no_train_loss_printed_when_it_is_not_computed(digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", "--train_loss_eval", "off")) == 0
    out = capsys.readouterr().out
    assert "round" in out and "nan" not in out and "train loss" not in out


# ---- signals and worker processes --------------------------------------------------------------------
def start(root, out, *flags):
    cmd = [sys.executable, str(REPO / "system" / "main.py"), *cli(root, out, *flags)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_for_round(proc, n=1):
    """Read stdout until the n-th evaluation line (round n-1) has been printed."""
    seen = 0
    for line in proc.stdout:
        if line.startswith("round"):
            seen += 1
            if seen >= n:
                return
    raise AssertionError(f"the run ended early: {proc.stderr.read()}")


def children(pid):
    try:
        return [int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its new parent) counts as gone
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")


@needs_proc
@pytest.mark.parametrize("repeat", [1, 3])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_keeps_the_rounds_done_and_says_how_to_resume(digits_tiny_root, tmp_path, sig, repeat):
    flags = ("-gr", "200", "--executor", "fork", "--workers", "2", "--checkpoint_every", "1", "--no-progress")
    proc = start(digits_tiny_root, tmp_path, *flags)
    wait_for_round(proc, 3)  # the third evaluation printed: at least two are saved
    workers = children(proc.pid)
    for _ in range(repeat):  # an impatient user presses Ctrl-C again while the run saves and ends
        if proc.poll() is not None:
            break
        if sig == signal.SIGINT:  # Ctrl-C: the terminal signals the whole process group, workers included
            os.killpg(proc.pid, sig)
        else:  # kill PID: the server alone
            proc.send_signal(sig)
        time.sleep(0.05)
    proc.wait(timeout=60)
    err = proc.stderr.read().strip().splitlines()
    assert proc.returncode == 128 + sig, err  # 130 for Ctrl-C, 143 for SIGTERM
    assert len(err) == 1 and "interrupted in round" in err[0] and "--resume" in err[0], err
    meta = sidecar(tmp_path)
    assert meta["status"] == "interrupted" and meta["evaluations"] >= 2
    assert len(read_h5(tmp_path / f"{STEM}.h5")["rs_test_acc"]) == meta["evaluations"]
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("*.lock"))
    deadline = time.time() + 10
    while any(alive(w) for w in workers) and time.time() < deadline:
        time.sleep(0.1)
    assert workers and not any(alive(w) for w in workers)
    assert list(tmp_path.glob("*.ckpt"))  # the last round's checkpoint, which --resume continues from


@needs_proc
def test_workers_die_with_a_killed_server(digits_tiny_root, tmp_path):
    proc = start(digits_tiny_root, tmp_path, "-gr", "500", "--executor", "fork", "--workers", "2", "--no-progress")
    wait_for_round(proc, 1)
    workers = children(proc.pid)
    assert len(workers) == 2
    proc.kill()
    proc.wait()
    deadline = time.time() + 10
    while any(alive(w) for w in workers) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(alive(w) for w in workers)


# ---- result files ------------------------------------------------------------------------------------
def test_full_disk_keeps_the_previous_complete_files(digits_tiny_root, tmp_path, capsys, monkeypatch):
    import h5py

    real, calls = h5py.File, []

    def failing(path, mode="r", *a, **k):
        if mode == "w":
            calls.append(path)
            if len(calls) > 1:
                raise OSError(28, "No space left on device")
        return real(path, mode, *a, **k)

    monkeypatch.setattr(h5py, "File", failing)
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "3", "--executor", "sequential")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "could not write" in err[0] and "No space left" in err[0], err
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("*.lock"))
    monkeypatch.setattr(h5py, "File", real)
    h5, meta = read_h5(tmp_path / f"{STEM}.h5"), sidecar(tmp_path)
    assert len(h5["rs_test_acc"]) == meta["evaluations"] == 1  # the first save, h5 and sidecar together
    assert meta["status"] == "failed" and "No space left" in meta["status_reason"]  # not left "running"
    assert np.isfinite(h5["rs_test_acc"]).all()


def test_a_second_run_on_the_same_result_name_is_refused(digits_tiny_root, tmp_path, capsys):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / f"{STEM}.lock").write_text(str(holder.pid))
        assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", "--executor", "sequential")) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"another run (pid {holder.pid})" in err[0], err
        assert not (tmp_path / f"{STEM}.h5").exists()
    finally:
        holder.kill()
        holder.wait()
    # its holder gone, the lock is stale and taken over
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", "--executor", "sequential")) == 0
    assert sidecar(tmp_path)["status"] == "finished" and not (tmp_path / f"{STEM}.lock").exists()


def test_out_of_gpu_memory_is_one_line(digits_tiny_root, tmp_path, capsys, monkeypatch):
    import torch

    from flcore.servers.serveravg import FedAvgServer

    def oom(self, round_idx):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(FedAvgServer, "run_round", oom)
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "2", "--executor", "sequential")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "out of GPU memory" in err[0] and "--client_state cpu" in err[0], err
    meta = json.loads((tmp_path / f"{STEM}.json").read_text())
    assert meta["status"] == "failed" and "OutOfMemoryError" in meta["status_reason"]


def test_an_existing_result_is_not_overwritten_silently(digits_tiny_root, tmp_path, capsys):
    flags = ("-gr", "1", "--executor", "sequential")

    def plain(*extra):  # the tests' cli() passes --overwrite; a user's command line does not
        argv = cli(digits_tiny_root, tmp_path, *flags)
        argv.remove("--overwrite")
        return argv + list(extra)

    assert main.main(plain()) == 0
    before = (tmp_path / f"{STEM}.h5").read_bytes()
    capsys.readouterr()
    assert main.main(plain("-lr", "0.1")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already exists" in err[0] and "--overwrite" in err[0], err
    assert (tmp_path / f"{STEM}.h5").read_bytes() == before
    assert main.main(plain("-lr", "0.1", "--overwrite")) == 0
    assert sidecar(tmp_path)["config"]["local_learning_rate"] == 0.1


# ---- Ray stays local and dies with the run ----------------------------------------------------------
DASHBOARD_PORT = 8265  # Ray's dashboard (web UI and job API) listens here when it runs


def listening_ports() -> set[int]:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                if state == "0A":  # LISTEN
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


@needs_proc
@pytest.mark.optional_deps("ray")
def test_no_ray_process_survives_a_killed_run(digits_tiny_root, tmp_path):
    pytest.importorskip("ray")
    from runtime.reaper import _ray_descendants

    proc = start(digits_tiny_root, tmp_path, "-gr", "500", "--executor", "ray", "--workers", "1", "--no-progress")
    wait_for_round(proc, 1)
    ray_procs = _ray_descendants(proc.pid)
    cmds = [open(f"/proc/{p}/cmdline").read() for p in ray_procs]
    assert any("raylet" in c for c in cmds), cmds
    assert DASHBOARD_PORT not in listening_ports()  # no dashboard unless asked for
    proc.kill()  # kill -9: no atexit, no ray.shutdown
    proc.wait()
    deadline = time.time() + 15
    while any(alive(p) for p in ray_procs) and time.time() < deadline:
        time.sleep(0.2)
    assert not [c for p, c in zip(ray_procs, cmds) if alive(p)]


@pytest.mark.optional_deps("ray")
@pytest.mark.parametrize("address,expected", [("127.0.0.1:1", "nothing answers at 127.0.0.1:1"),
                                              ("ray://127.0.0.1:1", "127.0.0.1:1")])
def test_a_bad_ray_address_is_one_line_quickly(digits_tiny_root, tmp_path, capsys, address, expected):
    pytest.importorskip("ray")
    began = time.time()
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", "--executor", "ray", "--ray_address", address)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0] and time.time() - began < 30, err
