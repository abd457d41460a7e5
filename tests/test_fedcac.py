"""FedCAC: critical-parameter selection on hand-made sensitivities, overlap rates and collaborator choice on
hand-made masks, the server's composition against a hand recomputation from the uploads, a client without
a new composition keeping its critical entries, FedAvg when nothing is critical, and the refusals (-ala,
bad -tau/-bt). -dp: tests/test_dp_registry.py."""
import pytest
import torch

from cli import parse_config
from conftest import cli
from flcore.clients.clientcac import critical_mask
from flcore.registry import get_server_class
from flcore.servers.servercac import collaborators, overlap_rates
from utils.data_utils import load_split
from utils.errors import FLError
from runtime import loop


def make_server(root, *flags, algo="FedCAC"):
    cfg = parse_config(cli(root, root, "-algo", algo, "--executor", "sequential", "-gr", "2", *flags))
    return get_server_class(algo)(cfg.replace(device="cpu", num_classes=10), load_split("Digits", root))


def test_critical_mask_is_the_top_tau_by_sensitivity():
    after = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    before = after - torch.tensor([[1.0, 1.0], [-1.0, 4.0]])
    # s = |θ' ⊙ Δθ| = [[1, 2], [3, 2]]: the top half (2 of 4) are 3 and one 2, ties included -> three
    assert torch.equal(critical_mask(before, after, 0.5), torch.tensor([[False, True], [True, True]]))
    assert torch.equal(critical_mask(before, after, 0.25), torch.tensor([[False, False], [True, False]]))
    assert critical_mask(before, after, 1.0).all()
    assert not critical_mask(before, after, 0.1).any()  # int(0.1 · 4) = 0 entries
    # fewer moved entries than the top fraction asks for: exactly the moved ones
    moved = after.clone()
    moved[0, 1] += 0.5
    assert torch.equal(critical_mask(after, moved, 0.75), torch.tensor([[False, True], [False, False]]))
    assert not critical_mask(after, after.clone(), 0.5).any()  # nothing moved: nothing critical


def test_critical_mask_at_its_two_small_thresholds():
    """The k-th largest sensitivity at exactly 1e-10 counts as ~0 (the moved entries are taken instead), and
    an entry whose sensitivity is exactly 1e-20 has not moved. Sensitivities set exactly: with θ = θ' - 1,
    s = |1 · θ'| = θ'."""
    tiny = torch.tensor(1e-10).item()  # float32's nearest value, the one the comparison sees
    after = torch.tensor([tiny, 1e-15, 0.0, 0.0])
    before = after - 1
    before[2:] = 0.0  # unmoved: s = 0
    assert torch.equal(((after - before) * after).abs(), after)
    # tau 0.25: k = 1, threshold s_0 = 1e-10 -> ~0, so the two moved entries are critical
    assert critical_mask(before, after, 0.25).tolist() == [True, True, False, False]
    edge = torch.tensor([torch.tensor(1e-20).item(), 0.0, 0.0, 0.0])
    edge_before = edge - 1
    edge_before[1:] = 0.0
    assert not critical_mask(edge_before, edge, 0.5).any()  # s = 1e-20 is not "moved"


def test_the_client_scores_sensitivity_by_its_trained_parameters(digits_tiny_root):
    """The masks after a local update are the top tau of |(θ' − θ) ⊙ θ'|, θ' the trained parameters
    (ranked here by sorting, ties at the threshold included)."""
    server = make_server(digits_tiny_root, "-lr", "0.1")
    c = server.clients[0]
    before = {k: p.detach().clone() for k, p in c.model.named_parameters()}
    c.local_update(0)
    for k, p in c.model.named_parameters():
        s = ((p.detach() - before[k]) * p.detach()).abs().reshape(-1)
        kth = s.sort(descending=True).values[int(0.5 * s.numel()) - 1]
        assert kth > 1e-10
        assert torch.equal(c.critical[k].reshape(-1), s >= kth), k


