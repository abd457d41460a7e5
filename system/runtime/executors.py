"""Executors: where clients live, and how the server's calls reach them. One contract for all.

The server reaches its clients only by calls: of a method by name (``receive``, ``upload`` and any method an
algorithm adds) or of an engine function of the client (``fn(client, ...)``: local training, evaluation,
checkpoints), run where the client lives:

    start(factory, datas) -> clients    the run's clients, built where they will live
    map(clients, method, *args)         [c.method(*args) for c in clients], in order
    call_each(method, [(c, args), ...]) [c.method(*args) for c, args in calls]
    end_setup() / reset() / close()     training starts / rebuild after a lost worker / release

- ``SequentialExecutor``: the clients are ordinary objects in this process; ``map`` is a for loop.
- ``ForkExecutor`` (runtime/fork.py): single-thread worker processes forked from this one, one per
  core by default; each builds and keeps a fixed share of the clients for the whole run.
- ``RayExecutor`` (runtime/raypool.py): the same, on Ray actors spread over devices and machines.

With workers (and with parking in this process) the server holds ``ClientHandle`` proxies: a method call
runs on the owning worker, an attribute read returns a copy, an attribute write is refused. Per call only the arguments and the return
values travel (pickled once per worker per call, so a model sent to every client crosses once), never the
clients' state. What a client method returns is a snapshot: only the sequential executor hands out live
references, so servers must not rely on aliasing (and change a client only through its methods).

Parking idle clients off the device (``--client_state cpu|disk``, runtime/parking.py) is done by every
executor, in every process that holds clients (``ClientHost``).

Numbers do not depend on the executor: clients build their state from (seed, run, client id) streams
(utils/seeding.py) and share none, so neither the order nor the process in which clients run matters.
At the same torch thread count per process the results are bitwise equal (tests/test_executors.py).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
import torch
from torch import nn

from runtime.parking import ClientStore, own_folder
from utils import fileio
from utils.errors import FLError
from utils.seeding import torch_seeded


class WorkerLost(RuntimeError):
    """A worker process died; the run recovers from its last checkpoint (``runtime.loop.train``)."""


# ---- moving values across the wire -----------------------------------------------------------------
def to_wire(obj):
    """``obj`` with every tensor and module on the CPU (copies only where something is elsewhere)."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, nn.Module):
        on_cpu = all(t.device.type == "cpu" for t in [*obj.parameters(), *obj.buffers()])
        return obj if on_cpu else copy.deepcopy(obj).cpu()
    return _walk(obj, to_wire)


def to_device(obj, device):
    """``obj`` with every tensor and module moved to ``device`` (modules in place: they are private copies)."""
    if isinstance(obj, (torch.Tensor, nn.Module)):
        return obj.to(device)
    return _walk(obj, functools.partial(to_device, device=device))


