"""Checkpoints: the whole state of a run, so a killed run resumes (``--resume``) or a lost worker is
recovered with exactly the numbers of an undisturbed run.

``--checkpoint_every N`` writes ``<results>/<stem>.ckpt`` after every N-th round and after the last one,
atomically (tmp + rename). It holds the server's state, the result recorder's series and every client's
state, each as ``server_state`` and ``client_state`` give it (runtime/state.py: tensors and plain values; the config and
the data are rebuilt from the flags and the split). It is read with ``torch.load(weights_only=True)``,
which builds tensors and plain values only, so a checkpoint from someone else cannot run code; one that
was crafted, damaged or made for another run is refused with one line (docs/security.md).

A resumed run must use the same flags; only those in ``RUN_ONLY`` (where and how it runs, and ``-gr`` to
extend a run) may change.
"""
from __future__ import annotations

import copy
import os
import pickle
from pathlib import Path

import torch

from runtime import state
from utils.errors import FLError
from utils.results import save_files

# 1: pickled objects (refused: loading one could run code); 2: without the run's identity (refused: whose
# run it continues cannot be told; 3 adds ``identity``)
FORMAT = 3
RUN_ONLY = {"executor", "device", "device_id", "workers", "gpus_per_worker", "ray_address", "max_restarts",
            "resume", "checkpoint_every", "progress", "results_dir", "dataset_root", "times", "prev",
            "global_rounds", "save_folder_name", "client_state", "client_state_dir", "overwrite", "print_config"}
KEYS = {"format": int, "round": int, "config": dict, "split": str, "server": dict, "recorder": (dict, type(None)),
        "clients": (list, type(None)), "identity": dict}


def identity(server) -> dict:
    """Whose state a checkpoint holds: the run index, its seed, the algorithm, the dataset and the split's
    checksum. A checkpoint of another run is refused even where every flag is the same."""
    return {"run": server.run, "seed": server.cfg.seed + server.run, "algorithm": server.cfg.algorithm,
            "dataset": server.data.name, "split": server.data.config_hash}


# The server's attributes a checkpoint leaves out (its ``declares.checkpoint_skip`` adds to them), those
# whose saved value must be this run's, and those built from the flags (None in a fresh server: None saved).
SERVER_SKIP = ("checkpoints", "new_clients", "timer")
SERVER_FIXED = ("run",)
SERVER_BUILT = ("client_model_names",)


def server_links(server) -> dict:
    """Objects a server's saved state refers to rather than holds (wherever they occur in its attributes):
    they are rebuilt from the flags and the split, or live elsewhere."""
    return {"cfg": server.cfg, "data": server.data, "recorder": server.recorder, "executor": server.executor,
            **{f"client:{c.id}": c for c in server.clients}}


def server_state(server) -> dict:
    """The server's state as tensors and plain values (runtime/state.py): every attribute but
    ``SERVER_SKIP`` and its ``checkpoint_skip`` (global model, streams, an algorithm's own state such as
    stored client models)."""
    links = {id(v): k for k, v in server_links(server).items() if v is not None}
    return state.encode_attrs(server, links, (*SERVER_SKIP, *server.declares.checkpoint_skip), "server")


def load_server_state(server, saved: dict) -> None:
    """Put a ``server_state`` back onto the server, as built by its constructor. A module the constructor
    does not build (made during the run) is rebuilt as a copy of the global model, into which the saved
    entries are loaded strictly."""
    state.decode_attrs(server, saved, server_links(server), server.device, "server",
                       lambda name: copy.deepcopy(server.global_model), SERVER_FIXED, SERVER_BUILT)


# A client's attributes whose saved value must be this client's (whose state it is), and those its
# constructor builds from the flags (None in a fresh client: None saved).
CLIENT_FIXED = ("id", "run")
CLIENT_BUILT = ("white", "scaler", "ala", "dp", "x_val", "y_val")


def client_links(client) -> dict:
    """Objects a client's saved state refers to rather than holds: the config and the data, rebuilt from the
    flags and the split."""
    return {"cfg": client.cfg, "x_train": client.x_train, "y_train": client.y_train, "x_test": client.x_test,
            "y_test": client.y_test,
            **({} if client.x_val is None else {"x_val": client.x_val, "y_val": client.y_val})}


def client_state(client, skip=()) -> dict:
    """The client's state as tensors and plain values (runtime/state.py): every attribute but its
    ``declares.checkpoint_skip`` and ``skip`` (model, optimizer, streams, ALA, an algorithm's extras). Run
    where the client lives (``executor.map(clients, client_state)``); parking keeps the same."""
    links = {id(v): k for k, v in client_links(client).items()}
    return state.encode_attrs(client, links, (*client.declares.checkpoint_skip, *skip), f"client {client.id}")


