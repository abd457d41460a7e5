"""FD (federated distillation) against hand computations: the per-label mean logits a client uploads, the
server's per-label average without the receiver's own logits, the distillation term, and that no model
weights cross the wire; with λ = 0 it is Local."""
import numpy as np
import pytest
import torch
from torch.nn import functional as F

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientfd import distillation, label_means
from flcore.registry import get_server_class
from utils.comm import payload_bytes
from utils.data_utils import load_split
from utils.errors import FLError
from utils.results import read_h5
from runtime import loop
from runtime import client_steps


def build(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FD", "--executor", "sequential", "-lr", "0.1", "-lbs", "20",
                                "-nc", "3", *flags))
    data = load_split("Digits", root, 3, "cpu")
    return get_server_class("FD")(cfg.replace(num_classes=data.num_classes), data, 0, None)


def test_label_means_by_hand():
    sums = torch.zeros(3, 3)
    counts = torch.tensor([2, 0, 1])
    sums[0] = torch.tensor([1.0, 3.0, -2.0]) + torch.tensor([3.0, 1.0, 0.0])
    sums[2] = torch.tensor([0.5, 0.5, 4.0])
    labels, means = label_means(sums, counts)
    assert labels.tolist() == [0, 2]
    torch.testing.assert_close(means, torch.tensor([[2.0, 2.0, -1.0], [0.5, 0.5, 4.0]]))


def test_client_accumulates_the_rounds_logits_per_label(digits_tiny_root):
    server = build(digits_tiny_root)
    c = server.clients[0]
    x, y = c.x_train[:6], torch.tensor([3, 1, 3, 3, 7, 1])
    c.loss(x[:4], y[:4])  # two batches of one round
    c.loss(x[4:], y[4:])
    up = c.upload()
    with torch.no_grad():
        out = c.model(x)
    assert up.extras["labels"].tolist() == [1, 3, 7]
    want = torch.stack([(out[1] + out[5]) / 2, (out[0] + out[2] + out[3]) / 3, out[4]])
    torch.testing.assert_close(up.extras["logits"], want)


def test_server_averages_the_other_clients_logits_per_label(digits_tiny_root):
    from flcore.clients.clientbase import Upload

    server = build(digits_tiny_root)
    c = server.data.num_classes
    rows = {k: torch.arange(c, dtype=torch.float32) * k for k in range(1, 5)}
    uploads = [Upload(0, 10, None, {"labels": torch.tensor([0, 2]), "logits": torch.stack([rows[1], rows[2]])}),
               Upload(1, 20, None, {"labels": torch.tensor([2]), "logits": torch.stack([rows[3]])}),
               Upload(2, 30, None, {"labels": torch.tensor([0, 2, 5]), "logits": torch.stack([rows[4], rows[1], rows[2]])})]
    server.aggregate(uploads)
    to0, to1, to2 = (server.broadcast(k) for k in server.clients)
    # client 0: label 0 from client 2 only; label 2 = mean of clients 1 and 2; label 5 from client 2
    assert to0["labels"].tolist() == [0, 2, 5]
    torch.testing.assert_close(to0["logits"], torch.stack([rows[4], (rows[3] + rows[1]) / 2, rows[2]]))
    assert to1["labels"].tolist() == [0, 2, 5]
    torch.testing.assert_close(to1["logits"], torch.stack([(rows[1] + rows[4]) / 2, (rows[2] + rows[1]) / 2, rows[2]]))
    assert to2["labels"].tolist() == [0, 2]
    torch.testing.assert_close(to2["logits"], torch.stack([rows[1], (rows[2] + rows[3]) / 2]))
    server.aggregate(uploads[:1])  # the only uploader gets no target (and drops the old ones)
    assert server.broadcast(server.clients[0])["labels"].numel() == 0
    assert server.broadcast(server.clients[1])["labels"].tolist() == [0, 2]
    c0 = server.clients[0]
    c0.receive(to0)
    c0.receive(server.broadcast(c0))
    assert not c0.has_teacher.any()


