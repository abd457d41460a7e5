"""The pixel-trigger backdoor with model replacement (--attack backdoor, utils/backdoor.py): the trigger, the
poisoned share of exactly the malicious clients' training data, the boosted upload and the attack success
rate, against hand computations and a loop written here."""
import json

import numpy as np
import pytest
import torch

import main
from conftest import cli, plugin
from test_attacks import uploads_before_and_after_the_attack
from test_executors import build
from utils import backdoor
from utils.data_utils import load_split
from utils.results import read_h5
from utils.seeding import torch_gen
from runtime import loop


def test_stamp_sets_the_bottom_right_square_only():
    x = torch.zeros(2, 1, 5, 5)
    out = backdoor.stamp(x, 2, torch.ones(1, 1, 1))
    assert out[:, :, 3:, 3:].eq(1).all() and out.sum() == 2 * 4  # 2 images x a 2 x 2 square
    assert x.sum() == 0  # a copy
    rgb = backdoor.stamp(torch.zeros(1, 3, 4, 4), 1, torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1))
    assert rgb[0, :, 3, 3].tolist() == [1.0, 2.0, 3.0] and rgb.sum() == 6


def test_white_is_pixel_255_after_normalisation():
    assert backdoor.white_value((1, 28, 28), {"mean": [0.5], "std": [0.5]}).flatten().tolist() == [1.0]
    w = backdoor.white_value((3, 8, 8), {"mean": [0.2, 0.5, 0.0], "std": [0.4, 0.25, 1.0]})
    assert w.shape == (3, 1, 1) and w.flatten().tolist() == pytest.approx([2.0, 2.0, 1.0])  # (1 - m) / s
    assert backdoor.white_value((1, 8, 8), None).flatten().tolist() == [1.0]
    assert backdoor.white_value((60,), None) is None  # not an image


def test_poison_training_stamps_and_relabels_a_seeded_share():
    x, y = torch.zeros(10, 1, 4, 4), torch.arange(10) % 3
    px, py = backdoor.poison_training(x, y, 2, 0.5, 2, torch.ones(1, 1, 1), torch_gen(0, 0, "backdoor", 1))
    chosen = torch.randperm(10, generator=torch_gen(0, 0, "backdoor", 1))[:5]  # the same stream's first 5
    hit = torch.zeros(10, dtype=torch.bool)
    hit[chosen] = True
    assert py[hit].eq(2).all() and torch.equal(py[~hit], y[~hit])
    assert px[hit][:, :, 2:, 2:].eq(1).all() and px[hit].sum() == 5 * 4 and px[~hit].sum() == 0
    assert x.sum() == 0 and torch.equal(y, torch.arange(10) % 3)  # inputs untouched


def test_success_counts_by_hand():
    x = torch.zeros(4, 1, 3, 3)
    y = torch.tensor([0, 1, 2, 1])
    white = torch.ones(1, 1, 1)

    def fooled_first_two(imgs):  # classifies as 0 the first two it is given, 1 the rest
        out = torch.zeros(len(imgs), 3)
        out[:2, 0] = 1
        out[2:, 1] = 1
        return out

    # target 0: eligible are the 3 images labelled 1, 2, 1; the first two of them go to 0
    assert backdoor.success_counts(fooled_first_two, x, y, 0, 1, white) == (2, 3)
    # a model that reads the trigger: class 1 when the corner is white
    reads = lambda imgs: torch.nn.functional.one_hot((imgs[:, 0, 2, 2] == 1).long(), 3).float()  # noqa: E731
    assert backdoor.success_counts(reads, x, y, 1, 1, white) == (2, 2)  # labels 0 and 2, both to 1
    assert backdoor.success_counts(reads, x, torch.ones(4, dtype=torch.long), 1, 1, white) == (0, 0)


def test_replacement_boost():
    assert backdoor.replacement_boost(20, 1) == 20.0  # the paper's n / η
    assert backdoor.replacement_boost(20, 4) == 5.0  # four attackers share one replacement
    assert backdoor.replacement_boost(10, 2, eta=0.5) == 10.0