def load_client_state(client, saved: dict) -> None:
    """Put a ``client_state`` back onto the client, as built by its constructor; a module the constructor
    does not build comes from the client's ``new_module`` hook."""
    state.decode_attrs(client, saved, client_links(client), client.device, f"client {client.id}",
                       client.new_module, CLIENT_FIXED, CLIENT_BUILT)


def snapshot(server, round_idx: int, with_clients: bool = True) -> dict:
    """The state after ``round_idx`` (-1: before round 0; clients then rebuild from the factory), as
    tensors and plain values."""
    rec = server.recorder
    return {"format": FORMAT, "round": round_idx, "identity": identity(server),
            "config": state.encode(server.cfg.to_dict(), {}, "config"),
            "split": server.data.config_hash, "server": server_state(server),
            "recorder": state.encode(rec.state_dict(), {}, "recorder") if rec is not None else None,
            "clients": server.executor.map(server.clients, client_state) if with_clients else None}


def checkpoint_file(recorder) -> Path:
    """Where the run of ``recorder`` (a ``RunRecorder``) keeps its checkpoint."""
    return recorder.out_dir / f"{recorder.stem}.ckpt"


class Checkpoints:
    """A run's checkpoints: the file (``<results>/<stem>.ckpt``; None when the run writes no results) and
    the point a lost worker returns to (that file, or a snapshot kept in memory)."""

    def __init__(self, recorder):
        self.recorder = recorder
        self.path = None if recorder is None else checkpoint_file(recorder)
        self.restart_point: Path | dict | None = None
        self.resumed: Path | None = None  # the checkpoint this run continues, once restored

    def begin(self, server) -> int:
        """Resume from the run's checkpoint with ``--resume`` (when there is one), else start at round 0.
        Either way, set the point a lost worker returns to. Returns the first round to run."""
        first = 0
        if server.cfg.resume and self.path is not None and os.path.lexists(self.path):
            first = restore(server, load(self.path, server), self.path)
            self.restart_point = self.resumed = self.path
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
        save_files(self.recorder.folder, [(self.path.name, lambda f: state.write_file(ckpt, f))])
        self.restart_point = self.path
        self.recorder.checkpointed = round_idx

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
    fmt = ckpt.get("format") if isinstance(ckpt, dict) else None
    if type(fmt) is int and fmt in (1, 2):
        raise FLError(f"checkpoint {path} was written by an earlier version (format {fmt}: it does not say "
                      f"which run it holds); delete it to start over")
    if type(fmt) is not int or fmt != FORMAT:
        raise FLError(f"{path} is not a checkpoint of this library version; delete it to start over")
    bad = [k for k, kind in KEYS.items() if not isinstance(ckpt.get(k), kind)]
    if bad:
        raise FLError(f"checkpoint {path} is damaged (missing or wrong: {', '.join(bad)}); delete it to start over")
    old, new = ckpt["config"], server.cfg.to_dict()
    diff = sorted(k for k in set(old) | set(new) if k not in RUN_ONLY and not _same(old.get(k), new.get(k)))
    if diff:
        shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:5])
        raise FLError(f"checkpoint {path} was made with other flags ({shown}); resume with the same flags, "
                      f"or drop --resume to start over")
    mine, theirs = identity(server), ckpt["identity"]
    other = [k for k in mine if not _same(theirs.get(k), mine[k])]
    if other:
        shown = ", ".join(f"{k} {str(theirs.get(k))[:20]!r} -> {mine[k]!r}" for k in other)
        raise FLError(f"checkpoint {path} holds another run ({shown}); drop --resume, or resume that run")
    if ckpt["split"] != server.data.config_hash:
        raise FLError(f"checkpoint {path} was made on another '{server.data.name}' split; drop --resume")
    check_values(ckpt, server, path)
    clients = ckpt["clients"]
    if clients is not None and (len(clients) != len(server.clients) or not all(isinstance(c, dict) for c in clients)):
        raise FLError(f"checkpoint {path} is damaged (it holds {len(clients)} client states for "
                      f"{len(server.clients)} clients); delete it to start over")
    if server.recorder is not None and ckpt["recorder"] is None:  # resuming would drop the rounds so far
        raise FLError(f"checkpoint {path} is damaged (it holds no results of the rounds it has run); delete it "
                      f"to start over")
    return ckpt


def _same(saved, mine) -> bool:
    """Whether a saved plain value equals the run's (of the same type: a tensor or a list saved where the
    run holds a number is another value, not an error)."""
    if type(saved) is not type(mine):
        return False
    try:
        return bool(saved == mine)
    except (RuntimeError, TypeError, ValueError):
        return False


