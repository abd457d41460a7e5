"""Attacks (--attack, plugins/attack.py and plugins/attacks.py): the seeded malicious set and its record, label flipping of exactly the
malicious clients' training labels, the upload attacks against hand computation (with their declared default
scales, on a one-layer model), the named random streams they draw from, the backdoor's data poisoning and the
plug-in's one-line refusals, and benign accuracy."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import main
from cli import parse_config
from conftest import cli, opened, plugin
from flcore.clients.clientbase import Upload
from flcore.servers.serverbase import Server
from test_executors import build
from plugins import attack, attacks
from plugins.attacks import malicious_clients
from utils.data_utils import load_split
from utils.errors import FLError
from utils.results import read_h5
from utils.seeding import np_rng, torch_gen
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


def test_the_declared_defaults_are_the_documented_ones():
    """What each ``@attack`` declares, read from plugins/attacks.py's source: the roles, the default
    --attack_scale (--attack_scale's help: 1 signflip, 1 gaussian, 10 scaled, 0.1 ipm) and whether it takes
    one (the backdoor's boost: n / (η k) unless given)."""
    want = {"labelflip": ({"data"}, None, False), "signflip": ({"upload"}, 1.0, True),
            "gaussian": ({"upload"}, 1.0, True), "scaled": ({"upload"}, 10.0, True), "alie": ({"upload"}, None, False),
            "ipm": ({"upload"}, 0.1, True), "minmax": ({"upload"}, None, False), "minsum": ({"upload"}, None, False),
            "backdoor": ({"data", "upload"}, None, True)}
    assert {n: (a["roles"], a["scale"], a["scalable"]) for n, a in attack.ATTACKS.items()} == want


class Tiny(torch.nn.Module):
    """W: weight (1, 2) = [[1, 2]], bias = [0], and an integer buffer that no attack touches."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        with torch.no_grad():
            self.lin.weight.copy_(torch.tensor([[1.0, 2.0]]))
            self.lin.bias.zero_()
        self.register_buffer("steps", torch.tensor(5))


def tiny_upload(cid, weight, bias, steps=7):
    return Upload(cid, 1.0, {"lin.weight": torch.tensor([weight]), "lin.bias": torch.tensor(bias),
                             "steps": torch.tensor(steps)})


def tiny_attack(kind, malicious, uploads, seed=3, run=1, round_idx=2, perturbation="std"):
    """``kind`` on the uploads through the plug-in (no --attack_scale: the attack's default), malicious set
    ``malicious``, on a server whose global model is ``Tiny`` at round ``round_idx``."""
    a = attack.Attack(kind, 0.25, None, seed, run, 8)
    a.malicious = list(malicious)
    server = SimpleNamespace(global_model=Tiny(), round_idx=round_idx,
                             cfg=SimpleNamespace(minmax_perturbation=perturbation))
    return {u.id: u.state for u in a.on_uploads(server, None, uploads)}


def test_upload_attacks_with_their_default_scale_by_hand():
    """W = ([1, 2], [0]); malicious client 4 trained W_4 = ([3, 1], [1]), so W_4 - W = ([2, -1], [1]).
    signflip (s = 1): W - (W_4 - W) = ([-1, 3], [-1]); scaled (s = 10): W + 10 (W_4 - W) = ([21, -8], [10]).
    Benign client 6, the integer buffer and an upload without a model are sent as trained."""
    for kind, weight, bias in (("signflip", [-1.0, 3.0], [-1.0]), ("scaled", [21.0, -8.0], [10.0])):
        ups = [Upload(5, 1.0, None), tiny_upload(6, [9.0, 9.0], [9.0]), tiny_upload(4, [3.0, 1.0], [1.0])]
        got = tiny_attack(kind, [4], ups)
        assert got[4]["lin.weight"].tolist() == [weight] and got[4]["lin.bias"].tolist() == bias, kind
        assert got[4]["steps"].item() == 7 and got[5] is None
        assert got[6]["lin.weight"].tolist() == [[9.0, 9.0]] and got[6]["lin.bias"].tolist() == [9.0]


def test_gaussian_noise_is_the_named_stream_with_the_default_scale():
    """Client 4 in round 2 of run 1 under seed 3: W + 1 * ξ, ξ drawn from the stream (3, 1, "attack-noise",
    2, 4), the weight's two values first, then the bias's (W's entry order); client 0's from its own stream."""
    ups = [tiny_upload(0, [0.0, 0.0], [0.0]), tiny_upload(6, [9.0, 9.0], [9.0]), tiny_upload(4, [3.0, 1.0], [1.0])]
    got = tiny_attack("gaussian", [4, 0], ups)
    for cid in (4, 0):
        gen = torch_gen(3, 1, "attack-noise", 2, cid)
        xi_w, xi_b = torch.randn((1, 2), generator=gen), torch.randn((1,), generator=gen)
        assert torch.equal(got[cid]["lin.weight"], torch.tensor([[1.0, 2.0]]) + xi_w), cid
        assert torch.equal(got[cid]["lin.bias"], xi_b), cid
        assert got[cid]["steps"].item() == 7
    assert got[6]["lin.weight"].tolist() == [[9.0, 9.0]]


def test_ipm_with_its_default_epsilon_by_hand():
    """Benign updates (W_i - W over weight, bias): client 1 ([2, 2], [1]) - W = (1, 0, 1), client 2
    ([1, 4], [-1]) - W = (0, 2, -1); μ = (0.5, 1, 0), Δ = -0.1 μ = (-0.05, -0.1, 0): each malicious client
    (4 and 0, whatever it trained) uploads W + Δ = ([0.95, 1.9], [0])."""
    ups = [tiny_upload(4, [7.0, 7.0], [7.0]), tiny_upload(1, [2.0, 2.0], [1.0]), tiny_upload(2, [1.0, 4.0], [-1.0]),
           tiny_upload(0, [5.0, 5.0], [5.0])]
    got = tiny_attack("ipm", [4, 0], ups)
    for cid in (4, 0):
        assert torch.allclose(got[cid]["lin.weight"], torch.tensor([[0.95, 1.9]]), rtol=0, atol=1e-7), cid
        assert got[cid]["lin.bias"].tolist() == [0.0] and got[cid]["steps"].item() == 7
    assert got[1]["lin.weight"].tolist() == [[2.0, 2.0]] and got[2]["lin.bias"].tolist() == [-1.0]


def test_minmax_reads_the_perturbation_of_the_run():
    """Benign updates (weight, bias) written out: client 1 ([1, 2], [0]) - W = (0, 0, 0), client 2
    ([5, 2], [0]) - W = (4, 0, 0), client 3 ([1, 4], [0]) - W = (0, 2, 0). Min-Max (utils/update_attacks.py,
    tested on its own) on these rows with the run's --minmax_perturbation: -sign(μ) = -(1, 1, 0) and
    -σ = -(4/√3, 2/√3, 0) point elsewhere, so the malicious upload tells which one the attack was given."""
    from utils import update_attacks

    ups = [tiny_upload(4, [7.0, 7.0], [7.0]), tiny_upload(1, [1.0, 2.0], [0.0]), tiny_upload(2, [5.0, 2.0], [0.0]),
           tiny_upload(3, [1.0, 4.0], [0.0])]
    rows = torch.tensor([[0.0, 0.0, 0.0], [4.0, 0.0, 0.0], [0.0, 2.0, 0.0]], dtype=torch.float64)
    got = {}
    for p in ("std", "sign", "unit_vec"):
        delta = update_attacks.min_max(rows, p)
        got[p] = tiny_attack("minmax", [4], ups, perturbation=p)[4]["lin.weight"]
        assert torch.allclose(got[p].double(), torch.tensor([[1.0, 2.0]], dtype=torch.float64) + delta[:2],
                              rtol=0, atol=1e-6), p
    assert not torch.allclose(got["std"], got["sign"], rtol=0, atol=1e-3)


def test_a_round_whose_uploads_are_all_malicious_or_all_benign_is_left_as_trained():
    """No benign upload: an omniscient attack has nothing to read, and every upload goes as trained; no
    malicious upload: the uploads go as they are, for every upload attack."""
    ups = [tiny_upload(4, [7.0, 7.0], [7.0]), tiny_upload(0, [5.0, 5.0], [5.0])]
    for kind in ("alie", "ipm", "minmax", "minsum"):
        got = tiny_attack(kind, [4, 0], ups)
        assert got[4]["lin.weight"].tolist() == [[7.0, 7.0]] and got[0]["lin.bias"].tolist() == [5.0], kind
    for kind in ("signflip", "scaled", "gaussian", "ipm", "backdoor"):
        got = tiny_attack(kind, [3], ups)
        assert got[4] is ups[0].state and got[0] is ups[1].state, kind


def test_the_malicious_set_is_the_named_stream():
    """round(0.25 x 20) = 5 clients drawn without replacement from the stream (seed 3, run 1, "malicious")."""
    want = sorted(int(i) for i in np_rng(3, 1, "malicious").choice(20, size=5, replace=False))
    assert malicious_clients(3, 1, 20, 0.25) == want


def backdoor_client(x):
    return SimpleNamespace(x_train=x, y_train=torch.arange(len(x)) % 3, white=torch.full((1, 1, 1), 7.0))


def backdoor_cfg(size):
    return SimpleNamespace(trigger_size=size, backdoor_target=2, backdoor_frac=0.5, seed=3)


def test_backdoor_data_stamps_the_named_streams_share():
    """Client 4 of run 1 under seed 3, 6 images 4 x 4: the first round(0.5 x 6) = 3 of a permutation drawn
    from the stream (3, 1, "backdoor", 4) get the 2 x 2 white (7) corner and label 2, the others are kept."""
    x = torch.zeros(6, 1, 4, 4)
    px, py = attacks.backdoor_data(backdoor_client(x), backdoor_cfg(2), 1, 4)
    chosen = torch.randperm(6, generator=torch_gen(3, 1, "backdoor", 4))[:3]
    want_x, want_y = torch.zeros(6, 1, 4, 4), torch.arange(6) % 3
    for i in chosen.tolist():
        want_x[i, 0, 2:, 2:] = 7.0
        want_y[i] = 2
    assert torch.equal(px, want_x) and torch.equal(py, want_y)


def test_backdoor_data_refuses_what_cannot_carry_the_trigger():
    """A 3 x 3 trigger fits 3 x 3 and 4 x 4 images (one channel: the channel count is not a side), not
    2 x 5 ones; inputs that are not images (no white value) are refused with the same line."""
    for shape in ((2, 1, 3, 3), (2, 1, 4, 4)):
        px, py = attacks.backdoor_data(backdoor_client(torch.zeros(shape)), backdoor_cfg(3), 1, 4)
        assert px.shape == shape and len(py) == 2
    with pytest.raises(FLError) as e:
        attacks.backdoor_data(backdoor_client(torch.zeros(2, 1, 2, 5)), backdoor_cfg(3), 1, 4)
    assert str(e.value) == ("--attack backdoor stamps a 3x3 trigger on images; this split's inputs have shape "
                            "(1, 2, 5): use an image split or a smaller --trigger_size")
    flat = SimpleNamespace(x_train=torch.zeros(2, 1, 4, 4), y_train=torch.zeros(2), white=None)
    with pytest.raises(FLError, match=r"^--attack backdoor stamps a 3x3 trigger on images; this split's inputs "
                                      r"have shape \(1, 4, 4\)"):
        attacks.backdoor_data(flat, backdoor_cfg(3), 1, 4)


def test_an_upload_attack_on_an_algorithm_that_averages_no_model_is_refused():
    """The server class's declared reason is the line; a data-only attack passes (labelflip: any algorithm)."""
    server_cls = SimpleNamespace(declares=SimpleNamespace(averaging_refusal="it keeps no global model"))
    cfg = parse_config(["--attack", "signflip"]).replace(algorithm="Toy")
    with pytest.raises(FLError) as e:
        attack.Attack.check(cfg, server_cls, set())
    assert str(e.value) == "--attack: Toy cannot take it: it keeps no global model"
    ok = parse_config(["--attack", "labelflip"]).replace(algorithm="Toy")
    assert attack.Attack.check(ok, server_cls, set()) == ok


def test_a_backdoor_target_outside_the_classes_is_one_exact_line():
    """A split of 4 classes (0..3): target 4 is refused, naming the classes; target 3 is accepted."""
    server = SimpleNamespace(data=SimpleNamespace(num_classes=4, name="Toy"), run=0, recorder=None)
    cfg = parse_config(["--attack", "backdoor", "--backdoor_target", "4", "--attack_frac", "0.5", "-nc", "4"])
    with pytest.raises(FLError) as e:
        attack.Attack.build(cfg, server)
    assert str(e.value) == "--backdoor_target 4: split 'Toy' has classes 0..3"
    assert attack.Attack.build(cfg.replace(backdoor_target=3), server).kind == "backdoor"


def test_a_fraction_that_makes_every_client_malicious_is_one_exact_line():
    """4 clients: 0.75 makes round(3) = 3 malicious (one benign left: accepted); 0.9 makes round(3.6) = 4,
    refused, with the largest share that still leaves one benign client, (4 - 0.5) / 4 = 0.875."""
    assert len(attack.Attack("signflip", 0.75, None, 0, 0, 4).malicious) == 3
    with pytest.raises(FLError) as e:
        attack.Attack("signflip", 0.9, None, 0, 0, 4)
    assert str(e.value) == ("--attack_frac 0.9 makes all 4 clients malicious; give a fraction that leaves at least "
                            "one benign client (below 0.875)")


def test_the_benign_summary_by_hand():
    """Clients 0, 1, 2, client 1 malicious. Per client (correct, tested, AUC) and (loss sum, trained):
    0: (3, 4, 0.5), (2, 4); 1: (9, 9, 0.9), (7, 7); 2: (1, 2, 0.7), (3, 2). Over clients 0 and 2: accuracy
    4 / 6, mean of 0.75 and 0.5 = 0.625, std 0.125, worst 0.5, 10th percentile 0.5 + 0.1 x 0.25 = 0.525,
    AUC (0.5 x 4 + 0.7 x 2) / 6 = 3.4 / 6, train loss (2 + 3) / (4 + 2) = 5 / 6."""
    a = attack.Attack("signflip", 0.25, None, 0, 0, 3)
    a.malicious = [1]
    server = SimpleNamespace(clients=[SimpleNamespace(id=i) for i in range(3)])
    tests = np.array([[3, 4, 0.5], [9, 9, 0.9], [1, 2, 0.7]])
    trains = np.array([[2.0, 4], [7, 7], [3, 2]])
    want = {"benign_test_acc": 4 / 6, "benign_test_acc_mean": 0.625, "benign_test_acc_std": 0.125,
            "benign_test_acc_min": 0.5, "benign_test_acc_p10": 0.525, "benign_test_auc": 3.4 / 6,
            "benign_train_loss": 5 / 6}
    got = a.metrics(server, tests, trains)
    assert got.keys() == want.keys() and all(got[k] == pytest.approx(v, abs=1e-12) for k, v in want.items())


class CornerReader(torch.nn.Module):
    """Class 2 when the bottom-right pixel is white (1), else class 0 (logits over 3 classes)."""

    def forward(self, x):
        return torch.nn.functional.one_hot(2 * (x[:, 0, -1, -1] == 1).long(), 3).float()


def test_backdoor_metrics_counts_by_hand_and_restores_the_training_mode():
    """Target 2, a 1 x 1 trigger: the test images labelled 0, 1, 0 are eligible (the one labelled 2 is not)
    and a model that reads the corner sends all 3 to class 2: (3, 3). The model is left in the mode it was
    in (training here), as the client's next local round expects."""
    model = CornerReader().train()
    client = SimpleNamespace(cfg=SimpleNamespace(amp="off", eval_batch_size=2, backdoor_target=2, trigger_size=1),
                             eval_model=lambda: model, device=torch.device("cpu"), x_test=torch.zeros(4, 1, 3, 3),
                             y_test=torch.tensor([0, 2, 1, 0]), white=torch.ones(1, 1, 1))
    assert attack.backdoor_metrics(client) == (3, 3)
    assert model.training
    model.eval()
    attack.backdoor_metrics(client)
    assert not model.training
