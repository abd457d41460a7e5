"""Executors: where clients live, and how the server's calls reach them.

The server talks to clients only through method calls by name (``receive_global``, ``train``, ``upload``,
``test_metrics``, ``train_metrics`` and any method an algorithm adds). That is the one interface that
crosses the wire, whatever the executor:

- ``SequentialExecutor`` (default): clients are ordinary objects in this process; ``map`` is a for loop.
- ``RayExecutor`` (``--executor ray``): each client is built inside a Ray actor (``ClientWorker``) and stays
  there for the whole run with all its state (model, optimizer, ALA weights, generators, algorithm extras);
  worker w owns the fixed subset of clients ``{i : i mod W == w}``. The server holds ``ClientHandle``
  proxies: a method call runs on the owning worker (``call(cid, method, *args)``), an attribute read
  fetches a copy, an attribute write is refused. ``map`` sends one request per worker, so the workers train
  their clients in parallel. Per round only the broadcast (global model) and the returned values travel.

What crosses the wire: tensors and modules travel as CPU copies and are moved to the receiving side's
device on arrival, so a GPU worker and a CPU-only server interoperate. What a client method returns is a
snapshot: aliasing a client's live tensors only happens with the sequential executor, so servers must not
rely on it (and must change a client only through its methods).

Numbers do not depend on the executor: clients build their state from (seed, run, client id) streams
(utils/seeding.py) and no stream is shared between clients, so the order and the process in which clients
run never matter. On CPU the results are bitwise equal (tests/test_executor.py).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import os
from pathlib import Path

import torch
from torch import nn

from utils.errors import FLError
from utils.seeding import torch_seeded

SYSTEM_DIR = Path(__file__).resolve().parents[1]  # holds the importable packages flcore/ and utils/
RAY_PIN = "ray==2.60.0"


class WorkerLost(RuntimeError):
    """A Ray worker died; the server recovers from its last checkpoint (``Server.train``)."""


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


# ---- building clients anywhere ---------------------------------------------------------------------
@dataclasses.dataclass
class ClientFactory:
    """How every client is built, in this process or inside a Ray worker: ``client_class(cfg, cid, data,
    model, run)`` under the (seed, run, "client-init", cid) stream. ``model`` is the common initial model."""
    client_class: type
    cfg: object
    run: int
    model: nn.Module

    def __call__(self, cid: int, data, device=None):
        cfg = self.cfg
        if device is not None and str(device) != cfg.device:
            cfg = cfg.replace(device=str(device))
            self.model.to(device)
            data = to_device(data, device)
        with torch_seeded(cfg.seed, self.run, "client-init", cid):
            return self.client_class(cfg, cid, data, self.model, self.run)


class SequentialExecutor:
    """Clients are plain objects in this process, run one after the other."""
    name = "sequential"
    can_lose_workers = False

    def start(self, factory: ClientFactory, datas: list) -> list:
        self.clients = [factory(i, d) for i, d in enumerate(datas)]
        return self.clients

    def map(self, clients, method: str, *args, **kwargs) -> list:
        """``[c.method(*args, **kwargs) for c in clients]``."""
        return [getattr(c, method)(*args, **kwargs) for c in clients]

    def call_each(self, method: str, calls) -> list:
        """``[c.method(*args) for c, args in calls]`` (different arguments per client)."""
        return [getattr(c, method)(*args) for c, args in calls]

    def call(self, cid: int, method: str, *args, **kwargs):
        return getattr(self.clients[cid], method)(*args, **kwargs)

    def end_setup(self) -> None:
        """Training starts (see ``RayExecutor.end_setup``)."""

    def reset(self) -> list:
        raise FLError("clients in this process cannot be lost, so there is nothing to rebuild")

    def close(self) -> None:
        """Nothing to release."""


# ---- Ray ---------------------------------------------------------------------------------------------
class ClientHandle:
    """The server-side stand-in for a client that lives in a Ray worker. ``handle.train(3)`` runs
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
        raise FLError(f"client {self.id} lives in a Ray worker: setting '{name}' from the server has no effect "
                      f"there; give the client a method that sets it and call that method")

    def __repr__(self) -> str:
        return f"ClientHandle({self._cls.__name__} {self.id})"