def _real(v) -> bool:
    """An int or float (numpy's float64 is one), never a bool: true and false are not recorded numbers."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number(v, nested: bool) -> bool:
    """A recorded value: a number, a numpy scalar or (``nested``: per-client values) a list, array or
    1-d tensor of numbers, as ``state.encode`` saved them."""
    if _real(v):
        return True
    if isinstance(v, dict) and v.get(state.KIND) == "numpy_scalar":
        return _real(v.get("value"))
    if not nested:
        return False
    if isinstance(v, dict) and v.get(state.KIND) == "ndarray":
        v = v.get("data")
    if isinstance(v, torch.Tensor):
        return v.dim() <= 1 and not v.is_complex()
    return isinstance(v, list) and all(_real(e) for e in v)


def _numbers(values, nested: bool = False) -> bool:
    return isinstance(values, list) and all(_number(v, nested) for v in values)


def check_values(ckpt: dict, server, path) -> None:
    """The checkpoint's values, before any is loaded: the round a whole number from -1 (before round 0) to
    -gr - 1, the recorded series numbers, one per evaluation, their rounds increasing and none after the
    checkpoint's round (so a resumed run continues them)."""
    def damaged(what):
        return FLError(f"checkpoint {path} is damaged ({what}); delete it to start over")

    rnd = ckpt["round"]
    if isinstance(rnd, bool) or not -1 <= rnd:
        raise damaged(f"round {rnd!r}")
    if rnd >= max(server.cfg.global_rounds, 1):  # rounds 0 .. -gr - 1 train; the checkpoint is after one of them
        raise FLError(f"checkpoint {path} holds {rnd + 1} rounds, more than -gr {server.cfg.global_rounds}; resume "
                      f"with -gr {rnd + 1} or more (or drop --resume to start over)")
    rec = ckpt["recorder"]
    if rec is None:
        return
    series, times = rec.get("series"), rec.get("round_time")
    if not isinstance(series, dict) or not _numbers(times) or not all(
            isinstance(k, str) and _numbers(v, nested=True) for k, v in series.items()):
        raise damaged("its recorded series are not lists of numbers")
    bytes_ = rec.get("round_bytes", {"up": [], "down": []})
    if not isinstance(bytes_, dict) or not all(_numbers(v) for v in bytes_.values()):
        raise damaged("its recorded bytes are not lists of numbers")
    tags = {k[3:-len("_round")] for k in series if k.endswith("_round") and k != "rs_round"}
    for key, values in series.items():
        tag = next((t for t in tags if key.startswith(f"rs_{t}_")), None)
        index = series.get(f"rs_{tag}_round" if tag else "rs_round", [])
        if len(values) != len(index):
            raise damaged(f"series {key[:40]} has {len(values)} entries for {len(index)} evaluations")
    for key in ["rs_round", *(f"rs_{t}_round" for t in tags)]:
        rounds = series.get(key, [])
        whole = all(isinstance(r, int) and not isinstance(r, bool) for r in rounds)
        if not whole or any(b <= a for a, b in zip(rounds, rounds[1:])) or (
                rounds and (rounds[0] < 0 or rounds[-1] > rnd)):
            raise damaged(f"{key} is not increasing rounds up to its round {rnd}")


# What the rounds after a restore may raise when a checkpoint's values have the right kinds but do not fit
# (an index past the data, a tensor of another shape, None where a round reads a value): the run names the
# checkpoint (``blame``) instead of showing a traceback.
MISFIT = (TypeError, ValueError, IndexError, AttributeError, KeyError, RuntimeError)


def blame(server, error: BaseException) -> FLError | None:
    """The one-line error for ``error`` raised while running a resumed run's rounds, or None when the run
    was not resumed or the error is not one a misfit state raises."""
    path = getattr(getattr(server, "checkpoints", None), "resumed", None)
    if path is None or isinstance(error, FLError) or not isinstance(error, MISFIT):
        return None
    return FLError(f"checkpoint {path} does not fit this run ({type(error).__name__}: {state.first_line(error)} "
                   f"after it was restored); delete it to start over")


def restore(server, ckpt: dict, source) -> int:
    """Put every client (when saved), the server and the recorder back to the checkpoint; returns the
    first round still to run. A state that does not fit the run is refused with one line."""
    try:
        if ckpt["clients"] is not None:
            server.executor.call_each(load_client_state, [(c, (s,)) for c, s in zip(server.clients, ckpt["clients"])])
        load_server_state(server, ckpt["server"])
        if server.recorder is not None and ckpt["recorder"] is not None:
            server.recorder.load_state_dict(state.decode(ckpt["recorder"], None, {}, "cpu", "recorder"))
    except state.StateError as e:
        raise FLError(f"checkpoint {source} does not fit this run ({e}); delete it to start over") from None
    except FLError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError) as e:  # torch's own checks
        raise FLError(f"checkpoint {source} is damaged ({state.first_line(e)}); delete it to start over") from None
    except RecursionError:
        raise FLError(f"checkpoint {source} is damaged (nested too deeply); delete it to start over") from None
    return ckpt["round"] + 1
