"""Result files: ``results/<dataset>_<algo>_<goal>_<run>.h5`` plus a ``.json`` sidecar, written atomically
after every evaluation so a crash or a NaN loss never loses what was already measured."""
from __future__ import annotations

import contextlib
import os
import platform
import secrets
import time
from pathlib import Path

import numpy as np

from utils.paths import RESULTS_DIR
from utils.errors import FLError

__version__ = "0.1.0"


_writing = {"now": False, "interrupted": False, "signal": None}


def interrupt(signum, frame) -> None:
    """Signal handler for Ctrl-C and SIGTERM (main.py installs it): a KeyboardInterrupt, held back while
    result files are being written so that a signal never leaves a half-written file open. Only the first
    signal counts (``stopped_by``): a repeated Ctrl-C or SIGTERM while the run saves its results and ends
    its workers is ignored, so the run still ends with one line and exit code 128 + that signal."""
    if _writing["signal"] is not None:
        return
    _writing["signal"] = signum
    if _writing["now"]:
        _writing["interrupted"] = True
    else:
        raise KeyboardInterrupt


def reset_interrupt() -> None:
    """Forget an earlier run's signal (main.py, before it installs ``interrupt``)."""
    _writing["signal"] = None


def stopped_by() -> int | None:
    """The signal that stopped this run (SIGINT or SIGTERM), if one did; ``interrupt`` records it."""
    return _writing["signal"]


def atomic_write(writes: list[tuple[Path, object]]) -> None:
    """Write each (path, write(tmp_path)) to a temporary file first, then rename them all into place: a
    failed write (a full disk) leaves every previous complete file as it was and no temporary file behind,
    and the files of one save (an h5 and its sidecar) are replaced together. A signal that arrives
    meanwhile takes effect once the files are in place. Each temporary file is created anew, exclusively,
    under a random name beside its target (``exclusive_tmp``): a path planted there (a symlink to another
    file) is never followed or overwritten."""
    outer = _writing["now"]
    _writing["now"] = True
    tmps: list[Path] = []
    try:
        try:
            for path, write in writes:
                tmps.append(exclusive_tmp(path))
                write(tmps[-1])
        except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
            for tmp in tmps:
                tmp.unlink(missing_ok=True)
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
            raise FLError(f"could not write {writes[0][0]} ({why}); the previous complete file is kept") from None
        for tmp, (path, _) in zip(tmps, writes):
            os.replace(tmp, path)
    finally:
        _writing["now"] = outer
    if not outer and _writing["interrupted"]:
        _writing["interrupted"] = False
        raise KeyboardInterrupt


