"""The batched engine (utils/engine.py) against the sequential path, evaluation modes and --amp.

The reference is the sequential path itself: same seed, same batches, so the batched engine must give
the same models and curves up to float summation order."""
import numpy as np
import pytest
import torch

import main
from conftest import cli
from flcore.clients.clientavg import FedAvgClient
from flcore.registry import get_server_class
from utils.data_utils import load_split
from utils.engine import BatchedEngine, batch_sizes, schedule
from utils.forking import balance
from utils.errors import FLError


@pytest.fixture(scope="module")
def digits_dir_root(tmp_path_factory):
    """Digits split among 6 clients by Dir(0.3): unequal sizes, so clients finish at different steps."""
    from dataset import generate_Digits

    root = tmp_path_factory.mktemp("data_dir")
    assert generate_Digits.main(["--root", str(root), "--num-clients", "6", "--partition", "dir", "--alpha",
                                 "0.3", "--seed", "1"]) == 0
    return root


def build(root, algo, *extra):
    cfg = main.parse_config(cli(root, root, "-algo", algo, "-lr", "0.05", "--train_loss_eval", "full", *extra))
    data = load_split("Digits", root, None, "cpu")
    cfg = cfg.replace(num_classes=data.num_classes, num_clients=len(data.clients))
    return get_server_class(algo)(cfg, data, 0, None)


def run_rounds(server, rounds: int) -> list[dict]:
    """The round loop's training part plus an evaluation after each round (no result files)."""
    out = []
    for t in range(rounds):
        server.round_idx = t
        chosen = server.select_clients()
        server.send_models(chosen)
        server.train_clients(chosen)
        server.aggregate(server.receive_models(chosen))
        server.send_models(server.clients)
        out.append(server.evaluate())
    return out


def states(server):
    return [[p.detach().clone() for p in c.model.parameters()] for c in server.clients]


# ---- the schedule -----------------------------------------------------------------------------------
def test_batch_sizes_match_client_batches():
    assert batch_sizes(25, 1, 10).tolist() == [10, 10, 5]
    assert batch_sizes(20, 2, 10).tolist() == [10, 10, 10, 10]
    assert batch_sizes(7, 2, 10).tolist() == [7, 7]


def test_schedule_keeps_the_active_clients_a_prefix():
    order, plan = schedule([25, 7, 10], epochs=1, bs=10)
    # client 0 takes 3 steps; clients 2 (a full batch) and 1 (7 samples) one step each
    assert order.tolist() == [0, 2, 1]
    assert plan == [[(10, slice(0, 2)), (7, slice(2, 3))], [(10, slice(0, 1))], [(5, slice(0, 1))]]


def test_schedule_covers_every_batch_once():
    ns, epochs, bs = [31, 5, 64, 10, 17], 3, 8
    order, plan = schedule(ns, epochs, bs)
    seen = {k: [] for k in range(len(ns))}
    for groups in plan:
        for size, members in groups:
            positions = range(len(ns))[members] if isinstance(members, slice) else members
            for pos in positions:
                seen[int(order[pos])].append(size)
    assert all(seen[k] == batch_sizes(ns[k], epochs, bs).tolist() for k in seen)


def test_balance_splits_steps_evenly():
    groups = balance([594, 572, 10, 300, 290, 8], 2)
    totals = sorted(sum([594, 572, 10, 300, 290, 8][k] for k in g) for g in groups)
    assert totals == [884, 890]  # longest first: 594 | 572, 300 | +290 | +10 | +8 and sorted(k for g in groups for k in g) == list(range(6))


# ---- batched == sequential ---------------------------------------------------------------------------
@pytest.mark.parametrize("algo,rounds,extra", [
    ("FedAvg", 2, ()),
    ("FedALA", 2, ("--ala_max_epochs", "3")),  # ALA starts in a client's second round
    ("FedProx", 1, ("-mu", "0.1")),
    ("Local", 1, ()),
    ("FedAvg", 1, ("-ls", "2", "-lbs", "7", "-jr", "0.5")),  # short batches inside the round, a subset trains
])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_batched_equals_sequential(digits_dir_root, algo, rounds, extra, layout):
    seq = build(digits_dir_root, algo, "--memory_format", layout, *extra)
    bat = build(digits_dir_root, algo, "--engine", "batched", "--engine_stack", "8", "--memory_format", layout, *extra)
    a, b = run_rounds(seq, rounds), run_rounds(bat, rounds)
    for x, y in zip(a, b):
        assert x["test_acc"] == y["test_acc"]  # sums of correct predictions: identical curves
        assert np.array_equal(x["client_test_acc"], y["client_test_acc"])
        assert x["train_loss"] == pytest.approx(y["train_loss"], rel=1e-5)
    for pa, pb in zip(states(seq), states(bat)):
        for u, v in zip(pa, pb):
            torch.testing.assert_close(u, v, atol=1e-5, rtol=1e-4)
    for cs, cb in zip(seq.clients, bat.clients):
        # the same batch stream, consumed exactly as far: the next round's batches agree too
        assert torch.equal(cs.batch_gen.get_state(), cb.batch_gen.get_state())
        assert len(cs.train_time) == len(cb.train_time)


