"""FedCP: the conditional policy's split by hand on a fixed tensor (r + s = 1, so h ⊙ r + h ⊙ s = h, and the
output is the two heads' sum), the MMD² against a pairwise hand sum, a round's wiring (the global head
frozen locally, the personal head uploaded under the global head's names and never overwritten, the new
global head = the sample-weighted mean of the personal heads, the context never uploaded), -ala runs
(-dp is refused: tests/test_dp_registry.py), -lam's bound and the linear classifier it needs."""
import copy
import math

import pytest
import torch
from torch import nn

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientcp import CPModel, mmd
from flcore.registry import get_server_class
from flcore.trainmodel.parts import BaseHeadSplit
from utils.data_utils import load_split
from utils.errors import FLError
from runtime import loop


def make_server(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedCP", "--executor", "sequential", "-nc", "3", *flags))
    return get_server_class("FedCP")(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root, 3))


def test_policy_split_by_hand():
    torch.manual_seed(0)
    m = CPModel(BaseHeadSplit(nn.Identity(), nn.Linear(2, 3)))
    with torch.no_grad():
        m.cpn[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 2.0]]))
        m.cpn[0].bias.copy_(torch.tensor([0.0, 0.5, -0.5, 0.0]))
        m.context.copy_(torch.tensor([3.0, 4.0]))  # v / ||v|| = (0.6, 0.8)
    h = torch.tensor([[1.0, 2.0]])
    c = [1.0 * 0.6, 2.0 * 0.8]
    z = [c[0], c[1] + 0.5, c[0] + c[1] - 0.5, -c[0] + 2 * c[1]]
    mean = sum(z) / 4
    var = sum((v - mean) ** 2 for v in z) / 4
    a = [max(0.0, (v - mean) / math.sqrt(var + 1e-5)) for v in z]  # LayerNorm (weight 1, bias 0), ReLU
    # scores as K = 2 pairs: the first K are the personal scores, the last K the global ones
    r = [math.exp(a[2 + k]) / (math.exp(a[k]) + math.exp(a[2 + k])) for k in range(2)]
    got_r, got_s = m.policy(h)
    assert got_r[0].tolist() == pytest.approx(r, rel=1e-5)
    assert torch.allclose(got_r + got_s, torch.ones(1, 2))
    assert torch.allclose(h * got_r + h * got_s, h)
    hg, hp = h * torch.tensor(r), h * (1 - torch.tensor(r))
    want = m.head(hg) + m.phead(hp)
    assert torch.allclose(m(h), want, atol=1e-6)
    noise = torch.tensor([[[0.3, -0.2], [-0.1, 0.4]]])  # Gumbel draws (pair member, feature)
    r_noisy = [1 / (1 + math.exp((a[k] + noise[0, 0, k].item()) - (a[2 + k] + noise[0, 1, k].item()))) for k in range(2)]
    assert m.policy(h, noise)[0][0].tolist() == pytest.approx(r_noisy, rel=1e-5)


def test_mmd_by_hand():
    x = torch.tensor([[0.0, 1.0], [2.0, 0.0], [1.0, 1.0]])
    y = torch.tensor([[0.5, 0.5], [3.0, -1.0], [0.0, 0.0]])

    def k(u, v):
        d = sum((a - b) ** 2 for a, b in zip(u, v))
        return sum(math.exp(-d / (2 * w)) for w in (10.0, 15.0, 20.0, 50.0))

    xs, ys = x.tolist(), y.tolist()
    want = sum(k(a, b) for a in xs for b in xs) / 9 + sum(k(a, b) for a in ys for b in ys) / 9 \
        - 2 * sum(k(a, b) for a in xs for b in ys) / 9
    assert float(mmd(x, y)) == pytest.approx(want, rel=1e-5)
    assert abs(float(mmd(x, x))) < 1e-6


