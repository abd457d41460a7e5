"""What crosses the fork executor's pipe: runtime.fork.dumps sends dense tensors as raw bytes; every value
must arrive exactly as torch's own pickling delivers it (the reference), whichever path it took."""
import dataclasses
import pickle

import pytest
import torch
from torch import nn

from runtime import fork


@dataclasses.dataclass
class Record:
    state: dict
    extras: list


def payload():
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))
    shared = torch.randn(4, generator=g)
    big = torch.randn(6, 5, generator=g)
    return {
        "model": model,
        "record": Record({k: v.clone() for k, v in model.state_dict().items()},
                         [torch.tensor(3), torch.tensor([True, False]), torch.arange(5, dtype=torch.int64),
                          torch.randn(3, generator=g).to(torch.float16)]),
        "param": nn.Parameter(torch.randn(2, 2, generator=g)),
        "leaf_grad": torch.randn(3, generator=g).requires_grad_(),
        "non_leaf": torch.randn(3, generator=g).requires_grad_() * 2,  # arrives a leaf that requires grad
        "bf16": torch.randn(3, generator=g).to(torch.bfloat16),  # no numpy dtype: torch's own pickling
        "transposed": big.t(),  # not contiguous
        "row": big[2],  # a view into a larger storage
        "channels_last": torch.randn(2, 3, 4, 4, generator=g).to(memory_format=torch.channels_last),
        # one channel: "contiguous" in both layouts, with channels-last strides (25, 1, 5, 1)
        "one_channel": torch.randn(2, 1, 5, 5, generator=g).to(memory_format=torch.channels_last),
        "twice": [shared, shared],  # one object twice stays one object
        "plain": (1, "a", 2.5, None),
    }


def tensors(obj, path=""):
    """(path, tensor) of every tensor in ``obj``, module parameters and buffers included."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, nn.Module):
        yield from ((f"{path}.{k}", v) for k, v in obj.state_dict(keep_vars=True).items())
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors(v, f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensors(v, f"{path}[{i}]")
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from tensors(getattr(obj, f.name), f"{path}.{f.name}")


def test_everything_arrives_as_torchs_own_pickling_delivers_it():
    sent = payload()
    got = pickle.loads(fork.dumps(sent))
    ref = pickle.loads(pickle.dumps(sent, protocol=pickle.HIGHEST_PROTOCOL))
    ours, theirs = dict(tensors(got)), dict(tensors(ref))
    assert ours.keys() == theirs.keys() and len(ours) > 15
    for k, t in theirs.items():
        o = ours[k]
        assert type(o) is type(t), k
        assert o.dtype == t.dtype and o.shape == t.shape and o.stride() == t.stride(), k
        assert o.requires_grad == t.requires_grad, k
        assert torch.equal(o, t), k
    assert got["twice"][0] is got["twice"][1]
    assert got["plain"] == sent["plain"] and isinstance(got["record"], Record)
    assert torch.equal(got["model"](torch.ones(1, 1, 4, 4)), sent["model"](torch.ones(1, 1, 4, 4)))


def test_raw_tensors_arrive_writable_and_unshared():
    t = torch.arange(6, dtype=torch.float32)
    got = pickle.loads(fork.dumps(t))
    got += 1  # a read-only buffer would refuse or warn
    assert torch.equal(t, torch.arange(6, dtype=torch.float32)) and torch.equal(got, t + 1)


@pytest.mark.parametrize("name", ["model", "param", "leaf_grad", "record"])
def test_dense_tensors_take_the_raw_path(name):
    """The raw path is really taken for dense tensors (the point of dumps), and not for a view."""
    assert b"_raw_tensor" in fork.dumps(payload()[name])
    assert b"_raw_tensor" not in fork.dumps(payload()["row"])
    assert b"_raw_tensor" not in fork.dumps(payload()["bf16"])
    assert b"_raw_tensor" in fork.dumps(payload()["one_channel"])


def test_a_worker_asks_linux_to_kill_it_with_its_parent(monkeypatch):
    calls = []

    class Libc:
        def prctl(self, option, sig):
            calls.append((option, sig))

    monkeypatch.setattr(fork.ctypes, "CDLL", lambda name, use_errno: Libc())
    fork._die_with_parent()
    assert calls == [(1, fork.signal.SIGKILL)]  # PR_SET_PDEATHSIG: SIGKILL when the parent dies


class Pipe:
    """A worker's end of its pipe: the requests it will read (pickled), the answers it sent (unpickled)."""

    def __init__(self, *requests):
        self.requests, self.sent, self.closed = [pickle.dumps(r) for r in requests], [], False

    def recv_bytes(self):
        if not self.requests:
            raise EOFError  # the server is gone
        return self.requests.pop(0)

    def send_bytes(self, data):
        self.sent.append(pickle.loads(data))

    def close(self):
        self.closed = True


class Echo:
    def __init__(self, cid, data, device):
        if data is None:
            raise ValueError(f"client {cid} has no data")
        self.id, (self.train_samples, self.test_samples) = cid, data

    def echo(self, value):
        return self.id, value


@pytest.fixture
def worker_setup(monkeypatch):
    """What a worker does to its own process (parent-death signal, Ctrl-C, threads), recorded instead of done."""
    calls = []
    monkeypatch.setattr(fork, "_die_with_parent", lambda: calls.append("die with parent"))
    monkeypatch.setattr(fork.signal, "signal", lambda sig, handler: calls.append((sig, handler)))
    monkeypatch.setattr(fork.torch, "set_num_threads", lambda n: calls.append(("threads", n)))
    return calls


