"""Details of the base server's loop that every algorithm inherits, each against a value written down or
computed here: the line naming the tensors ALA adapts, each round's recorded wall time, the progress bar,
and the summary of the clients that join after training (-nnc)."""
import copy
import time

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

import main
from conftest import QUICK, build_server as build, cli, plugin
from utils.results import read_h5
from runtime import checkpoint
from flcore import building
from runtime import loop
from runtime import client_steps


# Digits' default model is PFLlib's CNN: conv1, conv2, fc1, fc, each a weight and a bias; -p counts tensors
# from the end, --ala_layers layers from the top.
ALL = "conv1.0.weight, conv1.0.bias, conv2.0.weight, conv2.0.bias, fc1.0.weight, fc1.0.bias, fc.weight, fc.bias"


@pytest.mark.parametrize("flags,line", [
    (("-algo", "FedAvg", "-ala", "--ala_layers", "1"), "ALA adapts 2 tensor(s) (top 1 layer(s)): fc.weight, fc.bias"),
    (("-algo", "FedAvg", "-ala", "--ala_layers", "0"),
     "ALA adapts 8 tensor(s) (top all layer(s)): " + ALL),
    (("-algo", "FedALA", "-p", "1"), "ALA adapts 1 tensor(s) (last 1 tensor(s), -p): fc.bias"),
    (("-algo", "FedALA", "-p", "0"),
     "ALA adapts 8 tensor(s) (last all tensor(s), -p): " + ALL),
])
def test_the_start_up_line_names_what_ala_adapts_and_how_it_was_counted(flags, line, digits_tiny_root, tmp_path,
                                                                         capsys):
    build(digits_tiny_root, tmp_path, *flags)
    assert [x for x in capsys.readouterr().out.splitlines() if x.startswith("ALA adapts")] == [line]


def test_without_ala_nothing_is_said_about_it(digits_tiny_root, tmp_path, capsys):
    build(digits_tiny_root, tmp_path, "-algo", "FedAvg")
    assert "ALA" not in capsys.readouterr().out


def test_each_round_time_is_a_part_of_the_runs_wall_time(digits_tiny_root, tmp_path):
    start = time.perf_counter()
    assert main.main(cli(digits_tiny_root, tmp_path, *QUICK, "-gr", "3")) == 0
    wall = time.perf_counter() - start
    times = read_h5(tmp_path / "Digits_FedAvg_test_0.h5")["rs_round_time"]
    assert len(times) == 3 and all(t > 0 for t in times) and sum(times) < wall


@pytest.mark.parametrize("progress", [True, False])
def test_the_progress_bar_is_shown_only_with_progress_and_erased_when_the_run_ends(progress, digits_tiny_root,
                                                                                   tmp_path, capsys):
    flag = "--progress" if progress else "--no-progress"
    assert main.main(cli(digits_tiny_root, tmp_path, *QUICK, "-gr", "2", flag)) == 0
    err = capsys.readouterr().err
    assert ("FedAvg run 0:" in err) == progress
    if progress:  # the bar is written over with blanks, so the run's own lines stay the last thing shown
        assert err.endswith("\r") and not err.rsplit("\r", 2)[-2].strip()


def test_new_clients_summary_is_computed_from_their_own_test_splits(digits_tiny_root, tmp_path):
    """-nc 3 -nnc 2 -ften 0 with FedAvg: each new client is the final global model; its accuracy, the pooled
    accuracy and the sample-weighted AUC (scikit-learn's, on the flattened one-vs-rest decisions) by hand.
    The summary carries no training loss (new clients have none)."""
    server = build(digits_tiny_root, tmp_path, "-gr", "2", "-nnc", "2", "-ften", "0", clients=3, new=2)
    loop.train(server)
    got = loop.evaluate_new_clients(server)
    correct, n, auc = [], [], []
    with torch.no_grad():
        for d in server.data.new_clients:
            probs = torch.softmax(server.global_model(d.x_test), 1).numpy()
            onehot = np.eye(10)[d.y_test.numpy()]
            correct.append(int((probs.argmax(1) == d.y_test.numpy()).sum()))
            n.append(len(d.y_test))
            auc.append(roc_auc_score(onehot.ravel(), probs.ravel()))
    acc = np.array(correct) / np.array(n)
    assert "train_loss" not in got
    assert got["client_test_acc"].tolist() == pytest.approx(acc.tolist(), abs=1e-12)
    assert got["test_acc"] == pytest.approx(sum(correct) / sum(n), abs=1e-12)
    assert got["test_acc_mean"] == pytest.approx(acc.mean(), abs=1e-12)
    assert got["test_auc"] == pytest.approx(np.dot(auc, n) / sum(n), abs=1e-9)
    assert len(set(n)) == 2 and len(set(auc)) == 2  # unequal sizes and AUCs: a swapped column shows