def test_overlap_rates_and_collaborators_on_hand_made_masks():
    m = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    o = overlap_rates(m)
    # o_ij = 1 − |m_i − m_j|₁ / (2 |m_i|₁)
    want = torch.tensor([[1, 0.5, 1, 0.75], [0.5, 1, 0.5, 0.75], [1, 0.5, 1, 0.75], [1 - 1 / 6, 1 - 1 / 6, 1 - 1 / 6, 1]],
                        dtype=torch.float64)
    assert torch.allclose(o, want)
    off = want[~torch.eye(4, dtype=torch.bool)]
    mean = float(off.mean())  # (0.5+1+.75 + .5+.5+.75 + 1+.5+.75 + 3·5/6) / 12 = 0.729
    assert mean == pytest.approx((2.25 + 1.75 + 2.25 + 2.5) / 12)
    # progress 0: threshold = mean, so o_ij >= 0.729: 0.75, 5/6 and 1 qualify
    assert collaborators(o, 0.0) == [[0, 2, 3], [1, 3], [2, 0, 3], [3, 0, 1, 2]]
    # progress 1: threshold = max = 1: only 0 and 2, whose critical sets are identical
    assert collaborators(o, 1.0) == [[0, 2], [1], [2, 0], [3]]
    assert collaborators(o, 2.0) == [[0], [1], [2], [3]]  # past β rounds: everyone alone
    assert collaborators(o[:1, :1], 0.0) == [[0]]
    # two clients: the threshold is their common overlap (mean = max), so they collaborate
    assert collaborators(o[:2, :2], 0.0) == [[0, 1], [1, 0]]
    # a client with no critical entry (its overlap uses |m_i|₁ clamped at 1) and one with a single entry
    m = torch.tensor([[0, 0, 0], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    want = torch.tensor([[1, 1 - 1 / 2, 1 - 2 / 2], [1 - 1 / 2, 1, 1 - 1 / 2], [1 - 2 / 4, 1 - 1 / 4, 1]],
                        dtype=torch.float64)
    assert torch.equal(overlap_rates(m), want)


def test_server_composes_each_uploaders_model_by_hand(digits_tiny_root, monkeypatch):
    server = make_server(digits_tiny_root, "-lr", "0.1", "-bt", "3")
    seen = []
    receive = loop.receive
    monkeypatch.setattr(loop, "receive", lambda srv, cs: seen.append(receive(srv, cs)) or seen[-1])
    loop.run_round(server, 0)
    uploads = seen[0]
    n = torch.tensor([float(u.weight) for u in uploads])
    names = [k for k, _ in server.global_model.named_parameters()]
    glob = {k: sum(w * u.state[k] for w, u in zip(n, uploads)) / n.sum() for k in names}
    flat = torch.stack([torch.cat([u.extras["critical"][k].reshape(-1) for k in names]) for u in uploads]).double()
    o = 1 - torch.cdist(flat, flat, p=1) / (2 * flat.sum(1, keepdim=True))
    off = o[~torch.eye(len(uploads), dtype=torch.bool)]
    threshold = off.mean() + (0 + 1) / 3 * (off.max() - off.mean())
    sizes = []
    for i, u in enumerate(uploads):
        group = [i] + [j for j in range(len(uploads)) if j != i and o[i, j] >= threshold]
        sizes.append(len(group))
        for k in names:
            mean = sum(uploads[j].state[k] for j in group) / len(group)
            want = torch.where(u.extras["critical"][k], mean, glob[k])
            assert torch.allclose(server.composed[u.id][k], want, atol=1e-6), (u.id, k)
    assert max(sizes) > 1  # someone collaborates: the check is not about self-averages only
    loop.send(server, server.clients)
    for c in server.clients:
        for k, p in c.model.named_parameters():
            assert torch.equal(p, server.composed[c.id][k])


def test_a_client_without_a_composition_keeps_its_critical_entries(digits_tiny_root):
    server = make_server(digits_tiny_root, "-lr", "0.1")
    loop.run_round(server, 0)
    c = server.clients[2]
    before = {k: p.detach().clone() for k, p in c.model.named_parameters()}
    glob = server.global_model.state_dict()
    c.receive(("global", server.global_model), participating=False)
    for k, p in c.model.named_parameters():
        crit = c.critical[k]
        assert crit.any() and (~crit).any()
        assert torch.equal(p[crit], before[k][crit]) and torch.equal(p[~crit], glob[k][~crit])


def test_nothing_critical_is_fedavg(digits_tiny_root):
    cac = make_server(digits_tiny_root, "-lr", "0.1", "-tau", "1e-9")
    avg = make_server(digits_tiny_root, "-lr", "0.1", algo="FedAvg")
    for t in range(2):
        loop.run_round(cac, t)
        loop.run_round(avg, t)
    for k, v in avg.global_model.state_dict().items():
        assert torch.equal(cac.global_model.state_dict()[k], v), k
    for c, a in zip(cac.clients, avg.clients):
        assert all(not m.any() for m in c.critical.values())
        assert all(torch.equal(p, q) for p, q in zip(c.model.parameters(), a.model.parameters()))


@pytest.mark.parametrize("flags,message", [(("-ala",), "-ala"), (("-bt", "0"), "-bt > 0"), (("-tau", "0"), "-tau"),
                                           (("-tau", "1.5"), "-tau")])
def test_refusals(flags, message, digits_tiny_root):
    with pytest.raises(FLError, match=message):
        parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedCAC", *flags))


def test_every_entry_critical_and_a_short_beta_are_accepted(digits_tiny_root):
    """-tau 1 (PFLlib's) and any positive -bt are valid."""
    cfg = parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedCAC", "-tau", "1", "-bt", "0.5"))
    assert (cfg.tau, cfg.beta) == (1.0, 0.5)


def test_defaults_are_the_official_cifar10_configuration(digits_tiny_root):
    """τ 0.5 with β 100, the official CIFAR-10 config (its CIFAR-100 pair is τ 0.4, β 170)."""
    cfg = parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedCAC"))
    assert (cfg.tau, cfg.beta) == (0.5, 100.0)


def buffers(model) -> dict:
    return {k: b.detach().clone() for k, b in model.named_buffers()}


def mark(client, value: float) -> dict:
    """Give ``client`` running statistics of its own (``value``) and parameters unlike anyone's (+1); return
    its buffers."""
    with torch.no_grad():
        for b in client.model.buffers():
            if b.is_floating_point():
                b.fill_(value)
        for p in client.model.parameters():
            p.add_(1.0)
    return buffers(client.model)


@pytest.mark.parametrize("mode", ["shared", "local"])
def test_batchnorm_statistics_follow_bn_stats(mode, digits_tiny_root):
    """-m BNCNN: a client takes the global running statistics with its model under --bn_stats shared and
    keeps its own under local, however the model arrives: the global model before it has trained (nothing
    critical yet), the model composed for it, or the global model around its critical entries."""
    server = make_server(digits_tiny_root, "-lr", "0.1", "-m", "BNCNN", "--bn_stats", mode)
    assert buffers(server.global_model)  # the model has running statistics to share or keep
    with torch.no_grad():
        for b in server.global_model.buffers():
            if b.is_floating_point():
                b.fill_(3.0)

    def check(client, own: dict, params: dict):
        want = buffers(server.global_model) if mode == "shared" else own
        for k, b in client.model.named_buffers():
            assert torch.equal(b, want[k]), (mode, k)
        for k, p in client.model.named_parameters():
            assert torch.equal(p, params[k]), k

    # before any training: the whole global model, its statistics as --bn_stats says
    c = server.clients[0]
    assert c.critical is None
    own = mark(c, 7.0)
    glob = {k: p.detach().clone() for k, p in server.global_model.named_parameters()}
    c.receive(("global", server.global_model))
    check(c, own, glob)
    for k, p in server.global_model.named_parameters():
        assert torch.equal(p, glob[k]), k  # received, not sent back

    loop.run_round(server, 0)
    for c in server.clients:
        composed = server.composed[c.id]
        for k, b in server.global_model.named_buffers():
            assert torch.equal(composed[k], b), k  # the composed model carries the global statistics
        own = mark(c, 7.0)
        c.receive(("own", composed))
        check(c, own, {k: composed[k] for k, _ in c.model.named_parameters()})

    # trained, without a composition: critical entries kept, the rest and (shared) the statistics global
    c = server.clients[1]
    own = mark(c, 5.0)
    kept = {k: p.detach().clone() for k, p in c.model.named_parameters()}
    glob = server.global_model.state_dict()
    c.receive(("global", server.global_model), participating=False)
    check(c, own, {k: torch.where(c.critical[k], kept[k], glob[k]) for k in kept})
