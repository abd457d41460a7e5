"""Client state off the device (``--client_state cpu|disk``): memory grows with a round's clients, not
with all clients. Every executor parks the clients of each process it runs clients in
(``executors.ClientHost``): this one for ``sequential``, each worker for ``fork`` and ``ray``.

A client is "parked" when it has not been used for a while: every attribute except its identity, its
data and its timing (``KEEP``) is serialised with the checkpoint machinery (runtime/checkpoint.py, so
models, optimizers, generators, ALA weights and any algorithm's extras are included without code of
their own) into one compact CPU buffer (``cpu``) or one file (``disk``), and the live objects are
dropped; in ``cpu`` mode large tensors go into a pool that holds each distinct tensor once (a thousand
FedAvg clients holding the broadcast model cost one model, not a thousand). The first attribute access
brings it back exactly as it was (``Client.__getattr__``), onto its device. Parking and unparking are
exact: same numbers as ``--client_state device`` (the default), bit for bit (tests/test_executors.py).

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
import shutil
import tempfile
import weakref
from pathlib import Path

from runtime.checkpoint import TensorPool, pack_state, unpack_state

# What a parked client keeps: identity, data (rebuilt from the split, not per-client state to move) and
# the per-round training times (len(train_time) = rounds trained, read by ALA and others).
KEEP = frozenset({"cfg", "id", "run", "device", "x_train", "y_train", "x_test", "y_test", "train_samples",
                  "test_samples", "num_classes", "train_time", "parked_in"})


def _trim_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc ``malloc_trim``; elsewhere a no-op).
    Parking and unparking free and allocate a model's worth of memory per client; glibc keeps freed
    blocks of that size in its heap, where they fragment, so without this the process's resident size
    grows well past what it holds (1,000 FedALA clients on MNIST, 10 rounds: 4.5 GB peak RSS)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class ClientStore:
    """Parked client states, in memory (``mode="cpu"``) or as files under ``folder`` (``"disk"``)."""

    def __init__(self, mode: str, capacity: int, folder: str | None = None):
        self.mode, self.capacity = mode, max(1, capacity)
        self.live: collections.OrderedDict = collections.OrderedDict()  # id -> client, oldest first
        self.pinned: set[int] = set()
        self.blobs: dict[int, bytes] = {}
        # cpu: large tensors held once by content (clients that hold the same model, e.g. every FedAvg
        # client after a broadcast, share one copy); the ids each parked client's blob refers to.
        self.pool = TensorPool() if mode == "cpu" else None
        self.pooled: dict[int, list[int]] = {}
        self.folder = None
        if mode == "disk":
            own = folder is None
            self.folder = Path(tempfile.mkdtemp(prefix="fl-clients-") if own else folder)
            self.folder.mkdir(parents=True, exist_ok=True)
            if own:
                weakref.finalize(self, shutil.rmtree, self.folder, True)
        self.loads = self.stores = 0

    def __getstate__(self):  # a checkpoint of the server keeps the settings, not the parked states
        return {**self.__dict__, "live": collections.OrderedDict(), "blobs": {}, "pinned": set(), "pooled": {},
                "pool": TensorPool() if self.pool is not None else None}

    def park(self, c) -> None:
        """Serialise everything but ``KEEP`` (and what the client's checkpoints skip) and drop it."""
        skip = KEEP | set(getattr(c, "checkpoint_skip", ()))
        blob = pack_state(c, c.checkpoint_links(), tuple(skip), self.pool)
        if self.pool is not None:
            self.pooled[c.id] = self.pool.used
        for k in [k for k in vars(c) if k not in skip]:
            del vars(c)[k]
        if self.folder is not None:
            (self.folder / f"{c.id}.pt").write_bytes(blob)
        else:
            self.blobs[c.id] = blob
        vars(c)["parked_in"] = self
        self.live.pop(c.id, None)
        self.stores += 1
        if self.stores % self.capacity == 0:  # about once per round's worth of clients
            _trim_heap()

    def unpark(self, c) -> None:
        """Bring a parked client back (called by ``Client.__getattr__`` on first use)."""
        blob = (self.folder / f"{c.id}.pt").read_bytes() if self.folder is not None else self.blobs.pop(c.id)
        del vars(c)["parked_in"]
        unpack_state(c, blob, c.device, c.checkpoint_links(), self.pool)
        if self.pool is not None:
            self.pool.release(self.pooled.pop(c.id))
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