@pytest.mark.parametrize("last", [None, "eof"])
def test_a_worker_answers_until_told_to_stop_or_the_server_is_gone(worker_setup, last):
    requests = [("sizes",), ("map", "echo", [7, 4], (5,), {}), ("stop",), *([None, ("sizes",)] if last is None else [])]
    conn, others = Pipe(*requests), [Pipe(), Pipe()]
    fork._serve(conn, others, Echo, [4, 7], [(10, 3), (20, 5)], None, 2)
    assert worker_setup == ["die with parent", (fork.signal.SIGINT, fork.signal.SIG_IGN), ("threads", 1)]
    assert all(o.closed for o in others) and conn.closed  # the other workers' ends are not this one's to hold
    assert conn.sent[:3] == [(True, None), (True, {4: (10, 3), 7: (20, 5)}), (True, [(7, 5), (4, 5)])]
    ok, error = conn.sent[3]
    assert not ok and isinstance(error, ValueError) and "unknown request 'stop'" in str(error)
    assert len(conn.sent) == 4 and conn.requests == ([pickle.dumps(("sizes",))] if last is None else [])


def test_a_worker_that_cannot_build_its_clients_says_so_and_ends(worker_setup):
    conn = Pipe(("sizes",))
    fork._serve(conn, [], Echo, [3], [None], None, 1)
    [(ok, error)] = conn.sent
    assert not ok and str(error) == "client 3 has no data" and conn.closed and conn.requests  # nothing read


def test_an_error_crosses_as_itself_or_as_its_text():
    class Unpicklable(Exception):
        def __reduce__(self):
            raise TypeError("cannot pickle this")

    from utils.errors import FLError

    plain = fork._portable(ValueError("bad value"))
    assert type(plain) is ValueError and plain.__notes__[0].startswith("in a fork worker:\nValueError: bad value")
    flerror = fork._portable(FLError("one line"))
    assert type(flerror) is FLError and not getattr(flerror, "__notes__", None)  # its one line says it all
    text = fork._portable(Unpicklable("odd"))
    assert type(text) is RuntimeError and str(text).startswith("in a fork worker:\n")
    assert "Unpicklable: odd" in str(text)


# ---- the server's side of a pool, with stand-in pipes and processes ----------------------------------
class StandInProc:
    """A worker process that exits when joined, or (``stubborn``) only once killed."""

    def __init__(self, stubborn=False, exitcode=None):
        self.alive, self.stubborn, self.exitcode, self.calls = True, stubborn, exitcode, []

    def join(self, timeout=None):
        self.calls.append(("join", timeout))
        if not self.stubborn:
            self.alive = False

    def is_alive(self):
        return self.alive

    def kill(self):
        self.calls.append(("kill",))
        self.stubborn = False


class StandInConn:
    def __init__(self, broken=False, answer_after=0):
        self.broken, self.sent, self.closed, self.polls, self.answer_after = broken, [], False, 0, answer_after

    def send_bytes(self, data):
        if self.broken:
            raise BrokenPipeError
        self.sent.append(pickle.loads(data))

    def close(self):
        self.closed = True

    def poll(self, timeout):
        self.polls += 1
        return self.polls > self.answer_after

    def recv_bytes(self):
        return pickle.dumps((True, "answer"))


def test_stopping_asks_each_worker_to_end_and_kills_one_that_does_not():
    pool = fork.ForkExecutor(3)
    procs = [StandInProc(), StandInProc(stubborn=True), StandInProc()]
    conns = [StandInConn(), StandInConn(), StandInConn(broken=True)]  # the third's worker is gone already
    pool.procs, pool.conns = list(procs), list(conns)
    pool._stop()
    assert [c.sent for c in conns] == [[None], [None], []] and all(c.closed for c in conns)
    assert procs[0].calls == procs[2].calls == [("join", 5)]
    assert procs[1].calls == [("join", 5), ("kill",), ("join", None)]  # still alive after 5 s: killed, reaped
    assert pool.procs == [] and pool.conns == []


def test_close_stops_the_workers_and_releases_the_parked_states():
    class Parking:
        released = 0

        def release(self):
            self.released += 1

    parking = Parking()
    pool = fork.ForkExecutor(1, parking)
    proc, conn = StandInProc(), StandInConn()
    pool.procs, pool.conns = [proc], [conn]
    pool.close()
    assert conn.sent == [None] and conn.closed and proc.calls == [("join", 5)] and parking.released == 1


def test_a_slow_answer_is_waited_for_and_a_dead_worker_reported_with_its_exit_code():
    pool = fork.ForkExecutor(1)
    pool.procs, pool.conns = [StandInProc()], [StandInConn(answer_after=3)]  # no answer for three polls
    assert pool._answer(0) == (True, "answer")
    dead = StandInProc(exitcode=-9)
    dead.alive = False
    pool.procs, pool.conns = [dead], [StandInConn(answer_after=10 ** 9)]
    with pytest.raises(fork.WorkerLost, match=r"^fork worker 0 died \(exit code -9; out of memory\?"):
        pool._answer(0)
    (call,) = dead.calls
    assert call[0] == "join" and 0 < call[1] <= 5  # reaped, for a bounded time, before its exit code is read
