"""Attacks (--attack, plugins/attack.py and plugins/attacks.py): the seeded malicious set and its record, label flipping of exactly the
malicious clients' training labels, the upload attacks against hand computation, and benign accuracy."""
import json

import numpy as np
import pytest
import torch

import main
from cli import parse_config
from conftest import cli, opened, plugin
from flcore.servers.serverbase import Server
from test_executors import build
from plugins.attacks import malicious_clients
from utils.data_utils import load_split
from utils.results import read_h5
from runtime import loop


def test_the_malicious_set_is_seeded_fixed_and_sized():
    a = malicious_clients(3, 0, 20, 0.2)
    assert a == malicious_clients(3, 0, 20, 0.2) and len(a) == 4 and a == sorted(set(a)) and 0 <= a[0] and a[-1] < 20
    others = {tuple(malicious_clients(s, 0, 20, 0.2)) for s in range(4, 12)}
    assert len(others) > 1  # the seed moves it
    assert len(malicious_clients(3, 0, 20, 0.33)) == 7  # round(6.6)


def test_labelflip_flips_only_the_malicious_clients_training_labels(digits_tiny_root):
    server = build(digits_tiny_root, "FedAvg", "--attack", "labelflip", "--attack_frac", "0.4")
    data = load_split("Digits", digits_tiny_root)
    bad = plugin(server, "Attack").malicious
    assert len(bad) == 2
    for c, d in zip(server.clients, data.clients):
        want = 9 - d.y_train if c.id in bad else d.y_train
        assert torch.equal(c.y_train, want), c.id
        assert torch.equal(c.y_test, d.y_test)


def uploads_before_and_after_the_attack(root, monkeypatch, *flags):
    """Round 0's uploads as the clients sent them and as the server aggregates them, and the global model."""
    server = build(root, "FedAvg", "-m", "BNCNN", "--train_loss_eval", "off", *flags)
    sent, seen = [], []
    receive = loop.receive
    monkeypatch.setattr(loop, "receive",
                        lambda self, clients: sent.extend(receive(self, clients)) or list(sent))
    average = server.average_uploads
    monkeypatch.setattr(server, "average_uploads", lambda uploads: (seen.extend(opened(uploads)), average(uploads)))
    glob = {k: v.clone() for k, v in server.global_model.state_dict().items()}
    loop.run_round(server, 0)
    return server, {u.id: u.state for u in sent}, {u.id: u.state for u in seen}, glob


@pytest.mark.parametrize("kind,scale", [("signflip", -2.0), ("scaled", 3.0)])
def test_signflip_and_scaled_uploads_by_hand(kind, scale, digits_tiny_root, monkeypatch):
    s = abs(scale)
    server, sent, seen, glob = uploads_before_and_after_the_attack(
        digits_tiny_root, monkeypatch, "--attack", kind, "--attack_frac", "0.4", "--attack_scale", str(s))
    params = {k for k, _ in server.global_model.named_parameters()}
    bad = set(plugin(server, "Attack").malicious)
    for cid, state in seen.items():
        for k, v in state.items():
            if cid in bad and k in params:  # W + scale (W_i - W): signflip W - 2 (W_i - W), scaled W + 3 (W_i - W)
                want = glob[k] + scale * (sent[cid][k] - glob[k])
                assert torch.allclose(v, want, atol=1e-6), (cid, k)
            else:  # benign uploads, and BatchNorm statistics and counters, as trained
                assert torch.equal(v, sent[cid][k]), (cid, k)
    assert any("running_var" in k for k in glob)


def test_gaussian_uploads_are_the_global_model_plus_seeded_noise(digits_tiny_root, monkeypatch):
    runs = [uploads_before_and_after_the_attack(digits_tiny_root, monkeypatch, "--attack", "gaussian",
                                                "--attack_frac", "0.4", "--attack_scale", "0.5") for _ in range(2)]
    server, sent, seen, glob = runs[0]
    bad = plugin(server, "Attack").malicious
    params = [k for k, _ in server.global_model.named_parameters()]
    noise = torch.cat([(seen[c][k] - glob[k]).flatten() for c in bad for k in params])
    assert abs(float(noise.std()) - 0.5) < 0.01 and abs(float(noise.mean())) < 0.01  # N(0, 0.5^2)
    assert all(torch.equal(seen[c][k], runs[1][2][c][k]) for c in bad for k in seen[c])  # the same seeded draw


def test_benign_accuracy_excludes_the_malicious_clients(digits_tiny_root, tmp_path):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", "--attack", "signflip", "--attack_frac", "0.4")) == 0
    series = read_h5(tmp_path / "Digits_FedAvg_test_0.h5")
    meta = json.loads((tmp_path / "Digits_FedAvg_test_0.json").read_text())
    bad = meta["malicious_clients"]
    assert bad == malicious_clients(0, 0, 5, 0.4)
    n_test = np.array([len(c.y_test) for c in load_split("Digits", digits_tiny_root).clients])
    acc = series["rs_client_test_acc"]  # rounds x clients
    ok = np.array([i not in bad for i in range(5)])
    for r in range(2):
        assert np.isclose(series["rs_benign_test_acc"][r], (acc[r] * n_test)[ok].sum() / n_test[ok].sum())
        assert np.isclose(series["rs_benign_test_acc_mean"][r], acc[r][ok].mean())
        assert np.isclose(series["rs_test_acc"][r], (acc[r] * n_test).sum() / n_test.sum())  # all clients


def test_without_an_attack_nothing_is_recorded(digits_tiny_root, tmp_path):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1")) == 0
    assert "malicious_clients" not in json.loads((tmp_path / "Digits_FedAvg_test_0.json").read_text())
    assert not any(k.startswith("rs_benign") for k in read_h5(tmp_path / "Digits_FedAvg_test_0.h5"))


def test_labelflip_applies_to_an_algorithm_that_averages_no_model(digits_tiny_root, tmp_path):
    cfg = parse_config(cli(digits_tiny_root, tmp_path, "-algo", "FedProto", "--attack", "labelflip"))
    assert cfg.attack_frac == 0.2
