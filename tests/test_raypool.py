"""runtime/raypool.py by hand, without a cluster: how ``--ray_address`` is checked, how Ray is started (what
``ray.init`` is given and what is put back after it), how the executor sizes itself from the cluster's
resources, and how Ray's errors reach the server. Ray itself is a stand-in here; the executor's runs on a real
local cluster are tested in tests/test_executors.py."""
import logging
import os
import signal
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from runtime import raypool, reaper
from runtime.executors import WorkerLost
from utils import fileio
from utils.errors import FLError

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.optional_deps("ray")
from ray._private import worker as ray_worker  # noqa: E402  (after the skip: Ray is optional)


# ---- --ray_address ---------------------------------------------------------------------------------
@pytest.fixture
def dialled(monkeypatch):
    """``calls``: the (host, port) and timeout of each connection attempt; ``error``: what they raise."""
    seen = SimpleNamespace(calls=[], error=None)

    def connect(addr, timeout):
        seen.calls.append((addr, timeout))
        if seen.error is not None:
            raise seen.error
        return socket.socket()  # closed by check_address

    monkeypatch.setattr(socket, "create_connection", connect)
    return seen


@pytest.mark.parametrize("address, expected", [
    ("10.1.2.3:7000", ("10.1.2.3", 7000)),
    ("headnode", ("headnode", 6379)),               # no port: Ray's GCS port
    ("ray://headnode", ("headnode", 10001)),        # no port on a client address: Ray client's port
    ("ray://10.1.2.3:10002", ("10.1.2.3", 10002)),
    ("headnode:gcs", ("headnode:gcs", 6379)),       # not a port: the whole is taken as the host
])
def test_an_address_is_dialled_at_its_host_and_port_within_the_documented_10_s(dialled, address, expected):
    raypool.check_address(address)
    assert dialled.calls == [(expected, 10)]


def test_auto_is_left_to_ray(dialled):
    raypool.check_address("auto")
    assert dialled.calls == []


def test_an_address_that_does_not_answer_is_one_line(dialled):
    dialled.error = ConnectionRefusedError(111, "Connection refused")
    with pytest.raises(FLError, match=r"^--ray_address h:1: nothing answers at h:1 \(Connection refused\); "
                                      r"start the cluster \(ray start --head\) or fix the address$"):
        raypool.check_address("h:1")
    dialled.error = socket.timeout("timed out")  # an OSError without strerror: its text
    with pytest.raises(FLError, match=r"nothing answers at h:1 \(timed out\)"):
        raypool.check_address("h:1")


def test_a_client_address_needs_rays_client_extra(dialled, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real(name, *a))
    with pytest.raises(FLError, match=r"needs Ray's client: pip install 'ray\[client\]'"):
        raypool.check_address("ray://h:10001")
    raypool.check_address("h:6379")  # a plain address does not need it
    assert dialled.calls == [(("h", 6379), 10)]


def test_without_ray_the_executor_names_the_pinned_package(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "ray", None)
    with pytest.raises(FLError, match=r"^--executor ray needs Ray: pip install ray==2\.60\.0$"):
        raypool.import_ray()


# ---- starting Ray ----------------------------------------------------------------------------------
@pytest.fixture
def started(monkeypatch):
    """``ray.init`` replaced by a recorder of its arguments and of what it saw set (the cluster switch,
    CUDA_VISIBLE_DEVICES); it takes SIGTERM over as the real one does. The reaper is a stand-in too."""
    from ray._private import ray_constants

    seen = SimpleNamespace(calls=[], error=None, watched=0, stopped=[], shutdowns=0)

    def init(**kwargs):
        seen.calls.append(kwargs)
        seen.cluster = ray_constants.ENABLE_RAY_CLUSTER
        seen.visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if seen.error is not None:
            raise seen.error

    def watch():
        seen.watched += 1
        return f"watcher {seen.watched}"

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: setattr(seen, "shutdowns", seen.shutdowns + 1))
    monkeypatch.setattr(reaper, "watch", watch)
    monkeypatch.setattr(reaper, "stop", seen.stopped.append)
    monkeypatch.setattr(raypool, "_watcher", [])
    monkeypatch.setattr(raypool, "_session", [])
    monkeypatch.setattr(raypool, "_printer", [])
    monkeypatch.setattr(ray_worker, "print_to_stdstream", ray_worker.print_to_stdstream)  # put back after the test
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    handler = signal.getsignal(signal.SIGTERM)
    yield seen
    signal.signal(signal.SIGTERM, handler)
    while raypool._session:  # the session folders of the starts a test did not shut down: not left in /tmp
        fileio.remove_made(raypool._session.pop())


