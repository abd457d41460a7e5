"""FedAS: the Fisher trace on a toy model against the squared batch-mean score gradients summed by hand, the
aggregation with those weights against a hand-weighted mean, the parameter alignment against a hand step,
only participants receiving (the body only), and -ala."""
import copy

import pytest
import torch
from torch import nn

import main
from cli import parse_config
from conftest import cli
from flcore.clients import clientas
from flcore.clients.clientas import fisher_trace
from flcore.registry import get_server_class
from utils.comm import payload_bytes
from utils.data_utils import load_split
from runtime import loop


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedAS", "--executor", "sequential", "-nc", "3", "-lbs", "20",
                                "-lr", "0.1", "--train_loss_eval", "off", *flags))
    return get_server_class("FedAS")(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root, 3))


def state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_fisher_trace_of_softmax_regression_by_hand():
    torch.manual_seed(0)
    model = nn.Linear(3, 4)
    x, y = torch.randn(5, 3), torch.tensor([0, 3, 1, 1, 2])
    batches = [torch.tensor([0, 1, 2]), torch.tensor([3, 4])]
    want = 0.0
    for b in batches:  # in float64 from the float32 parameters
        # d(-log p_y)/dW = (softmax(W x + c) - e_y) x^T, d/dc = softmax - e_y; the batch's mean, squared, summed
        err = torch.softmax(x[b].double() @ model.weight.detach().double().T + model.bias.detach().double(), 1)
        err[range(len(b)), y[b]] -= 1
        gw, gc = (err[:, :, None] * x[b].double()[:, None, :]).mean(0), err.mean(0)
        want += float((gw ** 2).sum() + (gc ** 2).sum())
    assert abs(fisher_trace(model, x, y, batches) - want) < 1e-6 * want  # float32 gradients
    assert model.training  # its mode is restored


def test_fisher_trace_takes_batchnorm_in_evaluation_mode():
    """With BatchNorm the trace is the evaluation-mode model's (running statistics, not each batch's):
    a frozen BatchNorm in front of the linear layer is the by-hand formula on the normalised inputs."""
    torch.manual_seed(1)
    bn, lin = nn.BatchNorm1d(3), nn.Linear(3, 4)
    bn.running_mean.copy_(torch.tensor([0.5, -1.0, 2.0]))
    bn.running_var.copy_(torch.tensor([4.0, 0.25, 1.0]))
    bn.weight.requires_grad_(False)
    bn.bias.requires_grad_(False)
    model = nn.Sequential(bn, lin)
    x, y = torch.randn(6, 3), torch.tensor([0, 3, 1, 1, 2, 0])
    batches = [torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])]
    z = (x.double() - bn.running_mean.double()) / (bn.running_var.double() + bn.eps).sqrt()
    want = 0.0
    for b in batches:
        err = torch.softmax(z[b] @ lin.weight.detach().double().T + lin.bias.detach().double(), 1)
        err[range(len(b)), y[b]] -= 1
        gw, gc = (err[:, :, None] * z[b][:, None, :]).mean(0), err.mean(0)
        want += float((gw ** 2).sum() + (gc ** 2).sum())
    assert abs(fisher_trace(model, x, y, batches) - want) < 1e-5 * want
    assert model.training and torch.equal(bn.running_mean, torch.tensor([0.5, -1.0, 2.0]))


def test_bodies_are_averaged_with_the_fisher_traces_as_weights(digits_tiny_root, monkeypatch):
    server = make_server(digits_tiny_root)
    traced = {}

    def recording(model, x, y, batches):  # the model whose trace a client computes, its batches, the trace
        cut = list(batches)
        value = fisher_trace(model, x, y, cut)
        traced[len(traced)] = (state(model), value, cut, len(y))
        return value

    monkeypatch.setattr(clientas, "fisher_trace", recording)
    seen = []
    receive = loop.receive
    monkeypatch.setattr(loop, "receive", lambda srv, clients: seen.extend(receive(srv, clients)) or seen)
    loop.run_round(server, 0)
    assert sorted(u.id for u in seen) == [0, 1, 2] and len(traced) == 3
    for u, (trained, value, cut, n) in zip(seen, traced.values()):
        c = server.clients[u.id]
        assert u.weight == value == c.fisher > 0
        assert sorted(torch.cat(cut).tolist()) == list(range(n)) == list(range(c.train_samples))  # one epoch
        assert max(len(b) for b in cut) == c.cfg.batch_size
        assert all(torch.equal(trained[k], v) for k, v in c.model.state_dict().items())  # the trained model
        assert set(u.state) == {k for k in trained if k.startswith("base.")}  # the body only
    total = sum(u.weight for u in seen)
    for k, v in server.global_model.base.state_dict().items():
        want = sum(u.weight / total * u.state[f"base.{k}"].double() for u in seen)
        assert torch.allclose(v.double(), want, atol=1e-6), k


