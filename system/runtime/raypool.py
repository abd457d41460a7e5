"""The Ray executor (``--executor ray``): clients live in Ray actors, on several devices and machines.

Each actor (``ClientWorker``) hosts a fixed share of the clients for the whole run (``ClientHost``, as a
fork worker does), with its own device: tensors travel as CPU copies and are moved to the receiving side's
device on arrival, so GPU workers and a CPU-only server interoperate. The actors are kept across the runs
of one invocation (``-t``); ``close`` ends them. Ray is imported only here, only with ``--executor ray``.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from runtime.executors import ClientHost, PoolExecutor, WorkerLost, to_device, to_wire
from utils.errors import FLError

SYSTEM_DIR = Path(__file__).resolve().parents[1]  # holds the importable packages flcore/, runtime/, utils/
PACKAGES = ("flcore", "runtime", "utils")
RAY_PIN = "ray==2.60.0"


class ClientWorker:
    """A Ray actor hosting a fixed share of the clients (built here, kept here between rounds)."""

    def __init__(self, device: str):
        self.device = device
        self.host = None

    def setup(self, factory, cids: list[int], parking, total: int, *datas) -> None:
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise FLError("a Ray worker was given a GPU but torch sees no CUDA device there")
        self.host = ClientHost(factory, list(cids), list(datas), self.device, parking, total)

    def handle(self, request: tuple):
        return self.host.handle(request, self.device)

    def ping(self) -> bool:
        return True


def import_ray():
    try:
        import ray
    except ImportError:
        raise FLError(f"--executor ray needs Ray: pip install {RAY_PIN}") from None
    return ray


def init_ray(address: str | None = None, num_cpus: int | None = None, device_ids: list[str] | None = None,
             **kwargs) -> bool:
    """Start a local Ray cluster, or join ``address``, with this library importable on every worker (its
    packages travel with the job as ``py_modules``, so machines without a checkout work too).
    ``device_ids`` limits a local cluster to those GPUs. Returns False when Ray was already running (then
    nothing is changed; start it through this function so the workers find the library)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    opts = dict(include_dashboard=False, runtime_env={"py_modules": [str(SYSTEM_DIR / p) for p in PACKAGES]})
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


class RayExecutor(PoolExecutor):
    """Clients spread over ``--workers`` Ray actors (default: one per CPU of the cluster, or one per
    ``--gpus_per_worker`` share of its GPUs), each with 1 CPU and ``--gpus_per_worker`` GPUs."""
    name = "ray"

    def __init__(self, cfg, parking=None):
        super().__init__(parking)
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

    def _launch(self) -> None:
        n = len(self.placement)
        for a in self.actors[n:]:
            self.ray.kill(a)
        self.actors = self.actors[:n] + [self._new_actor() for _ in range(n - len(self.actors))]
        self.factory_ref = self.ray.put(to_wire(self.factory))
        self.data_refs = [self.ray.put(to_wire(d)) for d in self.datas]  # owned here: survive a worker's death
        self._setup_all()

    def _new_actor(self):
        return self.worker_class.remote(self.device)

    def _setup_all(self) -> None:
        total = len(self.datas)
        self._receive([a.setup.remote(self.factory_ref, cids, self.parking, total, *[self.data_refs[c] for c in cids])
                       for a, cids in zip(self.actors, self.placement)])

    def _relaunch(self) -> None:
        for w, a in enumerate(self.actors):
            try:
                self.ray.get(a.ping.remote(), timeout=120)
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError):
                self.actors[w] = self._new_actor()
        self._setup_all()

    def _send(self, worker: int, request: tuple):
        return self.actors[worker].handle.remote(to_wire(request))

    def _receive(self, tickets: list) -> list:
        exc = self.ray.exceptions
        try:
            answers = self.ray.get(tickets)
        except exc.RayActorError as e:
            raise WorkerLost(f"a Ray worker died ({type(e).__name__})") from None
        except exc.RayTaskError as e:
            if isinstance(e.cause, (FLError, ModuleNotFoundError)):
                hint = ("" if isinstance(e.cause, FLError) else "; start Ray through runtime.raypool.init_ray "
                        "(or with runtime_env py_modules of system/flcore, system/runtime and system/utils)")
                raise type(e.cause)(f"{e.cause}{hint}") from None
            raise
        return to_device(answers, self.server_device)

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []
        if self.started_ray:
            self.ray.shutdown()
        if self.parking is not None:
            self.parking.release()