def _walk(obj, fn):
    if isinstance(obj, dict):
        return {k: fn(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(fn(v) for v in obj) if not hasattr(obj, "_fields") else type(obj)(*map(fn, obj))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: fn(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
    return obj


def balance(sizes: list[int], parts: int) -> list[list[int]]:
    """Positions 0..len(sizes)-1 split into at most ``parts`` groups of nearly equal total size (largest
    first, each to the lightest group; longest-processing-time scheduling)."""
    groups: list[list[int]] = [[] for _ in range(min(parts, len(sizes)))]
    load = [0] * len(groups)
    for k in sorted(range(len(sizes)), key=lambda k: -sizes[k]):
        g = load.index(min(load))
        groups[g].append(k)
        load[g] += sizes[k]
    return [sorted(g) for g in groups if g]


def call(client, method, args=(), kwargs=None):
    """``client.method(*args, **kwargs)``; ``method`` is a method's name, or an engine function of the client
    (``fn(client, *args, **kwargs)``, a module-level function, so it crosses to a worker by name): how the
    engine runs its own steps where the client lives (evaluation, checkpoints: runtime/evaluation.py,
    runtime/checkpoint.py) without their being client methods."""
    if callable(method):
        return method(client, *args, **(kwargs or {}))
    return getattr(client, method)(*args, **(kwargs or {}))


# ---- building and hosting clients anywhere ---------------------------------------------------------
@dataclasses.dataclass
class ClientFactory:
    """How every client is built, in this process or inside a worker: ``client_class(cfg, cid, data,
    model, run)`` under the (seed, run, "client-init", cid) stream. ``model`` is the common initial model.
    With different architectures on different clients, ``own`` maps each client id to the initial model of
    its own: it replaces ``model``, or, when ``personal``, comes beside it as the keyword ``own_model``."""
    client_class: type
    cfg: object
    run: int
    model: nn.Module
    own: dict[int, nn.Module] | None = None
    personal: bool = False

    def __call__(self, cid: int, data, device=None):
        cfg = self.cfg
        model, extra = self.model, {}
        if self.own is not None:
            model, extra = (self.model, {"own_model": self.own[cid]}) if self.personal else (self.own[cid], {})
        if device is not None and str(device) != cfg.device:
            cfg = cfg.replace(device=str(device))
            for m in (model, *extra.values()):
                m.to(device)
            data = to_device(data, device)
        with torch_seeded(cfg.seed, self.run, "client-init", cid):
            return self.client_class(cfg, cid, data, model, self.run, **extra)


@dataclasses.dataclass(frozen=True)
class Parking:
    """``--client_state``: ``mode`` cpu or disk, ``capacity`` clients live across all hosts (a round's
    worth), files under ``folder`` for disk."""
    mode: str
    capacity: int
    folder: str | None = None  # this run's own folder (under --client_state_dir), removed by ``release``

    @classmethod
    def from_config(cls, cfg) -> "Parking | None":
        from utils.selection import join_count

        if cfg.client_state == "device":
            return None
        # One folder for every worker of this run and no other run: runs sharing --client_state_dir
        # never see each other's files.
        folder = str(own_folder(cfg.client_state_dir)) if cfg.client_state == "disk" else None
        return cls(cfg.client_state, join_count(cfg.join_ratio, cfg.num_clients or 1), folder)

    def store(self, share: float, rebuild) -> ClientStore:
        """The store of a host holding ``share`` of all clients (``rebuild``: see ``ClientStore``)."""
        return ClientStore(self.mode, max(1, math.ceil(self.capacity * share)), rebuild, self.folder)

    def release(self) -> None:
        """Remove this run's folder: the I/O layer removes only a folder it made and recorded in this process
        (``fileio.remove_made``), never following a symlink inside it."""
        if self.folder is not None:
            fileio.remove_made(self.folder)


class ClientHost:
    """The clients of one process (this one, or a worker) and the calls that run on them. With parking,
    a client is brought back before a call, kept live while it runs and may be parked afterwards."""

    def __init__(self, factory: ClientFactory, cids: list[int], datas: list, device=None,
                 parking: Parking | None = None, total: int | None = None):
        self.factory, self.device = factory, device
        self.store = (parking.store(len(cids) / (total or len(cids)), self.rebuild) if parking is not None
                      else None)
        # what each client was built from, kept for ``rebuild`` (references to the split's own tensors)
        self.datas = dict(zip(cids, datas)) if self.store is not None else {}
        self.clients: dict = {}
        for cid, d in zip(cids, datas):  # parked as they are built: peak memory stays bounded
            self.clients[cid] = factory(cid, d, device)
            if self.store is not None:
                self.store.touch(self.clients[cid])

    def rebuild(self, c):
        """A fresh client of ``c``'s id, built as it was first built (what a parked state is loaded into): from
        the data it was given, not its own ``x_train``/``y_train``, which ``-fs``, ``--val_ratio`` and label
        flipping have already processed (processing them again would leave fewer samples, flip labels back,
        or refuse a client left with one)."""
        return self.factory(c.id, self.datas[c.id], self.device)

    def run(self, cid: int, method, args=(), kwargs=None):
        c = self.clients[cid]
        if self.store is None:
            return call(c, method, args, kwargs)
        # pinned first: bringing it back parks the least recently used unpinned clients beyond the capacity,
        # which would otherwise be this one when every other live client is in a call (a batched session)
        self.store.pinned.add(cid)
        try:
            if "parked_in" in vars(c):  # back before the call (a method may also replace attributes wholesale)
                self.store.unpark(c)
            return call(c, method, args, kwargs)
        finally:
            self.store.pinned.discard(cid)
            if "parked_in" not in vars(c):
                self.store.touch(c)

    def handle(self, request: tuple, device=None):
        """One request of a pool's protocol, run here: ``("map", method, cids, args, kwargs)``,
        ``("each", method, [(cid, args), ...])``, ``("attr", cid, name)`` or ``("sizes",)``. Arguments
        arrive on the CPU and go to ``device``; results go back on the CPU."""
        kind = request[0]
        if kind == "map":
            _, method, cids, args, kwargs = request
            args, kwargs = to_device((args, kwargs), device) if device is not None else (args, kwargs)
            return [to_wire(self.run(c, method, args, kwargs)) for c in cids]
        if kind == "each":
            _, method, calls = request
            return [to_wire(self.run(c, method, to_device(a, device) if device is not None else a))
                    for c, a in calls]
        if kind == "attr":
            _, cid, name = request
            return to_wire(self.run(cid, "__getattribute__", (name,)))
        if kind == "sizes":
            return {cid: (c.train_samples, c.test_samples) for cid, c in self.clients.items()}
        raise ValueError(f"unknown request {kind!r}")


# ---- in this process ---------------------------------------------------------------------------------
class SequentialExecutor:
    """Clients are plain objects in this process, run one after the other."""
    name = "sequential"
    can_lose_workers = False

    def __init__(self, parking: Parking | None = None):
        self.parking = parking

    def start(self, factory: ClientFactory, datas: list) -> list:
        """The clients themselves; with parking, ``ClientHandle`` proxies, so that every use of a client,
        an attribute read included, goes through ``ClientHost.run``, which brings a parked one back first."""
        self.host = ClientHost(factory, list(range(len(datas))), datas, parking=self.parking)
        clients = [self.host.clients[i] for i in range(len(datas))]
        if self.parking is None:
            return clients
        return [ClientHandle(self, factory.client_class, c.id, c.train_samples, c.test_samples) for c in clients]

    def map(self, clients, method: str, *args, **kwargs) -> list:
        return [self.host.run(c.id, method, args, kwargs) for c in clients]

    def call_each(self, method: str, calls) -> list:
        return [self.host.run(c.id, method, args) for c, args in calls]

    def call(self, cid: int, method: str, *args, **kwargs):
        """One client's ``method(*args, **kwargs)`` (a ``ClientHandle``'s method call)."""
        return self.map([self.host.clients[cid]], method, *args, **kwargs)[0]

    def get_attr(self, cid: int, name: str):
        """One client's attribute ``name`` (a ``ClientHandle``'s read), the client brought back first if parked;
        a live reference, as this executor's clients are."""
        return self.host.run(cid, "__getattribute__", (name,))

    def end_setup(self) -> None:
        """Training starts (see ``PoolExecutor.end_setup``)."""

    def reset(self) -> list:
        raise FLError("clients in this process cannot be lost, so there is nothing to rebuild")

    def close(self) -> None:
        if self.parking is not None:
            self.parking.release()


# ---- in worker processes -------------------------------------------------------------------------------
class ClientHandle:
    """The server-side stand-in for a client that lives in a worker. ``handle.train(3)`` runs
    ``client.train(3)`` on the owning worker; ``handle.x`` returns a copy of ``client.x``; ``id``,
    ``train_samples`` and ``test_samples`` are known locally. Attribute writes are refused: change a
    client through one of its methods, so the server works with any executor."""
    __slots__ = ("id", "train_samples", "test_samples", "_executor", "_cls")

    def __init__(self, executor, cls: type, cid: int, train_samples: int, test_samples: int):
        for k, v in (("id", cid), ("train_samples", train_samples), ("test_samples", test_samples),
                     ("_executor", executor), ("_cls", cls)):
            object.__setattr__(self, k, v)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if callable(getattr(self._cls, name, None)):
            return functools.partial(self._executor.call, self.id, name)
        return self._executor.get_attr(self.id, name)

    def __setattr__(self, name, value):
        raise FLError(f"client {self.id} lives in a worker process: setting '{name}' from the server has no "
                      f"effect there; give the client a method that sets it and call that method")

    def __repr__(self) -> str:
        return f"ClientHandle({self._cls.__name__} {self.id})"


class PoolExecutor:
    """Clients spread over worker processes, each holding a fixed share for the whole run (placed by
    training samples, balanced), reached through ``ClientHandle`` proxies. Subclasses say how workers
    start (``_launch``), how a request reaches one (``_send``) and how answers come back (``_receive``,
    which raises ``WorkerLost`` for a dead worker)."""
    can_lose_workers = True
    max_workers = 1

    def __init__(self, parking: Parking | None = None):
        self.parking = parking

    def start(self, factory: ClientFactory, datas: list) -> list[ClientHandle]:
        """Build this run's clients inside the workers; returns their handles."""
        # The factory's model is the server's global model, which training changes in place: keep a copy
        # of it as it is now, so that clients rebuilt after a lost worker (``reset``) start from the
        # initial model too (a fork worker would otherwise inherit the trained one).
        self.factory = dataclasses.replace(factory, model=copy.deepcopy(factory.model))
        self.datas = datas
        self.placement = balance([len(d.y_train) for d in datas], self.max_workers)
        self.owner = {cid: w for w, cids in enumerate(self.placement) for cid in cids}
        self.setup_log: list = []  # calls made before training starts, replayed by reset()
        self.logging = True
        self._launch()
        sizes = {}
        for part in self._receive([self._send(w, ("sizes",)) for w in range(len(self.placement))]):
            sizes.update(part)
        self.handles = [ClientHandle(self, factory.client_class, i, *sizes[i]) for i in range(len(datas))]
        return self.handles

    def map(self, clients, method: str, *args, **kwargs) -> list:
        if not clients:
            return []
        ids = [c.id for c in clients]
        if self.logging:
            self.setup_log.append(("map", ids, method, args, kwargs))
        groups = self._group(ids)
        tickets = [self._send(w, ("map", method, [cid for _, cid in g], args, kwargs)) for w, g in groups.items()]
        return self._gather(groups, tickets, len(ids))

    def call_each(self, method: str, calls) -> list:
        calls = [(c.id, args) for c, args in calls]
        if not calls:
            return []
        if self.logging:
            self.setup_log.append(("each", calls, method))
        groups = self._group([cid for cid, _ in calls])
        tickets = [self._send(w, ("each", method, [calls[pos] for pos, _ in g])) for w, g in groups.items()]
        return self._gather(groups, tickets, len(calls))

    def call(self, cid: int, method: str, *args, **kwargs):
        return self.map([self.handles[cid]], method, *args, **kwargs)[0]

    def get_attr(self, cid: int, name: str):
        return self._receive([self._send(self.owner[cid], ("attr", cid, name))])[0]

    def _group(self, cids: list[int]) -> dict[int, list[tuple[int, int]]]:
        groups: dict[int, list[tuple[int, int]]] = {}
        for pos, cid in enumerate(cids):
            groups.setdefault(self.owner[cid], []).append((pos, cid))
        return groups

    def _gather(self, groups, tickets, n: int) -> list:
        out = [None] * n
        for g, results in zip(groups.values(), self._receive(tickets)):
            for (pos, _), r in zip(g, results):
                out[pos] = r
        return out

    # ---- recovery ------------------------------------------------------------------------------------
    def end_setup(self) -> None:
        """Training starts: stop logging calls. The calls made before (a server's own set-up of its
        clients after construction) are replayed when ``reset`` rebuilds clients from scratch."""
        self.logging = False

    def reset(self) -> list[ClientHandle]:
        """Replace dead workers, rebuild every client from the factory and replay the set-up calls."""
        try:
            self._relaunch()
        except WorkerLost:
            raise FLError("a replacement worker could not be started; results so far are kept; rerun with "
                          "--resume to continue from the last checkpoint") from None
        logging, self.logging = self.logging, False
        for entry in self.setup_log:
            if entry[0] == "map":
                _, cids, method, args, kwargs = entry
                self.map([self.handles[i] for i in cids], method, *args, **kwargs)
            else:
                _, calls, method = entry
                self.call_each(method, [(self.handles[i], args) for i, args in calls])
        self.logging = logging
        return self.handles

    def _launch(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must say how its workers start")

    def _relaunch(self) -> None:
        self._launch()

    def _send(self, worker: int, request: tuple):
        raise NotImplementedError(f"{type(self).__name__} must say how a request reaches a worker")

    def _receive(self, tickets: list) -> list:
        raise NotImplementedError(f"{type(self).__name__} must say how answers come back")
