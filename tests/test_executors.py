"""Executors (sequential, fork, Ray), lost workers, checkpoints and resume, parked clients, and what
crosses the wire (system/runtime/).

Runs are 2-3 rounds on a 5-client split of 500 digits (``digits_tiny_root``), well under a second each.
Equality is exact (``np.array_equal``) wherever every process runs torch at one thread (fork and Ray
workers do, and the ``one_thread`` fixture pins this one): the same float operations then run in the same
order whichever process runs a client. The Ray tests share one local Ray session (2 CPUs) and one pool of
2 workers, reused by every run as ``-t N`` runs reuse it: starting Ray is the slow part.
"""
import copy
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import main
from cli import algorithm_arg, parse_config
from conftest import (REPO, RAY_POOL, build_server, cli, observed_name, sequential_name, sequential_series,
                      two_observed_rounds)
from flcore.clients.clientavg import FedAvgClient
from flcore.registry import ALGORITHMS, get_server_class
from flcore.servers.serveravg import FedAvgServer
from flcore.servers.serverbase import Declares, Server
from runtime.executors import ClientHandle, balance
from runtime.fork import ForkExecutor
from runtime import raypool
from utils.data_utils import load_split
from utils.errors import FLError
from utils.results import RunRecorder, read_h5
from runtime import loop
from runtime import client_steps

ALGOS = sorted(ALGORITHMS)
FAST = ("-lr", "0.1", "-lbs", "20")
SEQUENTIAL = ("--executor", "sequential")
FORK = ("--executor", "fork", "--workers", "2")
RAY = ("--executor", "ray", "--workers", "2")
ON = {"sequential": SEQUENTIAL, "fork": FORK, "ray": RAY}
WITH_RAY = pytest.param("ray", marks=pytest.mark.optional_deps("ray"))  # the executor parameter "ray"


KILLED = ("-algo", "FedALA", "-gr", "3", "--checkpoint_every", "1")  # a worker killed in round 2
PARKED = ("-algo", "FedALA", "-gr", "2", "-jr", "0.4", "--ala_max_epochs", "2")  # clients parked between rounds


def shared_run(item) -> str | None:
    """The sequential run a test compares with (``sequential_run``), named by its flags (tests/conftest.py's
    ``regroup``): every test that reads it runs in the test process that makes it. The tests on the shared Ray pool run in one test
    process instead (``RAY_POOL``); the check of personal entries reads conftest's ``two_observed_rounds``."""
    params = item.callspec.params if hasattr(item, "callspec") else {}
    if params.get("executor") == "ray" or item.originalname == "test_ray_matches_sequential":
        return RAY_POOL
    if item.originalname == "test_personal_entries_never_reach_the_server":
        return observed_name(params["algo"])
    flags = {"test_fork_matches_sequential": lambda: two_rounds(params["algo"]),
             "test_resume_after_crash_equals_uninterrupted_run": lambda: resumed(params["case"]),
             "test_killed_worker_resumes_from_checkpoint": lambda: KILLED,
             "test_killed_worker_without_checkpoint_replays_from_round_0": lambda: two_rounds("Ditto"),
             "test_parked_clients_give_the_same_run_with_a_round_of_memory": lambda: PARKED}.get(item.originalname)
    return None if flags is None else sequential_name(*FAST, *flags(), *SEQUENTIAL)


# ---- helpers -----------------------------------------------------------------------------------------
def two_rounds(algo: str) -> tuple:
    return ("-algo", algo, "-gr", "2")


def resumed(case: tuple) -> tuple:
    """The flags of a ``RESUMED`` case's run, checkpointed every 2 rounds."""
    algo, *extra = case
    return ("-algo", algo, "-gr", "3", "-jr", "0.6", *extra, "--checkpoint_every", "2")


def series(out, algo: str) -> dict:
    """Every recorded series of a run except the wall times."""
    return {k: v for k, v in read_h5(out / f"Digits_{algo}_test_0.h5").items() if k != "rs_round_time"}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k], equal_nan=True), k


def run_main(root, out, *flags, executor=None) -> dict:
    """A run through the command line (``executor``: a pool to run on instead of one from the flags)."""
    argv = cli(root, out, *FAST, *flags)
    if executor is None:
        assert main.main(argv) == 0
    else:
        main.run(parse_config(argv), executor=executor)
    return series(out, algorithm_arg(argv))


def build(root, algo: str = "FedAvg", *flags) -> Server:
    """A server with its clients in this process (sequential executor), built as main.run builds it,
    without result files; tests drive it with ``loop.run_round(server, t)``."""
    return build_server(root, root, "-algo", algo, *flags)


def tensors(obj):
    """Every tensor inside ``obj`` (nested dicts, lists and tuples)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors(v)


@pytest.fixture
def one_thread():
    """Torch at one thread in this process, as in every fork and Ray worker: bitwise comparisons need the
    same kernels on both sides. conftest already sets one thread at import; the tests whose comparisons
    depend on it request this fixture, so they hold whatever ran before them."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def sequential_run(digits_tiny_root, tmp_path_factory):
    """Undisturbed sequential runs on the tiny split, each set of flags run once per test process
    (conftest's ``sequential_series``)."""
    def get(*flags) -> dict:
        return sequential_series(digits_tiny_root, tmp_path_factory, *FAST, *flags, *SEQUENTIAL)

    return get


@pytest.fixture(scope="module")
def ray_pool(digits_tiny_root):
    pytest.importorskip("ray")
    from runtime.raypool import RayExecutor, init_ray, shutdown_ray

    init_ray(num_cpus=2)
    pool = RayExecutor(parse_config(cli(digits_tiny_root, digits_tiny_root, *RAY)))
    yield pool
    pool.close()
    shutdown_ray()


def pool_for(executor: str, request):
    """The shared Ray pool for ``ray`` (tests that use it are marked ``optional_deps("ray")``); None (one made
    from the flags) otherwise."""
    return request.getfixturevalue("ray_pool") if executor == "ray" else None


# ---- every algorithm gives the sequential numbers on every executor ------------------------------------
@pytest.mark.parametrize("algo", ALGOS)
def test_fork_matches_sequential(algo, digits_tiny_root, tmp_path, sequential_run, one_thread):
    """Every registered algorithm on fork workers gives the sequential run's numbers exactly. It is also the
    determinism check: the fork run is this process's second run of these flags, after the sequential one, so
    a run that draws from a random state it did not seed (in the server or in a client: the workers inherit
    the state the first run moved on), or that reads what an earlier run left behind, differs."""
    seq = sequential_run(*two_rounds(algo))
    assert len(seq["rs_round"]) == 3 and np.all(np.isfinite(seq["rs_train_loss"]))  # rounds 0, 1 and final
    assert_same(seq, run_main(digits_tiny_root, tmp_path, *two_rounds(algo), *FORK))


