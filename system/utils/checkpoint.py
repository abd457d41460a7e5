"""Checkpoints: the whole state of a run, so a killed run resumes (``--resume``) or a lost Ray worker is
recovered with exactly the numbers of an undisturbed run.

``--checkpoint_every N`` writes ``<results>/<stem>.ckpt`` after every N-th round and after the last one,
atomically (tmp + rename). It holds the server's state, the result recorder's series and every client's
full object state: all attributes of the client object (model, optimizer, ALA weights and stream, batch
stream, algorithm extras) except its config and data, which are rebuilt from the flags and the split.
Objects are saved whole (pickle, through ``torch.save``), so an algorithm's own attributes are included
without code of its own; load checkpoints you made yourself only, as with any pickle.

A resumed run must use the same flags; only those in ``RUN_ONLY`` (where and how it runs, and ``-gr`` to
extend a run) may change.
"""
from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import torch

from utils.errors import FLError

FORMAT = 1
RUN_ONLY = {"executor", "device", "device_id", "workers", "gpus_per_worker", "ray_address", "max_restarts",
            "resume", "checkpoint_every", "progress", "results_dir", "dataset_root", "times", "prev",
            "global_rounds", "save_folder_name"}


class ClientRef:
    """Stands for a client inside saved server state (a server's list of selected clients, say)."""

    def __init__(self, cid: int):
        self.cid = cid


def _swap(value, fn):
    """``value`` with ``fn`` applied to the leaves of its lists, tuples and dicts; containers in which
    nothing changed are returned as they are (so aliasing between attributes survives)."""
    if isinstance(value, (list, tuple, dict)):
        items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
        new = [(k, _swap(v, fn)) for k, v in items]
        if all(a is b for (_, a), (_, b) in zip(items, new)):
            return value
        if isinstance(value, dict):
            return dict(new)
        return type(value)(v for _, v in new)
    return fn(value)


def pack_state(obj, skip, clients=()) -> bytes:
    """Every attribute of ``obj`` except those named in ``skip``, as bytes; members of ``clients`` found in
    the attributes (directly or in lists, tuples, dicts) are saved as references."""
    ids = {id(c): c.id for c in clients}
    state = {k: _swap(v, lambda x: ClientRef(ids[id(x)]) if id(x) in ids else x)
             for k, v in vars(obj).items() if k not in skip}
    buf = io.BytesIO()
    try:
        torch.save(state, buf)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        bad = next((k for k, v in state.items() if not _picklable(v)), "?")
        raise FLError(f"cannot checkpoint {type(obj).__name__}.{bad} ({e}); keep picklable state on clients and "
                      f"servers, or name the attribute in checkpoint_skip if it is rebuilt from the flags") from None
    return buf.getvalue()


def _picklable(v) -> bool:
    try:
        torch.save(v, io.BytesIO())
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


def unpack_state(obj, blob: bytes, device, clients=()) -> None:
    """Set the attributes saved by ``pack_state`` on ``obj`` (tensors onto ``device``)."""
    state = torch.load(io.BytesIO(blob), map_location=device, weights_only=False)
    by_id = {c.id: c for c in clients}
    vars(obj).update({k: _swap(v, lambda x: by_id[x.cid] if isinstance(x, ClientRef) else x)
                      for k, v in state.items()})


def checkpoint_path(server) -> Path | None:
    rec = server.recorder
    return None if rec is None else rec.out_dir / f"{rec.stem}.ckpt"


def snapshot(server, round_idx: int, with_clients: bool = True) -> dict:
    """The state after ``round_idx`` (-1: before round 0; clients then rebuild from the factory)."""
    return {"format": FORMAT, "round": round_idx, "config": server.cfg.to_dict(),
            "split": server.data.config_hash, "server": server.server_state(),
            "recorder": server.recorder.state_dict() if server.recorder is not None else None,
            "clients": server.executor.map(server.clients, "checkpoint_state") if with_clients else None}


def save(server, round_idx: int) -> None:
    """Checkpoint after ``round_idx`` to the run's ``.ckpt`` file (kept in memory when the run has no
    result files); it becomes the point a lost worker returns to."""
    ckpt = snapshot(server, round_idx)
    path = checkpoint_path(server)
    if path is None:
        server.restart_point = ckpt
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(ckpt, tmp)
    os.replace(tmp, path)
    server.restart_point = path


def load(path: Path, server) -> dict:
    """Read a checkpoint and check that it belongs to this configuration and split."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, EOFError, RuntimeError, pickle.UnpicklingError) as e:
        raise FLError(f"cannot read checkpoint {path} ({e}); delete it to start over") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise FLError(f"{path} is not a checkpoint of this library version; delete it to start over")
    old, new = ckpt["config"], server.cfg.to_dict()
    diff = sorted(k for k in set(old) | set(new) if k not in RUN_ONLY and old.get(k) != new.get(k))
    if diff:
        shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:5])
        raise FLError(f"checkpoint {path} was made with other flags ({shown}); resume with the same flags, "
                      f"or drop --resume to start over")
    if ckpt["split"] != server.data.config_hash:
        raise FLError(f"checkpoint {path} was made on another '{server.data.name}' split; drop --resume")
    return ckpt


def restore(server, ckpt: dict) -> int:
    """Put the server, the recorder and (when saved) every client back to the checkpoint; returns the
    first round still to run."""
    server.load_server_state(ckpt["server"])
    if server.recorder is not None and ckpt["recorder"] is not None:
        server.recorder.load_state_dict(ckpt["recorder"])
    if ckpt["clients"] is not None:
        server.executor.call_each("load_checkpoint_state",
                                  [(c, (blob,)) for c, blob in zip(server.clients, ckpt["clients"])])
    return ckpt["round"] + 1


def begin(server) -> int:
    """Resume from the run's checkpoint with ``--resume`` (when there is one), else start at round 0.
    Either way, set the point a lost worker returns to. Returns the first round to run."""
    path = checkpoint_path(server)
    first = 0
    if server.cfg.resume and path is not None and path.exists():
        first = restore(server, load(path, server))
        server.restart_point = path
        print(f"resuming {path.name}: rounds 0-{first - 1} were done")
    else:
        if server.cfg.resume:
            print(f"--resume: no checkpoint {path}; starting at round 0")
        server.restart_point = snapshot(server, -1, with_clients=False)
    server.executor.end_setup()
    return first


def recover(server, error: Exception) -> int:
    """After a lost worker: rebuild the clients, go back to the last checkpoint (round 0 without one) and
    return the round to replay from."""
    point = server.restart_point
    ckpt = load(point, server) if isinstance(point, Path) else point
    print(f"warning: {error}; rebuilding its clients and replaying from round {ckpt['round'] + 1}")
    server.clients = server.executor.reset()
    return restore(server, ckpt)