def test_the_new_clients_line_is_printed_and_their_series_is_on_disk_when_the_call_returns(digits_tiny_root,
                                                                                           tmp_path, capsys):
    """-nnc: one printed line with the count, the fine-tuning epochs and the figures, and the ``new`` series
    already in the run's file when ``evaluate_new_clients`` returns (a run stopped after it keeps them)."""
    from utils.results import RunRecorder

    recorder = RunRecorder("new", {}, tmp_path)
    server = build(digits_tiny_root, tmp_path, "-nnc", "2", "-ften", "0", clients=3, new=2, recorder=recorder)
    got = loop.evaluate_new_clients(server)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("new clients")]
    assert lines == [f"new clients (2, 0 fine-tuning epoch(s)) | acc {got['test_acc']:.4f} (clients "
                     f"{got['test_acc_mean']:.4f} ± {got['test_acc_std']:.4f}, worst {got['test_acc_min']:.4f}) "
                     f"| auc {got['test_auc']:.4f}"]
    saved = read_h5(recorder.h5_path)
    assert list(saved["rs_new_test_acc"]) == [got["test_acc"]]
    assert saved["rs_new_client_test_acc"].tolist() == [got["client_test_acc"].tolist()]


def test_an_evaluation_pools_every_clients_own_metrics_and_the_benign_ones_apart(digits_tiny_root, tmp_path,
                                                                                 capsys):
    """One evaluation with an attack and a validation split, after a round of training: every pooled figure
    from the clients' own (correct, samples, AUC), (loss sum, samples) and validation counts, by hand; the
    benign series over the clients the attack did not take; the printed line carries each of them."""
    server = build(digits_tiny_root, tmp_path, "-gr", "1", "--attack", "signflip", "--attack_frac", "0.4",
                   "--val_ratio", "0.2")
    loop.run_round(server, 0)
    capsys.readouterr()
    tests = [client_steps.test_metrics(c) for c in server.clients]
    trains = [client_steps.train_metrics(c) for c in server.clients]
    vals = [client_steps.val_metrics(c) for c in server.clients]
    bad = set(plugin(server, "Attack").malicious)
    benign = [i for i in range(len(server.clients)) if i not in bad]
    assert 0 < len(bad) < len(server.clients)

    def pooled(ids):
        n = sum(tests[i][1] for i in ids)
        return (sum(tests[i][0] for i in ids) / n, sum(tests[i][2] * tests[i][1] for i in ids) / n,
                sum(trains[i][0] for i in ids) / sum(trains[i][1] for i in ids))

    got = loop.evaluate(server)
    everyone = range(len(server.clients))
    assert (got["test_acc"], got["test_auc"], got["train_loss"]) == pytest.approx(pooled(everyone), abs=1e-12)
    assert ((got["benign_test_acc"], got["benign_test_auc"], got["benign_train_loss"])
            == pytest.approx(pooled(benign), abs=1e-12))
    assert pooled(benign) != pytest.approx(pooled(everyone), abs=1e-6)  # the benign figures are their own
    assert "benign_client_test_acc" not in got
    assert got["val_acc"] == pytest.approx(sum(v[0] for v in vals) / sum(v[1] for v in vals), abs=1e-12)
    loop.record(server, got)
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"round    0 | benign acc {got['benign_test_acc']:.4f}, all acc {got['test_acc']:.4f} ")
    assert line.endswith(f" | val acc {got['val_acc']:.4f} | auc {got['test_auc']:.4f} | train loss "
                         f"{got['train_loss']:.4f}")  # the attack's figures lead the line and nothing trails it


@pytest.mark.parametrize("flags,f", [
    (("--aggregator", "multikrum"), 0),  # nobody is known to be malicious
    (("--aggregator", "multikrum", "--attack", "signflip", "--attack_frac", "0.2"), 1),  # the malicious count
    (("--aggregator", "multikrum", "--attack", "signflip", "--attack_frac", "0.2", "--krum_f", "0"), 0),  # given
    (("--aggregator", "trimmed_mean", "--trim_frac", "0.2"), 0),
])
def test_the_aggregator_gets_the_flags_and_the_krum_f_the_attack_implies(flags, f, digits_tiny_root, tmp_path,
                                                                         monkeypatch):
    from plugins import aggregators as robust

    seen = []
    aggregate = robust.aggregate

    def recording(states, weights, rule, keys, trim_frac, krum_f, *rest):
        seen.append((rule, trim_frac, krum_f, list(weights)))
        return aggregate(states, weights, rule, keys, trim_frac, krum_f, *rest)

    monkeypatch.setattr(robust, "aggregate", recording)
    server = build(digits_tiny_root, tmp_path, "-gr", "1", *flags)
    loop.run_round(server, 0)
    cfg = server.cfg
    assert seen == [(cfg.aggregator, cfg.trim_frac, f, [c.train_samples for c in server.clients])]
    assert cfg.trim_frac != f  # so trim_frac and f swapped would show


