"""Simulated client faults (runtime/faults.py, ``Server._active_clients``): drop-outs (``-cdr``) and slow
clients (``-tsr`` / ``-ssr`` / ``-tth``), checked against seeded re-draws and hand-computable bounds.

A slow trainer waits 0.1·U(0, 1) s per local step, a slow sender 0.1·U(0, 1) s per transfer (two per
round), so with k steps a train-slow client needs at most 0.1·k s (0.05·k on average) and a send-slow
one at most 0.2 s. The cases below are built so that these bounds alone decide who is late."""
import math

import numpy as np
import pytest

from cli import parse_config
from conftest import cli
from flcore.clients.clientavg import FedAvgClient
from flcore.servers.serveravg import FedAvgServer
from flcore.servers.serverbase import Declares, Server
from runtime.faults import SlowClients
from utils.data_utils import load_split
from utils.seeding import np_rng
from runtime import loop


def make_server(root, *flags, server_cls=FedAvgServer):
    cfg = parse_config(cli(root, root, "--executor", "sequential", *flags)).replace(num_classes=10)
    return server_cls(cfg, load_split("Digits", root))


def slow_cfg(tsr=1.0, ssr=0.0, tth=10.0, seed=0):
    return parse_config(["-tsr", str(tsr), "-ssr", str(ssr), "-tth", str(tth), "--seed", str(seed)])


# ---- drop-outs -------------------------------------------------------------------------------------------
def test_drop_rate_half_trains_the_seeded_half(digits_root, monkeypatch):
    server = make_server(digits_root, "-cdr", "0.5", "-gr", "3", "-lr", "0.05", "-lbs", "20",
                         "--train_loss_eval", "off")
    trained, uploaded = [], []
    train, receive = loop.train_clients, loop.receive
    monkeypatch.setattr(loop, "train_clients", lambda s, cs: (trained.append([c.id for c in cs]), train(s, cs)))
    monkeypatch.setattr(loop, "receive", lambda s, cs: uploaded.append(len(cs)) or receive(s, cs))
    loop.train(server)
    # Independent expectation: -jr 1 selects everyone; each drops when its draw from the (seed 0, run 0,
    # "drop") stream is below 0.5.
    drop = np_rng(0, 0, "drop")
    expected = []
    for _ in range(3):
        u = drop.random(5)
        expected.append([i for i in range(5) if u[i] >= 0.5])
    assert trained == expected and uploaded == [len(e) for e in expected]
    assert any(len(e) < 5 for e in expected)
    kept = [len(loop.active_clients(server, server.clients)) for _ in range(400)]
    assert abs(np.mean(kept) / 5 - 0.5) < 0.05


# ---- who is slow ---------------------------------------------------------------------------------------
# (clients, rate) -> int(rate * clients), worked out by hand; 7 x 0.5 = 3.5 and 7 x 0.99 = 6.93 round down.
SLOW_COUNTS = {(7, 0.5): 3, (7, 0.99): 6, (3, 0.2): 0, (20, 0.25): 5, (20, 1.0): 20, (5, 0.0): 0}


@pytest.mark.parametrize("n,rate", list(SLOW_COUNTS))
def test_slow_flags_pick_int_rate_n_distinct_clients(n, rate):
    for seed in range(5):
        slow = SlowClients(slow_cfg(tsr=rate, ssr=rate, seed=seed), 0, [1] * n)
        assert slow.train_slow.dtype == bool and slow.train_slow.shape == (n,)
        assert slow.train_slow.sum() == SLOW_COUNTS[n, rate]
        assert slow.send_slow.sum() == SLOW_COUNTS[n, rate]


def test_slow_sets_follow_the_seed_and_are_drawn_apart():
    sets = [SlowClients(slow_cfg(tsr=0.25, ssr=0.25, seed=s), 0, [1] * 20) for s in range(10)]
    train_sets = {tuple(np.flatnonzero(s.train_slow)) for s in sets}
    assert len(train_sets) > 1  # the seed chooses them
    assert any(not np.array_equal(s.train_slow, s.send_slow) for s in sets)  # separate streams
    again = SlowClients(slow_cfg(tsr=0.25, ssr=0.25, seed=3), 0, [1] * 20)
    assert np.array_equal(again.train_slow, sets[3].train_slow)


# ---- how long they take -------------------------------------------------------------------------------
def test_lateness_by_hand():
    """Steps [0, 1000, 1], every client slow to train, -tth 10: 1000 steps of 0.1·U(0, 1) take 50 s on
    average (std 0.9 s) and can never fall to 10 s in practice; 1 step takes at most 0.1 s; 0 steps take 0."""
    slow = SlowClients(slow_cfg(tsr=1, ssr=0, tth=10), 0, [0, 1000, 1])
    for t in range(20):
        costs = [slow.time_cost(c, t) for c in range(3)]
        assert costs[0] == 0.0
        assert 40 < costs[1] < 60
        assert 0 < costs[2] <= 0.1
        assert slow.late(range(3), t) == {1}
        assert slow.late([0, 2], t) == set()
    # slow to send as well: at most 0.2 s more for everyone, which changes nobody's outcome
    both = SlowClients(slow_cfg(tsr=1, ssr=1, tth=10), 0, [0, 1000, 1])
    for t in range(20):
        costs = [both.time_cost(c, t) for c in range(3)]
        assert 0 < costs[0] <= 0.2 and 40 < costs[1] < 60 and 0 < costs[2] <= 0.3
        assert both.late(range(3), t) == {1}


