"""Checkpoints: the whole state of a run, so a killed run resumes (``--resume``) or a lost worker is
recovered with exactly the numbers of an undisturbed run.

``--checkpoint_every N`` writes ``<results>/<stem>.ckpt`` after every N-th round and after the last one,
atomically (tmp + rename). It holds the server's state, the result recorder's series and every client's
state, each as its ``state_dict`` gives it (runtime/state.py: tensors and plain values; the config and
the data are rebuilt from the flags and the split). It is read with ``torch.load(weights_only=True)``,
which builds tensors and plain values only, so a checkpoint from someone else cannot run code; one that
was crafted, damaged or made for another run is refused with one line (docs/security.md).

A resumed run must use the same flags; only those in ``RUN_ONLY`` (where and how it runs, and ``-gr`` to
extend a run) may change.
"""
from __future__ import annotations

import pickle
from pathlib import Path


from runtime import state
from utils.errors import FLError
from utils.results import atomic_write

FORMAT = 2  # 1: pickled objects (refused: loading one could run code)
RUN_ONLY = {"executor", "device", "device_id", "workers", "gpus_per_worker", "ray_address", "max_restarts",
            "resume", "checkpoint_every", "progress", "results_dir", "dataset_root", "times", "prev",
            "global_rounds", "save_folder_name", "client_state", "client_state_dir", "overwrite", "print_config"}
KEYS = {"format": int, "round": int, "config": dict, "split": str, "server": dict, "recorder": (dict, type(None)),
        "clients": (list, type(None))}


def snapshot(server, round_idx: int, with_clients: bool = True) -> dict:
    """The state after ``round_idx`` (-1: before round 0; clients then rebuild from the factory), as
    tensors and plain values."""
    rec = server.recorder
    return {"format": FORMAT, "round": round_idx, "config": state.encode(server.cfg.to_dict(), {}, "config"),
            "split": server.data.config_hash, "server": server.state_dict(),
            "recorder": state.encode(rec.state_dict(), {}, "recorder") if rec is not None else None,
            "clients": server.executor.map(server.clients, "state_dict") if with_clients else None}


def checkpoint_file(recorder) -> Path:
    """Where the run of ``recorder`` (a ``RunRecorder``) keeps its checkpoint."""
    return recorder.out_dir / f"{recorder.stem}.ckpt"


class Checkpoints:
    """A run's checkpoints: the file (``<results>/<stem>.ckpt``; None when the run writes no results) and
    the point a lost worker returns to (that file, or a snapshot kept in memory)."""

    def __init__(self, recorder):
        self.path = None if recorder is None else checkpoint_file(recorder)
        self.restart_point: Path | dict | None = None

    def begin(self, server) -> int:
        """Resume from the run's checkpoint with ``--resume`` (when there is one), else start at round 0.
        Either way, set the point a lost worker returns to. Returns the first round to run."""
        first = 0
        if server.cfg.resume and self.path is not None and self.path.exists():
            first = restore(server, load(self.path, server), self.path)
            self.restart_point = self.path
            print(f"resuming {self.path.name} after round {first - 1}")
        else:
            if server.cfg.resume:
                print(f"--resume: no checkpoint {self.path}; starting at round 0")
            # Where a lost worker sends the run before any checkpoint: round 0 (clients rebuild themselves).
            self.restart_point = snapshot(server, -1, with_clients=False) if server.executor.can_lose_workers else None
        server.executor.end_setup()
        return first

    def save(self, server, round_idx: int) -> None:
        """Checkpoint after ``round_idx`` to the run's file (kept in memory when the run has no result
        files); it becomes the point a lost worker returns to."""
        ckpt = snapshot(server, round_idx)
        if self.path is None:
            self.restart_point = ckpt
            return
        atomic_write([(self.path, lambda tmp: state.write_file(ckpt, tmp))])
        self.restart_point = self.path

    def recover(self, server, error: Exception) -> int:
        """After a lost worker, once the server has rebuilt its clients: go back to the last checkpoint
        (round 0 without one) and return the round to replay from."""
        point = self.restart_point
        ckpt = load(point, server) if isinstance(point, Path) else point
        print(f"warning: {error}; rebuilt its clients, replaying from round {ckpt['round'] + 1}")
        return restore(server, ckpt, point if isinstance(point, Path) else "the last snapshot")


def load(path: Path, server) -> dict:
    """Read a checkpoint (tensors and plain values only) and check that it belongs to this configuration
    and split."""
    try:
        ckpt = state.read_file(path, map_location="cpu")
    except state.StateError as e:
        raise FLError(f"checkpoint {path} is damaged ({e}); delete it to start over") from None
    except pickle.UnpicklingError:
        raise FLError(f"checkpoint {path} holds objects other than tensors and plain values (made by an older "
                      f"version, or crafted to run code); it was not loaded; delete it to start over") from None
    except state.UNREADABLE as e:
        raise FLError(f"cannot read checkpoint {path} ({state.first_line(e)}); delete it to start over") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise FLError(f"{path} is not a checkpoint of this library version; delete it to start over")
    bad = [k for k, kind in KEYS.items() if not isinstance(ckpt.get(k), kind)]
    if bad:
        raise FLError(f"checkpoint {path} is damaged (missing or wrong: {', '.join(bad)}); delete it to start over")
    old, new = ckpt["config"], server.cfg.to_dict()
    diff = sorted(k for k in set(old) | set(new) if k not in RUN_ONLY and old.get(k) != new.get(k))
    if diff:
        shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:5])
        raise FLError(f"checkpoint {path} was made with other flags ({shown}); resume with the same flags, "
                      f"or drop --resume to start over")
    if ckpt["split"] != server.data.config_hash:
        raise FLError(f"checkpoint {path} was made on another '{server.data.name}' split; drop --resume")
    clients = ckpt["clients"]
    if clients is not None and (len(clients) != len(server.clients) or not all(isinstance(c, dict) for c in clients)):
        raise FLError(f"checkpoint {path} is damaged (it holds {len(clients)} client states for "
                      f"{len(server.clients)} clients); delete it to start over")
    if server.recorder is not None and ckpt["recorder"] is None:  # resuming would drop the rounds so far
        raise FLError(f"checkpoint {path} is damaged (it holds no results of the rounds it has run); delete it "
                      f"to start over")
    return ckpt


def restore(server, ckpt: dict, source) -> int:
    """Put every client (when saved), the server and the recorder back to the checkpoint; returns the
    first round still to run. A state that does not fit the run is refused with one line."""
    try:
        if ckpt["clients"] is not None:
            server.executor.call_each("load_state_dict", [(c, (s,)) for c, s in zip(server.clients, ckpt["clients"])])
        server.load_state_dict(ckpt["server"])
        if server.recorder is not None and ckpt["recorder"] is not None:
            server.recorder.load_state_dict(state.decode(ckpt["recorder"], None, {}, "cpu", "recorder"))
    except state.StateError as e:
        raise FLError(f"checkpoint {source} does not fit this run ({e}); delete it to start over") from None
    except (KeyError, TypeError, ValueError) as e:
        raise FLError(f"checkpoint {source} is damaged ({state.first_line(e)}); delete it to start over") from None
    return ckpt["round"] + 1