class ClientWorker:
    """A Ray actor hosting a fixed subset of clients (built here, kept here between rounds)."""

    def __init__(self, device: str):
        self.device = device
        self.clients: dict = {}

    def setup(self, factory: ClientFactory, cids: list[int], *datas) -> list[tuple[int, int]]:
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise FLError("a Ray worker was given a GPU but torch sees no CUDA device there")
        self.factory, self.cids, self.datas = factory, list(cids), datas
        self.clients = {cid: factory(cid, d, self.device) for cid, d in zip(cids, datas)}
        return [(c.train_samples, c.test_samples) for c in self.clients.values()]

    def run(self, method: str, cids: list[int], shared) -> list:
        args, kwargs = to_device(shared, self.device)
        return [to_wire(getattr(self.clients[c], method)(*args, **kwargs)) for c in cids]

    def run_each(self, method: str, calls: list) -> list:
        return [to_wire(getattr(self.clients[c], method)(*to_device(args, self.device))) for c, args in calls]

    def get_attr(self, cid: int, name: str):
        return to_wire(getattr(self.clients[cid], name))

    def ping(self) -> bool:
        return True


def init_ray(address: str | None = None, num_cpus: int | None = None, device_ids: list[str] | None = None,
             **kwargs) -> bool:
    """Start a local Ray cluster, or join ``address``, with this library importable on every worker (its
    ``flcore`` and ``utils`` packages travel with the job as ``py_modules``, so machines without a checkout
    work too). ``device_ids`` limits a local cluster to those GPUs. Returns False when Ray was already
    running (then nothing is changed; start it through this function so the workers find the library)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    opts = dict(include_dashboard=False, runtime_env={"py_modules": [str(SYSTEM_DIR / "flcore"),
                                                                     str(SYSTEM_DIR / "utils")]})
    if address:
        opts["address"] = address
    elif num_cpus is not None:
        opts["num_cpus"] = num_cpus
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        if not address and device_ids and torch.cuda.is_available():
            # The raylet started here inherits this environment; this process's own view is restored below.
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(device_ids)
            opts["num_gpus"] = len(device_ids)
        ray.init(**{**opts, **kwargs})
    finally:
        if visible is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
    return True


def import_ray():
    try:
        import ray
    except ImportError:
        raise FLError(f"--executor ray needs Ray: pip install {RAY_PIN}") from None
    return ray


class RayExecutor:
    """Clients spread over ``--workers`` Ray actors (default: one per CPU of the cluster, or one per
    ``--gpus_per_worker`` share of its GPUs), each with 1 CPU and ``--gpus_per_worker`` GPUs. The actors
    are kept across the runs of one invocation (``-t``); ``close`` ends them."""
    name = "ray"
    can_lose_workers = True

    def __init__(self, cfg):
        self.ray = import_ray()
        ids = [d for d in str(cfg.device_id).split(",") if d.strip()]
        self.started_ray = init_ray(cfg.ray_address, device_ids=ids)
        gpus = cfg.gpus_per_worker
        if gpus is None:
            gpus = 1.0 if str(cfg.device).startswith("cuda") else 0.0
        self.gpus, self.device = float(gpus), "cuda:0" if gpus > 0 else "cpu"
        res = self.ray.cluster_resources()
        if self.gpus > 0 and res.get("GPU", 0) < self.gpus:
            raise FLError(f"--gpus_per_worker {self.gpus} but the Ray cluster has {res.get('GPU', 0)} GPU(s); "
                          f"use --gpus_per_worker 0 for CPU workers")
        auto = int(res.get("CPU", 1)) if self.gpus == 0 else int(res.get("GPU", 0) // self.gpus)
        self.max_workers = cfg.workers or max(1, auto)
        self.worker_class = self.ray.remote(num_cpus=1, num_gpus=self.gpus, max_restarts=0)(ClientWorker)
        self.actors: list = []
        self.server_device = torch.device(cfg.device)

    # ---- placement ---------------------------------------------------------------------------------
    def start(self, factory: ClientFactory, datas: list) -> list[ClientHandle]:
        """Build this run's clients inside the workers; returns their handles (client i on worker i mod W)."""
        n_workers = min(self.max_workers, len(datas))
        for a in self.actors[n_workers:]:
            self.ray.kill(a)
        self.actors = self.actors[:n_workers] + [self._new_actor() for _ in range(n_workers - len(self.actors))]
        self.owner = [i % n_workers for i in range(len(datas))]
        self.factory_ref = self.ray.put(to_wire(factory))
        self.data_refs = [self.ray.put(to_wire(d)) for d in datas]  # owned here: survive a worker's death
        self.setup_log: list = []  # calls made before training starts, replayed by reset()
        self.logging = True
        sizes = self._setup_all()
        self.handles = [ClientHandle(self, factory.client_class, i, *sizes[i]) for i in range(len(datas))]
        return self.handles

    def _new_actor(self):
        return self.worker_class.remote(self.device)

    def _cids(self, w: int) -> list[int]:
        return [i for i, o in enumerate(self.owner) if o == w]

    def _setup_all(self) -> dict:
        futures = [a.setup.remote(self.factory_ref, self._cids(w), *[self.data_refs[i] for i in self._cids(w)])
                   for w, a in enumerate(self.actors)]
        sizes = {}
        for w, out in enumerate(self._get(futures)):
            sizes.update(zip(self._cids(w), out))
        return sizes

    # ---- calls ---------------------------------------------------------------------------------------
    def map(self, clients, method: str, *args, **kwargs) -> list:
        if not clients:
            return []
        if self.logging:
            self.setup_log.append(("map", [c.id for c in clients], method, args, kwargs))
        groups = self._group([c.id for c in clients])
        shared = self.ray.put(to_wire((args, kwargs)))
        futures = [self.actors[w].run.remote(method, [cid for _, cid in g], shared) for w, g in groups.items()]
        return self._gather(groups, futures, len(clients))

    def call_each(self, method: str, calls) -> list:
        calls = list(calls)
        if self.logging:
            self.setup_log.append(("each", [(c.id, args) for c, args in calls], method))
        groups = self._group([c.id for c, _ in calls])
        futures = [self.actors[w].run_each.remote(method, [(cid, to_wire(calls[pos][1])) for pos, cid in g])
                   for w, g in groups.items()]
        return self._gather(groups, futures, len(calls))

    def call(self, cid: int, method: str, *args, **kwargs):
        return self.map([self.handles[cid]], method, *args, **kwargs)[0]

    def get_attr(self, cid: int, name: str):
        return to_device(self._get([self.actors[self.owner[cid]].get_attr.remote(cid, name)])[0], self.server_device)

    def _group(self, cids: list[int]) -> dict[int, list[tuple[int, int]]]:
        groups: dict[int, list[tuple[int, int]]] = {}
        for pos, cid in enumerate(cids):
            groups.setdefault(self.owner[cid], []).append((pos, cid))
        return groups

    def _gather(self, groups, futures, n: int) -> list:
        out = [None] * n
        for g, results in zip(groups.values(), self._get(futures)):
            for (pos, _), r in zip(g, results):
                out[pos] = to_device(r, self.server_device)
        return out

    def _get(self, futures) -> list:
        exc = self.ray.exceptions
        try:
            return self.ray.get(futures)
        except exc.RayActorError as e:
            raise WorkerLost(f"a Ray worker died ({type(e).__name__})") from None
        except exc.RayTaskError as e:
            if isinstance(e.cause, (FLError, ModuleNotFoundError)):
                hint = ("" if isinstance(e.cause, FLError) else "; start Ray through utils.executor.init_ray "
                        "(or with runtime_env py_modules of system/flcore and system/utils)")
                raise type(e.cause)(f"{e.cause}{hint}") from None
            raise

    # ---- recovery ------------------------------------------------------------------------------------
    def end_setup(self) -> None:
        """Training starts: stop logging calls. The calls made before (a server's own set-up of its
        clients after construction) are replayed when ``reset`` rebuilds clients from scratch."""
        self.logging = False

    def reset(self) -> list[ClientHandle]:
        """Replace dead workers, rebuild every client from the factory and replay the set-up calls."""
        for w, a in enumerate(self.actors):
            try:
                self.ray.get(a.ping.remote(), timeout=120)
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError):
                self.actors[w] = self._new_actor()
        logging, self.logging = self.logging, False
        try:
            self._setup_all()
        except WorkerLost:
            raise FLError("a replacement Ray worker could not be started; is the cluster still up? Results so "
                          "far are kept; rerun with --resume to continue from the last checkpoint") from None
        for entry in self.setup_log:
            if entry[0] == "map":
                _, cids, method, args, kwargs = entry
                self.map([self.handles[i] for i in cids], method, *args, **kwargs)
            else:
                _, calls, method = entry
                self.call_each(method, [(self.handles[i], args) for i, args in calls])
        self.logging = logging
        return self.handles

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []
        if self.started_ray:
            self.ray.shutdown()


def make_executor(cfg):
    """The executor named by ``--executor``."""
    if cfg.executor == "ray":
        return RayExecutor(cfg)
    if len([d for d in str(cfg.device_id).split(",") if d.strip()]) > 1 and str(cfg.device).startswith("cuda"):
        print(f"note: the sequential executor uses one device ({cfg.device}); add --executor ray to place "
              f"clients on all of -did {cfg.device_id}")
    if getattr(cfg, "client_state", "device") != "device":  # clients parked off the device when idle
        from utils.clientstate import make_parking_executor

        return make_parking_executor(cfg)
    return SequentialExecutor()