def test_selection_drop_out_and_the_initial_model_come_from_the_runs_own_streams(digits_tiny_root, tmp_path):
    """--seed 3, run 1 (seed and run unequal, so a swap of the two shows): the round's selection, the clients
    that drop out (-cdr) and the initial model are the draws of (3, 1, "select"), (3, 1, "drop") and
    (3, 1, "model"), by hand."""
    from flcore.trainmodel.models import build_model
    from utils.seeding import np_rng, torch_seeded
    from utils.selection import select

    server = build(digits_tiny_root, tmp_path, "--seed", "3", "-jr", "0.6", "-cdr", "0.5", run=1)
    pick, drop = np_rng(3, 1, "select"), np_rng(3, 1, "drop")
    for _ in range(3):
        chosen = select(server.cfg, 5, pick).tolist()
        selected = server.select_clients()
        assert [c.id for c in selected] == chosen
        kept = [i for i, u in zip(chosen, drop.random(len(chosen))) if u >= 0.5]
        assert [c.id for c in loop.active_clients(server, selected)] == kept
    with torch_seeded(3, 1, "model"):
        want = build_model("CNN", server.data.input_shape, server.data.num_classes, server.cfg.feature_dim,
                           server.cfg.vocab_size, config=server.data.config)
    got = building.initial_model(server).state_dict()
    assert all(torch.equal(v, got[k]) for k, v in want.state_dict().items())


def test_each_architecture_starts_from_its_own_seeded_draw(digits_tiny_root, tmp_path):
    """--client_models CNN1,CNN3 at --seed 3, run 1: each architecture's initial model is the draw of
    (3, 1, "client-model", its name), built by hand, and the clients of one architecture share it."""
    from flcore.trainmodel.models import build_client_model
    from utils.seeding import torch_seeded

    server = build(digits_tiny_root, tmp_path, "-algo", "Local", "--client_models", "CNN1,CNN3", "--seed", "3", run=1)
    built = building.client_models(server)
    d = server.data
    for cid, name in enumerate(["CNN1", "CNN3", "CNN1", "CNN3", "CNN1"]):
        with torch_seeded(3, 1, "client-model", name):
            want = build_client_model(name, d.input_shape, d.num_classes, server.cfg.feature_dim,
                                      server.cfg.vocab_size, config=d.config)
        got = built[cid].state_dict()
        assert all(torch.equal(v, got[k]) for k, v in want.state_dict().items()), (cid, name)


def test_a_saved_state_rebuilds_a_model_the_constructor_does_not_make_and_names_what_it_refuses(digits_tiny_root,
                                                                                                 tmp_path):
    """A module an algorithm adds after construction comes back through ``new_module`` (a copy of the global
    model, its saved entries loaded); a saved value of the wrong kind is refused naming it under "server"."""
    from runtime.state import StateError

    server = build(digits_tiny_root, tmp_path)
    server.later = copy.deepcopy(server.global_model)  # a model the constructor does not make
    with torch.no_grad():
        next(server.later.parameters()).add_(1.0)
    saved = checkpoint.server_state(server)
    fresh = build(digits_tiny_root, tmp_path)
    checkpoint.load_server_state(fresh, saved)
    assert all(torch.equal(v, fresh.later.state_dict()[k]) for k, v in server.later.state_dict().items())
    assert fresh.later is not fresh.global_model
    with pytest.raises(StateError, match=r"^server\.global_model: a Module in this run, a int in the saved state"):
        checkpoint.load_server_state(build(digits_tiny_root, tmp_path), {**saved, "global_model": 3})
    # the run index must be this run's (SERVER_FIXED); the clients' architectures are built from the flags
    # (SERVER_BUILT): a saved list where this run's flags build none is another run's state
    with pytest.raises(StateError, match=r"^server\.run: saved '1', this run's is 0 \(a state of another client"):
        checkpoint.load_server_state(build(digits_tiny_root, tmp_path), {**saved, "run": 1})
    with pytest.raises(StateError, match=r"^server\.client_model_names: this run's flags build none"):
        checkpoint.load_server_state(build(digits_tiny_root, tmp_path), {**saved, "client_model_names": ["CNN1"]})


