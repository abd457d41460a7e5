"""runtime/choose.py: which executor ``--executor`` (and ``auto``) gives, with how many workers, and the
refusals and notes it prints. The core count is set by hand, so the choice does not depend on the machine."""
import os

import pytest

from cli import parse_config
from runtime import choose
from runtime.executors import Parking, SequentialExecutor
from runtime.fork import ForkExecutor
from utils.errors import FLError


def config(*flags, **fields):
    return parse_config(["-nc", "20", *flags]).replace(**{"device": "cpu", **fields})


@pytest.fixture
def cores(monkeypatch):
    def set_cores(n):
        monkeypatch.setattr(choose, "usable_cores", lambda: n)
    return set_cores


@pytest.mark.parametrize("n_cores,clients,device,expected", [
    (2, 20, "cpu", "fork"),
    (1, 20, "cpu", "sequential"),        # one core: no worker to spare
    (2, 1, "cpu", "sequential"),         # one client: nothing to spread
    (2, 2, "cpu", "fork"),               # the smallest case that forks
    (16, 20, "cuda", "sequential"),      # CUDA does not survive a fork
    (16, 20, "cuda:1", "sequential"),
])
def test_auto_forks_only_on_a_multicore_cpu_with_several_clients(cores, n_cores, clients, device, expected):
    cores(n_cores)
    assert choose.executor_kind(config(num_clients=clients, device=device)) == expected


@pytest.mark.parametrize("kind", ["sequential", "fork", "ray"])
def test_a_named_executor_is_taken_as_named(cores, kind):
    cores(1)
    assert choose.executor_kind(config("--executor", kind, num_clients=1, device="cuda")) == kind


def test_fork_takes_one_worker_per_usable_core_unless_workers_is_given(cores):
    cores(3)
    executor = choose.make_executor(config("--executor", "fork"))
    assert isinstance(executor, ForkExecutor) and executor.max_workers == 3
    executor = choose.make_executor(config("--executor", "fork", "--workers", "2"))
    assert executor.max_workers == 2
    assert choose.make_executor(config("--executor", "fork", "--workers", "1")).max_workers == 1  # as asked
    assert ForkExecutor(0).max_workers == 1  # built by hand with none: still one worker to hold the clients
    cores(2)
    assert choose.make_executor(config()).max_workers == 2  # auto on 2 cores: fork, 2 workers


def test_fork_on_a_gpu_is_refused_with_one_line(cores):
    cores(4)
    with pytest.raises(FLError, match="--executor fork runs on the CPU") as e:
        choose.make_executor(config("--executor", "fork", device="cuda"))
    assert "\n" not in str(e.value)


def test_sequential_notes_that_it_uses_one_of_several_gpus(cores, capsys):
    cores(4)
    executor = choose.make_executor(config("-did", "0,1", device="cuda"))
    assert isinstance(executor, SequentialExecutor)
    assert "uses one device (cuda); add --executor ray" in capsys.readouterr().out
    for device, ids in (("cuda", "0"), ("cuda", "0, "), ("cpu", "0,1")):  # one GPU, or the CPU: no note
        choose.make_executor(config("--executor", "sequential", "-did", ids, device=device))
        assert capsys.readouterr().out == ""


def test_the_executor_parks_clients_as_client_state_says(cores):
    cores(1)
    assert choose.make_executor(config()).parking is None  # --client_state device: nothing parked
    parking = choose.make_executor(config("--client_state", "cpu", "-jr", "0.5")).parking
    assert isinstance(parking, Parking) and parking.mode == "cpu" and parking.capacity == 10


def test_ray_gets_the_config_and_the_parking(cores, monkeypatch):
    made = []
    monkeypatch.setattr(choose, "RayExecutor", lambda cfg, parking: made.append((cfg, parking)) or "ray")
    cfg = config("--executor", "ray", "--client_state", "cpu")
    assert choose.make_executor(cfg) == "ray"
    (got, parking), = made
    assert got is cfg and parking.mode == "cpu"


def test_usable_cores_are_the_affinity_set_or_the_cpu_count(monkeypatch):
    assert choose.usable_cores() == len(os.sched_getaffinity(0))
    # this process's set (pid 0), not another's: a run started under taskset -c 0 gets one worker
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0} if pid == 0 else {0, 1, 2, 3})
    assert choose.usable_cores() == 1
    monkeypatch.delattr(os, "sched_getaffinity")  # not Linux
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert choose.usable_cores() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown
    assert choose.usable_cores() == 1


def test_a_batched_executor_falls_back_only_where_auto_chose_it():
    """``--executor batched`` named: a model it cannot stack is refused (``auto`` off); resolved from ``auto``
    (main.py passes ``auto=True``): the sequential loop instead, with a note."""
    from runtime.batched import BatchedExecutor

    named = choose.make_executor(config("--executor", "batched"))
    resolved = choose.make_executor(config("--executor", "batched"), auto=True)
    assert isinstance(named, BatchedExecutor) and isinstance(resolved, BatchedExecutor)
    assert named.auto is False and resolved.auto is True
