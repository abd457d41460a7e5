"""GPFL: the angle- and magnitude-level guidance losses by hand on tiny tensors, the Conditional Valve's
affine map by hand, the conditional inputs (g = mean embedding, p_i = label-distribution-weighted
embeddings), the μ term's gradient = weight decay μ on CoV and GCE only, the upload (extractor, GCE,
CoV; never the head or p_i), -ala runs (-dp: tests/test_dp_registry.py)."""
import math

import pytest
import torch

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientgpfl import CoV, angle_loss, magnitude_loss
from flcore.registry import get_server_class
from utils.data_utils import load_split
from runtime import loop


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "GPFL", "--executor", "sequential", "-nc", "3", *flags))
    return get_server_class("GPFL")(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root, 3))


def test_guidance_losses_by_hand():
    f = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    emb = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-1.0, -1.0]])
    y = torch.tensor([1, 2])
    # cosines of f_0 = (0.6, 0.8) and f_1 = (1, 0) with e_0 = (1, 0), e_1 = (0, 1), e_2 = -(1, 1)/sqrt 2
    r = 1 / math.sqrt(2)
    cos = [[0.6, 0.8, -(0.6 + 0.8) * r], [1.0, 0.0, -r]]
    nll = [-(c[t] - math.log(sum(math.exp(v) for v in c))) for c, t in zip(cos, [1, 2])]
    assert float(angle_loss(f, emb, y)) == pytest.approx(sum(nll) / 2, rel=1e-6)
    # ||f_0 - e_1|| = ||(3, 2)||, ||f_1 - e_2|| = ||(2, 1)||
    assert float(magnitude_loss(f, emb, y)) == pytest.approx((math.sqrt(13) + math.sqrt(5)) / 2, rel=1e-6)
    # a third sample, f_2 = 0 with e_0: ||(-1, 0)|| = 1 (three rows, so a norm over the batch would differ)
    f3, y3 = torch.cat([f, torch.zeros(1, 2)]), torch.tensor([1, 2, 0])
    assert float(magnitude_loss(f3, emb, y3)) == pytest.approx((math.sqrt(13) + math.sqrt(5) + 1) / 3, rel=1e-6)


def test_cov_by_hand():
    torch.manual_seed(0)
    cov = CoV(2)
    with torch.no_grad():
        cov.gamma[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
        cov.gamma[0].bias.zero_()
        cov.beta[0].weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
        cov.beta[0].bias.copy_(torch.tensor([0.0, -3.0]))
    cond = torch.tensor([1.0, 2.0])
    # γ: Linear -> (1, 4) -> ReLU -> LayerNorm -> (-1, 1); β: (2, -2) -> ReLU (2, 0) -> LayerNorm (1, -1)
    eps = 1e-5
    g = [-1 / math.sqrt(1 + eps), 1 / math.sqrt(1 + eps)]
    b = [1 / math.sqrt(1 + eps), -1 / math.sqrt(1 + eps)]
    f = torch.tensor([[2.0, -1.0], [0.5, 3.0]])
    want = [[max(0.0, v * (gi + 1) + bi) for v, gi, bi in zip(row, g, b)] for row in f.tolist()]
    assert cov(f, cond).tolist() == [pytest.approx(w, rel=1e-5, abs=1e-6) for w in want]


def test_conditional_inputs_and_mu_gradient(digits_noniid_root):
    server = make_server(digits_noniid_root, "-mu", "0.3")
    loop.send(server, server.clients)
    emb = server.global_model.gce.weight.detach()
    c = server.clients[0]
    counts = torch.bincount(c.y_train, minlength=10).float()
    assert torch.allclose(c.model.cond_p, (counts[:, None] * emb).sum(0) / counts.sum(), atol=1e-6)
    assert torch.allclose(c.cond_g, emb.mean(0), atol=1e-6)
    x, y = c.x_train[:6], c.y_train[:6]
    params = dict(c.model.named_parameters())
    with_mu = dict(zip(params, torch.autograd.grad(c.loss(x, y), list(params.values()))))
    c.cfg = c.cfg.replace(mu=0.0)
    without = dict(zip(params, torch.autograd.grad(c.loss(x, y), list(params.values()))))
    for name, p in params.items():
        decayed = name.startswith(("cov.", "gce."))
        want = without[name] + (0.3 * p.detach() if decayed else 0)
        assert torch.allclose(with_mu[name], want, atol=1e-6), name


def test_upload_keeps_head_and_cond_p(digits_noniid_root, monkeypatch):
    server = make_server(digits_noniid_root)
    seen = []
    receive = loop.receive
    monkeypatch.setattr(loop, "receive", lambda srv, cs: seen.extend(receive(srv, cs)) or seen)
    loop.run_round(server, 0)
    assert len(seen) == 3
    for u in seen:
        assert {k.split(".")[0] for k in u.state} == {"base", "gce", "cov"}
    n = {u.id: u.weight for u in seen}
    want = sum(n[u.id] * u.state["gce.weight"] for u in seen) / sum(n.values())
    assert torch.allclose(server.global_model.gce.weight, want, atol=1e-6)


def test_ala_runs(digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "GPFL", "-ala", "-gr", "2", "-nc", "3",
                         "--executor", "sequential")) == 0
    assert "ALA adapts 2 tensor(s) (last 2 tensor(s), -p): cov.beta.2.weight, cov.beta.2.bias" in capsys.readouterr().out


