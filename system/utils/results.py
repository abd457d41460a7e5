"""Result files: ``results/<dataset>_<algo>_<goal>_<run>.h5`` plus a ``.json`` sidecar, written atomically
after every evaluation so a crash or a NaN loss never loses what was already measured."""
from __future__ import annotations

import contextlib
import os
import platform
import time
from pathlib import Path

import numpy as np

from utils import fileio, locks
from utils.errors import FLError
from utils.paths import RESULTS_DIR

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


def raise_if_stopped() -> None:
    """A safe point (the round loop calls it before each round and before the final evaluation): once a
    signal has been recorded, a run still going ends here. ``interrupt`` raises its KeyboardInterrupt in
    whatever code runs when the signal arrives; in a finalizer (an object's ``__del__``, a weakref or
    garbage-collector callback) Python prints it as "Exception ignored" and goes on, and the run would
    otherwise train to its end and report success."""
    if _writing["signal"] is not None and not _writing["now"]:
        raise KeyboardInterrupt


def reset_interrupt() -> None:
    """Forget an earlier run's signal (main.py, before it installs ``interrupt``)."""
    _writing["signal"] = None


def stopped_by() -> int | None:
    """The signal that stopped this run (SIGINT or SIGTERM), if one did; ``interrupt`` records it."""
    return _writing["signal"]


def save_files(folder, writes: list[tuple[str, object]]) -> None:
    """Write each ``(name, write(file))`` into ``folder`` (a ``utils.fileio.Folder``) through a temporary
    file renamed into place (``Folder.replace``: no symlink followed, a full disk keeps every previous
    complete file, the files of one save are replaced together). A signal that arrives meanwhile takes
    effect once the files are in place."""
    outer = _writing["now"]
    _writing["now"] = True
    try:
        folder.replace(writes)
    finally:
        _writing["now"] = outer
    if not outer and _writing["interrupted"]:
        _writing["interrupted"] = False
        raise KeyboardInterrupt


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
        self.saved = None  # evaluations in this run's last complete save (None: none yet)
        self.checkpointed = None  # the round after which this run last wrote its checkpoint (runtime/checkpoint.py)

    def log_to_tensorboard(self, folder: Path) -> None:
        """Also write every scalar of every series, by its name without ``rs_`` and at its round, as TensorBoard
        events in ``folder`` (torch's writer; the tensorboard package is imported only here)."""
        from torch.utils.tensorboard import SummaryWriter

        self.board = SummaryWriter(log_dir=str(folder))

    def _to_board(self, name: str, round_idx: int, value) -> None:
        if self.board is not None and np.ndim(value) == 0 and not isinstance(value, bool):
            self.board.add_scalar(name.removeprefix("rs_"), float(value), round_idx)

    @property
    def folder(self) -> fileio.Folder:
        """The results folder, opened for one save (utils/fileio.py: every file of the run is written through
        it; its descriptor is closed once the save is done, so a run holds none between saves)."""
        return fileio.Folder(self.out_dir)

    @contextlib.contextmanager
    def lock(self):
        """Hold ``<stem>.lock`` while the run writes (``locks.take_lock``: pid and start time, created
        exclusively, held with flock: utils/locks.py): a second run writing the same result name at the same time is refused
        with one line instead of overwriting it; a lock left by a killed run is taken over."""
        folder = self.folder
        try:
            fd = locks.take_lock(folder, f"{self.stem}.lock")
        except locks.Busy as e:
            raise FLError(f"another run (pid {e.pid}) is writing {self.h5_path} now; wait for it or "
                          f"choose another -go") from None
        try:
            yield self
        finally:
            locks.release_lock(folder, f"{self.stem}.lock", fd)

    def finish(self, status: str, reason: str | None = None) -> None:
        """Record how the run ended in the sidecar (and write the files once more)."""
        self.status, self.status_reason = status, reason
        if self.board is not None:
            self.board.close()
        if not self.series and self.folder.entry(self.h5_path.name) is not None:  # ended before measuring anything (a refused checkpoint):
            return  # the files of an earlier run stay as they were
        try:
            self.save()
        except FLError as e:  # a full disk, a folder made read-only: the previous complete files stay
            sidecar = self._mark_previous()
            raise fileio.FileIOError(f"{str(e).split('; the previous complete file')[0]}; {self.kept(sidecar)}") from None

    def kept(self, sidecar: str) -> str:
        """What a run whose files can no longer be written keeps: its last complete save, what its sidecar
        says, its last checkpoint and how to continue from it."""
        if self.saved is not None:
            kept = f"{self.h5_path.name} keeps the first {self.saved} evaluation(s)"
        elif self.folder.entry(self.h5_path.name) is not None:
            kept = f"nothing of this run was saved ({self.h5_path.name} is an earlier run's)"
        else:
            kept = "nothing of this run was saved"
        if sidecar:
            kept += f", {sidecar}"
        if self.checkpointed is not None:
            kept += (f"; its checkpoint {self.stem}.ckpt after round {self.checkpointed} is kept: once the folder "
                     f"takes files again, rerun the same command with --resume to continue")
        return kept

    def _mark_previous(self) -> str:
        """Write the status into the sidecar of the previous complete save (a small file: a full disk may
        still take it; a folder made read-only takes it where the sidecar lies). Says what the sidecar now
        says, or that it could not be updated."""
        try:
            meta = self.folder.read_json(self.json_path.name, "sidecar")
        except (OSError, ValueError, FLError):
            return ""
        if not isinstance(meta, dict):
            return ""
        was = meta.get("status")
        meta.update(status=self.status, status_reason=self.status_reason)
        try:
            save_files(self.folder, [(self.json_path.name, lambda f: f.write(fileio.json_bytes(meta)))])
        except (OSError, ValueError, FLError):
            try:
                self.folder.rewrite_in_place(self.json_path.name, fileio.json_bytes(meta, indent=None))
            except (OSError, ValueError, FLError) as e:
                return f"its sidecar could not be updated ({str(e).split('(')[-1].rstrip(')')}) and still says '{was}'"
        return f"its sidecar says '{self.status}'"

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

        def write_h5(file):
            with h5py.File(file, "w") as f:
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
        text = ujson.dumps(meta, indent=1).encode()
        save_files(self.folder, [(self.h5_path.name, write_h5), (self.json_path.name, lambda f: f.write(text))])
        self.saved = meta["evaluations"]