@pytest.mark.optional_deps("ray")
@pytest.mark.parametrize("algo", ALGOS)
def test_ray_matches_sequential(algo, digits_tiny_root, tmp_path, sequential_run, ray_pool, one_thread):
    seq = sequential_run(*two_rounds(algo))
    assert_same(seq, run_main(digits_tiny_root, tmp_path, *two_rounds(algo), *RAY, executor=ray_pool))
    # Clients live on their workers: each actor holds exactly its share, balanced by training samples.
    ray = ray_pool.ray
    sizes = [h.train_samples for h in ray_pool.handles]
    held = [sorted(ray.get(a.handle.remote(("sizes",)))) for a in ray_pool.actors]
    assert held == ray_pool.placement and sorted(sum(held, [])) == list(range(5)) and len(held) == 2
    loads = [sum(sizes[c] for c in cids) for cids in held]
    assert max(loads) - min(loads) <= max(sizes)
    h = ray_pool.handles[3]
    assert len(h.train_time) == 2  # one entry per round trained, accumulated on the worker
    correct, n, _ = ray_pool.map([h], client_steps.test_metrics)[0]  # an engine call runs on the worker
    assert n == h.test_samples and 0 <= correct <= n
    assert isinstance(h.model, torch.nn.Module)  # an attribute read returns a copy
    with pytest.raises(FLError, match="method"):
        h.optimizer = None  # a write could never reach the worker: refused


@pytest.mark.optional_deps("ray")
def test_ray_writes_nothing_to_the_runs_terminal(ray_pool, capfd):
    """Ray's two ways to the run's terminal are closed: its processes' logs (a worker's prints, the raylet's
    notes such as a disk "over 95% full", which once broke a run's one-line ending) are not forwarded
    (``log_to_driver`` off), and the raylet's notes on a dead worker go to the ``ray`` logger
    (``quiet_notes``); the run reports the death itself, with Ray's reason."""
    import time

    ray = ray_pool.ray

    @ray.remote(num_cpus=0)  # the pool's workers may hold every CPU of the cluster
    def speak() -> int:
        print("from a worker's stdout", flush=True)
        print("from a worker's stderr", file=sys.stderr, flush=True)
        return 7

    @ray.remote(num_cpus=0, max_restarts=0)
    class Doomed:
        def die(self) -> None:
            os._exit(3)

    capfd.readouterr()
    assert ray.get(speak.remote()) == 7
    with pytest.raises(ray.exceptions.RayActorError) as e:
        ray.get(Doomed.remote().die.remote())
    assert "worker process has died" in raypool.died_because(e.value)
    time.sleep(2)  # Ray forwards a line within about half a second when it forwards at all
    out, err = capfd.readouterr()
    assert out == err == "", (out, err)


# ---- crash and --resume ------------------------------------------------------------------------------
# Algorithms whose server keeps per-client state (FedAMP's and FedFomo's stored models, APPLE's cores),
# and FedALA's client state (ALA weights and streams) parked off the device.
# Algorithms whose state beyond the model must survive a checkpoint: stored models and attention (FedAMP,
# FedFomo, APPLE, FedMTL), ALA weights, control variates and regulariser states (FedDyn's h and gradients),
# previous models (MOON), the server's generator with its optimizer and streams (FedGen), middleware models
# and their dispatch stream (FedCross: 5 rounds, so a lost stream shows), APFL's v and alpha.
RESUMED = [("FedAMP",), ("FedFomo",), ("APPLE",), ("FedALA", "--client_state", "cpu"), ("FedMTL", "-lam", "0.5"),
           ("FedDyn", "--client_state", "cpu"), ("MOON",), ("FedGen", "-se", "5"), ("FedCross", "-gr", "5"),
           ("APFL", "--client_state", "cpu"),
           # the server optimizer's per-entry state; with a robust aggregator and an attack on a split model
           ("FedAdam",), ("FedRep", "--server_opt", "yogi", "--aggregator", "geomed", "--attack", "gaussian", "-pls", "1")]


@pytest.mark.parametrize("executor", ["fork", "sequential"])
@pytest.mark.parametrize("case", RESUMED, ids=lambda c: "-".join(c))
def test_resume_after_crash_equals_uninterrupted_run(case, executor, digits_tiny_root, tmp_path, sequential_run,
                                                     stop_in_round, capsys, one_thread):
    algo = case[0]
    flags = resumed(case)
    base = sequential_run(*flags)

    stop_in_round(2)
    crash = tmp_path / "crash"
    with pytest.raises(RuntimeError, match="killed"):
        run_main(digits_tiny_root, crash, *flags, *ON[executor])
    ckpt = crash / f"Digits_{algo}_test_0.ckpt"
    assert ckpt.exists() and not list(crash.glob("*.tmp"))
    assert len(read_h5(crash / f"Digits_{algo}_test_0.h5")["rs_round"]) == 3  # rounds 0-2 evaluated
    stop_in_round(None)
    capsys.readouterr()

    # Resumed on the other executor: what one executor writes the other reads (fork -> sequential and
    # sequential -> fork are the two cases), so a checkpoint does not depend on where its clients lived.
    other = "sequential" if executor == "fork" else "fork"
    assert_same(base, run_main(digits_tiny_root, crash, *flags, *ON[other], "--resume"))
    assert "after round 1" in capsys.readouterr().out
    rounds = parse_config(cli(digits_tiny_root, crash, *flags)).global_rounds  # a case may set its own -gr
    assert len(read_h5(crash / f"Digits_{algo}_test_0.h5")["rs_round_time"]) == rounds