def exclusive_tmp(path: Path) -> Path:
    """A new empty file ``<name>.<random>.tmp`` beside ``path``, created exclusively (``O_EXCL``: never an
    existing file or a symlink's target), for a write that is then renamed onto ``path``."""
    for _ in range(100):
        tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o666))
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunRecorder:
    """Accumulates one run's per-evaluation series and writes them.

    h5 keys: ``rs_test_acc`` (sample-weighted), ``rs_test_auc``, ``rs_train_loss`` (PFLlib's three),
    ``rs_test_acc_mean`` / ``rs_test_acc_std`` (unweighted across clients), ``rs_round`` (round of each
    evaluation), ``rs_client_test_acc`` (evaluations x clients) and any extra series an algorithm adds
    (e.g. Ditto's global-model accuracy). Add-ons measured on their own rounds (``add_series``) carry their
    own index: ``rs_dlg_round`` with ``rs_dlg_psnr``, ``rs_dlg_ssim``, ``rs_dlg_label_acc``, ... for ``-dlg``;
    ``-dp`` adds ``rs_dp_epsilon_max`` / ``_mean`` and ``rs_dp_client_epsilon`` to every evaluation. The
    JSON sidecar holds the config, seeds, split hash, library version, machine, the wall time of every
    round (also ``rs_round_time``), the bytes sent up and down in all (per round: ``rs_bytes_up``,
    ``rs_bytes_down``, the tensors of every upload and broadcast payload, utils/comm.py) and the run's ``status``: running (while it runs), finished, diverged (a non-finite loss),
    interrupted (Ctrl-C or SIGTERM) or failed, with ``status_reason``."""

    def __init__(self, stem: str, meta: dict, out_dir: Path | str = RESULTS_DIR):
        self.out_dir = Path(out_dir)
        self.stem = stem
        self.meta = dict(meta)
        self.series: dict[str, list] = {}
        self.round_time: list[float] = []
        self.round_bytes: dict[str, list[int]] = {"up": [], "down": []}  # per round, summed over clients
        self.started = time.time()
        self.status, self.status_reason = "running", None  # finished / diverged / interrupted / failed
        self.board = None  # --tensorboard: a torch SummaryWriter (``log_to_tensorboard``)

    def log_to_tensorboard(self, folder: Path) -> None:
        """Also write every scalar of every series, by its name without ``rs_`` and at its round, as TensorBoard
        events in ``folder`` (torch's writer; the tensorboard package is imported only here)."""
        from torch.utils.tensorboard import SummaryWriter

        self.board = SummaryWriter(log_dir=str(folder))

    def _to_board(self, name: str, round_idx: int, value) -> None:
        if self.board is not None and np.ndim(value) == 0 and not isinstance(value, bool):
            self.board.add_scalar(name.removeprefix("rs_"), float(value), round_idx)

    @contextlib.contextmanager
    def lock(self):
        """Hold ``<stem>.lock`` while the run writes: a second run writing the same result name at the same
        time is refused with one line instead of overwriting it (a lock left by a killed run is taken over)."""
        path = self.out_dir / f"{self.stem}.lock"
        for _ in range(2):
            try:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
                break
            except FileExistsError:
                try:
                    pid = int(path.read_text() or 0)
                except (OSError, ValueError):
                    pid = 0
                if pid and pid != os.getpid() and _pid_alive(pid):
                    raise FLError(f"another run (pid {pid}) is writing {self.h5_path} now; wait for it or "
                                  f"choose another -go") from None
                path.unlink(missing_ok=True)  # stale: its run is gone
            except OSError as e:  # read-only, full, or not a folder
                raise FLError(f"cannot write in {self.out_dir} ({e.strerror or e}); choose another "
                              f"--results_dir") from None
        else:
            raise FLError(f"could not take the lock {path}; remove it if no run is writing there")
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        try:
            yield self
        finally:
            path.unlink(missing_ok=True)

    def finish(self, status: str, reason: str | None = None) -> None:
        """Record how the run ended in the sidecar (and write the files once more)."""
        self.status, self.status_reason = status, reason
        if self.board is not None:
            self.board.close()
        if not self.series and self.h5_path.exists():  # ended before measuring anything (a refused checkpoint):
            return  # the files of an earlier run stay as they were
        try:
            self.save()
        except FLError:  # a full disk: the previous complete files stay, their sidecar at least says so
            self._mark_previous()
            raise

    def _mark_previous(self) -> None:
        """Write the status into the sidecar of the previous complete save (a small file: a full disk may
        still take it). When even that fails, the error being raised already says what happened."""
        import ujson

        try:
            meta = ujson.loads(self.json_path.read_text())
            meta.update(status=self.status, status_reason=self.status_reason)
            atomic_write([(self.json_path, lambda tmp: tmp.write_text(ujson.dumps(meta, indent=1)))])
        except (OSError, ValueError, FLError):
            pass

    @property
    def h5_path(self) -> Path:
        return self.out_dir / f"{self.stem}.h5"

    @property
    def json_path(self) -> Path:
        return self.out_dir / f"{self.stem}.json"

    def add(self, round_idx: int, summary: dict) -> None:
        self.series.setdefault("rs_round", []).append(round_idx)
        for key, value in summary.items():
            name = key if key.startswith("rs_") else f"rs_{key}"
            self.series.setdefault(name, []).append(value)
            self._to_board(name, round_idx, value)

    def add_series(self, tag: str, round_idx: int, values: dict) -> None:
        """Series with their own round index, for add-ons that measure on other rounds than evaluations
        (e.g. DLG every -dlgg rounds): keys ``rs_<tag>_round`` and ``rs_<tag>_<name>``."""
        self.series.setdefault(f"rs_{tag}_round", []).append(round_idx)
        for key, value in values.items():
            self.series.setdefault(f"rs_{tag}_{key}", []).append(value)
            self._to_board(f"{tag}_{key}", round_idx, value)

    def state_dict(self) -> dict:
        """The series gathered so far (what a checkpoint keeps, so a resumed run writes complete files)."""
        return {"series": {k: list(v) for k, v in self.series.items()}, "round_time": list(self.round_time),
                "round_bytes": {k: list(v) for k, v in self.round_bytes.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.series = {k: list(v) for k, v in state["series"].items()}
        self.round_time = list(state["round_time"])
        self.round_bytes = {k: list(v) for k, v in state.get("round_bytes", {"up": [], "down": []}).items()}

    def best_last(self) -> tuple[float, float]:
        acc = self.series.get("rs_test_acc", [])
        return (max(acc), acc[-1]) if acc else (float("nan"), float("nan"))

    def save(self, extra_meta: dict | None = None) -> None:
        import h5py
        import ujson

        self.out_dir.mkdir(parents=True, exist_ok=True)

        def write_h5(tmp):
            with h5py.File(tmp, "w") as f:
                for key, values in self.series.items():
                    f.create_dataset(key, data=np.asarray(values, dtype=np.float64))
                f.create_dataset("rs_round_time", data=np.asarray(self.round_time, dtype=np.float64))
                for way, values in self.round_bytes.items():
                    f.create_dataset(f"rs_bytes_{way}", data=np.asarray(values, dtype=np.float64))

        best, last = self.best_last()
        meta = {**self.meta, **(extra_meta or {}), "library_version": __version__,
                "machine": {"python": platform.python_version(), "platform": platform.platform(),
                            "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count()},
                "round_time_s": self.round_time, "wall_time_s": time.time() - self.started,
                "bytes_up_total": sum(self.round_bytes["up"]), "bytes_down_total": sum(self.round_bytes["down"]),
                "best_test_acc": best, "last_test_acc": last,
                "evaluations": len(self.series.get("rs_round", [])),
                "status": self.status, "status_reason": self.status_reason}
        atomic_write([(self.h5_path, write_h5),
                      (self.json_path, lambda tmp: tmp.write_text(ujson.dumps(meta, indent=1)))])


def sidecar_status(sidecar: Path) -> str | None:
    """A result's ``status`` from its JSON sidecar (running, finished, diverged, interrupted, failed), None
    when the sidecar is absent or unreadable."""
    import json

    try:
        return json.loads(sidecar.read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def read_h5(path: Path | str) -> dict[str, np.ndarray]:
    """Every series of a result file, by name (the one reader of result files: main.py, scripts/)."""
    import h5py

    with h5py.File(path, "r") as f:
        return {k: f[k][()] for k in f.keys()}


def mean_std_over_runs(paths: list[Path | str]) -> dict:
    """Mean and std (over runs) of the best and of the last-round ``rs_test_acc``."""
    best, last = [], []
    for p in paths:
        acc = read_h5(p)["rs_test_acc"]
        best.append(acc.max())
        last.append(acc[-1])
    return {"runs": len(paths), "best_mean": float(np.mean(best)), "best_std": float(np.std(best)),
            "last_mean": float(np.mean(last)), "last_std": float(np.std(last))}