RESULT_CAP = 4 << 30  # the largest result file read back (h5: series of every evaluation and client)
SERIES_CAP = 1 << 27  # numbers in one series
STATUSES = ("running", "finished", "diverged", "interrupted", "failed")


class ResultError(FLError):
    """A result file (h5 or sidecar) that is not what the library writes: one line naming it."""


def sidecar_status(sidecar: Path) -> str | None:
    """A result's ``status`` from its JSON sidecar (running, finished, diverged, interrupted, failed), None
    when the sidecar is absent or unreadable (a FIFO or a symlink there is not read)."""
    try:
        meta = fileio.read_json(sidecar, "sidecar", follow=False)
    except FLError:
        return None
    status = meta.get("status") if isinstance(meta, dict) else None
    return status if status in STATUSES else None


def read_h5(path: Path | str) -> dict[str, np.ndarray]:
    """Every series of a result file, by name (the one reader of result files: main.py, scripts/): a
    regular file (``fileio.open_read``), each entry a dataset of numbers of at most 2 dimensions."""
    import h5py

    out = {}
    with fileio.open_read(path, "result file", cap=RESULT_CAP) as file:
        try:
            with h5py.File(file, "r") as f:
                for k in f.keys():
                    d = f.get(k)
                    if not isinstance(d, h5py.Dataset):
                        raise ResultError(f"result file {path}: '{k}' is not a series")
                    if d.dtype.kind not in "fiub" or d.ndim > 2 or d.size > SERIES_CAP:
                        raise ResultError(f"result file {path}: '{k}' is not a series of numbers ({d.dtype}, "
                                          f"shape {d.shape})")
                    out[k] = d[()]
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            raise ResultError(f"result file {path} cannot be read as HDF5 ({fileio.why(e)})") from None
    return out


def check_series(series: dict, path) -> dict:
    """A result's series as the scripts use them: ``rs_test_acc`` one number per evaluation, ``rs_round``
    (where present) as long and of whole, increasing rounds."""
    acc = series.get("rs_test_acc")
    if acc is None or acc.ndim != 1 or not len(acc):
        raise ResultError(f"result file {path} holds no accuracy series (rs_test_acc, one number per evaluation)")
    rounds = series.get("rs_round")
    if rounds is not None and (rounds.ndim != 1 or len(rounds) != len(acc) or (len(rounds) and (
            not np.all(np.isfinite(rounds)) or np.any(np.diff(rounds) <= 0) or rounds.min() < 0))):
        raise ResultError(f"result file {path}: rs_round is not one increasing round per evaluation")
    return series


def read_sidecar(path: Path | str) -> dict:
    """A result's JSON sidecar, its schema checked: an object whose ``config`` is an object, ``label`` a
    string, ``run`` an integer and ``status`` one of ``STATUSES``, where present."""
    meta = fileio.read_json(path, "sidecar")
    if not isinstance(meta, dict):
        raise ResultError(f"sidecar {path} is not a JSON object")
    kinds = {"config": dict, "label": str, "run": int, "status": (str, type(None)), "seed": int,
             "status_reason": (str, type(None))}
    for key, kind in kinds.items():
        if key in meta and (not isinstance(meta[key], kind) or isinstance(meta[key], bool)):
            raise ResultError(f"sidecar {path}: '{key}' is a {type(meta[key]).__name__}")
    if meta.get("status") not in (None, *STATUSES):
        raise ResultError(f"sidecar {path}: unknown status {str(meta['status'])[:40]!r}")
    return meta


def mean_std_over_runs(paths: list[Path | str]) -> dict:
    """Mean and std (over runs) of the best and of the last-round ``rs_test_acc``."""
    best, last = [], []
    for p in paths:
        acc = check_series(read_h5(p), p)["rs_test_acc"]
        best.append(acc.max())
        last.append(acc[-1])
    return {"runs": len(paths), "best_mean": float(np.mean(best)), "best_std": float(np.std(best)),
            "last_mean": float(np.mean(last)), "last_std": float(np.std(last))}
