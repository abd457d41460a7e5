"""Client state off the device (``--client_state cpu|disk``): memory grows with a round's clients, not
with all clients. Every executor parks the clients of each process it runs clients in
(``executors.ClientHost``): this one for ``sequential``, each worker for ``fork`` and ``ray``.

A client is "parked" when it has not been used for a while: its state (``checkpoint.client_state``, runtime/state.py:
tensors and plain values, so models, optimizers, generators, ALA weights and any algorithm's extras are
included without code of their own) of every attribute except its identity, its data and its timing
(``KEEP``) is kept on the CPU (``cpu``) or in one file (``disk``), and the live objects are dropped; in
``cpu`` mode large tensors go into a pool that holds each distinct tensor once (a thousand FedAvg
clients holding the broadcast model cost one model, not a thousand). The executor brings it
back exactly as it was before any use (``ClientHost.run``: every method call, and every attribute read
through a ``ClientHandle``, which is what the server holds of a parked client): the client's constructor
builds its structure again and the state is loaded into it, onto its device. Nothing reloads it
implicitly: on the parked object itself, an attribute outside ``KEEP`` is missing (``AttributeError``).
A file is read with ``torch.load(weights_only=True)`` (tensors and plain values only) from a folder of the
run's own (``fileio.make_private``, under ``--client_state_dir`` when given), so neither another run nor a
planted file reaches it. Parking and unparking are exact: same numbers as ``--client_state device`` (the default), bit for bit (tests/test_executors.py).

Which clients stay live: the ``capacity`` most recently used, ``capacity`` = a process's share of the
clients of one round (``utils.selection.join_count``). The host records every call and keeps a client
live while one of its methods runs. A round still touches every client (the broadcast, and evaluation
every ``-eg`` rounds), so each round loads and stores every client once or twice: memory is bounded, time
is not free. Servers talk to clients through method calls (the executor contract, runtime/executors.py): a
reference into a client's objects kept by the server goes stale when the client is parked.
"""
from __future__ import annotations

import collections
import ctypes
import tempfile
import weakref
from pathlib import Path

import torch

from runtime import checkpoint, state
from utils.errors import FLError
from utils import fileio
from utils.results import save_files

# What a parked client keeps: identity, data (rebuilt from the split, not per-client state to move) and
# the per-round training times (len(train_time) = rounds trained, read by ALA and others).
KEEP = frozenset({"cfg", "id", "run", "device", "x_train", "y_train", "x_test", "y_test", "x_val", "y_val",
                  "train_samples",
                  "test_samples", "num_classes", "train_time", "parked_in"})
POOLED = "pooled"  # the kind of an encoded node that stands for a tensor held by the pool


def _trim_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc ``malloc_trim``; elsewhere a no-op).
    Parking and unparking free and allocate a model's worth of memory per client; glibc keeps freed
    blocks of that size in its heap, where they fragment, so without this the process's resident size
    grows well past what it holds (1,000 FedALA clients on MNIST, 10 rounds: 4.5 GB peak RSS)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def own_folder(parent: str | None) -> Path:
    """A new folder only this run uses, under ``parent`` (created if need be, and a folder) or the system's
    temporary folder: ``fileio.make_private`` (created exclusively, mode 0700, recorded, so that
    ``fileio.remove_made`` removes it when the run ends)."""
    if parent is None:
        parent = tempfile.gettempdir()
        what = "temporary folder"
    else:
        what = "--client_state_dir"
    return fileio.make_private(parent, "fl-clients-", what)