def test_resume_checks_flags_and_starts_over_without_checkpoint(digits_tiny_root, tmp_path, capsys, one_thread):
    run_main(digits_tiny_root, tmp_path, "-gr", "1", "--checkpoint_every", "1", "--resume", *FORK)
    assert "no checkpoint" in capsys.readouterr().out
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", "-lr", "0.2", "-lbs", "20", "--resume")) == 2
    err = capsys.readouterr().err
    assert "other flags" in err and "local_learning_rate" in err
    # six flags changed: the line shows the first five (by name), old -> new
    six = ("-lr", "0.2", "-lbs", "7", "-ls", "2", "-jr", "0.8", "-eg", "2", "--seed", "5")
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", *six, "--resume")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.count(" -> ") == 5 and "seed" not in err, err
    # -gr may grow (and the executor change): the run continues after round 0 as a 2-round run would.
    longer = run_main(digits_tiny_root, tmp_path, "-gr", "2", "--resume", *SEQUENTIAL)
    assert "resuming" in capsys.readouterr().out
    assert_same(longer, run_main(digits_tiny_root, tmp_path / "fresh", "-gr", "2", *SEQUENTIAL))


# ---- a worker killed during a round ------------------------------------------------------------------
def kill_worker_at(monkeypatch, round_idx: int, worker: int, every_time: bool = False) -> list:
    """Kill ``worker`` of the run's executor as local training of round ``round_idx`` starts (a fork
    worker's process by SIGKILL, a Ray actor by ray.kill): once, or ``every_time`` the round is run.
    Returns the list of rounds in which a worker was killed."""
    killed: list = []
    train = loop.train_clients

    def kill_then_train(self, clients):
        if self.round_idx == round_idx and (every_time or not killed):
            ex = self.executor
            if ex.name == "fork":
                os.kill(ex.procs[worker].pid, signal.SIGKILL)
            else:
                ex.ray.kill(ex.actors[worker])
            killed.append(round_idx)
        return train(self, clients)

    monkeypatch.setattr(loop, "train_clients", kill_then_train)
    return killed


@pytest.mark.parametrize("executor", ["fork", WITH_RAY])
def test_killed_worker_resumes_from_checkpoint(executor, digits_tiny_root, tmp_path, sequential_run, monkeypatch,
                                               capsys, request, one_thread):
    pool = pool_for(executor, request)
    flags = KILLED
    base = sequential_run(*flags)
    killed = kill_worker_at(monkeypatch, round_idx=2, worker=1)
    got = run_main(digits_tiny_root, tmp_path, *flags, *ON[executor], executor=pool)
    assert killed == [2] and "replaying from round 2" in capsys.readouterr().out
    assert_same(base, got)


@pytest.mark.parametrize("executor", ["fork", WITH_RAY])
def test_killed_worker_without_checkpoint_replays_from_round_0(executor, digits_tiny_root, tmp_path, sequential_run,
                                                               monkeypatch, capsys, request, one_thread):
    """Ditto builds its personal model from the initial global model when a client is constructed: the
    rebuilt clients must start from that model, not from the server's model as trained so far."""
    pool = pool_for(executor, request)
    flags = two_rounds("Ditto")
    base = sequential_run(*flags)
    killed = kill_worker_at(monkeypatch, round_idx=1, worker=0)
    got = run_main(digits_tiny_root, tmp_path, *flags, *ON[executor], executor=pool)
    assert killed == [1] and "replaying from round 0" in capsys.readouterr().out
    assert_same(base, got)


class ScaledClient(FedAvgClient):
    """A client the server configures after construction (as APPLE sets its prior)."""

    def set_lr_scale(self, scale: float) -> None:
        self.lr_scale = scale

    def learning_rate(self, round_idx: int) -> float:
        return super().learning_rate(round_idx) * self.lr_scale

    def refuse(self) -> None:
        raise FLError(f"client {self.id} refuses")

    def fail(self) -> None:
        raise ValueError(f"client {self.id} fails")


