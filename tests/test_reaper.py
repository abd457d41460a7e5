"""The Ray reaper (runtime/reaper.py) driven in this process on a tree of plain processes, some named like Ray's:
which descendants it finds, that it kills only those (and only while the pid still names the same process),
that it ends when the run closes its pipe or dies, and its /proc parsing against a reading made here. A real
Ray cluster killed with its run: tests/test_reliability.py (optional, slow)."""
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from runtime import reaper

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")

SLEEP = "import time; time.sleep(120)"
# root: two children, one named like a Ray worker, one plain; the plain one has a grandchild named like
# Ray's GCS. Prints the three pids, then waits.
TREE = f"""
import subprocess, sys, time
a = subprocess.Popen([sys.executable, "-c", {SLEEP!r}, "ray::IDLE"])
b = subprocess.Popen([sys.executable, "-c", '''
import subprocess, sys, time
c = subprocess.Popen([sys.executable, "-c", {SLEEP!r}, "/opt/bin/gcs_" + "server"])  # b's own command line: no mark
print(c.pid, flush=True)
time.sleep(120)
'''], stdout=subprocess.PIPE, text=True)
c = int(b.stdout.readline())
print(a.pid, b.pid, c, flush=True)
time.sleep(120)
"""


def gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped by its new parent counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def wait_gone(pids, timeout=10.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return all(gone(p) for p in pids)


@pytest.fixture
def tree():
    root = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    a, b, c = map(int, root.stdout.readline().split())
    deadline = time.time() + 10  # a process just past exec can show an empty command line for a moment
    while time.time() < deadline and not all(open(f"/proc/{p}/cmdline", "rb").read() for p in (a, c)):
        time.sleep(0.01)
    yield root, a, b, c
    kill(a, b, c, root.pid)
    root.wait()


def kill(*pids) -> None:
    """SIGKILL each of ``pids`` still there (None: none to kill)."""
    for pid in pids:
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def closed_pipe():
    r, w = os.pipe()
    os.close(w)
    return os.fdopen(r, "rb")


def watch(root: int, start: str, pipe, timeout: float = 15.0) -> float:
    """Run the watch loop (in a thread, so that one that never ends fails the test instead of hanging it);
    the seconds it took."""
    t0 = time.time()
    thread = threading.Thread(target=reaper._watch, args=(root, start, pipe), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the watch did not end"
    return time.time() - t0


def test_the_ray_descendants_are_found_at_any_depth_and_no_others(tree):
    root, a, b, c = tree
    found = reaper._ray_descendants(root.pid)
    assert set(found) == {a, c}
    assert found[a] == reaper._start_time(a) and found[c] == reaper._start_time(c)


def test_a_closed_pipe_ends_the_watch_and_kills_only_rays_processes(tree):
    root, a, b, c = tree
    with closed_pipe() as pipe:
        assert watch(root.pid, reaper._start_time(root.pid), pipe) < 1.0  # at once, not after an interval
    assert wait_gone([a, c])
    assert not gone(b) and root.poll() is None


def test_the_runs_death_ends_the_watch_and_kills_what_it_saw(tree):
    root, a, b, c = tree
    r, w = os.pipe()  # never written nor closed during the watch: only the run's death can end it
    def die():  # killed and reaped by its parent, as a shell reaps a killed main.py
        root.kill()
        root.wait()

    threading.Timer(3 * reaper.INTERVAL_S, die).start()
    with os.fdopen(r, "rb") as pipe:
        took = watch(root.pid, reaper._start_time(root.pid), pipe)
    os.close(w)
    assert 3 * reaper.INTERVAL_S <= took < 3 * reaper.INTERVAL_S + 5
    assert wait_gone([a, c])
    assert not gone(b)  # orphaned, not Ray's: left alone



def test_the_watch_ends_within_one_interval_of_the_runs_death(tree):
    """The promise of the module: Ray's processes end within about one interval (0.5 s) of the run's end.
    The run dies 1.6 s in; polled every 0.5 s the watch ends by about 2.0 s (every 1.5 s: at 3.0 s)."""
    root, a, b, c = tree

    def die():
        root.kill()
        root.wait()

    threading.Timer(1.6, die).start()
    r, w = os.pipe()
    with os.fdopen(r, "rb") as pipe:
        took = watch(root.pid, reaper._start_time(root.pid), pipe)
    os.close(w)
    assert 1.6 <= took < 2.8
    assert wait_gone([a, c])


def test_a_thread_or_process_that_vanishes_mid_scan_is_skipped(tree, monkeypatch):
    """Between listing and reading, a thread of the run can end (its children file is gone) and a process
    can exit (its cmdline is gone): the scan skips them and goes on with the rest."""
    root, a, b, c = tree
    listdir, children = os.listdir, reaper._children
    ghost = 2 ** 22 + 7  # no such thread or process (above Linux's pid limit)

    def tasks(path):  # a vanished thread listed first
        return [str(ghost), *listdir(path)] if path == f"/proc/{root.pid}/task" else listdir(path)

    monkeypatch.setattr(os, "listdir", tasks)
    assert set(reaper._children(root.pid)) == {a, b}
    monkeypatch.setattr(reaper, "_children", lambda pid: children(pid) + ([ghost] if pid == root.pid else []))
    assert set(reaper._ray_descendants(root.pid)) == {a, c}  # the ghost is popped first

def test_a_pid_that_names_another_process_now_is_not_killed(tree):
    root, a, b, c = tree
    reaper._kill({a: "0"})  # the start time recorded for this pid is not a's
    time.sleep(0.2)
    assert not gone(a)
    reaper._kill({a: reaper._start_time(a)})
    assert wait_gone([a])


def test_a_watch_started_on_a_dead_run_kills_nothing(tree):
    root, a, b, c = tree
    with closed_pipe() as pipe:
        watch(root.pid, "0", pipe)  # root's start time differs: the run it was started for is gone
    time.sleep(0.2)
    assert not gone(a) and not gone(c)


def test_start_time_reads_field_22_even_when_the_name_holds_parentheses():
    """The child reads its own start time (field 22 of /proc/self/stat, split by hand before it renames
    itself), then takes a name with ') ' in it, which splits the line's fields differently."""
    code = ("s = open('/proc/self/stat').read(); print(s[s.rindex(')') + 2:].split(' ')[19], flush=True); "
            "open('/proc/self/comm', 'w').write('a) b c) d'); print('renamed', flush=True); "
            "import time; time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        expected = p.stdout.readline().strip()
        assert p.stdout.readline().strip() == "renamed"
        with open(f"/proc/{p.pid}/stat") as f:
            assert ") b c) d)" in f.read()
        assert reaper._start_time(p.pid) == expected
        assert reaper._start_time(2 ** 22 + 1) is None  # no such process
    finally:
        p.kill()
        p.wait()


def test_the_watcher_process_ignores_ctrl_c_and_exits_when_its_pipe_closes():
    w = reaper.watch()
    try:
        time.sleep(0.5)  # the interpreter has started and installed its handlers
        os.kill(w.pid, signal.SIGINT)
        time.sleep(0.3)
        assert w.poll() is None
        t0 = time.time()
        reaper.stop(w)
        assert w.returncode == 0 and time.time() - t0 < 5
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()


def test_processes_started_since_the_last_scan_are_found_when_the_pipe_closes(monkeypatch):
    """The run closes the pipe right after ray.shutdown: a Ray process started since the last periodic scan
    is found by the scan made on closing (periodic scans are pushed out to 60 s here, so only the first one
    and the closing one run)."""
    monkeypatch.setattr(reaper, "INTERVAL_S", 60.0)
    spawn = ("import subprocess, sys\n"
             "sys.stdin.readline()\n"
             "p = subprocess.Popen(['bash', '-c', 'exec -a ray::late sleep 120'])\n"
             "print(p.pid, flush=True)\n"
             "sys.stdin.readline()\n")
    root = subprocess.Popen([sys.executable, "-c", spawn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    r, w = os.pipe()
    late = None
    try:
        thread = threading.Thread(target=reaper._watch, args=(root.pid, reaper._start_time(root.pid),
                                                              os.fdopen(r, "rb")), daemon=True)
        thread.start()
        time.sleep(0.5)  # the first scan (it finds nothing) is done; the watch waits on the pipe
        root.stdin.write("\n")
        root.stdin.flush()
        late = int(root.stdout.readline())
        deadline = time.time() + 10
        while b"ray::late" not in open(f"/proc/{late}/cmdline", "rb").read() and time.time() < deadline:
            time.sleep(0.01)
        os.close(w)
        thread.join(15)
        assert not thread.is_alive()
        assert wait_gone([late])
    finally:
        kill(late, root.pid)
        root.wait()


def test_the_watcher_runs_in_its_own_session_and_holds_none_of_the_runs_files():
    """Its own session: a Ctrl-C to the terminal's process group does not reach it. No inherited descriptors:
    it cannot keep open a pipe or file of the run's (an inheritable pipe is made here to see that)."""
    r, w = os.pipe()
    os.set_inheritable(w, True)
    pipe = os.readlink(f"/proc/self/fd/{w}")
    watcher = reaper.watch()
    try:
        assert os.getsid(watcher.pid) == watcher.pid != os.getsid(0)
        held = []
        for fd in os.listdir(f"/proc/{watcher.pid}/fd"):
            with contextlib.suppress(FileNotFoundError):  # a file the starting interpreter closed meanwhile
                held.append(os.readlink(f"/proc/{watcher.pid}/fd/{fd}"))
        assert held and pipe not in held
    finally:
        reaper.stop(watcher)
        os.close(r)
        os.close(w)


def test_stop_kills_and_reaps_a_watcher_that_does_not_end_in_ten_seconds():
    calls = []

    class Hung:  # a watcher that never exits by itself
        class stdin:
            @staticmethod
            def close():
                calls.append("close")

        def wait(self, timeout=None):
            calls.append(("wait", timeout))
            if timeout is not None:
                raise subprocess.TimeoutExpired("watcher", timeout)

        def kill(self):
            calls.append("kill")

    reaper.stop(Hung())
    assert calls == ["close", ("wait", 10.0), "kill", ("wait", None)]
    reaper.stop(None)  # no watcher (no /proc): nothing to do

