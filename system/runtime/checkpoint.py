"""Checkpoints: the whole state of a run, so a killed run resumes (``--resume``) or a lost worker is
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
import pickle
import types
from pathlib import Path

import torch

from utils.errors import FLError
from utils.results import atomic_write

FORMAT = 1
RUN_ONLY = {"executor", "device", "device_id", "workers", "gpus_per_worker", "ray_address", "max_restarts",
            "resume", "checkpoint_every", "progress", "results_dir", "dataset_root", "times", "prev",
            "global_rounds", "save_folder_name", "client_state", "client_state_dir", "overwrite", "print_config"}


# Objects a checkpoint refers to instead of saving (the run's config, data, clients, recorder): id -> key
# while saving, key -> object while loading. Set only for the duration of one pack/unpack.
_LINKS: contextvars.ContextVar[dict] = contextvars.ContextVar("checkpoint_links", default={})


def _linked(key: str):
    return _LINKS.get()[key]


# A TensorPool that tensors are saved into by reference while packing / taken from while unpacking.
_POOL: contextvars.ContextVar = contextvars.ContextVar("checkpoint_pool", default=None)


class TensorPool:
    """Tensors stored once however many packed states hold them, by content: e.g. a thousand parked
    FedAvg clients whose models all equal the last broadcast, or FedALA's lower layers (equal to the
    global model's). Each entry is a CPU copy with a reference count; ``release`` the ids a state used
    once it is unpacked, and entries nobody refers to are dropped. Tensors match on shape, strides,
    dtype and values (``torch.equal``), so an unpacked state is bit for bit, layout included, the one
    packed. Only floating-point tensors of at least ``min_numel`` elements are pooled."""

    def __init__(self, min_numel: int = 4096):
        self.min_numel = min_numel
        self.entries: dict[int, list] = {}  # id -> [tensor, references, fingerprint]
        self.index: dict[tuple, list[int]] = {}  # cheap fingerprint -> ids
        self.next_id = 0
        self.used: list[int] | None = None  # ids taken by the pack in progress

    @staticmethod
    def _fingerprint(t: torch.Tensor) -> tuple:
        flat = t.detach().reshape(-1)
        probe = flat[::max(1, flat.numel() // 16)][:16].contiguous().view(torch.uint8).cpu()  # any float dtype
        return tuple(t.shape), t.stride(), t.dtype, probe.numpy().tobytes()

    def put(self, t: torch.Tensor) -> int | None:
        if t.numel() < self.min_numel or t.is_sparse or not t.is_floating_point():
            return None
        fp = self._fingerprint(t)
        ids = self.index.setdefault(fp, [])
        here = t.detach().cpu()
        for i in ids:
            if torch.equal(self.entries[i][0], here):
                break
        else:
            i = self.next_id
            self.next_id += 1
            self.entries[i] = [t.detach().to("cpu", copy=True), 0, fp]
            ids.append(i)
        self.entries[i][1] += 1
        self.used.append(i)
        return i

    def get(self, i: int, device) -> torch.Tensor:
        return self.entries[i][0].to(device, copy=True)

    def release(self, ids: list[int]) -> None:
        for i in ids:
            entry = self.entries[i]
            entry[1] -= 1
            if entry[1] == 0:
                del self.entries[i]
                fp = entry[2]
                self.index[fp].remove(i)
                if not self.index[fp]:
                    del self.index[fp]

    def nbytes(self) -> int:
        return sum(t.element_size() * t.numel() for t, _, _ in self.entries.values())


def _pooled(i: int, param: bool, requires_grad: bool, device: str):
    t = _POOL.get().get(i, device)
    return torch.nn.Parameter(t, requires_grad) if param else t.requires_grad_(requires_grad)


class _LinkingPickler(pickle.Pickler):
    def reducer_override(self, obj):
        key = _LINKS.get().get(id(obj))
        if key is not None:
            return (_linked, (key,))
        pool = _POOL.get()
        if pool is not None and type(obj) in (torch.Tensor, torch.nn.Parameter):
            i = pool.put(obj)
            if i is not None:
                return (_pooled, (i, type(obj) is torch.nn.Parameter, obj.requires_grad, str(obj.device)))
        return NotImplemented


_pickle = types.ModuleType("checkpoint_pickle")
_pickle.__dict__.update({k: v for k, v in vars(pickle).items() if not k.startswith("__")})
_pickle.Pickler = _LinkingPickler


def pack_state(obj, links: dict, skip=(), pool: TensorPool | None = None) -> bytes:
    """Every attribute of ``obj`` except those named in ``skip``, as bytes. The objects in ``links``
    (key -> object) are saved as references wherever they occur, at any depth; with ``pool``, large
    tensors are saved into it by reference (``pool.used`` then lists the ids this state holds)."""
    state = {k: v for k, v in vars(obj).items() if k not in skip}
    buf = io.BytesIO()
    token = _LINKS.set({id(v): k for k, v in links.items() if v is not None})
    pool_token = _POOL.set(pool)
    if pool is not None:
        pool.used = []
    try:
        torch.save(state, buf, pickle_module=_pickle)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        bad = next((k for k, v in state.items() if not _picklable(v)), "?")
        raise FLError(f"cannot checkpoint {type(obj).__name__}.{bad} ({e}); keep picklable state on clients and "
                      f"servers, or name the attribute in checkpoint_skip if it is rebuilt from the flags") from None
    finally:
        _LINKS.reset(token)
        _POOL.reset(pool_token)
    return buf.getvalue()


def _picklable(v) -> bool:
    try:
        torch.save(v, io.BytesIO(), pickle_module=_pickle)
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


def unpack_state(obj, blob: bytes, device, links: dict, pool: TensorPool | None = None) -> None:
    """Set the attributes saved by ``pack_state`` on ``obj`` (tensors onto ``device``; references to the
    objects of ``links``, key -> object, resolved to those objects; pooled tensors copied from ``pool``
    onto the device they were packed from)."""
    token = _LINKS.set(links)
    pool_token = _POOL.set(pool)
    try:
        state = torch.load(io.BytesIO(blob), map_location=device, weights_only=False)
    finally:
        _LINKS.reset(token)
        _POOL.reset(pool_token)
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
    atomic_write([(path, lambda tmp: torch.save(ckpt, tmp))])
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
