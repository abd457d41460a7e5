"""FedLC against hand computations: the calibrated logits for a fixed label distribution (a class with no
sample included), the client's loss on its own counts, τ = 0 as FedAvg, and -ala (-dp: tests/test_dp_registry.py)."""
import math

import numpy as np
import torch
from torch import nn

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientlc import calibrated_logits
from flcore.registry import get_server_class
from utils.data_utils import load_split
from utils.results import read_h5
from runtime import loop


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedLC", "--executor", "sequential", *flags))
    return get_server_class("FedLC")(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root))


def test_calibrated_logits_on_a_fixed_label_distribution():
    counts = torch.tensor([16, 1, 0, 81])
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]])
    got = calibrated_logits(logits, counts, tau=2.0)
    # τ n^{-1/4} = 2 * (1/2, 1, inf, 1/3) = (1, 2, inf, 2/3)
    want = torch.tensor([[0.0, 0.0, -math.inf, 4 - 2 / 3], [-0.5, -3.0, -math.inf, -2 / 3]])
    torch.testing.assert_close(got, want)
    assert torch.equal(calibrated_logits(logits, counts, tau=0.0), logits)  # τ = 0: no calibration


def test_missing_class_leaves_the_softmax_and_gets_no_gradient():
    counts = torch.tensor([16, 1, 0, 81])
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]], requires_grad=True)
    loss = nn.functional.cross_entropy(calibrated_logits(logits, counts, tau=2.0), torch.tensor([0]))
    # by hand: -log(e^0 / (e^0 + e^0 + e^{10/3})), class 2 (no sample) contributes e^{-inf} = 0
    want = -math.log(1.0 / (1.0 + 1.0 + math.exp(4 - 2 / 3)))
    assert math.isclose(loss.item(), want, rel_tol=1e-6)
    loss.backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[0, 2] == 0
    p = torch.tensor([1.0, 1.0, 0.0, math.exp(10 / 3)]) / (2 + math.exp(10 / 3))
    torch.testing.assert_close(logits.grad[0], p - torch.tensor([1.0, 0, 0, 0]))  # softmax - onehot


def test_client_loss_uses_its_own_label_counts(digits_noniid_root):
    tau = 1.5
    server = make_server(digits_noniid_root, "-tau", str(tau))
    client = server.clients[0]
    counts = np.bincount(client.y_train.numpy(), minlength=10)
    assert (counts == 0).sum() == 8  # pathological split: 2 classes per client
    assert client.label_counts.tolist() == counts.tolist()
    x, y = client.x_train[:20], client.y_train[:20]
    with torch.no_grad():
        z = client.model(x)
    shift = torch.tensor([tau * c ** -0.25 if c else math.inf for c in counts], dtype=torch.float32)
    want = -torch.log_softmax(z - shift, 1)[torch.arange(len(y)), y].mean()
    torch.testing.assert_close(client.loss(x, y).detach(), want)


def test_tau_zero_is_fedavg(digits_root, tmp_path):
    args = ("-gr", "2", "-lr", "0.1")
    assert main.main(cli(digits_root, tmp_path, "-algo", "FedAvg", *args)) == 0
    assert main.main(cli(digits_root, tmp_path, "-algo", "FedLC", "-tau", "0", *args)) == 0
    a = read_h5(tmp_path / "Digits_FedAvg_test_0.h5")
    b = read_h5(tmp_path / "Digits_FedLC_test_0.h5")
    for key in ("rs_test_acc", "rs_train_loss", "rs_test_auc"):
        assert np.array_equal(a[key], b[key]), key


def test_fedlc_runs_with_ala(digits_noniid_root):
    server = make_server(digits_noniid_root, "-ala", "--ala_max_epochs", "3", "-gr", "2", "-lr", "0.1", "-eg", "5")
    loop.train(server)
    assert any(c.ala.weights is not None for c in server.clients)  # ALA ran in round 2
    assert np.isfinite(loop.evaluate(server)["train_loss"])
