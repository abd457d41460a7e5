"""Ray's processes die with the run, however it ends (``kill -9`` of main.py included).

A local Ray cluster is a dozen processes (GCS, raylet, dashboard and runtime-env agents, workers) that
``ray.shutdown`` ends, but nothing ends them when the process that started them is killed outright.
``watch()`` starts a small watcher process (plain Python, this file run as a script, in its own session so
that a Ctrl-C to the terminal's group does not end it first) that, every ``INTERVAL_S``, notes which
descendants of the run are Ray's; once the run's process is gone, or closes the watcher's pipe after
``ray.shutdown``, it kills those still alive and exits: within about one interval of the run's end.
Linux only (it reads ``/proc``); elsewhere ``watch`` returns None.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

INTERVAL_S = 0.5
RAY_MARKS = ("ray::", "/ray/", "raylet", "gcs_server")  # in the command line of every Ray process


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot): with the pid, it names one process for good."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _children(pid: int) -> list[int]:
    kids = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                kids += [int(k) for k in f.read().split()]
        except OSError:
            continue
    return kids


def _ray_descendants(root: int) -> dict[int, str]:
    """pid -> start time of every descendant of ``root`` whose command line marks it as Ray's."""
    found, todo = {}, _children(root)
    while todo:
        pid = todo.pop()
        todo += _children(pid)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        start = _start_time(pid)
        if start is not None and any(m in cmd for m in RAY_MARKS):
            found[pid] = start
    return found


def _kill(seen: dict[int, str]) -> None:
    for pid, start in seen.items():
        if _start_time(pid) == start:  # still that process, not a new one given the same pid
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _watch(root: int, root_start: str, pipe) -> None:
    seen: dict[int, str] = {}
    while _start_time(root) == root_start:
        seen.update(_ray_descendants(root))
        readable, _, _ = select.select([pipe], [], [], INTERVAL_S)
        if readable and not os.read(pipe.fileno(), 1):  # closed: by the run after ray.shutdown, or at its death
            seen.update(_ray_descendants(root))
            break
    _kill(seen)


def watch() -> subprocess.Popen | None:
    """Start the watcher of this process's Ray descendants (None where there is no ``/proc``). Close its
    ``stdin`` once Ray is shut down (``stop``): it then ends what is left and exits."""
    if not os.path.exists("/proc/self/task"):
        return None
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), str(os.getpid()), _start_time(os.getpid())],
                            stdin=subprocess.PIPE, start_new_session=True, close_fds=True)


def stop(watcher: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """After ``ray.shutdown``: let the watcher end Ray's remaining processes, and wait for it."""
    if watcher is None:
        return
    watcher.stdin.close()
    try:
        watcher.wait(timeout)
    except subprocess.TimeoutExpired:
        watcher.kill()
        watcher.wait()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch(int(sys.argv[1]), sys.argv[2], sys.stdin)