def test_round_wiring(digits_noniid_root, monkeypatch):
    server = make_server(digits_noniid_root, "-lr", "0.05")
    glob = {k: v.clone() for k, v in server.global_model.state_dict().items()}
    loop.send(server, server.clients)
    pheads = {}
    seen = []
    receive = loop.receive

    def keep(srv, cs):
        uploads = receive(srv, cs)
        for c in server.clients:
            # the global head is frozen during local training; the personal head is what is uploaded
            assert torch.equal(c.model.head.weight, glob["head.weight"])
            pheads[c.id] = {k: v.clone() for k, v in c.model.phead.state_dict().items()}
        seen.extend(uploads)
        return uploads

    monkeypatch.setattr(loop, "receive", keep)
    loop.train_clients(server, server.clients)
    server.aggregate(loop.receive(server, server.clients))
    for u in seen:
        assert not [k for k in u.state if k.startswith(("phead.", "context"))]
        assert {k.split(".")[0] for k in u.state} == {"base", "cpn", "head"}
        assert torch.equal(u.state["head.weight"], pheads[u.id]["weight"])
    n = {c.id: c.train_samples for c in server.clients}
    want = sum(n[i] * pheads[i]["weight"] for i in n) / sum(n.values())
    assert torch.allclose(server.global_model.head.weight, want, atol=1e-6)
    server.round_idx = 1
    loop.send(server, server.clients)
    for c in server.clients:  # receiving keeps the personal head and sets the context from it
        assert torch.equal(c.model.phead.weight, pheads[c.id]["weight"])
        assert torch.allclose(c.model.context, pheads[c.id]["weight"].sum(0))
        assert torch.equal(c.model.head.weight, server.global_model.head.weight)
        assert torch.equal(c.global_base.state_dict()["fc1.0.weight"], server.global_model.base.state_dict()["fc1.0.weight"])


def test_ala_runs(digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "FedCP", "-ala", "-gr", "2", "-nc", "3",
                         "--executor", "sequential")) == 0
    assert "ALA adapts 2 tensor(s) (last 2 tensor(s), -p): head.weight, head.bias" in capsys.readouterr().out


def test_loss_is_ce_of_the_gumbel_split_plus_lambda_mmd_to_the_received_extractor(digits_tiny_root):
    server = make_server(digits_tiny_root, "-lam", "0.7")
    c = server.clients[0]
    loop.send(server, [c])
    received = {k: v.clone() for k, v in c.model.base.state_dict().items()}
    with torch.no_grad():  # local training has moved the extractor away from the received one, and the
        # personal head away from the global one (while they are equal, r + s = 1 makes the policy invisible)
        for p in [*c.model.base.parameters(), *c.model.phead.parameters()]:
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    x, y = c.x_train[:8], c.y_train[:8]
    gen = torch.Generator().set_state(c.gumbel_gen.get_state())
    got = c.loss(x, y)
    with torch.no_grad():
        h = c.model.base(x)
        noise = -torch.empty(8, 2, h.shape[1]).exponential_(generator=gen).log()
        ref_base = copy.deepcopy(c.model.base)
        ref_base.load_state_dict(received)
        want = nn.functional.cross_entropy(c.model.heads(h, noise), y) + 0.7 * mmd(h, ref_base(x))
    torch.testing.assert_close(got.detach(), want)


def test_gumbel_noise_comes_from_the_clients_own_stream(digits_tiny_root):
    from utils.seeding import torch_gen

    server = make_server(digits_tiny_root, "--seed", "2")
    for c in server.clients:
        assert torch.equal(c.gumbel_gen.get_state(), torch_gen(2, 0, "gumbel", c.id).get_state())


def test_lambda_zero_is_accepted_and_a_negative_one_refused(digits_tiny_root):
    assert parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedCP", "-lam", "0")).lamda == 0
    with pytest.raises(FLError, match="-lam >= 0"):
        parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedCP", "-lam", "-0.5"))


def test_a_classifier_that_is_not_linear_is_refused(digits_tiny_root, monkeypatch):
    from flcore.servers.partsharing import PartSharingServer

    head = nn.Sequential(nn.Linear(64, 10))
    monkeypatch.setattr(PartSharingServer, "build_model", lambda self, name=None: BaseHeadSplit(nn.Flatten(), head))
    with pytest.raises(FLError, match="FedCP needs a linear classifier.*Sequential"):
        make_server(digits_tiny_root)