def test_loss_terms_and_which_embeddings_each_guidance_term_trains(digits_noniid_root):
    server = make_server(digits_noniid_root, "-lam", "0.4", "-mu", "0")
    loop.send(server, server.clients)
    c = server.clients[0]
    m = c.model
    with torch.no_grad():  # after local steps the trainable GCE differs from the round's frozen copy
        m.gce.weight.add_(0.3 * torch.randn(m.gce.weight.shape, generator=torch.Generator().manual_seed(0)))
    x, y = c.x_train[:6], c.y_train[:6]
    got = c.loss(x, y)
    f = m.base(x)
    f_global = m.cov(f, c.cond_g)
    task = torch.nn.functional.cross_entropy(m.head(m.cov(f, m.cond_p)), y)
    angle = angle_loss(f_global, m.gce.weight, y)
    want = task + angle + 0.4 * magnitude_loss(f_global, c.gce_frozen, y)
    torch.testing.assert_close(got, want)
    # the GCE learns from the angle-level term only (the magnitude term's embeddings are the frozen copy)
    grad = torch.autograd.grad(got, m.gce.weight)[0]
    torch.testing.assert_close(grad, torch.autograd.grad(angle, m.gce.weight)[0])


def test_conditional_inputs_and_frozen_embeddings_hold_no_graph_to_the_received_model(digits_noniid_root):
    server = make_server(digits_noniid_root)
    c = server.clients[0]
    assert not c.gce_frozen.requires_grad and not c.cond_g.requires_grad  # before any broadcast too
    loop.send(server, server.clients)
    assert not c.gce_frozen.requires_grad and not c.cond_g.requires_grad and not c.model.cond_p.requires_grad


def test_a_client_takes_the_shared_parts_and_keeps_its_head(digits_noniid_root):
    server = make_server(digits_noniid_root)
    c = server.clients[0]
    head = {k: v.clone() for k, v in c.model.state_dict().items() if k.startswith("head.")}
    with torch.no_grad():
        for p in server.global_model.parameters():
            p.add_(0.5)  # the global model now differs from every client's
    loop.send(server, server.clients)
    glob = server.global_model.state_dict()
    for k, v in c.model.state_dict().items():
        if k.startswith(("base.", "gce.", "cov.")):
            assert torch.equal(v, glob[k]), k
        elif k in head:
            assert torch.equal(v, head[k]), k
    assert head and not torch.equal(head[next(iter(head))], glob[next(iter(head))])