def test_worker_processes_equal_in_process(digits_dir_root):
    here = build(digits_dir_root, "FedAvg", "--engine", "batched", "--engine_stack", "8")
    forked = build(digits_dir_root, "FedAvg", "--engine", "batched", "--engine_stack", "8", "--engine_workers", "2")
    (a,), (b,) = run_rounds(here, 1), run_rounds(forked, 1)  # training and evaluation in 2 processes
    for pa, pb in zip(states(here), states(forked)):
        for u, v in zip(pa, pb):
            torch.testing.assert_close(u, v, atol=1e-6, rtol=1e-5)
    assert np.array_equal(a["client_test_acc"], b["client_test_acc"])
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6)
    assert a["test_auc"] == pytest.approx(b["test_auc"], rel=1e-6)


@pytest.mark.parametrize("algo", ["FedALA", "Ditto"])
def test_worker_processes_run_ala_and_other_training_exactly(digits_dir_root, algo):
    """ALA (in the broadcast) and Ditto's own training run in the forked workers and their state comes
    back whole: bit for bit the numbers of this process (stacks of one: every client trains through its
    own loop on both sides, so both compute the same kernels)."""
    args = ("--engine", "batched", "--engine_stack", "1", "--ala_max_epochs", "2")
    here = build(digits_dir_root, algo, *args)
    forked = build(digits_dir_root, algo, *args, "--engine_workers", "2")
    a, b = run_rounds(here, 2), run_rounds(forked, 2)
    assert [x["train_loss"] for x in a] == [x["train_loss"] for x in b]
    for pa, pb in zip(states(here), states(forked)):
        assert all(torch.equal(u, v) for u, v in zip(pa, pb))
    for ch, cf in zip(here.clients, forked.clients):
        assert torch.equal(ch.batch_gen.get_state(), cf.batch_gen.get_state())
        assert len(ch.train_time) == len(cf.train_time)
        if algo == "FedALA":
            assert torch.equal(ch.ala.generator.get_state(), cf.ala.generator.get_state())
            assert all(torch.equal(ch.ala.weights[k], cf.ala.weights[k]) for k in ch.ala.weights)
        else:
            assert all(torch.equal(u, v) for u, v in zip(ch.pmodel.parameters(), cf.pmodel.parameters()))


def test_stack_cap_changes_nothing(digits_dir_root):
    whole = build(digits_dir_root, "FedAvg", "--engine", "batched", "--engine_stack", "0")
    capped = build(digits_dir_root, "FedAvg", "--engine", "batched", "--engine_stack", "2")
    run_rounds(whole, 1), run_rounds(capped, 1)
    for pa, pb in zip(states(whole), states(capped)):
        for u, v in zip(pa, pb):
            torch.testing.assert_close(u, v, atol=1e-6, rtol=1e-5)


def test_default_stack_is_per_client_on_the_cpu(digits_dir_root):
    """The CPU default (each client's own loop, no stack) and a 2-client stack train the same models."""
    own = build(digits_dir_root, "FedAvg", "--engine", "batched")
    assert own.engine.max_stack == 1
    stacked = build(digits_dir_root, "FedAvg", "--engine", "batched", "--engine_stack", "2")
    run_rounds(own, 1), run_rounds(stacked, 1)
    for pa, pb in zip(states(own), states(stacked)):
        for u, v in zip(pa, pb):
            torch.testing.assert_close(u, v, atol=1e-5, rtol=1e-4)


class LossOverridingClient(FedAvgClient):
    """Inherits FedAvg's declaration but changes the loss: must not be stacked."""

    def loss(self, x, y):
        return super().loss(x, y) * 2