def test_mean_times_match_pfllibs_sleeps():
    """Over 400 rounds: 100 train steps average 5 s (std of the mean 0.015 s); sending twice averages
    0.1 s and never exceeds 0.2 s."""
    train = SlowClients(slow_cfg(tsr=1, ssr=0), 0, [100])
    send = SlowClients(slow_cfg(tsr=0, ssr=1), 0, [100])
    t_train = np.array([train.time_cost(0, t) for t in range(400)])
    t_send = np.array([send.time_cost(0, t) for t in range(400)])
    assert abs(t_train.mean() - 5.0) < 0.1 and t_train.max() <= 10.0
    assert abs(t_send.mean() - 0.1) < 0.01 and 0 < t_send.min() and t_send.max() <= 0.2


def test_a_client_that_is_not_slow_costs_nothing():
    slow = SlowClients(slow_cfg(tsr=0.5, ssr=0, tth=10), 0, [1000] * 4)
    assert slow.train_slow.sum() == 2
    fast = set(np.flatnonzero(~slow.train_slow))
    for t in range(10):
        for c in range(4):
            cost = slow.time_cost(c, t)
            assert cost == 0.0 if c in fast else cost > 10
        assert slow.late(range(4), t) == set(range(4)) - fast


def test_times_depend_only_on_seed_run_client_and_round():
    cfg = slow_cfg(tsr=1, ssr=1)
    a = SlowClients(cfg, 0, [5, 50, 5])
    b = SlowClients(cfg, 0, [100, 50, 7, 9])  # other clients, other step counts
    first = [a.time_cost(1, t) for t in range(5)]
    assert [b.time_cost(c, 0) for c in (3, 2, 0)]  # draw for other clients first: nothing shifts
    assert [b.time_cost(1, t) for t in range(5)] == first
    assert [a.time_cost(1, t) for t in range(5)] == first  # asking again gives the same times
    assert [SlowClients(cfg, 0, [5, 50, 5]).time_cost(1, t) for t in range(5)] == first
    assert len(set(first)) == 5  # each round its own draw
    assert all(a.time_cost(0, t) != a.time_cost(2, t) for t in range(5))  # each client its own draw
    assert [SlowClients(cfg, 1, [5, 50, 5]).time_cost(1, t) for t in range(5)] != first  # run
    other_seed = SlowClients(slow_cfg(tsr=1, ssr=1, seed=1), 0, [5, 50, 5])
    assert [other_seed.time_cost(1, t) for t in range(5)] != first



def test_sets_and_times_are_the_documented_streams_drawn_by_hand():
    """The slow sets come from the streams (seed, run, "slow-train") and (seed, run, "slow-send"); a client's
    time in a round from (seed, run, "delay", client, round): its train steps' U(0, 1) draws first, then its
    two sends'. Drawn here from those streams, so a run's slow clients and their times stay the same across
    executors, resumes and versions."""
    cfg = slow_cfg(tsr=0.5, ssr=0.5, seed=7)
    steps = [3, 5, 2, 4]
    slow = SlowClients(cfg, 2, steps)
    for name, mask in (("slow-train", slow.train_slow), ("slow-send", slow.send_slow)):
        picked = np_rng(7, 2, name).choice(4, size=2, replace=False)
        assert sorted(np.flatnonzero(mask)) == sorted(picked), name
    for c in range(4):
        for t in (0, 3):
            u = np_rng(7, 2, "delay", c, t).random(steps[c] + 2)
            train = 0.1 * u[:steps[c]].sum() if slow.train_slow[c] else 0.0
            send = 0.1 * (u[steps[c]:].sum() if slow.train_slow[c] else u[:2].sum()) if slow.send_slow[c] else 0.0
            assert slow.time_cost(c, t) == pytest.approx(train + send, rel=1e-12), (c, t)


def test_a_client_exactly_at_the_threshold_is_on_time():
    """Late means the simulated time exceeds -tth (PFLlib keeps a client whose time is at most the threshold)."""
    slow = SlowClients(slow_cfg(tsr=1, ssr=0), 0, [10, 10])
    slow.threshold = slow.time_cost(0, 0)
    assert slow.late([0], 0) == set()
    slow.threshold = np.nextafter(slow.time_cost(0, 0), 0)
    assert slow.late([0], 0) == {0}

# ---- the server counts each client's own steps ------------------------------------------------------------
class StepsClient(FedAvgClient):
    def steps_per_round(self) -> int:
        return 1000 if self.id % 2 else 0


class StepsServer(FedAvgServer):
    declares = Declares(
        client_class=StepsClient,
    )


def test_server_uses_each_clients_step_count(digits_root, monkeypatch):
    """Every client slow to train, -tth 10: the odd clients (1000 steps) miss the round, the even ones
    (0 steps) make it, so only the even ones are aggregated."""
    server = make_server(digits_root, "-tsr", "1", "-tth", "10", "-gr", "1", server_cls=StepsServer)
    got = []
    aggregate = server.aggregate
    monkeypatch.setattr(server, "aggregate", lambda uploads: (got.append([u.id for u in uploads]), aggregate(uploads)))
    loop.run_round(server, 0)
    assert server.late == [1, 3] and got == [[0, 2, 4]]


@pytest.mark.parametrize("algo,pair", [("FedAvg", 1), ("Per-FedAvg", 2)])
def test_step_counts_follow_the_algorithm(digits_root, algo, pair):
    """-ls 2 -lbs 10: FedAvg takes 2·ceil(n / 10) steps; Per-FedAvg's steps each use two batches
    (2·ceil(n / 20))."""
    from flcore.registry import get_server_class

    server = make_server(digits_root, "-algo", algo, "-ls", "2", "-lbs", "10", "-tsr", "1",
                         server_cls=get_server_class(algo))
    sizes = [len(np.load(digits_root / "Digits" / "train" / f"{i}.npz", allow_pickle=False)["y"]) for i in range(5)]
    assert server.slow.steps == [2 * math.ceil(n / (10 * pair)) for n in sizes]
