"""``--executor batched`` (runtime/batched.py, runtime/stacked.py): the round's clients stacked into one
computation give the sequential executor's numbers up to float rounding, for every algorithm that declares
it; the others, and the flags it cannot honour, are refused with one line.

The reference is the sequential executor (a separate code path: per-client loops, autograd, torch.optim).
Runs are 2 rounds on the 5-client tiny digits split (37-98 training samples each, so clients take different
numbers of steps and the shorter ones are masked at the end of each phase).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import main
from cli import parse_config
from conftest import build_server, cli
from flcore.clients.clientavg import FedAvgClient
from flcore.clients.clientbase import ClientDeclares
from flcore.registry import ALGORITHMS, get_server_class
from runtime import batched, graphs, stacked, stacked_ala
from runtime.batched import batch_refusal
from runtime.choose import executor_kind
from utils.results import read_h5
from runtime import loop

BATCHING = sorted(a for a in ALGORITHMS if not batch_refusal(get_server_class(a).declares.client_class))


def client_behaviour(algo: str) -> tuple:
    """What a client class does, as the functions behind its members and its class attributes: algorithms
    whose clients differ only by name (FedAdam's and FedAvg's) train and evaluate alike."""
    cls = get_server_class(algo).declares.client_class
    names = sorted({n for k in cls.__mro__ if k is not object for n in vars(k) if not n.startswith("__")})
    return tuple((n, getattr(cls, n)) for n in names)


# The issue's list: each must be among the algorithms that declare batching.
COVERED = {"FedAvg", "FedProx", "FedALA", "Local", "FedPer", "LG-FedAvg", "FedRep", "FedBABU", "Ditto", "APFL"}
# One algorithm of each distinct client behaviour, the issue's first (the server side runs the same code on
# either executor)
_ORDER = sorted(BATCHING, key=lambda a: (a not in COVERED, a))
DISTINCT = sorted(a for i, a in enumerate(_ORDER) if client_behaviour(a) not in map(client_behaviour, _ORDER[:i]))
ATOL = 2e-5  # weights after two rounds at -lr 0.1 (float rounding of stacked kernels: about 1e-7 here)


def states(server) -> dict:
    """The global model's entries and every client's evaluated model's, by name."""
    out = {f"global.{k}": v for k, v in server.global_model.state_dict().items()}
    for c in server.clients:
        out.update({f"{c.id}.{k}": v for k, v in c.eval_model().state_dict().items()})
    return out


@pytest.fixture
def counted(monkeypatch):
    """How often each stacked computation ran, and how often a phase ran alone (not stacked)."""
    seen = {"train": 0, "predict": 0, "ala": 0, "alone": 0}

    def count(kind, fn):
        def wrapped(*a, **k):
            seen[kind] += 1
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(stacked.TrainPhase, "run", count("train", stacked.TrainPhase.run))
    monkeypatch.setattr(stacked_ala.ALAEpoch, "run", count("ala", stacked_ala.ALAEpoch.run))
    monkeypatch.setattr(batched, "predict_many", count("predict", batched.predict_many))
    monkeypatch.setattr(batched.Session, "_alone", staticmethod(count("alone", batched.Session._alone)))
    return seen


def summary(server) -> dict:
    """The round's evaluation, and each ALA's epochs and mean batch losses in it (what decides when its
    start phase has converged)."""
    return {**loop.evaluate(server), "ala": [(c.ala.last_epochs, c.ala.last_losses) for c in server.clients
                                             if getattr(c, "ala", None) is not None]}


def rounds(root, algo, executor, *flags, n=2):
    server = build_server(root, root, "-algo", algo, "--executor", executor, *flags)
    summaries = []
    for t in range(n):
        loop.run_round(server, t)
        summaries.append(summary(server))
    return server, summaries


def assert_close_runs(seq, bat) -> None:
    (s_server, s_sum), (b_server, b_sum) = seq, bat
    a, b = states(s_server), states(b_server)
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= ATOL, worst
    n_test = sum(c.test_samples for c in s_server.clients)
    for x, y in zip(s_sum, b_sum):
        assert abs(x["test_acc"] - y["test_acc"]) * n_test <= 1 + 1e-9  # within one test sample
        assert x["train_loss"] == pytest.approx(y["train_loss"], rel=1e-5)
        assert [e for e, _ in x["ala"]] == [e for e, _ in y["ala"]]
        for (_, mine), (_, theirs) in zip(x["ala"], y["ala"]):
            assert theirs == pytest.approx(mine, rel=1e-5)