def test_a_local_cluster_starts_on_loopback_quietly_with_the_library_and_a_watcher(started, monkeypatch):
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    term = signal.getsignal(signal.SIGTERM)
    token_note = logging.getLogger("ray._private.authentication.authentication_token_setup")
    monkeypatch.setattr(token_note, "level", logging.NOTSET)  # as a fresh process has it
    assert raypool.init_ray(num_cpus=3) is True
    assert token_note.level == logging.ERROR  # Ray's note on its session token, at every start, silenced
    (opts,) = started.calls
    assert Path(opts.pop("_temp_dir")).parent.name.startswith("fl-ray-")  # its own session folder (below)
    assert opts == {"include_dashboard": False, "logging_level": 30, "log_to_driver": False, "num_cpus": 3,
                    "runtime_env": {"py_modules": [str(raypool.SYSTEM_DIR / p) for p in ("flcore", "plugins", "runtime", "utils")]}}
    assert sorted(p.name for p in raypool.SYSTEM_DIR.iterdir() if p.name in ("flcore", "plugins", "runtime", "utils")) == [
        "flcore", "plugins", "runtime", "utils"]
    assert started.cluster is False and ray_constants.ENABLE_RAY_CLUSTER == before  # off for the start only
    assert signal.getsignal(signal.SIGTERM) is term  # Ray's SIGTERM handler replaced by the caller's again
    assert raypool._watcher == ["watcher 1"] and started.visible is None
    raypool.shutdown_ray()
    assert started.shutdowns == 1 and started.stopped == ["watcher 1"] and raypool._watcher == []


@pytest.mark.parametrize("tmpdir_length", ["short", "long"])
def test_a_local_cluster_writes_its_session_in_a_short_folder_the_io_layer_made_and_removes(
        started, monkeypatch, tmp_path, tmpdir_length):
    import tempfile

    from utils import fileio

    if tmpdir_length == "long":  # a temporary folder whose path would put Ray's sockets past 107 bytes
        long = tmp_path / ("t" * 40)
        long.mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(long))
    def init(**opts):  # as Ray does: its folder opened to every user, for a /tmp/ray that users share
        started.calls.append(opts)
        os.chmod(opts["_temp_dir"], 0o777)

    monkeypatch.setattr(ray, "init", init)
    raypool.init_ray(num_cpus=1)
    given = Path(started.calls[0]["_temp_dir"])
    folder = given.parent
    assert given.is_absolute() and given.is_dir() and not given.is_symlink() and fileio.made(given)
    assert folder.stat().st_mode & 0o777 == 0o700 and fileio.made(folder) and folder.name.startswith("fl-ray-")
    # Ray's longest socket path: <given>/session_2026-12-06_06-05-00_123456_<7-digit pid>/sockets/plasma_store.1
    longest = f"{given}/session_2026-12-06_06-05-00_123456_4194304/sockets/plasma_store.1"
    assert len(longest.encode()) <= 107, longest
    assert folder.parent == (Path(tempfile.gettempdir()) if tmpdir_length == "short" else Path("/tmp"))
    (given / "session_latest").symlink_to(tmp_path)  # what Ray leaves there, a link among it
    (given / "session_x" / "sockets").mkdir(parents=True)
    raypool.shutdown_ray()
    assert not folder.exists() and tmp_path.is_dir()


@pytest.mark.parametrize("length, kept", [(20, True), (21, False)])
def test_the_session_folder_moves_to_tmp_exactly_when_its_path_would_pass_36_bytes(monkeypatch, tmp_path, length,
                                                                                     kept):
    """The session folder is <temporary folder>/fl-ray-<8 characters> (16 bytes more); with a temporary folder of
    20 bytes it is 36 and Ray's longest socket path under it 106 bytes (Ray's limit 107, one byte in hand), so it
    stays; at 21 bytes the folder goes under /tmp."""
    import tempfile

    from utils import fileio

    parent = "/" + "p" * (length - 1)
    made = []

    def make_private(where, prefix, what):  # where the folder would be made (nothing is made at a made-up path)
        made.append(where)
        (tmp_path / "s").mkdir()
        return tmp_path / "s"

    monkeypatch.setattr(tempfile, "gettempdir", lambda: parent)
    monkeypatch.setattr(fileio, "make_private", make_private)
    assert raypool.session_folder() == tmp_path / "s" and (tmp_path / "s" / "ray").is_dir()
    assert made == [parent if kept else "/tmp"]
    folder = f"{parent}/fl-ray-12345678"
    longest = f"{folder}/ray/session_2026-12-06_06-05-00_123456_4194304/sockets/plasma_store.1"
    assert (len(folder), len(longest)) == ((36, 106) if kept else (37, 107))