def test_alignment_is_a_step_towards_the_local_prototypes(digits_tiny_root):
    # One batch holding every training sample (--align_batch_size above their count): one gradient step.
    server = make_server(digits_tiny_root, "--align_batch_size", "1000", "--align_lr", "0.5")
    c = server.clients[0]
    loop.run_round(server, 0)  # the clients now hold trained bodies and heads of their own
    own, glob = state(c.model), state(server.global_model.base)
    body = c.model.base.eval()
    with torch.no_grad():
        feats = body(c.x_train)
    classes = sorted(set(c.y_train.tolist()))
    protos = {k: feats[c.y_train == k].mean(0) for k in classes}
    ref = copy.deepcopy(server.global_model.base).train()
    loss = sum(((ref(c.x_train[c.y_train == k]) - protos[k]) ** 2).mean() for k in classes)
    grads = torch.autograd.grad(loss, list(ref.parameters()))
    want = {n: p.detach() - 0.5 * g for (n, p), g in zip(ref.named_parameters(), grads)}
    server.round_idx = 1
    loop.send(server, [c])
    got = c.model.state_dict()
    for n, v in want.items():
        assert torch.allclose(got[f"base.{n}"], v, atol=1e-5), n
    assert any(not torch.equal(got[f"base.{n}"], glob[n]) for n in want)  # the alignment moved it
    assert all(torch.equal(got[k], v) for k, v in own.items() if k.startswith("head."))  # its own head stays


def test_only_participants_receive_the_body(digits_tiny_root):
    server = make_server(digits_tiny_root)
    loop.run_round(server, 0)
    before = [state(c.model) for c in server.clients]
    server.bytes_down = 0
    loop.send(server, [server.clients[1]])
    assert server.bytes_down == payload_bytes(server.global_model.base)
    assert server.broadcast(server.clients[0]) is None
    for i in (0, 2):
        assert all(torch.equal(v, before[i][k]) for k, v in server.clients[i].model.state_dict().items())
    assert not all(torch.equal(v, before[1][k]) for k, v in server.clients[1].model.state_dict().items())
    server.clients[0].receive(server.broadcast(server.clients[1]), participating=False)  # told it sits out
    assert all(torch.equal(v, before[0][k]) for k, v in server.clients[0].model.state_dict().items())


@pytest.mark.parametrize("bn", ["shared", "local"])
def test_received_batchnorm_statistics_are_the_global_or_the_clients_own(bn, digits_tiny_root):
    """Without alignment steps (--align_epochs 0) a participant's body takes the global parameters and, with
    --bn_stats shared, the global BatchNorm statistics; with local, it keeps its own."""
    server = make_server(digits_tiny_root, "-m", "BNCNN", "--bn_stats", bn, "--align_epochs", "0")
    loop.run_round(server, 0)
    client = server.clients[1]
    own = {k: v.clone() for k, v in client.model.base.named_buffers()}
    glob = dict(server.global_model.base.named_buffers())
    mean = [k for k in own if k.endswith("running_mean")]
    assert mean and not torch.equal(own[mean[0]], glob[mean[0]])
    loop.send(server, [client])
    want = own if bn == "local" else glob
    assert all(torch.equal(b, want[k]) for k, b in client.model.base.named_buffers())
    params = dict(server.global_model.base.named_parameters())
    assert all(torch.equal(p, params[k]) for k, p in client.model.base.named_parameters())


def test_ala_takes_the_aligned_body(digits_tiny_root, tmp_path):
    server = make_server(digits_tiny_root, "-ala")
    c = server.clients[0]
    assert all(n.startswith("base.") for n in c.ala.names)
    loop.run_round(server, 0)
    calls = []
    c.ala.adaptive_local_aggregation = lambda glob, target, x, y: calls.append((state(glob), state(target)))
    glob = state(server.global_model.base)
    server.round_idx = 1
    loop.send(server, [c])
    (received, target), = calls  # ALA initialises the client's own model from the aligned body under its head
    assert target.keys() == received.keys() and all(torch.equal(received[k], v) for k, v in target.items()
                                                    if k.startswith("head."))
    assert any(not torch.equal(received[f"base.{k}"], v) for k, v in glob.items())  # aligned, not the global one
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "FedAS", "-ala", "-gr", "2", "-nc", "3",
                         "--executor", "sequential")) == 0