def test_the_issue_algorithms_declare_batching():
    assert COVERED <= set(BATCHING), COVERED - set(BATCHING)
    for algo in ("SCAFFOLD", "MOON", "FedBN", "pFedMe"):
        assert algo not in BATCHING


@pytest.mark.parametrize("algo", DISTINCT)
def test_batched_equals_sequential(algo, digits_tiny_root, counted):
    n = 2 if get_server_class(algo).declares.client_class.declares.use_ala else 1  # ALA starts in a client's second round
    seq = rounds(digits_tiny_root, algo, "sequential", n=n)
    assert counted == {"train": 0, "predict": 0, "ala": 0, "alone": 0}  # the sequential path hands nothing over
    bat = rounds(digits_tiny_root, algo, "batched", n=n)
    assert counted["train"] >= 1 and counted["predict"] >= 2 and counted["alone"] == 0, counted
    assert counted["ala"] > 0 if get_server_class(algo).declares.client_class.declares.use_ala else counted["ala"] == 0
    assert_close_runs(seq, bat)


@pytest.mark.parametrize("case", [
    ("FedALA", "-jr", "0.6", "-cdr", "0.3"),  # a partial, uneven selection with drop-outs; ALA batched
    ("FedPer", "-ala", "-p", "4"),  # ALA over the whole shared part: the full-model forward, stacked
    ("FedAvg", "-ls", "2", "-lbs", "16", "--batch_clients", "2"),  # two epochs; groups of two clients
    ("FedProx", "--client_state", "cpu", "-jr", "0.4"),  # idle clients parked in host memory
    ("FedAvg", "--server_opt", "adam", "--aggregator", "median"),  # server-side rules act on the uploads
    ("Local", "--client_models", "CNN1,CNN3"),  # two architectures, batched per architecture
    ("APFL", "-al", "0.0"),  # α at its bound: its projection (batch_step) acts
], ids=lambda c: "-".join(c))
def test_batched_equals_sequential_with_options(case, digits_tiny_root, counted):
    algo, *flags = case
    seq = rounds(digits_tiny_root, algo, "sequential", *flags)
    bat = rounds(digits_tiny_root, algo, "batched", *flags)
    assert counted["train"] >= 2 and counted["alone"] == 0, counted
    assert_close_runs(seq, bat)


def test_architectures_are_stacked_apart(digits_tiny_root, monkeypatch):
    sizes = []
    run = stacked.TrainPhase.__init__

    def record(self, plans, cuda_graphs=None):
        sizes.append(sorted(type(p.client.model.body if hasattr(p.client.model, "body") else p.client.model).__name__
                            + str(p.client.id % 2) for p in plans))
        run(self, plans, cuda_graphs)

    monkeypatch.setattr(stacked.TrainPhase, "__init__", record)
    rounds(digits_tiny_root, "Local", "batched", "--client_models", "CNN1,CNN3", n=1)
    assert sorted(len(s) for s in sizes) == [2, 3]  # clients 0, 2, 4 (CNN1) and 1, 3 (CNN3), one stack each
    assert all(len({name[-1] for name in s}) == 1 for s in sizes)


def test_checkpoint_and_resume_mid_run(digits_tiny_root, tmp_path, stop_in_round):
    flags = ("-algo", "FedALA", "-gr", "3", "-jr", "0.6", "--checkpoint_every", "1", "-lr", "0.1", "-lbs", "20")
    assert main.main(cli(digits_tiny_root, tmp_path / "seq", *flags, "--executor", "sequential")) == 0
    stop_in_round(2)
    with pytest.raises(RuntimeError, match="killed"):
        main.main(cli(digits_tiny_root, tmp_path / "bat", *flags, "--executor", "batched"))
    stop_in_round(None)
    assert main.main(cli(digits_tiny_root, tmp_path / "bat", *flags, "--executor", "batched", "--resume")) == 0
    a = read_h5(tmp_path / "seq" / "Digits_FedALA_test_0.h5")
    b = read_h5(tmp_path / "bat" / "Digits_FedALA_test_0.h5")
    assert len(a["rs_test_acc"]) == len(b["rs_test_acc"]) == 4
    n_test = 124
    assert np.all(np.abs(a["rs_test_acc"] - b["rs_test_acc"]) * n_test <= 1 + 1e-9)
    assert np.allclose(a["rs_train_loss"], b["rs_train_loss"], rtol=1e-5)