def test_a_dashboard_and_other_ray_options_can_be_asked_for(started):
    raypool.init_ray(include_dashboard=True)
    assert started.calls[0]["include_dashboard"] is True and "num_cpus" not in started.calls[0]


def test_joining_a_cluster_checks_its_address_and_starts_no_watcher(started, dialled):
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    assert raypool.init_ray("10.0.0.5:6379", num_cpus=8) is True
    assert dialled.calls == [(("10.0.0.5", 6379), 10)]
    (opts,) = started.calls
    assert opts["address"] == "10.0.0.5:6379" and "num_cpus" not in opts and "num_gpus" not in opts
    assert "_temp_dir" not in opts  # a cluster's session folder is the cluster's
    assert started.cluster == before and started.watched == 0  # a cluster's own settings are left alone


def test_ray_already_running_is_left_as_it_is(started, monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    assert raypool.init_ray(num_cpus=2) is False
    assert started.calls == [] and started.watched == 0


@pytest.mark.parametrize("visible", [None, "3,4"])
def test_gpu_ids_limit_a_local_cluster_and_this_process_keeps_its_own_view(started, monkeypatch, visible):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    raypool.init_ray(device_ids=["0", "2"])
    assert started.visible == "0,2" and started.calls[0]["num_gpus"] == 2
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == visible


def test_gpu_ids_are_ignored_without_cuda(started, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    raypool.init_ray(device_ids=["0"])
    assert started.visible is None and "num_gpus" not in started.calls[0]


@pytest.mark.parametrize("error", [ConnectionError, RuntimeError, ValueError, TimeoutError])
def test_ray_that_does_not_start_is_one_line_and_puts_everything_back(started, dialled, monkeypatch, error):
    from ray._private import ray_constants

    before, term = ray_constants.ENABLE_RAY_CLUSTER, signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    started.error = error("no room\nsecond line")
    with pytest.raises(FLError, match=r"^Ray did not start \(no room\)$"):
        raypool.init_ray(device_ids=["1"])
    assert ray_constants.ENABLE_RAY_CLUSTER == before and signal.getsignal(signal.SIGTERM) is term
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    session = Path(started.calls[0]["_temp_dir"]).parent
    assert raypool._session == [] and not session.exists()  # the session folder made for it removed
    with pytest.raises(FLError, match=r"^Ray did not start at h:1 \(no room\)$"):
        raypool.init_ray("h:1")


@pytest.mark.parametrize("address", [None, "10.0.0.5:6379"])
def test_rays_notes_go_to_its_logger_until_shutdown(started, dialled, capfd, address):
    """The raylet's notes that Ray's driver prints on stdout (a worker died, ...) reach the ``ray`` logger at
    DEBUG while a cluster this process started or joined is up, and Ray's printer is back after
    ``shutdown_ray``."""
    original = ray_worker.print_to_stdstream
    notes = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: notes.append((record.levelno, record.getMessage()))
    logger = logging.getLogger("ray")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        raypool.init_ray(address)
        assert ray_worker.print_to_stdstream is not original
        ray_worker.print_to_stdstream({"lines": ["A worker died", "or was killed"], "pid": "raylet", "is_err": False},
                                      ignore_prefix=False)
        ray_worker.print_to_stdstream({"lines": ["the disk is full"], "pid": "raylet", "is_err": True}, False)
        raypool.init_ray(address)  # a second start (Ray stopped outside shutdown_ray): Ray's printer is still kept
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    out, err = capfd.readouterr()
    assert out == err == ""
    assert notes == [(logging.DEBUG, "(raylet) A worker died"), (logging.DEBUG, "(raylet) or was killed"),
                     (logging.DEBUG, "(raylet) the disk is full")]
    raypool.shutdown_ray()
    assert ray_worker.print_to_stdstream is original and raypool._printer == []


def test_ray_already_running_keeps_its_printer_and_a_failed_start_does_not_replace_it(started, monkeypatch):
    original = ray_worker.print_to_stdstream
    started.error = RuntimeError("no")
    with pytest.raises(FLError):
        raypool.init_ray(num_cpus=1)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    assert raypool.init_ray(num_cpus=1) is False
    assert ray_worker.print_to_stdstream is original and raypool._printer == []


def test_a_ray_without_the_printer_is_started_as_it_is(started, monkeypatch):
    monkeypatch.delattr(ray_worker, "print_to_stdstream")
    assert raypool.init_ray(num_cpus=1) is True and raypool._printer == []
    raypool.shutdown_ray()
    assert not hasattr(ray_worker, "print_to_stdstream")


@pytest.mark.parametrize("message, said", [
    ("", "a Ray worker died (RayActorError)"),  # "gone": test_rays_errors_reach_the_server_as_the_runs_own
    ("  \n ", "a Ray worker died (RayActorError)"),
    ("The actor died unexpectedly before finishing this task.\n\tclass_name: ClientWorker\n\tpid: 8864\n"
     "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
     "Worker unexpectedly exits with a connection error code 2. End of file. Some common causes include: (1) the "
     "process was killed by the OOM killer",
     "a Ray worker died (RayActorError: The actor is dead because its worker process has died. Worker exit type: "
     "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file.)"),
    ("The actor died unexpectedly before finishing this task.\nThe actor is dead because it was killed by `ray.kill`.",
     "a Ray worker died (RayActorError: The actor is dead because it was killed by `ray.kill`.)"),
])
def test_a_dead_worker_is_one_line_with_rays_reason(stand_in, message, said):
    made = stand_in({"CPU": 2.0})
    ex = raypool.RayExecutor(cfg())
    made.ray.answers = made.ray.exceptions.RayActorError(message)
    with pytest.raises(WorkerLost) as e:
        ex._receive(["t"])
    assert str(e.value) == said


def test_each_local_start_writes_in_its_own_new_session_folder(started):
    raypool.init_ray(num_cpus=1)
    raypool.init_ray(num_cpus=1)  # a second start (Ray stopped outside shutdown_ray): a folder of its own
    first, second = (Path(c["_temp_dir"]).parent for c in started.calls)
    assert first != second and raypool._session == [first, second] and first.is_dir() and second.is_dir()
    raypool.shutdown_ray()
    assert raypool._session == [] and not first.exists() and not second.exists()


# ---- the executor ----------------------------------------------------------------------------------
class TaskError(Exception):
    def __init__(self, cause):
        super().__init__(str(cause))
        self.cause = cause


class StandInRay:
    """What RayExecutor asks of Ray: the cluster's resources, actor classes, object refs and results."""

    def __init__(self, resources):
        self.resources, self.options, self.killed, self.shutdown = resources, None, [], 0
        self.exceptions = SimpleNamespace(RayActorError=type("RayActorError", (Exception,), {}),
                                          RayTaskError=TaskError,
                                          GetTimeoutError=type("GetTimeoutError", (Exception,), {}))
        self.answers = None

    def cluster_resources(self):
        return dict(self.resources)

    def remote(self, **options):
        self.options = options
        return lambda cls: SimpleNamespace(remote=lambda device: SimpleNamespace(device=device))

    def get(self, tickets, timeout=None):
        if isinstance(self.answers, Exception):
            raise self.answers
        return self.answers

    def kill(self, actor):
        self.killed.append(actor)


def cfg(**kw):
    base = dict(device="cpu", device_id="0", ray_address=None, gpus_per_worker=None, workers=None)
    return SimpleNamespace(**{**base, **kw})


@pytest.fixture
def stand_in(monkeypatch):
    made = SimpleNamespace(ray=None, init=[], started=True)

    def use(resources):
        made.ray = StandInRay(resources)
        return made

    monkeypatch.setattr(raypool, "import_ray", lambda: made.ray)

    def init_ray(address=None, device_ids=None):
        made.init.append((address, device_ids))
        return made.started

    monkeypatch.setattr(raypool, "init_ray", init_ray)
    monkeypatch.setattr(raypool, "shutdown_ray", lambda: setattr(made.ray, "shutdown", made.ray.shutdown + 1))
    return use


@pytest.mark.parametrize("config, resources, gpus, device, workers", [
    (cfg(), {"CPU": 6.0}, 0.0, "cpu", 6),                                        # one CPU worker per CPU
    (cfg(workers=2), {"CPU": 6.0}, 0.0, "cpu", 2),                               # as asked
    (cfg(device="cuda"), {"CPU": 16.0, "GPU": 3.0}, 1.0, "cuda:0", 3),           # one per GPU on a GPU run
    (cfg(device="cuda:1", gpus_per_worker=0.5), {"CPU": 16.0, "GPU": 3.0}, 0.5, "cuda:0", 6),
    (cfg(device="cuda", gpus_per_worker=0.0), {"CPU": 5.0, "GPU": 1.0}, 0.0, "cpu", 5),  # CPU workers asked for
    (cfg(device="cuda", gpus_per_worker=2.0), {"CPU": 4.0, "GPU": 3.0}, 2.0, "cuda:0", 1),
    (cfg(device="cuda"), {"CPU": 4.0, "GPU": 1.0}, 1.0, "cuda:0", 1),           # exactly the GPU it needs
    (cfg(device="cuda", gpus_per_worker=0.1), {"CPU": 16.0, "GPU": 1.0}, 0.1, "cuda:0", 10),  # 1 // 0.1 is 9.0
    (cfg(device="cuda", gpus_per_worker=0.1), {"CPU": 16.0, "GPU": 0.3}, 0.1, "cuda:0", 3),   # 0.3 // 0.1 is 2.0
    (cfg(device="cuda", gpus_per_worker=0.3), {"CPU": 16.0, "GPU": 1.0}, 0.3, "cuda:0", 3),   # a share left over
    (cfg(device="cuda", gpus_per_worker=0.0001), {"CPU": 1.0, "GPU": 1.0}, 0.0001, "cuda:0", 10000),  # Ray's least
    (cfg(), {}, 0.0, "cpu", 1),                                                  # no CPU listed: one worker
    (cfg(), {"CPU": 0.0}, 0.0, "cpu", 1),          # a head node without CPUs (an autoscaling cluster): one
])
def test_the_executor_sizes_itself_from_the_cluster(stand_in, config, resources, gpus, device, workers):
    made = stand_in(resources)
    ex = raypool.RayExecutor(config)
    assert (ex.gpus, ex.device, ex.max_workers) == (gpus, device, workers)
    assert made.ray.options == {"num_cpus": 1, "num_gpus": gpus, "max_restarts": 0}
    assert ex.server_device == torch.device(config.device) and ex.actors == []


def test_the_executor_starts_ray_with_the_runs_address_and_gpu_ids(stand_in):
    made = stand_in({"CPU": 2.0})
    raypool.RayExecutor(cfg(ray_address="h:1", device_id="0,2"))  # -did as the parser writes it
    assert made.init == [("h:1", ["0", "2"])]


def test_gpus_per_worker_takes_zero_and_rays_least_share():
    from cli import parse_config

    assert [parse_config(["--gpus_per_worker", g]).gpus_per_worker for g in ("0", "0.0001")] == [0.0, 0.0001]


def test_more_gpus_per_worker_than_the_cluster_has_is_one_line(stand_in):
    stand_in({"CPU": 8.0, "GPU": 1.0})
    with pytest.raises(FLError, match=r"^--gpus_per_worker 2\.0 but the Ray cluster has 1\.0 GPU\(s\); use "
                                      r"--gpus_per_worker 0 for CPU workers$"):
        raypool.RayExecutor(cfg(device="cuda", gpus_per_worker=2.0))
    stand_in({"CPU": 8.0})
    with pytest.raises(FLError, match=r"has 0 GPU\(s\)"):
        raypool.RayExecutor(cfg(device="cuda"))


def test_rays_errors_reach_the_server_as_the_runs_own(stand_in):
    made = stand_in({"CPU": 2.0})
    ex = raypool.RayExecutor(cfg())
    made.ray.answers = [torch.ones(2), {"a": torch.zeros(1)}]
    out = ex._receive(["t1", "t2"])
    assert torch.equal(out[0], torch.ones(2)) and out[1]["a"].device == torch.device("cpu")
    made.ray.answers = made.ray.exceptions.RayActorError("gone")
    with pytest.raises(WorkerLost, match=r"^a Ray worker died \(RayActorError: gone\)$"):
        ex._receive(["t"])
    made.ray.answers = TaskError(FLError("client 3 refuses"))
    with pytest.raises(FLError) as e:
        ex._receive(["t"])
    assert str(e.value) == "client 3 refuses"
    made.ray.answers = TaskError(ModuleNotFoundError("No module named 'flcore'"))
    with pytest.raises(ModuleNotFoundError, match=r"^No module named 'flcore'; start Ray through "
                                                  r"runtime\.raypool\.init_ray \(or with runtime_env py_modules"):
        ex._receive(["t"])
    made.ray.answers = error = TaskError(ValueError("a bug"))
    with pytest.raises(TaskError) as e:
        ex._receive(["t"])
    assert e.value is error  # anything else: Ray's own error, with the worker's traceback


class Parking:
    released = 0

    def release(self):
        self.released += 1


@pytest.mark.parametrize("started_here", [True, False])
def test_close_ends_the_actors_and_only_a_cluster_it_started(stand_in, started_here):
    made = stand_in({"CPU": 2.0})
    made.started = started_here
    parking = Parking()
    ex = raypool.RayExecutor(cfg(), parking)
    ex.actors = ["a0", "a1"]
    ex.close()
    assert made.ray.killed == ["a0", "a1"] and ex.actors == [] and parking.released == 1
    assert made.ray.shutdown == int(started_here)


def test_relaunch_replaces_only_the_actors_that_do_not_answer(stand_in, monkeypatch):
    made = stand_in({"CPU": 3.0})
    ex = raypool.RayExecutor(cfg())
    exc = made.ray.exceptions
    answers = {"ok": True, "dead": exc.RayActorError("x"), "hung": exc.GetTimeoutError("y")}
    ex.actors = [SimpleNamespace(name=n, ping=SimpleNamespace(remote=lambda n=n: n)) for n in answers]
    asked = []

    def get(ticket, timeout=None):
        asked.append((ticket, timeout))
        if isinstance(answers[ticket], Exception):
            raise answers[ticket]
        return answers[ticket]

    made.ray.get = get
    monkeypatch.setattr(ex, "_setup_all", lambda: asked.append("setup"))
    ex._relaunch()
    assert asked == [("ok", 120), ("dead", 120), ("hung", 120), "setup"]
    assert ex.actors[0].name == "ok" and ex.actors[1].device == "cpu" and ex.actors[2].device == "cpu"


def test_launching_again_keeps_the_actors_it_needs_and_ends_the_rest(stand_in):
    made = stand_in({"CPU": 3.0})
    ex = raypool.RayExecutor(cfg())
    calls = []

    def actor(name):
        return SimpleNamespace(name=name, setup=SimpleNamespace(remote=lambda *a: calls.append((name, a))))

    ex.actors = [actor("a0"), actor("a1"), actor("a2")]
    surplus = ex.actors[2]
    ex.factory, ex.datas, ex.placement = "factory", ["d0", "d1", "d2"], [[0, 2], [1]]
    made.ray.put = lambda value: ("ref", value)
    made.ray.answers = [None, None]
    ex._launch()
    assert made.ray.killed == [surplus] and [a.name for a in ex.actors] == ["a0", "a1"]
    ref = ex.factory_ref
    assert ref == ("ref", "factory") and ex.data_refs == [("ref", "d0"), ("ref", "d1"), ("ref", "d2")]
    assert calls == [("a0", (ref, [0, 2], None, 3, ("ref", "d0"), ("ref", "d2"))),
                     ("a1", (ref, [1], None, 3, ("ref", "d1")))]


# ---- the actor -------------------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a worker without CUDA")
def test_a_worker_given_a_gpu_without_cuda_says_so():
    with pytest.raises(FLError, match=r"^a Ray worker was given a GPU but torch sees no CUDA device there$"):
        raypool.ClientWorker("cuda:0").setup(None, [], None, 0)


def test_a_worker_hosts_its_share_of_the_clients_on_its_own_device(monkeypatch):
    built = []

    class Host:
        def __init__(self, *args):
            built.append(args)

        def handle(self, request, device):
            return request, device

    monkeypatch.setattr(raypool, "ClientHost", Host)
    worker = raypool.ClientWorker("cpu")
    worker.setup("factory", (3, 1), "parking", 5, "data 3", "data 1")
    assert built == [("factory", [3, 1], ["data 3", "data 1"], "cpu", "parking", 5)]
    assert worker.handle(("sizes",)) == (("sizes",), "cpu")
