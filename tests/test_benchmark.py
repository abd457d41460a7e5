"""scripts/run/benchmark.py runs the executors side by side and reports consistent figures (a smoke test of
the figures' bookkeeping, not a timing test: speed is reported by the script, docs/performance.md)."""
import json

import pytest


def test_benchmark_compares_executors(digits_root, tmp_path):
    from runtime import loop
    from scripts.run import benchmark
    from utils.data_utils import load_split

    before = dict(vars(loop))

    n_train = sum(len(c.y_train) for c in load_split("Digits", digits_root, None, "cpu").clients)
    out = tmp_path / "bench.json"
    res = benchmark.main_benchmark(["-data", "Digits", "--dataset_root", str(digits_root), "-dev", "cpu",
                                    "-algo", "FedAvg", "-gr", "2", "--ref_seconds", "0.2", "--json", str(out),
                                    "--executors", "sequential,fork", "--workers", "2"])
    assert json.loads(out.read_text())["runs"][1]["rounds"] == json.loads(json.dumps(res["runs"][1]["rounds"],
                                                                                     default=float))
    seq, fork = res["runs"]
    assert (seq["executor"], seq["workers"], fork["executor"], fork["workers"]) == ("sequential", 0, "fork", 2)
    for run in res["runs"]:
        rounds = run["rounds"]
        assert [r["round"] for r in rounds] == [0, 1]
        for r in rounds:
            phases = sum(r[k] for k in benchmark.PHASES)
            assert 0 < phases <= r["wall"] * 1.001  # the phases are parts of the round's wall time
            assert r["samples"] == n_train  # every client, one epoch
            assert r["reference"] > 0
        samples = sum(r["samples"] for r in rounds)
        assert run["train_samples_per_s"] == pytest.approx(samples / sum(r["train"] for r in rounds))
        assert [c["round"] for c in run["curve"]] == [0, 1, 2]  # evaluations after rounds 0..2
        assert run["steady_round_s"] == pytest.approx(rounds[1]["wall"])  # --steady_from 1: round 1 only
    assert fork["vs_first"] == pytest.approx(fork["steady_round_s"] / seq["steady_round_s"])
    assert fork["same_curve_as_first"]  # the executors give the same numbers
    assert all(m > 0 for m in fork["peak_rss_workers_mb"])
    assert res["train_mflop_per_sample"] > res["eval_mflop_per_sample"] > 0  # backward costs more
    # the timing went through the server's timer: the loop module is left as it was, so a later run in this
    # process meets the plain loop
    assert vars(loop).keys() == before.keys() and all(vars(loop)[k] is v for k, v in before.items())


def test_the_loop_times_each_step_of_a_round_through_the_servers_timer(digits_tiny_root, tmp_path):
    """runtime.loop's timing seam: each step inside ``phase``, in the order of a round (send, evaluate,
    train, receive, aggregate), each evaluation ``recorded``, each round ``round_done``; the final evaluation
    is a send and an evaluation. A default server's timer does nothing."""
    import contextlib

    from conftest import build_server
    from runtime import loop

    class Log(loop.PhaseTimer):
        def __init__(self):
            self.seen = []

        @contextlib.contextmanager
        def phase(self, server, name, clients):
            self.seen.append((name, server.round_idx, sorted(c.id for c in clients)))
            yield
            self.seen.append(("/" + name,))

        def recorded(self, server, summary):
            self.seen.append(("recorded", server.round_idx, summary["test_acc"]))

        def round_done(self, server):
            self.seen.append(("done", server.round_idx))

    server = build_server(digits_tiny_root, tmp_path, "-algo", "FedAvg", "-gr", "2", "-eg", "2", "-jr", "0.5",
                          clients=4)
    assert type(server.timer) is loop.PhaseTimer
    server.timer = log = Log()
    loop.train(server)
    rounds = [[e for e in log.seen if len(e) > 1 and e[1] == t] for t in range(3)]
    chosen = [rounds[t][0][2] for t in range(3)]
    assert all(len(c) == 2 for c in chosen)  # -jr 0.5 of 4 clients
    everyone = [0, 1, 2, 3]
    acc = [e[2] for e in log.seen if e[0] == "recorded"]
    assert len(acc) == 2  # -eg 2: rounds 0 and 2 (the final evaluation)
    assert rounds[0] == [("send", 0, chosen[0]), ("evaluate", 0, everyone), ("recorded", 0, acc[0]),
                         ("train", 0, chosen[0]), ("receive", 0, chosen[0]), ("aggregate", 0, chosen[0]),
                         ("done", 0)]
    assert rounds[1] == [("send", 1, chosen[1]), ("train", 1, chosen[1]), ("receive", 1, chosen[1]),
                         ("aggregate", 1, chosen[1]), ("done", 1)]
    assert rounds[2] == [("send", 2, chosen[2]), ("evaluate", 2, everyone), ("recorded", 2, acc[1])]
    # each phase closes before the next opens
    names = [e[0] for e in log.seen if e[0] not in ("recorded", "done")]
    assert names == [n for e in log.seen if e[0] in loop.PHASES for n in (e[0], "/" + e[0])]


def test_benchmark_sets_up_as_main_does(digits_root):
    """The split is loaded and checked by main's own set-up: a class count the split does not have is the
    same one-line error as main.py's, before anything runs."""
    from scripts.run import benchmark
    from utils.errors import FLError

    with pytest.raises(FLError, match="-ncl 3 but split 'Digits' has 10 classes"):
        benchmark.main_benchmark(["-data", "Digits", "--dataset_root", str(digits_root), "-dev", "cpu",
                                  "-algo", "FedAvg", "-gr", "1", "-ncl", "3"])
