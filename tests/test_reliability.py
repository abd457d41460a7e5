"""Runs end cleanly whatever happens: the sidecar says how a run ended (finished / diverged / interrupted);
Ctrl-C and SIGTERM keep the rounds done and say how to resume; workers never outlive their server; a full
disk leaves the previous complete files; a second run on the same result name is refused while the first
writes; -gr 0 evaluates the initial model as round 0."""
import contextlib
import ipaddress
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import main
from conftest import REPO, build_server, cli
from runtime import loop
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
    """``python system/main.py <flags>`` as a process of its own session (its group is what Ctrl-C signals),
    stdout and stderr piped, unbuffered."""
    cmd = [sys.executable, str(REPO / "system" / "main.py"), *cli(root, out, *flags)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


class Forked:
    """What ``start`` gives, without starting Python and importing torch again (about 2 CPU-seconds a
    process): this test process forks, and the child runs system/main.py as a program (``runpy`` with
    ``__name__ == "__main__"``, so the script's own signal set-up runs) in a session of its own, stdout and
    stderr piped and line-buffered, its exit code main's. The child ends with ``os._exit``: the exit
    handlers this test process registered are not the run's. Popen's interface as the tests use it."""

    def __init__(self, argv: list[str]):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                # The progress bar's lock is shared with this test process (a multiprocessing lock
                # inherited over fork): a child killed by the test while it holds it would leave it held
                # and this process waiting forever on its next bar. The child takes a lock of its own.
                import threading

                from tqdm import tqdm

                tqdm.set_lock(threading.RLock())
                os.setsid()
                null = os.open(os.devnull, os.O_RDONLY)
                for fd, target in ((null, 0), (out_w, 1), (err_w, 2)):
                    os.dup2(fd, target)
                for fd in (null, out_r, out_w, err_r, err_w):
                    os.close(fd)
                sys.stdin = open(0, closefd=False)
                sys.stdout = open(1, "w", buffering=1, closefd=False)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                sys.argv = [str(REPO / "system" / "main.py"), *argv]
                runpy.run_path(sys.argv[0], run_name="__main__")
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (e.code is not None)
            except BaseException:  # noqa: BLE001  (a child's error ends the child, as in a real process)
                import traceback

                traceback.print_exc()
            finally:
                for f in (sys.stdout, sys.stderr):
                    try:
                        f.flush()
                    except Exception:  # noqa: BLE001
                        pass
                os._exit(code)
        os.close(out_w)
        os.close(err_w)
        self.pid, self.returncode = pid, None
        self.stdout, self.stderr = open(out_r), open(err_r)

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.time() + timeout
        while self.poll() is None:
            if deadline is not None and time.time() > deadline:
                raise subprocess.TimeoutExpired(f"main.py (pid {self.pid})", timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self):
        self.send_signal(signal.SIGKILL)


def forked(root, out, *flags) -> Forked:
    return Forked(cli(root, out, *flags))


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
    # a zombie (exited, not yet reaped by its new parent) counts as gone, and so does one reaped meanwhile
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")


@needs_proc
@pytest.mark.parametrize("repeat", [1, 3])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_keeps_the_rounds_done_and_says_how_to_resume(digits_tiny_root, tmp_path, sig, repeat):
    flags = ("-gr", "200", "--executor", "fork", "--workers", "2", "--checkpoint_every", "1", "--no-progress")
    proc = forked(digits_tiny_root, tmp_path, *flags)
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


def test_a_run_stopped_by_a_signal_resumes_to_the_uninterrupted_numbers(digits_tiny_root, tmp_path, monkeypatch):
    flags = ("-gr", "3", "--checkpoint_every", "1", "--executor", "sequential")
    train = loop.train_clients

    def ctrl_c_in_round_2(self, clients):  # what the signal handler does, in the middle of a round
        if self.round_idx == 2:
            raise KeyboardInterrupt
        return train(self, clients)

    monkeypatch.setattr(loop, "train_clients", ctrl_c_in_round_2)
    assert main.main(cli(digits_tiny_root, tmp_path, *flags)) == 130
    assert sidecar(tmp_path)["status"] == "interrupted"
    monkeypatch.setattr(loop, "train_clients", train)
    assert main.main(cli(digits_tiny_root, tmp_path, *flags, "--resume")) == 0
    assert main.main(cli(digits_tiny_root, tmp_path / "whole", *flags)) == 0
    resumed, whole = read_h5(tmp_path / f"{STEM}.h5"), read_h5(tmp_path / "whole" / f"{STEM}.h5")
    assert len(whole["rs_test_acc"]) == 4
    for key in ("rs_test_acc", "rs_train_loss", "rs_test_auc"):
        assert np.array_equal(resumed[key], whole[key]), key


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("rounds", ["4", "2"])  # before the next round; before the final evaluation
def test_a_signal_whose_interrupt_a_finalizer_swallowed_still_ends_the_run(rounds, digits_tiny_root, tmp_path,
                                                                          monkeypatch, capsys):
    """A signal that arrives while a finalizer runs (an object's ``__del__``: a result folder closing its
    descriptor) raises its KeyboardInterrupt there, where Python prints "Exception ignored" and goes on:
    the run still ends before its next round, interrupted, with 128 + the signal (seen in CI: a SIGTERM lost
    in ``Folder.__del__`` let a Ray run train to its end and exit 0)."""
    from flcore.servers.serverbase import Server
    from utils import results

    class Finalized:
        def __del__(self):
            results.interrupt(signal.SIGTERM, None)  # what the signal handler does, here inside __del__

    after_round = Server.after_round

    def signal_in_a_finalizer(self):
        if self.round_idx == 1:
            Finalized()  # made and collected at once: its __del__ runs here
        after_round(self)

    monkeypatch.setattr(Server, "after_round", signal_in_a_finalizer)
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", rounds, "--executor", "sequential")) == 128 + signal.SIGTERM
    assert "interrupted in round 1" in capsys.readouterr().err
    assert sidecar(tmp_path)["status"] == "interrupted"
    assert list(read_h5(tmp_path / f"{STEM}.h5")["rs_round"]) == [0, 1]
    assert results.stopped_by() is None  # main forgets the signal once its exit code is read
    server = build_server(digits_tiny_root, tmp_path, "-gr", "1")
    loop.train(server)  # so a later run in this process is not stopped by it
    assert server.round_idx == 1


@needs_proc
def test_workers_die_with_a_killed_server(digits_tiny_root, tmp_path):
    proc = forked(digits_tiny_root, tmp_path, "-gr", "500", "--executor", "fork", "--workers", "2", "--no-progress")
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


def read_only_after(monkeypatch, folder, name, sidecar_writable=True):
    """Make ``folder`` take no new file once ``name`` has been written: a chmod where that stops a write (not
    as root), else a fault at the I/O layer's one seam for new files (``fileio._new_file``), as a read-only
    folder fails it. ``sidecar_writable=False``: the sidecar cannot be rewritten where it lies either (a
    read-only file system)."""
    import errno

    from utils import fileio

    real, seen = fileio._new_file, []

    def new_file(tmp, dir_fd):
        if seen and os.path.samefile(f"/proc/self/fd/{dir_fd}", folder):
            if os.geteuid() != 0:
                os.chmod(folder, 0o555)
            else:
                raise PermissionError(errno.EACCES, "Permission denied")
        fd = real(tmp, dir_fd)
        seen.extend([1] if tmp.startswith(name + ".") else [])
        return fd

    monkeypatch.setattr(fileio, "_new_file", new_file)
    if not sidecar_writable:
        def refuse(self, name, data):
            raise fileio.FileIOError(f"cannot rewrite {self.path / name} (Read-only file system)")

        monkeypatch.setattr(fileio.Folder, "rewrite_in_place", refuse)


@pytest.mark.parametrize("sidecar_writable", [True, False])
def test_a_results_folder_made_read_only_mid_run_is_one_line_and_names_what_is_kept(
        digits_tiny_root, tmp_path, capsys, monkeypatch, sidecar_writable):
    read_only_after(monkeypatch, tmp_path, f"{STEM}.ckpt", sidecar_writable)
    argv = cli(digits_tiny_root, tmp_path, "-gr", "3", "--executor", "sequential", "--checkpoint_every", "1")
    try:
        assert main.main(argv) == 2
    finally:
        os.chmod(tmp_path, 0o755)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "could not write" in err[0] and "Permission denied" in err[0], err
    assert f"{STEM}.h5 keeps the first 1 evaluation(s)" in err[0], err  # round 0's, saved with its checkpoint
    assert f"checkpoint {STEM}.ckpt after round 0 is kept" in err[0] and "--resume" in err[0], err
    assert not list(tmp_path.glob("*.tmp"))
    assert list(read_h5(tmp_path / f"{STEM}.h5")["rs_round"]) == [0]
    if sidecar_writable:  # rewritten where it lies: it no longer claims the run is going
        assert "its sidecar says 'failed'" in err[0]
        assert sidecar(tmp_path)["status"] == "failed" and sidecar(tmp_path)["evaluations"] == 1
    else:  # and when even that fails, the line says so
        assert "its sidecar could not be updated (Read-only file system) and still says 'running'" in err[0], err
    monkeypatch.undo()
    assert main.main(argv + ["--resume"]) == 0  # the folder writable again: the run continues from its checkpoint
    assert list(read_h5(tmp_path / f"{STEM}.h5")["rs_round"]) == [0, 1, 2, 3]
    assert sidecar(tmp_path)["status"] == "finished"


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

    def oom(server, round_idx):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(loop, "run_round", oom)
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


def listening() -> dict[str, tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """Socket inode -> (address, port) of every listening TCP socket of the machine (/proc/net/tcp{,6})."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                fields = row.split()
                if fields[3] != "0A":  # LISTEN
                    continue
                addr, port = fields[1].split(":")
                raw = bytes.fromhex(addr)  # 32-bit words in host (little-endian) order
                ip = ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))
                found[fields[9]] = (ip, int(port, 16))
    return found


def sockets_of(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` has open (/proc/<pid>/fd)."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # ended meanwhile
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def is_loopback(ip) -> bool:
    return ip.is_loopback or (isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None
                              and ip.ipv4_mapped.is_loopback)


def test_is_loopback_reads_the_kernels_tables_as_written():
    assert is_loopback(ipaddress.ip_address("127.0.0.1")) and is_loopback(ipaddress.ip_address("::1"))
    assert is_loopback(ipaddress.ip_address("::ffff:127.0.0.1"))  # an IPv6 socket bound to IPv4's loopback
    for anywhere in ("0.0.0.0", "::", "::ffff:0.0.0.0", "192.0.2.2"):
        assert not is_loopback(ipaddress.ip_address(anywhere))
    with socket.socket(socket.AF_INET6) as s6, socket.socket() as s4:  # a real listener of each family
        s6.bind(("::", 0))
        s4.bind(("127.0.0.1", 0))
        s6.listen()
        s4.listen()
        table = listening()
        assert {table[i] for i in sockets_of(os.getpid()) if i in table} == {
            (ipaddress.ip_address("::"), s6.getsockname()[1]), (ipaddress.ip_address("127.0.0.1"), s4.getsockname()[1])}


@needs_proc
@pytest.mark.optional_deps("ray")
def test_a_local_ray_cluster_listens_on_loopback_only_and_dies_with_a_killed_run(digits_tiny_root, tmp_path):
    pytest.importorskip("ray")
    from runtime.reaper import _ray_descendants

    proc = start(digits_tiny_root, tmp_path, "-gr", "500", "--executor", "ray", "--workers", "2", "--no-progress")
    wait_for_round(proc, 2)  # its workers have trained a round
    ray_procs = _ray_descendants(proc.pid)
    cmds = {}
    for p in ray_procs:
        with contextlib.suppress(FileNotFoundError):  # a short-lived helper that ended meanwhile
            cmds[p] = open(f"/proc/{p}/cmdline").read().replace("\0", " ")
    cmds[proc.pid] = "main.py"
    table = listening()
    listeners = [(cmds[p].split()[0].rsplit("/", 1)[-1], *table[i]) for p in cmds for i in sockets_of(p) if i in table]
    names = [name for name, _, _ in listeners]
    # GCS, raylet (node and object managers), the runtime-env agent, both workers and the driver listen
    assert {"gcs_server", "raylet", "ray::RuntimeEnvAgent", "main.py"} <= set(names), listeners
    assert sum(name.startswith("ray::ClientWorker") for name in names) == 2, listeners
    assert [(name, str(ip), port) for name, ip, port in listeners if not is_loopback(ip)] == []
    assert DASHBOARD_PORT not in {port for _, port in table.values()}  # no dashboard unless asked for
    proc.kill()  # kill -9: no atexit, no ray.shutdown
    proc.wait()
    deadline = time.time() + 15
    while any(alive(p) for p in ray_procs) and time.time() < deadline:
        time.sleep(0.2)
    assert not [c for p, c in cmds.items() if alive(p)]


@needs_proc
@pytest.mark.optional_deps("ray")
@pytest.mark.parametrize("sig,repeat", [(signal.SIGINT, 3), (signal.SIGTERM, 1)])
def test_a_signal_ends_a_ray_run_with_one_line_and_no_ray_process_left(digits_tiny_root, tmp_path, sig, repeat):
    pytest.importorskip("ray")
    from runtime.reaper import _ray_descendants

    proc = start(digits_tiny_root, tmp_path, "-gr", "500", "--executor", "ray", "--workers", "2", "--no-progress")
    wait_for_round(proc, 2)
    ray_procs = _ray_descendants(proc.pid)
    assert ray_procs
    for _ in range(repeat):  # Ctrl-C, pressed again while the run ends, reaches the workers as well
        if proc.poll() is not None:
            break
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        time.sleep(0.05)
    proc.wait(timeout=120)
    err = proc.stderr.read().strip().splitlines()  # nothing from Ray: no start-up notes, no worker tracebacks
    assert proc.returncode == 128 + sig and len(err) == 1 and "interrupted in round" in err[0], (proc.returncode, err)
    assert sidecar(tmp_path)["status"] == "interrupted"
    deadline = time.time() + 15
    while any(alive(p) for p in ray_procs) and time.time() < deadline:
        time.sleep(0.2)
    assert not [p for p in ray_procs if alive(p)]


@pytest.mark.optional_deps("ray")
@pytest.mark.parametrize("address,expected", [("127.0.0.1:1", "nothing answers at 127.0.0.1:1"),
                                              ("ray://127.0.0.1:1", "127.0.0.1:1")])
def test_a_bad_ray_address_is_one_line_quickly(digits_tiny_root, tmp_path, capsys, address, expected):
    pytest.importorskip("ray")
    began = time.time()
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", "--executor", "ray", "--ray_address", address)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0] and time.time() - began < 30, err


@pytest.mark.optional_deps("ray")
def test_a_ray_client_address_without_rays_client_is_one_line(digits_tiny_root, tmp_path, capsys, monkeypatch):
    import importlib.util

    pytest.importorskip("ray")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else find_spec(name, *a))
    argv = cli(digits_tiny_root, tmp_path, "-gr", "1", "--executor", "ray", "--ray_address", "ray://10.0.0.1:10001")
    assert main.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs Ray's client: pip install 'ray[client]'" in err[0], err


def test_a_replay_that_cannot_restore_names_the_checkpoint_it_read(digits_tiny_root, tmp_path):
    """A lost worker sends the run back to its restart point; when that point does not fit the run, the one
    line names it: the checkpoint file, or "the last snapshot" kept in memory."""
    import re

    import torch

    from runtime import state
    from runtime.checkpoint import Checkpoints, snapshot
    from test_executors import build
    from utils.errors import FLError

    server = build(digits_tiny_root)
    bad = snapshot(server, 0, with_clients=False)
    bad["server"]["global_model"]["state"]["fc.bias"] = torch.zeros(3)  # the model has 10 classes
    points = Checkpoints(None)
    points.restart_point = bad
    with pytest.raises(FLError, match="^checkpoint the last snapshot (does not fit|is damaged)"):
        points.recover(server, RuntimeError("worker 1 lost"))
    path = tmp_path / "run.ckpt"
    state.write_file(bad, path)
    points.restart_point = path
    with pytest.raises(FLError, match=f"^checkpoint {re.escape(str(path))} (does not fit|is damaged)"):
        points.recover(server, RuntimeError("worker 1 lost"))