class ScaledServer(FedAvgServer):
    declares = Declares(
        client_class=ScaledClient,
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for c in self.clients[::2]:  # one call per client, and one call for several with their own arguments
            c.set_lr_scale(0.5 + 0.25 * c.id)
        self.call_each("set_lr_scale", [(c, (0.5 + 0.25 * c.id,)) for c in self.clients[1::2]])


def scaled_server(root, out, executor=None) -> ScaledServer:
    cfg = parse_config(cli(root, out, *FAST, "-gr", "2", *SEQUENTIAL))
    data = load_split("Digits", root)
    return ScaledServer(cfg.replace(num_classes=data.num_classes), data, 0, RunRecorder("scaled", {}, out),
                        executor=executor)


@pytest.mark.parametrize("executor", ["fork", WITH_RAY])
def test_rebuilt_clients_get_the_servers_setup_calls_again(executor, digits_tiny_root, tmp_path, monkeypatch,
                                                           request, one_thread):
    if executor == "ray":
        pool = request.getfixturevalue("ray_pool")
        pool.ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this file
    else:
        pool = ForkExecutor(2)
    seq = scaled_server(digits_tiny_root, tmp_path / "seq")
    loop.train(seq)
    killed = kill_worker_at(monkeypatch, round_idx=1, worker=1)
    par = scaled_server(digits_tiny_root, tmp_path / executor, executor=pool)
    try:
        loop.train(par)
        assert killed == [1]
        assert_same(seq.recorder.series, par.recorder.series)
        # the set-up calls were replayed on the rebuilt clients (the lost worker held some of each kind)
        assert {c % 2 for c in pool.placement[1]} == {0, 1}
        assert [h.lr_scale for h in pool.handles] == [0.5 + 0.25 * c for c in range(5)]
        with pytest.raises(FLError, match="client 3 refuses"):  # a client's error reaches the server as it is
            pool.handles[3].refuse()
    finally:
        if executor == "fork":
            pool.close()


def test_lost_worker_beyond_max_restarts_stops_with_clear_message(digits_tiny_root, tmp_path, monkeypatch, capsys):
    killed = kill_worker_at(monkeypatch, round_idx=0, worker=1, every_time=True)
    assert main.main(cli(digits_tiny_root, tmp_path, *FAST, "-gr", "2", "--max_restarts", "1", *FORK)) == 2
    assert killed == [0, 0]  # the replayed round 0 lost its worker again
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "worker 1 died" in line and "2 time(s)" in line and "--max_restarts 1" in line and "--resume" in line
    assert len(read_h5(tmp_path / "Digits_FedAvg_test_0.h5")["rs_round"]) == 1  # round 0's evaluation kept


def test_the_server_imports_what_a_forked_worker_would_import_before_forking():
    """A client's first optimizer imports ``torch._dynamo`` lazily (about a CPU-second); the fork executor
    imports it in the server process as it launches its workers, before it forks, so they inherit it. In a
    fresh interpreter, as this test process has long imported it; a launch of no workers, so only the
    import is seen."""
    code = ("import sys, torch\n"
            "from runtime import fork\n"
            "assert 'torch._dynamo' not in sys.modules\n"
            "pool = fork.ForkExecutor(1)\n"
            "pool.placement, pool.datas, pool.factory = [], [], None\n"
            "pool._launch()\n"
            "assert 'torch._dynamo' in sys.modules and pool.procs == []\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO / "system", capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_closed_fork_pool_leaves_no_pipe_open_and_its_workers_are_daemons(digits_tiny_root, tmp_path):
    """The server keeps only its own end of each worker's pipe (a run of many -t repetitions or a sweep in
    one process must not gather descriptors), and a server that exits without ``close`` (a crash) does not
    wait for its workers: they are daemons, ended at exit."""
    def open_fds():
        return set(os.listdir("/proc/self/fd"))

    before = open_fds()
    pool = ForkExecutor(2)
    server = scaled_server(digits_tiny_root, tmp_path, executor=pool)
    try:
        assert len(pool.procs) == 2 and all(p.daemon for p in pool.procs)
        opened = open_fds() - before  # the pool's pipes (and whatever else the server opened meanwhile)
        assert len(opened) >= 2
        loop.train(server)
    finally:
        pool.close()
    assert not opened & open_fds()  # (other tests' leftovers may close meanwhile: only these are compared)


# ---- errors inside workers --------------------------------------------------------------------------
def test_non_finite_loss_in_a_fork_worker_is_a_clear_error(digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", "-lr", "1e12", *FORK)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: client ") and "training loss became" in err[-1]


def test_client_errors_cross_from_a_fork_worker(digits_tiny_root, tmp_path):
    server = scaled_server(digits_tiny_root, tmp_path, executor=ForkExecutor(2))
    try:
        assert isinstance(server.clients[3], ClientHandle)
        with pytest.raises(FLError) as e:  # the same one line, without a worker's traceback
            server.clients[3].refuse()
        assert str(e.value) == "client 3 refuses" and not getattr(e.value, "__notes__", None)
        with pytest.raises(ValueError, match="client 4 fails") as e:  # any other error: with the trace
            server.clients[4].fail()
        assert "in a fork worker" in e.value.__notes__[0] and "in fail" in e.value.__notes__[0]
        loop.run_round(server, 0)  # the pool still answers after its clients raised
    finally:
        loop.close(server)


# ---- personal entries stay on the client ---------------------------------------------------------------
def test_personal_keys_are_declared():
    declared = {a: get_server_class(a).declares.client_class.declares.personal_keys for a in ALGOS}
    assert declared["FedRep"] == ("head.",) and declared["Local"] == ("",)


@pytest.mark.parametrize("algo", ALGOS)
def test_personal_entries_never_reach_the_server(algo, digits_tiny_root):
    """Read from the rounds conftest's ``two_observed_rounds`` ran (tests/test_comm.py reads them too)."""
    seen = two_observed_rounds(digits_tiny_root, algo)
    assert len(seen.rounds) == 2
    for r in seen.rounds:
        assert sorted(u.id for u in r.uploads) == list(range(5))
        for u in r.uploads:
            keys = seen.server.clients[u.id].personal_keys
            if "" in keys:  # the whole model is personal: no model crosses the wire
                assert u.state is None
                continue
            if keys:  # not vacuous: the model has personal entries and something else is uploaded
                assert r.personal[u.id] and u.state
            assert not [k for k in u.state or {} if k.startswith(keys)], keys
            sent = list(tensors(u.state)) + list(tensors(u.extras))
            for name, p in r.personal[u.id].items():
                assert not any(torch.equal(p, t) for t in sent), f"client {u.id} uploads its personal {name}"


# ---- evaluation ---------------------------------------------------------------------------------------
def test_sampled_train_loss_is_a_fixed_seeded_sample(digits_tiny_root):
    flags = ("--train_loss_eval", "sampled", "--train_loss_fraction", "0.25")
    server = build(digits_tiny_root, "FedAvg", *flags)
    c = server.clients[0]
    idx = client_steps.train_loss_sample(c)
    assert len(idx) == int(np.ceil(0.25 * c.train_samples)) and len(set(idx.tolist())) == len(idx)
    assert torch.equal(idx, client_steps.train_loss_sample(c))  # drawn once, kept
    assert torch.equal(idx, client_steps.train_loss_sample(build(digits_tiny_root, "FedAvg", *flags).clients[0]))  # same seed
    assert not torch.equal(idx, client_steps.train_loss_sample(build(digits_tiny_root, "FedAvg", *flags, "--seed", "1").clients[0]))
    loss_sum, n = client_steps.train_metrics(c)
    with torch.no_grad():
        mean = torch.nn.functional.cross_entropy(c.model(c.x_train[idx]), c.y_train[idx])
    assert n == c.train_samples and loss_sum == pytest.approx(float(mean) * c.train_samples, rel=1e-5)


def test_sampled_with_everything_equals_full(digits_tiny_root):
    full = loop.evaluate(build(digits_tiny_root, "FedAvg"))
    sampled = loop.evaluate(build(digits_tiny_root, "FedAvg", "--train_loss_eval", "sampled", "--train_loss_fraction", "1"))
    assert sampled["train_loss"] == pytest.approx(full["train_loss"], rel=1e-6)
    assert sampled["test_acc"] == full["test_acc"]


# ---- mixed precision -----------------------------------------------------------------------------------
@pytest.mark.parametrize("executor", ["sequential", "fork"])
def test_amp_bf16_runs_on_cpu(executor, digits_tiny_root, tmp_path):
    h5 = run_main(digits_tiny_root, tmp_path, "-gr", "2", "--amp", "bf16", *ON[executor])
    assert np.all(np.isfinite(h5["rs_train_loss"])) and h5["rs_train_loss"][-1] < h5["rs_train_loss"][0]


def test_amp_fp16_on_cpu_is_refused(digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", "--amp", "fp16")) == 2
    assert "--amp bf16" in capsys.readouterr().err


# ---- ALA with the classifier's inputs computed once ------------------------------------------------------
def test_ala_head_inputs_equal_the_full_forward():
    """p = 1 on the CNN: training W on the classifier's inputs computed once gives the numbers of the
    whole model run in every step, up to float rounding."""
    from flcore.trainmodel.models import build_model
    from flcore.trainmodel.parts import adapted_names
    from utils.ALA import ALA
    from utils.seeding import torch_gen, torch_seeded

    with torch_seeded(0, 0, "test-ala"):
        glob, local = (build_model("CNN", (1, 28, 28), 10, feature_dim=32) for _ in range(2))
    gen = torch_gen(0, 0, "test-ala-data")
    x, y = torch.randn(60, 1, 28, 28, generator=gen), torch.randint(0, 10, (60,), generator=gen)
    results = []
    for head in ("fc", None):
        target = copy.deepcopy(local)
        ala = ALA(adapted_names(target, 1), eta=1.0, rand_percent=80, batch_size=10, max_epochs=4,
                  generator=torch_gen(0, 0, "test-ala-sample"), head=head)
        assert (ala.head_inputs(glob, x[:2]) is not None) == (head == "fc")  # the fast path is taken
        ala.adaptive_local_aggregation(glob, target, x, y)
        ala.adaptive_local_aggregation(glob, target, x, y)  # the start phase, then one epoch
        results.append((target.state_dict(), ala.weights, ala.last_losses))
    (sa, wa, la), (sb, wb, lb) = results
    assert la == pytest.approx(lb, rel=1e-5)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-5, rtol=1e-4)
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], atol=1e-5, rtol=1e-4)