def test_only_the_malicious_clients_train_on_triggered_images(digits_tiny_root):
    server = build(digits_tiny_root, "FedAvg", "--attack", "backdoor", "--attack_frac", "0.4",
                   "--backdoor_target", "3", "--backdoor_frac", "0.5", "--trigger_size", "2")
    data = load_split("Digits", digits_tiny_root)
    bad = plugin(server, "Attack").malicious
    assert len(bad) == 2
    for c, d in zip(server.clients, data.clients):
        changed = (c.y_train != d.y_train) | (c.x_train != d.x_train).flatten(1).any(1)
        if c.id in bad:
            n = len(d.y_train)
            chosen = torch.randperm(n, generator=torch_gen(0, 0, "backdoor", c.id))[:round(0.5 * n)]
            assert c.y_train[chosen].eq(3).all() and (c.x_train[chosen][:, :, -2:, -2:] == c.white).all()
            rest = torch.ones(n, dtype=torch.bool)
            rest[chosen] = False
            assert not changed[rest].any()
        else:
            assert not changed.any(), c.id
        assert torch.equal(c.y_test, d.y_test) and torch.equal(c.x_test, d.x_test)


def test_malicious_uploads_are_boosted_by_n_over_k(digits_tiny_root, monkeypatch):
    server, sent, seen, glob = uploads_before_and_after_the_attack(digits_tiny_root, monkeypatch, "--attack", "backdoor",
                                                                   "--attack_frac", "0.4")
    params = {k for k, _ in server.global_model.named_parameters()}
    bad = set(plugin(server, "Attack").malicious)
    for cid, state in seen.items():
        for k, v in state.items():
            if cid in bad and k in params:  # n = 5 uploads, k = 2 attackers: W + 2.5 (W_i - W)
                assert torch.allclose(v, glob[k] + 2.5 * (sent[cid][k] - glob[k]), atol=1e-6), (cid, k)
            else:
                assert torch.equal(v, sent[cid][k]), (cid, k)


def test_attack_success_rate_is_recorded_over_the_benign_clients(digits_tiny_root, tmp_path):
    out = tmp_path / "bd"
    assert main.main(cli(digits_tiny_root, out, "-gr", "1", "--attack", "backdoor", "--attack_frac", "0.4",
                         "--backdoor_target", "1")) == 0
    assert len(read_h5(out / "Digits_FedAvg_test_0.h5")["rs_backdoor_asr"]) == 2
    # by hand: each benign client's own model on its triggered test images not of class 1, on the initial
    # model (which sends a few of them to class 1) and after a round
    server = build(digits_tiny_root, "FedAvg", "--attack", "backdoor", "--attack_frac", "0.4", "--backdoor_target",
                   "1")
    for t in range(2):
        if t:
            loop.run_round(server, 0)
        loop.send(server, server.clients)
        hits = eligible = 0
        for c in server.clients:
            if c.id in plugin(server, "Attack").malicious:
                continue
            keep = c.y_test != 1
            x = c.x_test[keep].clone()
            x[:, :, -3:, -3:] = c.white
            with torch.no_grad():
                c.model.eval()
                pred = c.model(x).argmax(1)
            hits += int((pred == 1).sum())
            eligible += int(keep.sum())
        assert 0 < hits < eligible or t == 1
        assert loop.evaluate(server)["backdoor_asr"] == pytest.approx(hits / eligible)


def test_no_asr_series_without_the_backdoor(digits_tiny_root, tmp_path):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", "--attack", "signflip")) == 0
    assert "rs_backdoor_asr" not in read_h5(tmp_path / "Digits_FedAvg_test_0.h5")


@pytest.mark.parametrize("flags", [("--backdoor_frac", "0.5"), ("--attack", "backdoor", "--backdoor_frac", "0"),
                                   ("--attack", "backdoor", "--backdoor_target", "10"),
                                   ("--attack", "backdoor", "--trigger_size", "9")])
def test_bad_backdoor_flags_are_one_line(flags, digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", *flags)) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