def test_a_checkpoints_identity_is_the_runs_index_seed_algorithm_dataset_and_split(digits_tiny_root, tmp_path):
    """Run 2 of seed 5: the run's own seed is 5 + 2 (the seed each run of -t draws from)."""
    server = build(digits_tiny_root, tmp_path, "--seed", "5", run=2)
    assert checkpoint.identity(server) == {"run": 2, "seed": 7, "algorithm": "FedAvg", "dataset": "Digits",
                                           "split": server.data.config_hash}


def test_a_server_fresh_from_its_constructor_is_at_round_0_having_moved_and_averaged_nothing(digits_tiny_root,
                                                                                             tmp_path):
    """What a signal before the first round reports (main.py: "interrupted in round 0") and what the first
    round starts from."""
    server = build(digits_tiny_root, tmp_path)
    assert server.round_idx == 0 and server.bytes_down == server.bytes_up == 0 and server.averaged is False
    assert server.selected == [] and server.late == []


def test_clients_that_join_late_get_architectures_too(digits_tiny_root, tmp_path):
    """--client_models assigns ids 0 .. N-1 of the trained clients and then the -nnc new ones, in turn."""
    server = build(digits_tiny_root, tmp_path, "-algo", "Local", "--client_models", "CNN1,CNN3", "-nnc", "2",
                   "-ften", "0", clients=3, new=2)
    assert server.client_model_names == ["CNN1", "CNN3", "CNN1", "CNN3", "CNN1"]
    assert len(loop.evaluate_new_clients(server)["client_test_acc"]) == 2


def test_checkpoints_are_taken_every_ce_rounds_and_after_the_last(digits_tiny_root, tmp_path, monkeypatch):
    """-gr 7 --checkpoint_every 3: after rounds 2 and 5 (every third), and after round 6, the last."""
    server = build(digits_tiny_root, tmp_path, "-gr", "7", "--checkpoint_every", "3", "--train_loss_eval", "off",
                   "-eg", "7")
    saved = []
    monkeypatch.setattr(server.checkpoints, "save", lambda s, t: saved.append((s is server, t)))
    loop.train(server)
    assert saved == [(True, 2), (True, 5), (True, 6)]


@pytest.mark.parametrize("flags,acc,stop", [
    ((), [0.9, 0.5, 0.4, 0.3], False),  # without -ab nothing stops a run
    (("-ab", "-tc", "1"), [], False),  # nothing evaluated yet
    (("-ab", "-tc", "1"), [0.5, 0.9, 0.4], False),  # the best is one evaluation old: not more than -tc
    (("-ab", "-tc", "1"), [0.9, 0.5, 0.4], True),  # two old
    (("-ab", "-tc", "2"), [0.9, 0.5, 0.4], False),
    (("-ab", "-tc", "0"), [0.9, 0.5], True),
    (("-ab", "-tc", "0"), [0.5, 0.9], False),  # the best is the latest
    (("-ab", "-tc", "0"), [0.9, 0.9], True),  # a tie is not an improvement: the best is the first
])
def test_auto_break_stops_once_the_best_accuracy_is_more_than_tc_evaluations_old(flags, acc, stop, digits_tiny_root,
                                                                                  tmp_path):
    from types import SimpleNamespace

    server = build(digits_tiny_root, tmp_path, *flags)
    assert loop.should_stop(server) is False  # no recorder (a run without result files): never
    server.recorder = SimpleNamespace(series={"rs_test_acc": acc})
    assert loop.should_stop(server) is stop


def test_a_run_of_one_client_reports_what_ala_adapts(digits_tiny_root, tmp_path, capsys):
    server = build(digits_tiny_root, tmp_path, "-algo", "FedALA", "-p", "1", clients=1)
    assert len(server.clients) == 1
    assert "ALA adapts 1 tensor(s) (last 1 tensor(s), -p): fc.bias" in capsys.readouterr().out


def test_a_one_client_run_checks_its_architectures_on_its_own_sample(digits_tiny_root, tmp_path):
    """The shapes an algorithm exchanges (FD: logits) come from one forward pass of a sample of the first
    client's data, so a run of one client builds (and its model answers the split's ten classes)."""
    server = build(digits_tiny_root, tmp_path, "-algo", "FD", "--client_models", "CNN1,CNN3", clients=1)
    x = server.data.clients[0].x_train[:3]
    assert server.client_model_names == ["CNN1"] and server.clients[0].model(x).shape == (3, 10)