@pytest.mark.parametrize("flags, says", [
    (("-algo", "SCAFFOLD"), "SCAFFOLD cannot train batched: its local update is not declared batchable"),
    pytest.param(("-algo", "FedAvg", "-dp", "-dps", "1.0"), "-dp's DP-SGD", marks=pytest.mark.optional_deps("opacus")),
    (("-algo", "FedAvg", "--amp", "bf16"), "--amp"),
    (("-algo", "FedAvg", "-m", "BNCNN"), "BatchNorm2d layers"),
    (("-algo", "FedAvg", "--batch_clients", "-1"), "--batch_clients -1 is out of range"),
])
def test_what_cannot_batch_is_refused_with_one_line(flags, says, digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", "--executor", "batched", *flags)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


@pytest.mark.optional_deps("opacus")
def test_client_level_dp_runs_batched(digits_tiny_root, counted):
    flags = ("-dp", "--dp_level", "client", "-dps", "0.5", "-jr", "0.6", "-lr", "0.01")
    assert_close_runs(rounds(digits_tiny_root, "FedAvg", "sequential", *flags),
                      rounds(digits_tiny_root, "FedAvg", "batched", *flags))
    assert counted["train"] >= 2


def test_a_diverging_client_stops_the_run_with_one_line(digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", "-lr", "1e12", "--executor", "batched")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: client ") and "training loss became" in err[-1]


class LossBelow(FedAvgClient):
    def loss(self, x, y):
        return super().loss(x, y) * 2


class StepWithout(FedAvgClient):
    declares = ClientDeclares(
        batch_state=(),
    )

    def after_backward(self):
        pass


def test_declarations_are_checked():
    assert batch_refusal(LossBelow) == "LossBelow overrides loss below FedAvgClient, which declared batch_state"
    assert batch_refusal(StepWithout) == "StepWithout.after_backward has no batch_step"
    assert batch_refusal(get_server_class("APFL").declares.client_class) == ""  # after_backward with its batch_step
    assert "overrides after_backward" in batch_refusal(get_server_class("SCAFFOLD").declares.client_class)


def test_auto_picks_batched_on_cuda_only(digits_tiny_root, tmp_path):
    cfg = parse_config(cli(digits_tiny_root, tmp_path, "-algo", "FedAvg", "--executor", "auto"))
    avg, scaffold = (get_server_class(a).declares.client_class for a in ("FedAvg", "SCAFFOLD"))
    assert executor_kind(cfg, avg) == executor_kind(cfg) in ("fork", "sequential")  # the CPU rule is unchanged
    cuda = cfg.replace(device="cuda")
    assert executor_kind(cuda, avg) == "batched"
    assert executor_kind(cuda, scaffold) == "sequential"
    assert executor_kind(cuda.replace(amp="bf16"), avg) == "sequential"
    assert executor_kind(cuda.replace(device_id="0,1"), avg) == "sequential"


@pytest.mark.parametrize("algo", ["FedAvg", "Ditto"])
def test_a_phase_the_stack_cannot_express_runs_alone(algo, digits_tiny_root, counted, monkeypatch):
    """An optimizer other than plain SGD: that phase runs client by client, with the sequential numbers.
    FedAvg: its one phase; Ditto: its personal phase, with its own optimizer and objective (passed through
    as given), while its federated phase stays stacked."""
    if algo == "FedAvg":
        def momentum(self):
            return torch.optim.SGD(self.model.parameters(), lr=self.cfg.local_learning_rate, momentum=0.5)

        monkeypatch.setattr(FedAvgClient, "make_optimizer", momentum)
    else:
        from flcore.clients.clientditto import DittoClient

        made = DittoClient.__init__

        def personal_momentum(self, *a, **k):
            made(self, *a, **k)
            self.poptimizer = torch.optim.SGD(self.pmodel.parameters(), lr=self.cfg.local_learning_rate, momentum=0.5)

        monkeypatch.setattr(DittoClient, "__init__", personal_momentum)
    seq = rounds(digits_tiny_root, algo, "sequential")
    bat = rounds(digits_tiny_root, algo, "batched")
    assert counted["alone"] == 10 and (counted["train"] == 0) == (algo == "FedAvg")
    assert_close_runs(seq, bat)


def test_a_phase_with_another_optimizer_takes_plain_sgd_steps_batched_too(digits_tiny_root, counted, monkeypatch):
    """``run_epochs`` applies ``after_backward`` to the client's own optimizer's phases only; batched, the
    declared ``batch_step`` (its stacked form) follows the same rule: a client whose hook doubles every gradient
    and whose phase trains with another optimizer takes plain SGD steps on both executors."""
    import dataclasses

    from flcore.clients.clientbase import ClientDeclares
    from flcore.servers.serveravg import FedAvgServer

    def doubled(params, grads, lrs):
        return {n: p - 2 * lrs[n] * grads[n] for n, p in params.items()}

    class Doubling(FedAvgClient):
        declares = ClientDeclares(batch_state=(), batch_step=doubled)

        def after_backward(self):
            for p in self.model.parameters():
                p.grad.mul_(2)

        def local_update(self, round_idx):
            other = torch.optim.SGD(self.model.parameters(), lr=self.cfg.local_learning_rate)
            self.run_epochs(self.cfg.local_epochs, optimizer=other)

    monkeypatch.setattr(FedAvgServer, "declares", dataclasses.replace(FedAvgServer.declares, client_class=Doubling))
    seq = rounds(digits_tiny_root, "FedAvg", "sequential")
    plain = rounds(digits_tiny_root, "FedAvg", "sequential", "-lr", "0.2")  # what doubled steps would give
    bat = rounds(digits_tiny_root, "FedAvg", "batched")
    assert counted["train"] == 2 and counted["alone"] == 0
    assert_close_runs(seq, bat)
    with pytest.raises(AssertionError):
        assert_close_runs(plain, bat)


def test_clients_whose_inputs_differ_in_shape_are_never_stacked_together():
    """Evaluation requests are grouped by model signature and input shape past the sample dimension: two
    clients of one model whose inputs differ in length (an embedding model reads any) are predicted apart, each
    with its own model's logits; two of one shape are stacked."""
    from torch import nn

    class MeanEmbedding(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.fc = nn.Embedding(20, 4), nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(self.emb(x).mean(1))

    class Answering(batched.Session):
        def __init__(self):
            super().__init__(type("Executor", (), {"max_group": None, "graphs": None})())

    torch.manual_seed(0)
    models = [MeanEmbedding() for _ in range(3)]
    xs = [torch.randint(0, 20, (5, 7)), torch.randint(0, 20, (4, 9)), torch.randint(0, 20, (6, 7))]
    slots = []
    for m, x in zip(models, xs):
        s = batched._Slot()
        s.request = ("predict", m, x, 4)
        slots.append(s)
    ran = []
    real = batched.predict_many
    try:
        batched.predict_many = lambda ms, inputs, bs: ran.append(len(ms)) or real(ms, inputs, bs)
        Answering().compute(slots)
    finally:
        batched.predict_many = real
    assert sorted(ran) == [1, 2]
    for s, m, x in zip(slots, models, xs):
        with torch.no_grad():
            assert torch.allclose(s.result, m(x), atol=1e-6)


@pytest.mark.parametrize("algo, flags", [("FedAvg", ("-ls", "2", "-lbs", "16")), ("APFL", ("-al", "0.0")),
                                         ("Ditto", ()), ("FedALA", ()), ("FedPer", ("-ala", "-p", "4")),
                                         ("FedALA", ("-lbs", "128")), ("FedALA", ("-jr", "0.2"))])
def test_the_graphed_step_masks_clients_without_a_batch(algo, flags, digits_tiny_root):
    """The step CUDA graphs capture (every client of the stack, those without a full batch masked), run
    eagerly on its fixed buffers: the same numbers, round after round with the buffers reused (``-lbs 128``:
    ALA epochs of one step; ``-jr 0.2``: one client's ALA alone)."""
    seq = rounds(digits_tiny_root, algo, "sequential", *flags)
    server = build_server(digits_tiny_root, digits_tiny_root, "-algo", algo, "--executor", "batched", *flags)
    server.executor.graphs = graphs.CudaGraphs(capture=False)
    summaries = []
    for t in range(2):
        loop.run_round(server, t)
        summaries.append(summary(server))
    made = server.executor.graphs
    assert made.cache and not made.broken
    kinds = {key[0][0] for key in made.cache}  # the training step's keys, and ALA's W step's where ALA runs
    assert kinds == ({"train", "ala"} if server.clients[0].ala is not None else {"train"})
    assert_close_runs(seq, (server, summaries))


def test_auto_falls_back_to_the_sequential_loop_for_a_model_it_cannot_stack(digits_tiny_root, capsys):
    """--executor auto resolved to batched on CUDA, then a BatchNorm model: the sequential loop, said once."""
    from runtime.batched import BatchedExecutor

    flags = ("-m", "BNCNN")
    seq = rounds(digits_tiny_root, "FedAvg", "sequential", *flags, n=1)
    server = build_server(digits_tiny_root, digits_tiny_root, "-algo", "FedAvg", *flags)  # to copy its config
    executor = BatchedExecutor(server.cfg.replace(executor="batched"), auto=True)
    server = type(server)(server.cfg, server.data, 0, None, executor=executor)
    assert executor.plain and "note: --executor auto: the sequential loop" in capsys.readouterr().out
    loop.run_round(server, 0)
    assert all(torch.equal(a, b) for a, b in zip(states(seq[0]).values(), states(server).values()))


def test_a_model_with_active_dropout_is_refused_and_an_inactive_one_stacks():
    from torch import nn

    assert batched.model_refusal(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.0))) == ""
    for p in (0.5, 1.0):
        assert batched.model_refusal(nn.Sequential(nn.Linear(2, 2), nn.Dropout(p))) == (
            "the model has Dropout layers, whose masks vmap draws from the global generator, not from each "
            "client's stream")