# ---- client state off the device -------------------------------------------------------------------------
def test_parked_client_round_trips_exactly(digits_tiny_root):
    from runtime.parking import ClientStore
    from runtime.state import read_file

    server = build(digits_tiny_root, "FedALA", "--ala_max_epochs", "2", "--client_state", "cpu")  # all live
    loop.run_round(server, 0)
    loop.run_round(server, 1)  # ALA weights, trained models and advanced streams to carry
    c = server.executor.host.clients[1]  # the client itself (the server holds a handle)
    before = {k: v.clone() for k, v in c.model.state_dict().items()}
    weights = {k: v.clone() for k, v in c.ala.weights.items()}
    gen = c.batch_gen.get_state().clone()
    store = ClientStore("disk", 1, server.executor.host.rebuild)
    store.park(c)
    assert [p.name for p in store.folder.iterdir()] == ["1.pt"]
    saved = read_file(store.folder / "1.pt")  # tensors and plain values only (weights_only)
    assert saved["client"] == 1 and saved["state"]["model"]  # tagged with whose state it is
    assert "model" not in vars(c) and "ala" not in vars(c) and c.train_samples > 0  # identity stays
    store.unpark(c)  # brought back explicitly, as the executor does before any use
    assert all(torch.equal(v, before[k]) for k, v in c.model.state_dict().items())
    assert all(torch.equal(v, weights[k]) for k, v in c.ala.weights.items())
    assert torch.equal(c.batch_gen.get_state(), gen) and store.loads == 1 and "parked_in" not in vars(c)


def test_a_parked_client_is_not_reloaded_by_a_missing_attribute(digits_tiny_root):
    # a typo on a parked client is an AttributeError, as on any object, and leaves it parked: only the
    # executor brings a client back (before a call, or a handle's read)
    server = build(digits_tiny_root, "FedAvg", "-jr", "0.4", "--client_state", "cpu")
    host = server.executor.host
    c = next(c for c in host.clients.values() if "parked_in" in vars(c))
    loads = host.store.loads
    with pytest.raises(AttributeError, match="modle"):
        c.modle  # noqa: B018
    with pytest.raises(AttributeError, match="'model'"):
        c.model  # noqa: B018  (parked: not there until the executor brings it back)
    assert host.store.loads == loads and "parked_in" in vars(c)
    handle = server.clients[c.id]
    assert isinstance(handle, ClientHandle) and handle.model is not None  # the engine's read brings it back
    assert host.store.loads == loads + 1 and "parked_in" not in vars(c)
    with pytest.raises(AttributeError, match="modle"):
        handle.modle  # noqa: B018


def test_parking_by_hand(digits_tiny_root, tmp_path, monkeypatch):
    from runtime import parking
    from runtime.executors import Parking
    from runtime.parking import ClientStore

    cfg = parse_config(["-jr", "0.4", "-nc", "5"])
    assert Parking.from_config(cfg) is None  # --client_state device: nothing parks
    cpu = Parking.from_config(cfg.replace(client_state="cpu"))
    assert (cpu.mode, cpu.capacity, cpu.folder) == ("cpu", 2, None)  # int(0.4 x 5) clients live
    assert Parking.from_config(cfg.replace(client_state="cpu", num_clients=None, join_ratio=1.0)).capacity == 1
    disk = Parking.from_config(cfg.replace(client_state="disk", client_state_dir=str(tmp_path / "states")))
    assert disk.folder is not None and Path(disk.folder).parent == tmp_path / "states" and Path(disk.folder).is_dir()
    big = Parking("cpu", 5, None)
    assert big.store(0.5, None).capacity == 3 and big.store(0.1, None).capacity == 1  # ceil(5 x share), >= 1
    assert disk.store(0.5, None).folder == Path(disk.folder)
    disk.release()
    disk.release()  # twice, or after the folder went: quietly
    assert not Path(disk.folder).exists()
    with pytest.raises(AttributeError):  # one value shared by every host of the run: frozen
        big.capacity = 4
    built = build(digits_tiny_root, "FedAvg", "-jr", "0.4", "--client_state", "cpu")
    parked = [c.id for c in built.executor.host.clients.values() if "parked_in" in vars(c)]
    assert len(parked) == 3 and len(built.executor.host.store.live) == 2  # parked as they are built

    trims = []
    monkeypatch.setattr(parking, "_trim_heap", lambda: trims.append(1))
    server = build(digits_tiny_root, "FedAvg", "--client_state", "cpu")  # all five live (-jr 1)
    store = ClientStore("cpu", 2, server.executor.host.rebuild)
    clients = [server.executor.host.clients[i] for i in range(3)]
    for c in clients:
        store.park(c)
    assert store.stores == 3 and len(trims) == 1  # the heap trimmed once per capacity's worth of stores (at 2)
    assert len(store.pool.entries) > 0
    c = clients[0]
    store.unpark(c)
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad for p in c.model.parameters())  # unparked
    for c in clients:
        if "parked_in" in vars(c):
            store.unpark(c)
    assert list(store.live) == [1, 2]  # unparking made each client the most recent: client 0, the oldest, went
    store.touch(clients[1])  # used again: now the most recent, so client 2 is the one to go next
    store.unpark(clients[0])
    assert list(store.live) == [1, 0]
    # one client parked again (two stay live): the pool holds exactly the references the parked states make
    assert len(store.states) == 1 and len(store.live) == 2
    assert sum(e[1] for e in store.pool.entries.values()) == sum(len(ids) for ids in store.pooled.values()) > 0


