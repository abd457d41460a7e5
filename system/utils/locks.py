"""Locks on a run's result name: created exclusively holding the holder's pid and start time, held with
``flock`` while the run writes, taken over by exactly one process once their holder is gone (a lock file
in a ``utils.fileio.Folder``: never through a symlink, never a FIFO or a folder)."""
from __future__ import annotations

import contextlib
import fcntl
import os
import stat

from utils.fileio import FileIOError, Folder, _kind, check_name, read_proc, why

def process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks after boot, /proc/<pid>/stat field 22), None where unknown:
    with the pid it names one process, even after the pid is reused."""
    try:
        fields = read_proc(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()
        return fields[19].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    return True


def _holder(text: bytes) -> tuple[int, str | None]:
    parts = text.decode("ascii", "replace").split()
    try:
        pid = int(parts[0]) if parts else 0
    except ValueError:
        pid = 0
    return pid, (parts[1] if len(parts) > 1 else None)


def _lock_alive(pid: int, start: str | None) -> bool:
    """Whether the process a lock names still runs: its pid is alive and, where the lock records its start
    time, it started then (a reused pid is another process)."""
    if pid <= 0 or pid == os.getpid() or not pid_alive(pid):
        return False
    return start is None or process_start(pid) in (None, start)


class Busy(FileIOError):
    """The lock is held by a live process (``pid``)."""

    def __init__(self, message: str, pid: int):
        super().__init__(message)
        self.pid = pid


def take_lock(folder: Folder, name: str) -> int:
    """Hold the lock file ``name`` in ``folder``: it appears already holding this process's pid and start
    time (written under a temporary name, then linked into place: exclusive creation), and this process
    keeps an ``flock`` on it while it runs (the kernel drops that when the process dies, however it dies).
    A lock whose holder is gone is taken over by exactly one process: the one that gets its ``flock``;
    the others are refused. Raises ``Busy`` when a live process holds it, ``FileIOError`` when what is
    there is not a lock file (a folder, a FIFO, a symlink). Returns the descriptor to ``release_lock``."""
    check_name(name, "lock")
    me = f"{os.getpid()} {process_start(os.getpid()) or '-'}\n".encode()
    for _ in range(100):
        try:
            tmp = folder._exclusive_tmp(name)
        except OSError as e:
            raise FileIOError(f"cannot write in {folder.path} ({why(e)}); choose another {folder.what}") from None
        fd = os.open(tmp, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder.fd)
        try:
            os.write(fd, me)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.link(tmp, name, src_dir_fd=folder.fd, dst_dir_fd=folder.fd, follow_symlinks=False)
            return fd
        except FileExistsError:
            os.close(fd)
        except OSError as e:
            os.close(fd)
            raise FileIOError(f"cannot write in {folder.path} ({why(e)}); choose another {folder.what}") from None
        finally:
            folder._drop([tmp])
        fd = _take_over(folder, name, me)
        if fd is not None:
            return fd
    raise FileIOError(f"could not take the lock {folder.path / name}; remove it if no run is writing there")


def _take_over(folder: Folder, name: str, me: bytes) -> int | None:
    """The descriptor of the stale lock ``name``, now held and naming this process; None when the entry
    changed meanwhile (try again)."""
    path = folder.path / name
    try:
        fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder.fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        st = folder.entry(name)
        kind = _kind(st.st_mode) if st is not None else why(e)
        raise FileIOError(f"{path} is {kind}, not a lock file this library wrote; remove it if no run is "
                          f"writing there") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileIOError(f"{path} is {_kind(st.st_mode)}, not a lock file this library wrote; remove it if "
                              f"no run is writing there")
        pid, start = _holder(os.pread(fd, 64, 0))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(f"another run (pid {pid}) is writing there now", pid) from None
        if _lock_alive(pid, start):  # a lock of a version that held no flock, its run alive
            raise Busy(f"another run (pid {pid}) is writing there now", pid)
        now = folder.entry(name)
        if now is None or (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev):
            os.close(fd)
            return None
        os.ftruncate(fd, 0)
        os.pwrite(fd, me, 0)
        return fd
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def release_lock(folder: Folder, name: str, fd: int) -> None:
    """Remove the lock this process holds (while still holding it), then let it go."""
    try:
        st, now = os.fstat(fd), folder.entry(name)
        if now is not None and (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
            os.unlink(name, dir_fd=folder.fd)
    except (OSError, FileIOError):
        pass
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