def test_distillation_term_by_hand():
    logits = torch.tensor([[1.0, 0.0, -1.0], [0.0, 2.0, 0.0]])
    teacher = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    has = torch.tensor([True, False, True])
    y = torch.tensor([2, 1])  # the second sample's label has no teacher: it adds nothing
    q = torch.exp(teacher[2]) / torch.exp(teacher[2]).sum()
    logp = logits[0] - torch.logsumexp(logits[0], 0)
    want = -(q * logp).sum() / 2
    torch.testing.assert_close(distillation(logits, y, teacher, has), want)


def test_client_loss_is_ce_plus_lambda_times_the_term_toward_the_received_logits(digits_tiny_root):
    server = build(digits_tiny_root, "-lam", "0.3")
    c = server.clients[0]
    teacher = torch.randn(2, c.num_classes, generator=torch.Generator().manual_seed(0))
    c.receive({"labels": torch.tensor([1, 3]), "logits": teacher})
    x, y = c.x_train[:5], torch.tensor([3, 1, 0, 3, 1])
    with torch.no_grad():
        out = c.model(x)
    q = F.softmax(teacher[torch.tensor([1, 0, 0, 1, 0])], dim=1)  # label 3 -> row 1, label 1 -> row 0
    per_sample = -(q * F.log_softmax(out, dim=1)).sum(1) * torch.tensor([1.0, 1, 0, 1, 1])  # label 0: no teacher
    want = F.cross_entropy(out, y) + 0.3 * per_sample.mean()
    torch.testing.assert_close(c.loss(x, y).detach(), want)


def test_each_round_uploads_the_logits_of_that_round_only(digits_tiny_root):
    server = build(digits_tiny_root)
    c = server.clients[0]
    client_steps.train(c, 0)  # round 0 moves the model, so its logits differ from round 1's
    c.learning_rate = lambda round_idx: 0.0  # round 1 leaves the model as round 0 left it
    client_steps.train(c, 1)
    up = c.upload()
    with torch.no_grad():
        out = c.model(c.x_train)
    labels = torch.unique(c.y_train)
    want = torch.stack([out[c.y_train == label].mean(0) for label in labels])
    assert up.extras["labels"].tolist() == labels.tolist()
    torch.testing.assert_close(up.extras["logits"], want)
    assert (up.id, up.weight) == (c.id, c.train_samples) and c.id != c.train_samples  # the client's own


def test_no_weights_cross_the_wire(digits_tiny_root, monkeypatch):
    server = build(digits_tiny_root)
    seen = []
    receive = loop.receive
    monkeypatch.setattr(loop, "receive", lambda srv, clients: seen.extend(receive(srv, clients)) or seen[-len(clients):])
    for t in range(2):
        loop.run_round(server, t)
    c = server.data.num_classes
    for u in seen:
        assert u.state is None and set(u.extras) == {"labels", "logits"}
        k = len(u.extras["labels"])
        assert u.extras["logits"].shape == (k, c) and payload_bytes(u) == k * c * 4 + k * 8 + 8
    payload = server.broadcast(server.clients[0])
    assert set(payload) == {"labels", "logits"} and payload_bytes(payload) <= c * c * 4 + c * 8


def test_lambda_zero_is_local_and_lambda_changes_it(digits_tiny_root, tmp_path):
    acc = {}
    for name, flags in (("Local", ("-algo", "Local")), ("FD0", ("-algo", "FD", "-lam", "0")), ("FD", ("-algo", "FD"))):
        out = tmp_path / name
        assert main.main(cli(digits_tiny_root, out, *flags, "-gr", "2", "-lr", "0.1", "-nc", "3",
                             "--executor", "sequential")) == 0
        algo = flags[1]
        acc[name] = read_h5(out / f"Digits_{algo}_test_0.h5")["rs_train_loss"]
    assert np.array_equal(acc["FD0"], acc["Local"])
    assert not np.array_equal(acc["FD"], acc["Local"])


def test_ala_is_refused(digits_tiny_root):
    with pytest.raises(FLError, match="-ala"):
        parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FD", "-ala"))


def test_a_negative_lambda_is_refused(digits_tiny_root):
    with pytest.raises(FLError, match="-lam >= 0"):
        parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FD", "-lam", "-0.5"))
