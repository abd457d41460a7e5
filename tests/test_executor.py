"""Executors, lost workers, checkpoints and resume, simulated client faults (docs/distributed.md).

The Ray tests share one local Ray session (2 CPUs) and one pool of 2 workers: starting Ray and its
worker processes is the slow part, so the pool is reused by every run here, as ``-t N`` runs reuse it.
Equality is exact (``np.array_equal``): on the CPU the same float operations run in the same order
whichever process runs a client, so the numbers are bitwise equal.
"""
import sys

import numpy as np
import pytest
import torch

import main
from conftest import cli
from flcore.clients.clientavg import FedAvgClient
from flcore.servers.serveravg import FedAvgServer
from flcore.servers.serverbase import Server
from utils.data_utils import load_split
from utils.errors import FLError
from utils.executor import WorkerLost
from utils.results import RunRecorder, read_h5
from utils.seeding import np_rng

FAST = ("-lr", "0.1", "-lbs", "20", "--ala_max_epochs", "10")
_REFERENCE: dict = {}


def series(out, stem):
    """Every recorded series of a run except the wall times."""
    return {k: v for k, v in read_h5(out / f"{stem}.h5").items() if k != "rs_round_time"}


def assert_same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k], equal_nan=True), k


def reference(root, tmp_path_factory, *extra, stem):
    """An undisturbed sequential run, computed once per module for each set of flags."""
    if extra not in _REFERENCE:
        _REFERENCE[extra] = run_main(root, tmp_path_factory.mktemp("ref"), *extra, stem=stem)
    return _REFERENCE[extra]


def run_main(root, out, *extra, executor=None, stem="Digits_FedAvg_test_0"):
    argv = cli(root, out, *FAST, *extra)
    if executor is None:
        assert main.main(argv) == 0
    else:
        main.run(main.parse_config(argv), executor=executor)
    return series(out, stem)


@pytest.fixture(scope="module")
def ray_pool(digits_root):
    ray = pytest.importorskip("ray")
    from utils.executor import RayExecutor, init_ray

    init_ray(num_cpus=2)
    pool = RayExecutor(main.parse_config(cli(digits_root, digits_root, "--executor", "ray", "--workers", "2")))
    yield pool
    pool.close()
    ray.shutdown()


# ---- Ray gives the sequential numbers --------------------------------------------------------------
@pytest.mark.parametrize("algo", ["FedAvg", "FedALA"])
def test_ray_matches_sequential(algo, digits_root, tmp_path, tmp_path_factory, ray_pool):
    stem = f"Digits_{algo}_test_0"
    seq = reference(digits_root, tmp_path_factory, "-algo", algo, "-gr", "3", stem=stem)
    par = run_main(digits_root, tmp_path, "-algo", algo, "-gr", "3", executor=ray_pool, stem=stem)
    assert_same(seq, par)
    assert seq["rs_test_acc"][-1] > 0.4  # chance is 0.1
    # Clients live on their workers (client i on worker i mod 2) and keep their state there between rounds.
    assert ray_pool.owner == [0, 1, 0, 1, 0]
    h = ray_pool.handles[3]
    assert len(h.train_time) == 3  # one entry per round trained, accumulated on the worker
    assert (h.ala is not None) == (algo == "FedALA")
    correct, n, _ = h.test_metrics()  # a method call runs on the worker
    assert n == h.test_samples and 0 <= correct <= n
    assert isinstance(h.model, torch.nn.Module)  # an attribute read returns a copy
    with pytest.raises(FLError, match="method"):
        h.optimizer = None  # a write could never reach the worker: refused


# ---- a worker killed during a round -------------------------------------------------------------------
def kill_worker_at(monkeypatch, round_idx: int, worker: int):
    import ray

    done = []
    train = Server.train_clients

    def kill_then_train(self, clients):
        if self.round_idx == round_idx and not done:
            ray.kill(self.executor.actors[worker])
            done.append(True)
        return train(self, clients)

    monkeypatch.setattr(Server, "train_clients", kill_then_train)
    return done