def test_eligibility_is_declared_not_inherited(digits_root):
    server = build(digits_root, "FedAvg", "--engine", "batched")
    engine = BatchedEngine(server.cfg, max_stack=8)
    plain = server.clients[0]
    custom = LossOverridingClient(server.cfg, 1, server.data.clients[1], server.global_model)
    assert engine.split([plain, custom]) == ([plain], [custom])


def test_undeclared_algorithm_runs_sequentially_with_the_same_numbers(digits_root, tmp_path):
    """Ditto overrides the training procedure: with --engine batched it trains one by one, bit for bit."""
    from utils.results import read_h5

    for sub, engine in (("a", "sequential"), ("b", "batched")):
        assert main.main(cli(digits_root, tmp_path / sub, "-algo", "Ditto", "-gr", "1", "-lr", "0.05",
                             "--engine", engine)) == 0
    a, b = (read_h5(tmp_path / s / "Digits_Ditto_test_0.h5") for s in "ab")
    assert np.array_equal(a["rs_test_acc"], b["rs_test_acc"]) and np.array_equal(a["rs_train_loss"], b["rs_train_loss"])


def test_batched_non_finite_loss_is_a_clear_error(digits_root, tmp_path, capsys):
    for stack in ("8", "1"):
        assert main.main(cli(digits_root, tmp_path, "-gr", "1", "-lr", "1e12", "--engine", "batched",
                             "--engine_stack", stack)) == 2
        assert "training loss became" in capsys.readouterr().err


def test_batched_rejects_ray(digits_root):
    with pytest.raises(FLError, match="--executor sequential"):
        main.parse_config(cli(digits_root, digits_root, "--engine", "batched", "--executor", "ray"))


# ---- evaluation -------------------------------------------------------------------------------------
def test_sampled_train_loss_is_a_fixed_seeded_sample(digits_root):
    server = build(digits_root, "FedAvg", "--train_loss_eval", "sampled", "--train_loss_fraction", "0.25")
    c = server.clients[0]
    idx = c.train_loss_sample()
    assert len(idx) == int(np.ceil(0.25 * c.train_samples)) and len(set(idx.tolist())) == len(idx)
    assert torch.equal(idx, c.train_loss_sample())  # drawn once, kept
    again = build(digits_root, "FedAvg", "--train_loss_eval", "sampled", "--train_loss_fraction", "0.25")
    assert torch.equal(idx, again.clients[0].train_loss_sample())  # same seed, same sample
    loss_sum, n = c.train_metrics()
    with torch.no_grad():
        mean = torch.nn.functional.cross_entropy(c.model(c.x_train[idx]), c.y_train[idx])
    assert n == c.train_samples and loss_sum == pytest.approx(float(mean) * c.train_samples, rel=1e-5)


def test_sampled_with_everything_equals_full(digits_root):
    full = build(digits_root, "FedAvg").evaluate()
    sampled = build(digits_root, "FedAvg", "--train_loss_eval", "sampled", "--train_loss_fraction", "1").evaluate()
    assert sampled["train_loss"] == pytest.approx(full["train_loss"], rel=1e-6)
    assert sampled["test_acc"] == full["test_acc"]


# ---- mixed precision --------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["sequential", "batched"])
def test_amp_bf16_runs_on_cpu(digits_root, tmp_path, engine):
    from utils.results import read_h5

    assert main.main(cli(digits_root, tmp_path, "-gr", "1", "-lr", "0.1", "--amp", "bf16", "--engine", engine,
                         "-nc", "2", "-lbs", "50")) == 0
    h5 = read_h5(tmp_path / "Digits_FedAvg_test_0.h5")
    assert np.all(np.isfinite(h5["rs_train_loss"])) and h5["rs_train_loss"][-1] < h5["rs_train_loss"][0]


def test_amp_fp16_on_cpu_is_refused(digits_root, tmp_path, capsys):
    assert main.main(cli(digits_root, tmp_path, "-gr", "1", "--amp", "fp16")) == 2
    assert "--amp bf16" in capsys.readouterr().err