@pytest.mark.parametrize("executor", ["sequential", "fork"])
@pytest.mark.parametrize("mode", ["cpu", "disk"])
def test_parked_clients_give_the_same_run_with_a_round_of_memory(mode, executor, digits_tiny_root, tmp_path,
                                                                 sequential_run, one_thread):
    flags = PARKED
    got = run_main(digits_tiny_root, tmp_path, *flags, "--client_state", mode, *ON[executor])
    assert_same(sequential_run(*flags), got)  # bit for bit the run with every client live
    if executor == "sequential":
        server = build(digits_tiny_root, "FedALA", *flags[2:], "--client_state", mode)
        loop.run_round(server, 0)
        store = server.executor.host.store
        live = [c for c in server.executor.host.clients.values() if "parked_in" not in vars(c)]
        assert len(live) == store.capacity == 2  # int(0.4 * 5) clients stay live
        assert sorted(store.live) == sorted(c.id for c in live) and store.stores >= 3 and store.loads >= 1
        folder = store.folder
        assert (folder is not None) == (mode == "disk")
        loop.close(server)  # the run's own folder goes with it
        assert folder is None or not folder.exists()


def test_wire_conversion_walks_containers_and_copies_only_what_is_elsewhere():
    import collections
    import dataclasses

    from runtime.executors import to_device, to_wire

    module, t = torch.nn.Linear(2, 1), torch.ones(2)
    assert to_wire(module) is module  # on the CPU already: no copy
    Pair = collections.namedtuple("Pair", "a b")

    @dataclasses.dataclass
    class Box:
        x: object
        n: int

    out = to_wire({"p": Pair(t, [module, 3]), "box": Box(t, 2), "s": "kept"})
    assert type(out["p"]) is Pair and out["p"].a is t and out["p"].b[0] is module and out["p"].b[1] == 3
    assert out["box"] == Box(t, 2) and out["s"] == "kept"
    moved = to_device((Pair(t, 1), Box(module, 5)), "meta")
    assert moved[0].a.device.type == "meta" and moved[1].x.weight.device.type == "meta" and moved[1].n == 5


def test_client_factory_builds_each_client_under_its_own_stream_and_device():
    from runtime.executors import ClientFactory
    from utils.seeding import torch_seeded

    class Recorder:
        def __init__(self, cfg, cid, data, model, run, **extra):
            self.cfg, self.cid, self.data, self.model, self.run, self.extra = cfg, cid, data, model, run, extra
            self.draw = torch.randn(3)  # the constructor's initialisers draw from the global stream

    cfg = parse_config(["--seed", "7"]).replace(device="cpu")
    common, own = torch.nn.Linear(2, 2), {4: torch.nn.Linear(2, 3)}
    c = ClientFactory(Recorder, cfg, 2, common)(4, {"x": torch.ones(1)})
    with torch_seeded(7, 2, "client-init", 4):
        expected = torch.randn(3)
    assert torch.equal(c.draw, expected) and c.model is common and c.extra == {} and c.run == 2
    assert ClientFactory(Recorder, cfg, 2, common, own)(4, None).model is own[4]  # own replaces the model
    c = ClientFactory(Recorder, cfg, 2, common, own, personal=True)(4, None)   # ... or comes beside it
    assert c.model is common and c.extra == {"own_model": own[4]}
    c = ClientFactory(Recorder, cfg, 2, torch.nn.Linear(2, 2), {4: torch.nn.Linear(2, 3)}, personal=True)(
        4, {"x": torch.ones(1)}, device="meta")  # another device: the config, models and data follow it
    assert c.cfg.device == "meta" and c.data["x"].device.type == "meta"
    assert c.model.weight.device.type == "meta" and c.extra["own_model"].weight.device.type == "meta"


def test_a_host_answers_each_request_of_the_protocol():
    from runtime.executors import ClientHost

    class Echo:  # stands in for a client: reports where its arguments arrived
        def __init__(self, cid, data, device):
            self.id, self.tag, self.train_samples, self.test_samples = cid, torch.full((2,), float(cid)), *data

        def echo(self, *args, **kwargs):
            return self.id, [a.device.type for a in args], {k: v.device.type for k, v in kwargs.items()}

    host = ClientHost(Echo, [4, 7], [(10, 3), (20, 5)])
    t, u = torch.ones(2), torch.zeros(3)
    assert host.handle(("map", "echo", [7, 4], (t,), {"k": u}), "meta") == [(7, ["meta"], {"k": "meta"}),
                                                                        (4, ["meta"], {"k": "meta"})]
    assert host.handle(("map", "echo", [4], (t,), {}), None) == [(4, ["cpu"], {})]  # no device: as they came
    assert host.handle(("each", "echo", [(4, (t, u)), (7, (u,))]), "meta") == [(4, ["meta", "meta"], {}),
                                                                             (7, ["meta"], {})]
    assert host.handle(("each", "echo", [(7, (t,))])) == [(7, ["cpu"], {})]
    tag = host.handle(("attr", 7, "tag"))
    assert tag is host.clients[7].tag and tag.tolist() == [7.0, 7.0]  # on the CPU already: not copied
    assert host.handle(("sizes",)) == {4: (10, 3), 7: (20, 5)}
    with pytest.raises(ValueError, match="unknown request 'stop'"):
        host.handle(("stop",))


def test_a_client_stays_live_while_its_call_runs_and_is_the_most_recent_after(digits_tiny_root, monkeypatch):
    server = build(digits_tiny_root, "FedAvg", "--client_state", "cpu", "-jr", "0.4")  # two of five live
    host = server.executor.host
    seen = []

    def visit_others(self):  # a call that brings every other client back while it runs
        seen.append(set(host.store.pinned))
        for other in server.clients:
            if other.id != self.id:
                other.model  # noqa: B018  (a handle's read unparks; the least recently used unpinned one parks)
        return "parked_in" in vars(self)

    monkeypatch.setattr(FedAvgClient, "visit_others", visit_others, raising=False)
    assert host.run(0, "visit_others") is False  # pinned: never parked under its own call
    assert seen == [{0}] and host.store.pinned == set()  # unpinned once it returned
    assert list(host.store.live)[-1] == 0 and "parked_in" not in vars(host.clients[0])  # touched last
    assert len(host.store.live) == 2  # back within the capacity once nothing is pinned