def test_killed_worker_resumes_from_checkpoint(digits_root, tmp_path, tmp_path_factory, ray_pool, monkeypatch,
                                               capsys):
    stem = "Digits_FedALA_test_0"
    base = reference(digits_root, tmp_path_factory, "-algo", "FedALA", "-gr", "3", stem=stem)
    killed = kill_worker_at(monkeypatch, round_idx=2, worker=1)
    got = run_main(digits_root, tmp_path / "ray", "-algo", "FedALA", "-gr", "3", "--checkpoint_every", "1",
                   executor=ray_pool, stem=stem)
    assert killed and "replaying from round 2" in capsys.readouterr().out
    assert_same(base, got)


class ScaledClient(FedAvgClient):
    """A client the server configures after construction (as APPLE sets its prior)."""

    def set_lr_scale(self, scale: float) -> None:
        self.lr_scale = scale

    def learning_rate(self, round_idx: int) -> float:
        return super().learning_rate(round_idx) * self.lr_scale

    def refuse(self) -> None:
        raise FLError(f"client {self.id} refuses")


class ScaledServer(FedAvgServer):
    client_class = ScaledClient

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for c in self.clients:
            c.set_lr_scale(0.5 + 0.25 * c.id)


def test_killed_worker_without_checkpoint_replays_from_round_0(digits_root, tmp_path, ray_pool, monkeypatch):
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test file
    cfg = main.parse_config(cli(digits_root, tmp_path, *FAST, "-gr", "2")).replace(num_classes=10, num_clients=5)
    data = load_split("Digits", digits_root)
    recs = []
    for sub, executor in (("seq", None), ("ray", ray_pool)):
        if executor is not None:
            kill_worker_at(monkeypatch, round_idx=1, worker=0)
        recs.append(RunRecorder("scaled", {}, tmp_path / sub))
        ScaledServer(cfg, data, 0, recs[-1], executor=executor).train()
    assert_same(recs[0].series, recs[1].series)
    assert ray_pool.handles[2].lr_scale == 1.0  # the set-up call was replayed on the rebuilt clients
    with pytest.raises(FLError, match="client 3 refuses"):  # a client's error reaches the server as it is
        ray_pool.handles[3].refuse()


# ---- checkpoints and resume --------------------------------------------------------------------------
def test_resume_after_crash_equals_uninterrupted_run(digits_root, tmp_path, ray_pool, monkeypatch):
    stem = "Digits_FedALA_test_0"
    flags = ("-algo", "FedALA", "-gr", "3", "-jr", "0.8", "-cdr", "0.2", "-tsr", "0.4", "-tth", "1",
             "--checkpoint_every", "2")
    base = run_main(digits_root, tmp_path / "base", *flags, stem=stem)

    after_round = Server.after_round

    def crash_in_round_2(self):
        if self.round_idx == 2:
            raise RuntimeError("killed")
        after_round(self)

    monkeypatch.setattr(Server, "after_round", crash_in_round_2)
    with pytest.raises(RuntimeError, match="killed"):
        run_main(digits_root, tmp_path / "crash", *flags, stem=stem)
    assert (tmp_path / "crash" / f"{stem}.ckpt").exists() and not list((tmp_path / "crash").glob("*.tmp"))
    assert len(read_h5(tmp_path / "crash" / f"{stem}.h5")["rs_round"]) == 3  # rounds 0-2 evaluated
    monkeypatch.setattr(Server, "after_round", after_round)
    crashed = tmp_path / "crash" / f"{stem}.ckpt"
    (tmp_path / "crash2").mkdir()
    (tmp_path / "crash2" / crashed.name).write_bytes(crashed.read_bytes())

    resumed = run_main(digits_root, tmp_path / "crash", *flags, "--resume", stem=stem)
    assert_same(base, resumed)
    assert len(read_h5(tmp_path / "crash" / f"{stem}.h5")["rs_round_time"]) == 3
    # A checkpoint does not depend on the executor: the same one resumed on Ray workers.
    on_ray = run_main(digits_root, tmp_path / "crash2", *flags, "--resume", executor=ray_pool, stem=stem)
    assert_same(base, on_ray)


