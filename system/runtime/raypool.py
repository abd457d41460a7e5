"""The Ray executor (``--executor ray``): clients live in Ray actors, on several devices and machines.

Each actor (``ClientWorker``) hosts a fixed share of the clients for the whole run (``ClientHost``, as a
fork worker does), with its own device: tensors travel as CPU copies and are moved to the receiving side's
device on arrival, so GPU workers and a CPU-only server interoperate. The actors are kept across the runs
of one invocation (``-t``); ``close`` ends them. Ray is imported only here, only with ``--executor ray``.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

import torch

from runtime.executors import ClientHost, PoolExecutor, WorkerLost, to_device, to_wire
from utils import fileio
from utils.errors import FLError

SYSTEM_DIR = Path(__file__).resolve().parents[1]  # holds the importable packages flcore/, plugins/, runtime/, utils/
PACKAGES = ("flcore", "plugins", "runtime", "utils")
RAY_PIN = "ray==2.60.0"
RESOURCE_UNITS = 10_000  # Ray counts a resource in 1/10000ths (a request must be a multiple of 0.0001)


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


CONNECT_TIMEOUT_S = 10  # how long --ray_address may take to answer before the run stops with one line
_watcher: list = []  # the reaper watching the local cluster this process started (runtime/reaper.py)
_session: list = []  # the folder made for that cluster's session (``session_folder``), removed by ``shutdown_ray``
_printer: list = []  # Ray's own printer of its raylet's notes while ``quiet_notes`` has it replaced
# Ray puts Unix sockets under its session folder (<folder>/ray/session_<date>_<time>_<microseconds>_<pid>/
# sockets/plasma_store, about 70 bytes after the folder with a 7-digit pid), and Ray refuses a Unix socket path
# of more than 107 bytes, so the folder's own path is kept to this many bytes.
SESSION_FOLDER_MAX = 36


def session_folder() -> Path:
    """The folder of a local Ray cluster's session, in place of Ray's shared ``/tmp/ray``: a new folder only
    this run uses, made by the I/O layer (``fileio.make_private``: created exclusively, mode 0700, recorded, so
    that ``fileio.remove_made`` removes it at ``shutdown_ray``), under the system's temporary folder, or under
    ``/tmp`` where that path would make the folder's longer than ``SESSION_FOLDER_MAX`` bytes (the Unix socket
    limit above). Ray writes in its ``ray`` folder (``ray.init(_temp_dir=...)``: logs, sockets, spilled
    objects), made here through the layer too: Ray opens the folder it is given to every user (mode 0777, for
    a ``/tmp/ray`` that users share), and this one stays behind the 0700 folder."""
    import tempfile

    parent = tempfile.gettempdir()
    if len(os.fsencode(os.path.abspath(parent))) + len("/fl-ray-12345678") > SESSION_FOLDER_MAX:
        parent = "/tmp"
    try:
        folder = fileio.make_private(parent, "fl-ray-", "Ray's session folder")
        fileio.Folder(folder, create=False, what="Ray's session folder").sub("ray")
    except fileio.FileIOError as e:
        raise FLError(str(e)) from None
    return folder


def quiet_notes() -> None:
    """Ray's driver prints the notes its raylet publishes (a worker died, with Ray's guesses why) on stdout,
    from a thread that ``log_to_driver`` does not stop (``ray._private.worker.listen_error_messages``, which
    calls the module's ``print_to_stdstream``). Until ``shutdown_ray`` they go to the ``ray`` logger at DEBUG
    instead: Ray writes nothing to the run's terminal, and the run says in its own line that a worker died,
    with Ray's reason (``RayExecutor._receive``)."""
    from ray._private import worker

    def to_log(data: dict, ignore_prefix: bool = False) -> None:
        for line in data.get("lines", ()):
            logging.getLogger("ray").debug("(%s) %s", data.get("pid"), line)

    printer = getattr(worker, "print_to_stdstream", None)
    if printer is not None:  # a Ray other than RAY_PIN without it prints its notes as it does
        _printer.append(printer)
        worker.print_to_stdstream = to_log


def check_address(address: str) -> None:
    """Fail fast, with one line, on a ``--ray_address`` Ray would wait minutes for: a ``ray://`` address
    without Ray's client extra, or a host:port that does not answer within ``CONNECT_TIMEOUT_S``."""
    import importlib.util
    import socket

    if address == "auto":
        return
    client = address.startswith("ray://")
    if client and importlib.util.find_spec("grpc") is None:
        raise FLError(f"--ray_address {address} needs Ray's client: pip install 'ray[client]' (same version)")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        host, port = address.removeprefix("ray://"), "10001" if client else "6379"
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise FLError(f"--ray_address {address}: nothing answers at {host}:{port} ({e.strerror or e}); start the "
                      f"cluster (ray start --head) or fix the address") from None


def init_ray(address: str | None = None, num_cpus: int | None = None, device_ids: list[str] | None = None,
             **kwargs) -> bool:
    """Start a local Ray cluster, or join ``address``, with this library importable on every worker (its
    packages travel with the job as ``py_modules``, so machines without a checkout work too).
    Every process of a local cluster (GCS, raylet, object manager, agents, workers and this driver) listens
    on loopback only, it starts no dashboard (``include_dashboard=True`` in ``kwargs`` asks for one) and its
    processes end with this one, even when it is killed (a watcher, runtime/reaper.py; ``shutdown_ray`` ends
    it normally). ``device_ids`` limits a local cluster to those GPUs. Returns False when Ray was already
    running (then nothing is changed; start it through this function so the workers find the library)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    from ray._private import ray_constants

    # Ray writes nothing to the run's terminal: not its start-up notes (logging_level), not its processes' logs
    # (log_to_driver: the raylet's notes, a worker's output). The run reports a worker's failure in one line.
    opts = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
                runtime_env={"py_modules": [str(SYSTEM_DIR / p) for p in PACKAGES]})
    if address:
        check_address(address)
        opts["address"] = address
    else:
        if num_cpus is not None:
            opts["num_cpus"] = num_cpus
        from runtime import reaper

        _session.append(session_folder())
        opts["_temp_dir"] = str(_session[-1] / "ray")
        _watcher.append(reaper.watch())
        # A local cluster turns on Ray's session token and says so at every start: docs/security.md says it once.
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    visible, multi_node = os.environ.get("CUDA_VISIBLE_DEVICES"), ray_constants.ENABLE_RAY_CLUSTER
    # ray.init takes SIGTERM over (its handler exits with 1; its C++ one prints a stack and aborts): the
    # caller's is put back, so that SIGTERM ends a run as main.py says (143, one line).
    on_term = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    try:
        if not address:
            # Ray's servers listen on loopback only when the node's address is a loopback one (else on every
            # interface), and Ray replaces a loopback node address (a 127.0.0.1 given as _node_ip_address too)
            # by the outward interface's unless multi-node clusters are off: the switch that
            # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 sets, read once at Ray's import, so turned off for this start.
            ray_constants.ENABLE_RAY_CLUSTER = False
            if device_ids and torch.cuda.is_available():
                # The raylet started here inherits this environment; this process's own view is restored below.
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(device_ids)
                opts["num_gpus"] = len(device_ids)
        try:
            ray.init(**{**opts, **kwargs})
            quiet_notes()
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
            while _session:
                fileio.remove_made(_session.pop())
            raise FLError(f"Ray did not start{f' at {address}' if address else ''} ({str(e).strip().splitlines()[0]})"
                          ) from None
    finally:
        if on_term is not None:
            signal.signal(signal.SIGTERM, on_term)
        ray_constants.ENABLE_RAY_CLUSTER = multi_node
        if visible is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
    return True


def shutdown_ray() -> None:
    """``ray.shutdown``, then the watcher of a local cluster ends whatever Ray left running, the cluster's
    session folder is removed (``fileio.remove_made``: only the folder ``session_folder`` made) and Ray's
    printer of its raylet's notes is put back (``quiet_notes``)."""
    from runtime import reaper

    import_ray().shutdown()
    if _printer:
        from ray._private import worker

        worker.print_to_stdstream = _printer[0]
        _printer.clear()
    while _watcher:
        reaper.stop(_watcher.pop())
    while _session:
        fileio.remove_made(_session.pop())


def died_because(error: Exception) -> str:
    """Ray's reason for a dead actor, as ``: <reason>``, or ``""`` where its error gives none: the last line of
    the error ("The actor is dead because ..."; Ray's notes no longer reach the terminal, ``quiet_notes``),
    without the list of common causes Ray appends to it."""
    lines = str(error).strip().splitlines()
    reason = lines[-1].split(" Some common causes")[0].strip() if lines else ""
    return f": {reason}" if reason else ""


class RayExecutor(PoolExecutor):
    """Clients spread over ``--workers`` Ray actors (default: one per CPU of the cluster, or one per
    ``--gpus_per_worker`` share of its GPUs), each with 1 CPU and ``--gpus_per_worker`` GPUs."""
    name = "ray"

    def __init__(self, cfg, parking=None):
        super().__init__(parking)
        self.ray = import_ray()
        self.started_ray = init_ray(cfg.ray_address, device_ids=cfg.device_id.split(","))  # -did as parsed: "0,2"
        gpus = cfg.gpus_per_worker
        if gpus is None:
            gpus = 1.0 if str(cfg.device).startswith("cuda") else 0.0
        self.gpus, self.device = float(gpus), "cuda:0" if gpus > 0 else "cpu"
        res = self.ray.cluster_resources()
        if self.gpus > 0 and res.get("GPU", 0) < self.gpus:
            raise FLError(f"--gpus_per_worker {self.gpus} but the Ray cluster has {res.get('GPU', 0)} GPU(s); "
                          f"use --gpus_per_worker 0 for CPU workers")
        # the GPU shares that fit, counted in Ray's units, where the division is exact (in floats 1 // 0.1 is 9)
        auto = (int(res.get("CPU", 1)) if self.gpus == 0 else
                round(res.get("GPU", 0) * RESOURCE_UNITS) // round(self.gpus * RESOURCE_UNITS))
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
            raise WorkerLost(f"a Ray worker died ({type(e).__name__}{died_because(e)})") from None
        except exc.RayTaskError as e:
            if isinstance(e.cause, (FLError, ModuleNotFoundError)):
                hint = ("" if isinstance(e.cause, FLError) else "; start Ray through runtime.raypool.init_ray "
                        "(or with runtime_env py_modules of system/flcore, system/plugins, system/runtime and system/utils)")
                raise type(e.cause)(f"{e.cause}{hint}") from None
            raise
        return to_device(answers, self.server_device)

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []
        if self.started_ray:
            shutdown_ray()
        if self.parking is not None:
            self.parking.release()
