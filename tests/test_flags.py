"""Common flags, each checked for what it does: -rjr (and the expected participation FedPHP reads),
-ld / -ldg, -ab / -tc, -sfn, and a BatchNorm model (-m BNCNN) in a full run."""
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import main
from cli import parse_config
from conftest import cli
from flcore.registry import get_server_class
from flcore.trainmodel.models import build_model
from runtime.executors import SequentialExecutor
from utils.data_utils import load_split
from utils.results import read_h5
from utils.selection import expected_count
from runtime import loop

FAST = ("-lbs", "20", "--train_loss_eval", "off")


def make_server(root, *flags, algo="FedAvg"):
    """A server whose clients are objects in this process (their attributes can be read)."""
    cfg = parse_config(cli(root, root, "--executor", "sequential", "-algo", algo, *flags))
    return get_server_class(algo)(cfg.replace(num_classes=10), load_split("Digits", root))


def run_main(root, out, *flags, stem="Digits_FedAvg_test_0"):
    assert main.main(cli(root, out, *flags)) == 0
    return read_h5(out / f"{stem}.h5")


def train_sizes(root, n):
    return np.array([len(np.load(root / "Digits" / "train" / f"{i}.npz", allow_pickle=False)["y"])
                     for i in range(n)])


# ---- -jr / -rjr -------------------------------------------------------------------------------------------
def test_random_join_ratio_draws_the_count_uniformly(digits_root):
    """5 clients, -jr 0.4: int(2.0) = 2 per round; with -rjr a count in {2, 3, 4, 5}, each equally likely
    (mean 3.5, std 1.118: the mean of 2,000 draws is within 0.1 of it with overwhelming probability)."""
    fixed = make_server(digits_root, "-jr", "0.4", "-gr", "1")
    assert {len(fixed.select_clients()) for _ in range(200)} == {2}
    server = make_server(digits_root, "-jr", "0.4", "-rjr", "-gr", "1")
    picks = [server.select_clients() for _ in range(2000)]
    counts = np.array([len(p) for p in picks])
    assert set(counts.tolist()) == {2, 3, 4, 5}
    assert abs(counts.mean() - 3.5) < 0.1
    assert min(np.bincount(counts)[2:]) > 400  # each value about 500 times
    assert all(len({c.id for c in p}) == len(p) for p in picks)  # without replacement
    every = make_server(digits_root, "-jr", "1", "-rjr", "-gr", "1")
    assert {len(every.select_clients()) for _ in range(50)} == {5}  # [N, N]


@pytest.mark.parametrize("jr,rjr,n,want", [
    (0.4, False, 5, 2.0), (0.4, True, 5, 3.5),  # [2, 5]
    (0.1, False, 20, 2.0), (0.1, True, 20, 11.0),  # [2, 20]
    (0.01, False, 5, 1.0), (0.01, True, 5, 3.0),  # at least one: [1, 5]
    (1.0, True, 7, 7.0), (0.5, False, 10, 5.0),
    (0.1, False, 15, 1.0), (0.35, False, 10, 3.0), (0.35, True, 10, 6.5)])  # truncated as PFLlib: int(1.5), int(3.5)
def test_expected_count_by_hand(jr, rjr, n, want):
    assert expected_count(SimpleNamespace(join_ratio=jr, random_join_ratio=rjr), n) == want


@pytest.mark.parametrize("flags,participations", [
    (("-jr", "0.4"), 4),  # 2 of 5 clients for 10 rounds: 4 participations expected
    (("-jr", "0.4", "-rjr"), 7),  # 3.5 of 5 per round: 7
    (("-jr", "1"), 10)])
def test_fedphp_momentum_uses_the_expected_participations(digits_root, flags, participations):
    """μ_τ = min(μ τ / (ρ R), μ) with μ = 0.9, R = 10 rounds and ρ R the expected participations."""
    server = make_server(digits_root, *flags, "-gr", "10", "-mu", "0.9", algo="FedPHP")
    client = server.clients[3]
    for tau in range(12):
        client.train_time = [0.0] * tau  # tau earlier participations
        assert client.momentum() == pytest.approx(min(0.9 * tau / participations, 0.9), abs=1e-12), tau


# ---- -ld / -ldg ------------------------------------------------------------------------------------------
def test_learning_rate_decays_with_the_round(digits_root):
    """-lr 0.1 -ldg 0.5: whoever trains in round t does so at 0.1 * 0.5^t, also the first time it trains."""
    server = make_server(digits_root, *FAST, "-jr", "0.4", "-lr", "0.1", "-ld", "-ldg", "0.5", "-gr", "4")
    plain = make_server(digits_root, *FAST, "-jr", "0.4", "-lr", "0.1", "-gr", "4")
    first_round = {}
    for t, want in enumerate([0.1, 0.05, 0.025, 0.0125]):
        loop.run_round(server, t)
        loop.run_round(plain, t)
        assert len(server.selected) == 2
        for c in server.selected:
            assert c.optimizer.param_groups[0]["lr"] == want, (t, c.id)
            first_round.setdefault(c.id, t)
        assert [c.optimizer.param_groups[0]["lr"] for c in plain.selected] == [0.1, 0.1]
    assert max(first_round.values()) >= 1  # a client that first trains late starts decayed, not at 0.1


def test_learning_rate_decay_changes_a_run(digits_root, tmp_path):
    """Round 0 trains at 0.1 * 0.5^0 either way, so the evaluations at rounds 0 and 1 agree; the final one,
    after round 1 (0.05 against 0.1), differs."""
    flags = ("-lbs", "20", "-gr", "2", "-lr", "0.1", "-ldg", "0.5")
    plain = run_main(digits_root, tmp_path / "plain", *flags)
    decay = run_main(digits_root, tmp_path / "decay", *flags, "-ld")
    assert np.array_equal(plain["rs_train_loss"][:2], decay["rs_train_loss"][:2])
    assert plain["rs_train_loss"][2] != decay["rs_train_loss"][2]