# ---- ALA with the classifier's inputs computed once ---------------------------------------------------
def test_ala_head_inputs_equal_the_full_forward(monkeypatch):
    """p = 1 on the CNN: training W on precomputed features gives the whole-model numbers."""
    from flcore.trainmodel.models import build_model
    from utils.ALA import ALA, adapted_names

    torch.manual_seed(0)
    glob = build_model("CNN", (1, 28, 28), 10, feature_dim=32)
    local = build_model("CNN", (1, 28, 28), 10, feature_dim=32)
    x, y = torch.randn(60, 1, 28, 28), torch.randint(0, 10, (60,))
    results = []
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(ALA, "head_inputs", lambda self, g, xs: None)
        target = build_model("CNN", (1, 28, 28), 10, feature_dim=32)
        target.load_state_dict(local.state_dict())
        ala = ALA(adapted_names(target, 1), eta=1.0, rand_percent=80, batch_size=10, max_epochs=4,
                  generator=torch.Generator().manual_seed(3))
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
def test_parked_client_round_trips_exactly(digits_root):
    from utils.clientstate import ClientStore

    server = build(digits_root, "FedALA", "--ala_max_epochs", "2")
    run_rounds(server, 2)  # ALA weights, trained models and advanced streams to carry
    c = server.clients[1]
    before = {k: v.clone() for k, v in c.model.state_dict().items()}
    weights = {k: v.clone() for k, v in c.ala.weights.items()}
    gen = c.batch_gen.get_state().clone()
    store = ClientStore("disk", capacity=1)
    store.park(c)
    assert "model" not in vars(c) and "ala" not in vars(c) and c.train_samples > 0  # identity stays
    assert all(torch.equal(v, before[k]) for k, v in c.model.state_dict().items())  # first use unparks
    assert all(torch.equal(v, weights[k]) for k, v in c.ala.weights.items())
    assert torch.equal(c.batch_gen.get_state(), gen) and store.loads == 1 and "parked_in" not in vars(c)


@pytest.mark.parametrize("mode", ["cpu", "disk"])
def test_parked_clients_give_the_same_run_with_a_round_of_memory(digits_dir_root, tmp_path, mode):
    from utils.results import read_h5

    args = ("-algo", "FedALA", "-gr", "2", "-lr", "0.05", "-jr", "0.34", "--ala_max_epochs", "2")
    assert main.main(cli(digits_dir_root, tmp_path / "a", *args)) == 0
    assert main.main(cli(digits_dir_root, tmp_path / "b", *args, "--client_state", mode)) == 0
    a, b = (read_h5(tmp_path / s / "Digits_FedALA_test_0.h5") for s in "ab")
    for key in a:
        if key != "rs_round_time":
            assert np.array_equal(a[key], b[key], equal_nan=True), key  # bit for bit
    server = build(digits_dir_root, "FedALA", "-jr", "0.34", "--client_state", mode, "--engine", "batched")
    run_rounds(server, 1)
    live = [c for c in server.clients if "parked_in" not in vars(c)]
    assert len(live) == server.executor.store.capacity == 2  # round(0.34 * 6) clients stay live


def test_tensor_pool_holds_equal_tensors_once():
    from utils.checkpoint import TensorPool, pack_state, unpack_state

    class Holder:
        pass

    pool = TensorPool(min_numel=16)
    w = torch.randn(8, 4, 3, 3)
    a, b, c = Holder(), Holder(), Holder()
    a.w, a.small = w.clone(), torch.ones(3)
    b.w = torch.nn.Parameter(w.clone())
    c.w = w.clone().to(memory_format=torch.channels_last)  # same values, other layout: kept apart
    blobs = []
    for h in (a, b, c):
        blobs.append((pack_state(h, {}, (), pool), pool.used))
    assert [len(u) for _, u in blobs] == [1, 1, 1]  # the 3-element tensor stays in the blob
    assert len(pool.entries) == 2 and pool.nbytes() == 2 * w.numel() * 4
    for h, (blob, used) in zip((a, b, c), blobs):
        restored = Holder()
        unpack_state(restored, blob, "cpu", {}, pool)
        pool.release(used)
        assert torch.equal(restored.w, w) and restored.w.stride() == h.w.stride()
        assert type(restored.w) is type(h.w) and restored.w is not h.w
    assert pool.entries == {} and pool.index == {}


def test_parked_fedavg_clients_share_the_broadcast_model(digits_dir_root):
    """After a broadcast every FedAvg client holds the global model: parked, they cost one copy."""
    server = build(digits_dir_root, "FedAvg", "-jr", "0.34", "--client_state", "cpu")
    run_rounds(server, 1)
    large = sum(p.numel() * 4 for p in server.global_model.parameters() if p.numel() >= 4096)
    store = server.executor.store
    assert len(store.blobs) == 4 and store.pool.nbytes() == large