def test_a_parked_client_is_rebuilt_from_the_data_it_was_built_from(digits_tiny_root):
    # -fs, --val_ratio and label flipping process a client's data once: the client a parked state is loaded
    # into holds the same training, validation and test samples (processing them again would shrink them
    # and flip the labels back)
    flags = ("-fs", "6", "--val_ratio", "0.5", "--attack", "labelflip", "--attack_frac", "0.8",
             "--client_state", "cpu", "-jr", "0.4")
    server = build(digits_tiny_root, "FedAvg", *flags)
    host = server.executor.host
    for c in host.clients.values():
        if "parked_in" in vars(c):
            host.store.unpark(c)
        fresh = host.rebuild(c)
        for name in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test"):
            assert torch.equal(getattr(fresh, name), getattr(c, name)), name
    loop.run_round(server, 0)  # and the parked clients train and evaluate


def test_unparking_restores_parameters_and_plain_tensors_as_they_were(digits_tiny_root):
    # a subclass may hold tensors outside its modules: a pooled Parameter comes back a Parameter (the
    # optimizer and autograd see a leaf of the same kind), a pooled plain tensor a plain tensor
    from runtime.parking import ClientStore

    server = build(digits_tiny_root, "FedAvg", "--client_state", "cpu")
    store = ClientStore("cpu", 1, server.executor.host.rebuild)
    c = server.executor.host.clients[0]
    weight, frozen, plain = torch.randn(70, 70), torch.randn(70, 70), torch.randn(70, 70)
    c.scale = torch.nn.Parameter(weight.clone())
    c.fixed = torch.nn.Parameter(frozen.clone(), requires_grad=False)
    c.buffer = plain.clone()
    store.park(c)
    assert len(store.pooled[c.id]) >= 3  # all three went through the pool (4,900 values each)
    assert "scale" not in vars(c)  # parked
    store.unpark(c)
    assert type(c.scale) is torch.nn.Parameter and c.scale.requires_grad
    assert type(c.fixed) is torch.nn.Parameter and not c.fixed.requires_grad
    assert type(c.buffer) is torch.Tensor and not c.buffer.requires_grad
    assert torch.equal(c.scale, weight) and torch.equal(c.fixed, frozen) and torch.equal(c.buffer, plain)


def test_client_store_set_up_by_hand(tmp_path, monkeypatch):
    from runtime import parking
    from runtime.parking import ClientStore, own_folder

    assert ClientStore("cpu", 0, None).capacity == 1 and ClientStore("cpu", 1, None).capacity == 1  # at least one live
    assert ClientStore("cpu", 3, None).capacity == 3
    store = ClientStore("disk", 1, None, folder=str(tmp_path / "a" / "b"))  # a given folder is created
    assert store.folder == tmp_path / "a" / "b" and store.folder.is_dir()
    made = own_folder(str(tmp_path / "c" / "d"))  # its parents too
    assert made.parent == tmp_path / "c" / "d" and made.is_dir() and made.stat().st_mode & 0o777 == 0o700
    trims = []

    class Libc:
        def malloc_trim(self, pad):
            trims.append(pad)

    monkeypatch.setattr(parking.ctypes, "CDLL", lambda name: Libc())
    parking._trim_heap()
    assert trims == [0]  # every free page back to the system, none kept as padding


def test_with_parking_the_sequential_server_holds_handles_whose_calls_and_reads_reach_its_clients(digits_tiny_root):
    """With parking, the sequential executor hands the server ``ClientHandle``s: each knows its client's id and
    sample counts, and a method call or an attribute read through one runs on that very client (brought back first
    when parked), returning what the client itself returns."""
    server = build(digits_tiny_root, "FedAvg", "-jr", "0.2", "--client_state", "cpu")  # one client live
    host = server.executor.host
    assert all(isinstance(h, ClientHandle) for h in server.clients)
    counts = [(c.id, c.train_samples, c.test_samples) for c in (host.clients[i] for i in range(len(host.clients)))]
    assert [(h.id, h.train_samples, h.test_samples) for h in server.clients] == counts
    assert any(train != test for _, train, test in counts)  # the two counts differ, so a swap would show
    parked = next(h for h in server.clients if "parked_in" in vars(host.clients[h.id]))
    loads = host.store.loads
    got = parked.upload()  # a method call through the handle: that client's own upload
    assert host.store.loads == loads + 1 and "parked_in" not in vars(host.clients[parked.id])
    want = host.clients[parked.id].upload()
    assert (got.id, got.weight) == (want.id, want.weight) == (parked.id, parked.train_samples)
    assert got.state.keys() == want.state.keys() and all(torch.equal(got.state[k], want.state[k]) for k in got.state)
    assert parked.model is host.clients[parked.id].model  # a read: this executor's live reference


def test_a_client_brought_back_while_every_live_client_is_in_a_call_stays_live_for_its_own(digits_tiny_root):
    """A batched session holds several clients in a call at once (pinned): bringing one more back must not park it
    again before its own call runs, though the live clients then exceed the capacity for a while."""
    server = build(digits_tiny_root, "FedAvg", "-jr", "0.2", "--client_state", "cpu")  # one client live
    host = server.executor.host
    assert host.store.capacity == 1
    (busy,) = host.store.live  # the one live client, in a call (as a batched session holds it)
    other = next(cid for cid in host.clients if cid != busy)
    assert "parked_in" in vars(host.clients[other])
    host.store.pinned.add(busy)
    try:
        weights = host.run(other, "__getattribute__", ("model",))  # a call on a parked client: back, then called
    finally:
        host.store.pinned.discard(busy)
    assert isinstance(weights, torch.nn.Module) and "parked_in" not in vars(host.clients[busy])
    # after its call it is the least recently used unpinned client beyond the capacity: parked again
    assert list(host.store.live) == [busy] and "parked_in" in vars(host.clients[other])