class ClientStore:
    """Parked client states, in memory (``mode="cpu"``) or as files under ``folder`` (``"disk"``).
    ``rebuild(client)`` builds a fresh client of the same id (its constructor), into which a parked
    state is loaded."""

    def __init__(self, mode: str, capacity: int, rebuild, folder: str | None = None):
        self.mode, self.capacity, self.rebuild = mode, max(1, capacity), rebuild
        self.live: collections.OrderedDict = collections.OrderedDict()  # id -> client, oldest first
        self.pinned: set[int] = set()
        self.states: dict[int, dict] = {}
        # cpu: large tensors held once by content (clients that hold the same model, e.g. every FedAvg
        # client after a broadcast, share one copy); the ids each parked client's state refers to.
        self.pool = TensorPool() if mode == "cpu" else None
        self.pooled: dict[int, list[int]] = {}
        self.folder = None
        if mode == "disk":
            own = folder is None
            self.folder = own_folder(None) if own else Path(folder)
            fileio.Folder(self.folder, what="parked-client folder")  # a folder (made where missing)
            if own:
                weakref.finalize(self, fileio.remove_made, self.folder)
        self.loads = self.stores = 0

    def _kept(self, c) -> frozenset:
        return KEEP | set(c.declares.checkpoint_skip)

    def park(self, c) -> None:
        """Keep the state of everything but ``KEEP`` (and what the client's checkpoints skip) and drop it."""
        keep = self._kept(c)
        saved = checkpoint.client_state(c, keep)
        if self.pool is not None:
            ids: list[int] = []
            saved = state.map_tensors(saved, lambda t: self._pool_one(t, ids))
            self.pooled[c.id] = ids
        for k in [k for k in vars(c) if k not in keep]:
            del vars(c)[k]
        if self.folder is not None:
            tagged = {"client": c.id, "run": c.run, "state": saved}  # whose state: checked when read back
            save_files(fileio.Folder(self.folder, what="parked-client folder"), [(self.path(c).name, lambda f: state.write_file(tagged, f))])
        else:
            self.states[c.id] = saved
        vars(c)["parked_in"] = self
        self.live.pop(c.id, None)
        self.stores += 1
        if self.stores % self.capacity == 0:  # about once per round's worth of clients
            _trim_heap()

    def path(self, c) -> Path:
        return self.folder / f"{c.id}.pt"

    def _pool_one(self, t: torch.Tensor, ids: list[int]):
        i = self.pool.put(t)
        if i is None:
            return t
        ids.append(i)
        return {state.KIND: POOLED, "id": i, "param": isinstance(t, torch.nn.Parameter),
                "requires_grad": t.requires_grad}

    def _unpool(self, tree, device):
        if isinstance(tree, dict) and tree.get(state.KIND) == POOLED:
            t = self.pool.get(tree["id"], device)
            return torch.nn.Parameter(t, tree["requires_grad"]) if tree["param"] else t.requires_grad_(tree["requires_grad"])
        if isinstance(tree, dict):
            return {k: self._unpool(v, device) for k, v in tree.items()}
        if type(tree) in (list, tuple):
            return type(tree)(self._unpool(v, device) for v in tree)
        return tree

    def _read(self, c) -> dict:
        path = self.path(c)
        try:
            tagged = state.read_file(path, map_location=c.device)
        except (state.StateError, *state.UNREADABLE) as e:
            raise FLError(f"parked client file {path} cannot be read ({state.first_line(e)}); it was changed "
                          f"outside this run: start the run again") from None
        if not isinstance(tagged, dict) or (tagged.get("client"), tagged.get("run")) != (c.id, c.run) or \
                not isinstance(tagged.get("state"), dict):
            raise FLError(f"parked client file {path} does not hold client {c.id}'s state; it was changed outside "
                          f"this run: start the run again")
        return tagged["state"]

    def unpark(self, c) -> None:
        """Bring a parked client back (``ClientHost.run`` calls it before any use of the client): its constructor
        builds it again and its parked state is loaded into it."""
        if self.folder is not None:
            saved = self._read(c)
        else:
            saved = self.states.pop(c.id)
            if self.pool is not None:
                saved = self._unpool(saved, c.device)
                self.pool.release(self.pooled.pop(c.id))
        del vars(c)["parked_in"]
        keep = self._kept(c)
        vars(c).update({k: v for k, v in vars(self.rebuild(c)).items() if k not in keep})
        checkpoint.load_client_state(c, saved)
        self.loads += 1
        self.touch(c)

    def touch(self, c) -> None:
        """``c`` was just used: it stays live; the least recently used beyond ``capacity`` are parked."""
        self.live[c.id] = c
        self.live.move_to_end(c.id)
        for cid in list(self.live):
            if len(self.live) <= self.capacity:
                break
            if cid not in self.pinned:
                self.park(self.live[cid])


class TensorPool:
    """Tensors stored once however many packed states hold them, by content: e.g. a thousand parked
    FedAvg clients whose models all equal the last broadcast, or FedALA's lower layers (equal to the
    global model's). Each entry is a CPU copy with a reference count; ``release`` the ids a state used
    once it is unpacked, and entries nobody refers to are dropped. ``put`` keeps the tensor it is given
    (a private CPU copy, as ``state.encode`` makes) rather than copying it again. Tensors match on shape, strides,
    dtype and values (``torch.equal``), so an unpacked state is bit for bit, layout included, the one
    packed. Only floating-point tensors of at least ``min_numel`` elements are pooled."""

    def __init__(self, min_numel: int = 4096):
        self.min_numel = min_numel
        self.entries: dict[int, list] = {}  # id -> [tensor, references, fingerprint]
        self.index: dict[tuple, list[int]] = {}  # cheap fingerprint -> ids
        self.next_id = 0

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
            self.entries[i] = [here, 0, fp]
            ids.append(i)
        self.entries[i][1] += 1
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
