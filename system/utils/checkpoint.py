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

import contextvars
import io
import os
import pickle
import types
from pathlib import Path

import torch

from utils.errors import FLError

FORMAT = 1
RUN_ONLY = {"executor", "device", "device_id", "workers", "gpus_per_worker", "ray_address", "max_restarts",
            "resume", "checkpoint_every", "progress", "results_dir", "dataset_root", "times", "prev",
            "global_rounds", "save_folder_name", "client_state", "client_state_dir"}


# Objects a checkpoint refers to instead of saving (the run's config, data, clients, recorder): id -> key
# while saving, key -> object while loading. Set only for the duration of one pack/unpack.
_LINKS: contextvars.ContextVar[dict] = contextvars.ContextVar("checkpoint_links", default={})


def _linked(key: str):
    return _LINKS.get()[key]


class _LinkingPickler(pickle.Pickler):
    def reducer_override(self, obj):
        key = _LINKS.get().get(id(obj))
        return NotImplemented if key is None else (_linked, (key,))


_pickle = types.ModuleType("checkpoint_pickle")
_pickle.__dict__.update({k: v for k, v in vars(pickle).items() if not k.startswith("__")})
_pickle.Pickler = _LinkingPickler


def pack_state(obj, links: dict, skip=()) -> bytes:
    """Every attribute of ``obj`` except those named in ``skip``, as bytes. The objects in ``links``
    (key -> object) are saved as references wherever they occur, at any depth."""
    state = {k: v for k, v in vars(obj).items() if k not in skip}
    buf = io.BytesIO()
    token = _LINKS.set({id(v): k for k, v in links.items() if v is not None})
    try:
        torch.save(state, buf, pickle_module=_pickle)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        bad = next((k for k, v in state.items() if not _picklable(v)), "?")
        raise FLError(f"cannot checkpoint {type(obj).__name__}.{bad} ({e}); keep picklable state on clients and "
                      f"servers, or name the attribute in checkpoint_skip if it is rebuilt from the flags") from None
    finally:
        _LINKS.reset(token)
    return buf.getvalue()


def _picklable(v) -> bool:
    try:
        torch.save(v, io.BytesIO(), pickle_module=_pickle)
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


def unpack_state(obj, blob: bytes, device, links: dict) -> None:
    """Set the attributes saved by ``pack_state`` on ``obj`` (tensors onto ``device``; references to the
    objects of ``links``, key -> object, resolved to those objects)."""
    token = _LINKS.set(links)
    try:
        state = torch.load(io.BytesIO(blob), map_location=device, weights_only=False)
    finally:
        _LINKS.reset(token)
    vars(obj).update(state)


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
        print(f"resuming {path.name} after round {first - 1}")
    else:
        if server.cfg.resume:
            print(f"--resume: no checkpoint {path}; starting at round 0")
        # Where a lost worker sends the run before any checkpoint: round 0 (clients rebuild themselves).
        server.restart_point = snapshot(server, -1, with_clients=False) if server.executor.can_lose_workers else None
    server.executor.end_setup()
    return first


def recover(server, error: Exception) -> int:
    """After a lost worker: rebuild the clients, go back to the last checkpoint (round 0 without one) and
    return the round to replay from."""
    server.clients = server.executor.reset()
    point = server.restart_point
    ckpt = load(point, server) if isinstance(point, Path) else point
    print(f"warning: {error}; rebuilt its clients, replaying from round {ckpt['round'] + 1}")
    return restore(server, ckpt)