def test_a_parked_client_file_is_read_back_only_as_that_clients_state(digits_tiny_root, tmp_path):
    """A parked client's file names whose state it holds (client and run); one changed outside the run (another
    client's file, another run's, a file of other values, or bytes that are not a saved state) is refused with
    one line naming it, and the client stays parked."""
    from runtime import state
    from runtime.parking import ClientStore

    server = build(digits_tiny_root, "FedAvg", "--client_state", "cpu")  # all five live (-jr 1)
    host = server.executor.host
    store = ClientStore("disk", 1, host.rebuild, folder=str(tmp_path / "parked"))
    a, b = host.clients[0], host.clients[1]
    weights = copy.deepcopy(a.model.state_dict())
    store.park(a)
    store.park(b)
    good = store.path(a).read_bytes()
    refused = r"parked client file .*0\.pt does not hold client 0's state; it was changed outside this run: start " \
              r"the run again"
    saved = state.read_file(store.path(a))
    cases = {"another client's": {**saved, "client": 1}, "another run's": {**saved, "run": a.run + 1},
             "no state": {"client": 0, "run": a.run, "state": [1, 2]}, "not a tagged state": [0, a.run, saved]}
    for name, tree in cases.items():
        state.write_file(tree, store.path(a))
        with pytest.raises(FLError, match=f"^{refused}$"):
            store.unpark(a)
        assert "parked_in" in vars(a), name  # still parked: nothing was loaded
    store.path(a).write_bytes(store.path(b).read_bytes())  # client 1's own file in client 0's place
    with pytest.raises(FLError, match=f"^{refused}$"):
        store.unpark(a)
    store.path(a).write_bytes(b"not a saved state")
    with pytest.raises(FLError, match=r"^parked client file .*0\.pt cannot be read \(.+\); it was changed outside "
                                      r"this run: start the run again$"):
        store.unpark(a)
    store.path(a).write_bytes(good)  # its own file back: it unparks as it was
    store.unpark(a)
    assert all(torch.equal(v, weights[k]) for k, v in a.model.state_dict().items())


def test_a_stores_own_folder_goes_with_it_and_a_given_one_stays(tmp_path, capfd):
    import gc
    import shutil

    from runtime.parking import ClientStore

    store = ClientStore("disk", 1, None)  # its own folder, under the system's temporary folder
    own = store.folder
    assert own.is_dir()
    del store
    gc.collect()
    assert not own.exists()
    store = ClientStore("disk", 1, None, folder=str(tmp_path / "given"))
    del store
    gc.collect()
    assert (tmp_path / "given").is_dir()
    store = ClientStore("disk", 1, None)
    shutil.rmtree(store.folder)  # removed already: collecting the store says nothing
    del store
    gc.collect()
    assert "Error" not in capfd.readouterr().err


def test_balance_places_the_largest_first_on_the_lightest_worker():
    # sizes by position: largest first 9 (1) -> w0, 7 (3) -> w1, 5 (0) -> w1 (7 < 9), 3 (4) -> w0 (9 < 12),
    # 2 (2) -> w0 (a tie at 12 goes to the first worker): loads 14 and 12
    assert balance([5, 9, 2, 7, 3], 2) == [[1, 2, 4], [0, 3]]
    # three workers: 9 -> w0, 7 -> w1, 5 -> w2, 3 -> w2 (5 lightest), 2 -> w1 (7 < 8 < 9)
    assert balance([5, 9, 2, 7, 3], 3) == [[1], [2, 3], [0, 4]]
    assert balance([4, 1], 5) == [[0], [1]]  # never more workers than clients


def test_tensor_pool_holds_equal_tensors_once():
    from runtime.parking import TensorPool
    from utils.seeding import torch_gen

    pool = TensorPool(min_numel=16)
    w = torch.randn(8, 4, 3, 3, generator=torch_gen(0, 0, "test-pool"))
    held = [w.clone(), w.clone(), w.clone().to(memory_format=torch.channels_last)]  # the last: other layout
    assert pool.put(torch.ones(3)) is None  # small tensors stay where they are
    ids = [pool.put(t) for t in held]
    assert ids[0] == ids[1] != ids[2]
    assert len(pool.entries) == 2 and pool.nbytes() == 2 * w.numel() * 4
    for t, i in zip(held, ids):
        got = pool.get(i, "cpu")
        assert torch.equal(got, w) and got.stride() == t.stride() and got is not t
    pool.release(ids)
    assert pool.entries == {} and pool.index == {}
    tiny = TensorPool(min_numel=1)  # fewer elements than the fingerprint's 16 probes: every element probed
    a, b = tiny.put(torch.arange(4.0)), tiny.put(torch.arange(4.0))
    assert a == b and tiny.put(torch.arange(4.0).flip(0)) != a and torch.equal(tiny.get(a, "cpu"), torch.arange(4.0))
    assert tiny.get(a, "cpu").data_ptr() != tiny.entries[a][0].data_ptr()  # a copy: unpacked states never share
    assert TensorPool(min_numel=4).put(torch.arange(4.0)) is not None  # at least min_numel elements: pooled


def test_parked_fedavg_clients_share_the_broadcast_model(digits_tiny_root):
    """After a broadcast every FedAvg client holds the global model: parked, they cost one copy."""
    server = build(digits_tiny_root, "FedAvg", "-jr", "0.4", "--client_state", "cpu")
    loop.run_round(server, 0)
    large = sum(p.numel() * 4 for p in server.global_model.parameters() if p.numel() >= 4096)
    store = server.executor.host.store
    assert large > 0 and len(store.states) == 3 and store.pool.nbytes() == large  # 5 clients, 2 live


# ---- thread counts -----------------------------------------------------------------------------------
def test_threads_change_numbers_only_by_float_rounding(digits_tiny_root, tmp_path, one_thread):
    """Sequential at 2 torch threads against fork workers at 1 thread each. Multi-threaded kernels split
    their sums (convolutions, matrix products, reductions) into per-thread partial sums, so float
    addition happens in another order and the last bits differ; over 2 rounds of SGD that stays far below
    rel 1e-4 in the train loss, and can flip at most a borderline prediction or so per client: the
    tolerance is one test sample per client."""
    flags = ("-algo", "FedALA", "-gr", "2")
    forked = run_main(digits_tiny_root, tmp_path / "fork", *flags, *FORK)
    torch.set_num_threads(2)  # restored by one_thread
    seq = run_main(digits_tiny_root, tmp_path / "seq", *flags, *SEQUENTIAL)
    tests = np.array([len(c.y_test) for c in load_split("Digits", digits_tiny_root).clients])
    assert np.all(np.abs(seq["rs_client_test_acc"] - forked["rs_client_test_acc"]) <= 1 / tests + 1e-12)
    assert np.all(np.abs(seq["rs_test_acc"] - forked["rs_test_acc"]) <= len(tests) / tests.sum() + 1e-12)
    np.testing.assert_allclose(seq["rs_train_loss"], forked["rs_train_loss"], rtol=1e-4)
    assert np.array_equal(seq["rs_round"], forked["rs_round"])