# ---- -ab / -tc -------------------------------------------------------------------------------------------
def test_auto_break_stops_once_the_best_is_older_than_top_cnt(digits_noniid_root, tmp_path):
    """Local on two classes per client plateaus near 1.0 within a few rounds. With -tc 1 the run stops as
    soon as the best accuracy (first reached) is more than one evaluation old, then evaluates once more."""
    h5 = run_main(digits_noniid_root, tmp_path, *FAST, "-algo", "Local", "-gr", "30", "-lr", "0.05", "-ab",
                  "-tc", "1", stem="Digits_Local_test_0")
    acc, rounds = list(h5["rs_test_acc"]), list(h5["rs_round"])
    assert len(acc) < 30 + 1  # stopped early
    assert rounds == list(range(len(acc)))  # -eg 1: every round, then the final evaluation
    in_loop = acc[:-1]  # the evaluations the stopping rule saw
    best, age, stop = -1.0, 0, None
    for i, a in enumerate(in_loop):
        best, age = (a, 0) if a > best else (best, age + 1)
        if age > 1:
            stop = i
            break
    assert stop == len(in_loop) - 1, (stop, in_loop)  # not one evaluation earlier, not later
    assert max(in_loop) > 0.9


# ---- -sfn ------------------------------------------------------------------------------------------------
def test_save_folder_holds_the_final_global_model(digits_root, tmp_path):
    folder = tmp_path / "res" / "models"  # -sfn is a folder under --results_dir
    flags = cli(digits_root, tmp_path / "res", *FAST, "-gr", "2", "-lr", "0.1", "--executor", "sequential",
                "-sfn", "models")
    assert main.main(flags) == 0
    saved = torch.load(folder / "Digits_FedAvg_test_0_server.pt", weights_only=True)
    # a second identical run, built here, and its aggregated model
    cfg = parse_config(flags)
    data = load_split("Digits", digits_root)
    server = get_server_class("FedAvg")(cfg.replace(num_classes=10), data, 0, None, SequentialExecutor())
    initial = {k: v.clone() for k, v in server.global_model.state_dict().items()}
    loop.train(server)
    final = server.global_model.state_dict()
    assert saved.keys() == final.keys()
    assert all(torch.equal(saved[k], final[k]) for k in final)
    assert not all(torch.equal(saved[k], initial[k]) for k in initial)  # trained, not the initial model
    model = build_model("CNN", data.input_shape, 10)
    model.load_state_dict(saved)
    x = data.clients[0].x_test
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), server.global_model.eval()(x))


# ---- a BatchNorm model ---------------------------------------------------------------------------------
def test_bncnn_learns_in_a_full_run(digits_root, tmp_path):
    h5 = run_main(digits_root, tmp_path, *FAST, "-m", "BNCNN", "-gr", "2", "-lr", "0.05")
    assert h5["rs_test_acc"][-1] > 0.7, h5["rs_test_acc"]  # chance is 0.1
    assert json.loads((tmp_path / "Digits_FedAvg_test_0.json").read_text())["config"]["model"] == "BNCNN"


def test_bncnn_running_statistics_are_sample_weighted(digits_noniid_root, monkeypatch):
    """After one round the global BN statistics are Σ n_i s_i / Σ n_i over the uploads, with n_i the
    clients' training samples read from the split; num_batches_tracked is each client's ceil(n_i / 20)
    batches, averaged and rounded."""
    server = make_server(digits_noniid_root, *FAST, "-m", "BNCNN", "-gr", "1", "-lr", "0.05")
    uploads = []
    aggregate = server.aggregate

    def record(ups):
        uploads.extend((u.id, u.weight, {k: v.detach().clone() for k, v in u.state.items()}) for u in ups)
        aggregate(ups)

    monkeypatch.setattr(server, "aggregate", record)
    loop.run_round(server, 0)
    n = train_sizes(digits_noniid_root, 6)
    assert [u[0] for u in uploads] == list(range(6)) and [u[1] for u in uploads] == n.tolist()
    glob = server.global_model.state_dict()
    stats = [k for k in glob if k.endswith(("running_mean", "running_var"))]
    assert len(stats) == 4  # two BatchNorm layers
    for k in stats:
        per_client = np.stack([u[2][k].double().numpy() for u in uploads])
        want = (n[:, None] * per_client).sum(0) / n.sum()
        assert np.allclose(glob[k].double().numpy(), want, rtol=1e-5, atol=1e-7), k
        assert not np.allclose(per_client.mean(0), want, rtol=1e-3)  # the weights matter here
        assert np.ptp(per_client, axis=0).max() > 1e-2  # clients' statistics differ
    for k in (k for k in glob if k.endswith("num_batches_tracked")):
        batches = np.array([int(u[2][k]) for u in uploads])
        assert batches.tolist() == [math.ceil(m / 20) for m in n]
        assert int(glob[k]) == round(float((n * batches).sum() / n.sum()))


def test_relative_save_folder_goes_under_the_results_folder(digits_tiny_root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main.main(cli(digits_tiny_root, tmp_path / "res", "-gr", "1", "--executor", "sequential",
                         "-sfn", "items")) == 0
    assert (tmp_path / "res" / "items" / "Digits_FedAvg_test_0_server.pt").exists()
    assert not (tmp_path / "items").exists()  # nothing written relative to the working directory