def test_batch_clients_stacks_at_most_that_many_clients_at_a_time(digits_tiny_root, counted):
    """--batch_clients 2 over 5 clients: each round's training runs as three stacked computations (2, 2, 1),
    with the numbers of one stack."""
    seq = rounds(digits_tiny_root, "FedAvg", "sequential", n=1)
    bat = rounds(digits_tiny_root, "FedAvg", "batched", "--batch_clients", "2", n=1)
    assert counted["train"] == 3 and counted["alone"] == 0, counted
    assert_close_runs(seq, bat)


def test_no_cuda_graphs_off_cuda(digits_tiny_root, capsys):
    """--cuda_graphs is on by default and applies on CUDA only: on the CPU the batched executor builds none,
    and says nothing about them."""
    server = build_server(digits_tiny_root, digits_tiny_root, "-algo", "FedAvg", "--executor", "batched")
    assert server.cfg.cuda_graphs and server.executor.graphs is None
    loop.run_round(server, 0)
    assert "CUDA graphs" not in capsys.readouterr().out


def test_a_client_that_fails_ends_the_call_and_every_other_clients_thread():
    """One client raises while the others wait at a hand-over: the call raises that error, and each waiting
    client's thread is released, unwound and joined (none is left blocked), so the call returns at all."""
    import threading

    from utils.batching import session

    class Host:
        def run(self, cid, method, args, kwargs):
            for step in range(3):
                if cid == 1 and step == 1:
                    raise ValueError("client 1 failed")
                session()._hand_over(("step", cid))
            return cid

    class Answering(batched.Session):
        def compute(self, slots):  # every waiting thread's request answered with 0
            for s in slots:
                s.result = 0

    class Executor:
        host = Host()

    before, outcome = set(threading.enumerate()), []

    def call():
        try:
            Answering(Executor()).run([(c, "m", (), {}) for c in range(3)])
        except ValueError as e:
            outcome.append(str(e))

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(10)
    assert not caller.is_alive() and outcome == ["client 1 failed"]
    assert set(threading.enumerate()) == before