def test_resume_checks_flags_and_starts_over_without_checkpoint(digits_root, tmp_path, capsys):
    run_main(digits_root, tmp_path, "-gr", "1", "--checkpoint_every", "1", "--resume")
    assert "no checkpoint" in capsys.readouterr().out
    assert main.main(cli(digits_root, tmp_path, "-gr", "1", "-lr", "0.2", "--resume")) == 2
    err = capsys.readouterr().err
    assert "other flags" in err and "local_learning_rate" in err
    # -gr may grow: the run continues after round 0 as a 2-round run would.
    longer = run_main(digits_root, tmp_path, "-gr", "2", "--resume")
    assert_same(longer, run_main(digits_root, tmp_path / "fresh", "-gr", "2"))


def test_lost_worker_beyond_max_restarts_stops_with_clear_message(digits_root, tmp_path, monkeypatch, capsys):
    def lose(self, clients):
        raise WorkerLost("a Ray worker died (test)")

    monkeypatch.setattr(Server, "train_clients", lose)
    assert main.main(cli(digits_root, tmp_path, "-gr", "2", "--max_restarts", "0")) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "worker died" in line and "--max_restarts" in line and "--resume" in line
    assert len(read_h5(tmp_path / "Digits_FedAvg_test_0.h5")["rs_round"]) == 1  # round 0's evaluation kept


# ---- drop-outs and slow clients -----------------------------------------------------------------------
def make_server(root, *flags):
    cfg = main.parse_config(cli(root, root, *flags)).replace(num_classes=10, num_clients=5)
    return FedAvgServer(cfg, load_split("Digits", root))


def test_drop_rate_half_trains_the_seeded_half(digits_root, monkeypatch):
    server = make_server(digits_root, "-cdr", "0.5", "-gr", "3", "-lr", "0.05")
    trained, uploaded = [], []
    train, receive = Server.train_clients, Server.receive_models
    monkeypatch.setattr(Server, "train_clients", lambda s, cs: (trained.append([c.id for c in cs]), train(s, cs)))
    monkeypatch.setattr(Server, "receive_models", lambda s, cs: uploaded.append(len(cs)) or receive(s, cs))
    server.train()
    # Independent expectation: -jr 1 selects everyone; each drops when its draw from the (seed 0, run 0,
    # "drop") stream is below 0.5.
    drop = np_rng(0, 0, "drop")
    expected = []
    for _ in range(3):
        u = drop.random(5)
        expected.append([i for i in range(5) if u[i] >= 0.5])
    assert trained == expected and uploaded == [len(e) for e in expected]
    kept = [len(server.active_clients(server.clients)) for _ in range(400)]
    assert abs(np.mean(kept) / 5 - 0.5) < 0.05


def test_slow_clients_miss_the_deadline_without_sleeping(digits_root):
    server = make_server(digits_root, "-tsr", "0.4", "-ssr", "0.4", "-tth", "1.0", "-gr", "2")
    slow = server.slow
    assert slow.train_slow.sum() == 2 and slow.send_slow.sum() == 2  # int(0.4 * 5) distinct clients each
    n = [c.train_samples for c in server.clients]
    want = {}
    for cid in range(5):
        for t in range(2):
            rng = np_rng(0, 0, "delay", cid, t)
            steps = -(-n[cid] // 10)  # ceil(samples / -lbs), -ls 1
            want[cid, t] = (0.1 * rng.random(steps).sum() if slow.train_slow[cid] else 0.0)
            want[cid, t] += 0.1 * rng.random(2).sum() if slow.send_slow[cid] else 0.0
            assert slow.time_cost(cid, t) == pytest.approx(want[cid, t], abs=1e-12)
    expected_late = [cid for cid in range(5) if want[cid, 0] > 1.0]
    # ~27 steps of 0.1·U(0,1) (mean 1.35 s) against a send-slow client's at most 0.2 s.
    assert expected_late and all(slow.train_slow[c] for c in expected_late)
    server.round_idx = 0
    uploads = server.receive_models(server.clients)
    assert server.late == expected_late
    assert sorted(u["id"] for u in uploads) == sorted(set(range(5)) - set(expected_late))
    assert make_server(digits_root, "-tsr", "1", "-ssr", "1").slow.late(range(5), 0) == set()  # -tth 10000
