"""FedCross: the collaborator choice and the α mix by hand, the server's cross-aggregation of the uploaded
slots (kept slots, global = mean of the middleware models), α = 1 against a reference loop of K
independent middleware models, the FedAvg first stage (-fsb counted in rounds), -jr / -cdr, -ala (-dp: tests/test_dp_registry.py)."""
import math

import numpy as np
import pytest
import torch
from torch.func import functional_call

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientbase import Upload
from flcore.registry import get_server_class
from flcore.servers.servercross import choose_collaborators, cosine_matrix, cross_aggregate
from utils.data_utils import load_split
from utils.results import read_h5
from runtime import loop

FAST = ("-lr", "0.1", "-lbs", "20", "--train_loss_eval", "off")


def build(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedCross", "--executor", "sequential", *FAST, *flags))
    data = load_split("Digits", root, None, "cpu")
    return get_server_class("FedCross")(cfg.replace(num_classes=data.num_classes), data, 0, None)


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def play_round(server, t):
    """run_round's steps, returning (slot of each participant, uploads)."""
    server.round_idx = t
    server.selected = server.select_clients()
    loop.send(server, server.selected)
    active = loop.active_clients(server, server.selected)
    loop.train_clients(server, active)
    uploads = loop.receive(server, active)
    slots = dict(server.slot_of)
    server.aggregate(uploads)
    return slots, uploads


# ---- the pure math ---------------------------------------------------------------------------------------
def test_collaborators_by_hand():
    # Four models, parameter vectors over two entries (plus a buffer the similarity ignores):
    # v0 = (1, 0), v1 = (1, 1), v2 = (0, 1), v3 = (-1, 0.1).
    vecs = [(1.0, 0.0), (1.0, 1.0), (0.0, 1.0), (-1.0, 0.1)]
    states = [{"a": torch.tensor([x]), "b": torch.tensor([y]), "running": torch.tensor([9.0 * i])}
              for i, (x, y) in enumerate(vecs)]
    sims = cosine_matrix(states, ["a", "b"])
    n3 = math.sqrt(1.01)
    want = {(0, 1): 1 / math.sqrt(2), (0, 2): 0.0, (0, 3): -1 / n3, (1, 2): 1 / math.sqrt(2),
            (1, 3): -0.9 / (math.sqrt(2) * n3), (2, 3): 0.1 / n3}
    for (i, j), v in want.items():
        assert math.isclose(float(sims[i, j]), v, abs_tol=1e-7) and math.isclose(float(sims[j, i]), v, abs_tol=1e-7)
    # lowest similarity (1): 0 -> 3, 1 -> 3, 2 -> 0 (cos 0 < 0.1/n3), 3 -> 0
    assert choose_collaborators(1, 0, sims, 4) == [3, 3, 0, 0]
    # highest similarity (2), never the model itself: 0 -> 1, 1 -> 0 (tie with 2: lowest index), 2 -> 1, 3 -> 2
    assert choose_collaborators(2, 0, sims, 4) == [1, 0, 1, 2]
    # in order (0): offset t mod (K - 1) + 1 = 1, 2, 3, 1 for t = 0..3
    assert choose_collaborators(0, 0, None, 4) == [1, 2, 3, 0]
    assert choose_collaborators(0, 1, None, 4) == [2, 3, 0, 1]
    assert choose_collaborators(0, 2, None, 4) == [3, 0, 1, 2]
    assert choose_collaborators(0, 3, None, 4) == [1, 2, 3, 0]
    for s in (0, 1, 2):  # a single middleware model is its own partner
        assert choose_collaborators(s, 5, torch.ones(1, 1, dtype=torch.float64), 1) == [0]


def test_cosine_of_short_and_zero_vectors():
    """Cosines do not depend on the vectors' lengths, also below 1 (v0 = (0.3, 0.4), |v0| = 0.5;
    v1 = (0, 0.2)); a zero vector is orthogonal to every vector, itself included."""
    states = [{"a": torch.tensor([0.3, 0.4])}, {"a": torch.tensor([0.0, 0.2])}, {"a": torch.zeros(2)}]
    want = torch.tensor([[1.0, 0.8, 0.0], [0.8, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(cosine_matrix(states, ["a"]), want)


def test_highest_similarity_never_picks_the_model_itself():
    # Every other model points away from v0 (cos -0.981 and -0.995): PFLlib's self-similarity 0 would win.
    states = [{"a": torch.tensor([1.0, 0.0])}, {"a": torch.tensor([-1.0, 0.2])}, {"a": torch.tensor([-1.0, -0.1])}]
    partners = choose_collaborators(2, 0, cosine_matrix(states, ["a"]), 3)
    assert partners[0] == 1 and all(p != i for i, p in enumerate(partners))


def test_cross_aggregate_mixes_by_alpha():
    v = [{"w": torch.tensor([1.0, 2.0]), "steps": torch.tensor(10)},
         {"w": torch.tensor([5.0, -2.0]), "steps": torch.tensor(20)}]
    out = cross_aggregate(v, [1, 0], 0.75)
    torch.testing.assert_close(out[0]["w"], torch.tensor([2.0, 1.0]))  # 0.75 (1, 2) + 0.25 (5, -2)
    torch.testing.assert_close(out[1]["w"], torch.tensor([4.0, -1.0]))  # 0.75 (5, -2) + 0.25 (1, 2)
    assert out[0]["steps"].dtype == torch.int64 and int(out[0]["steps"]) == 12  # round(12.5) = 12 (half to even)
    assert int(out[1]["steps"]) == 18  # round(17.5) = 18
    assert all(torch.equal(a["w"], b["w"]) for a, b in zip(cross_aggregate(v, [1, 0], 1.0), v))  # α = 1 exactly


# ---- the server's aggregation ----------------------------------------------------------------------------
def toy_uploads(server, coords):
    """Slot s uploads a_s u + b_s z for coords[s] = (a_s, b_s): u and z orthonormal (u spread evenly over
    fc.bias, z over fc.weight, every other entry zero), so cosines are those of the 2-d vectors (a_s, b_s)."""
    init = state(server.global_model)
    u = {k: torch.zeros_like(v) for k, v in init.items()}
    z = {k: torch.zeros_like(v) for k, v in init.items()}
    u["fc.bias"] += 1 / math.sqrt(u["fc.bias"].numel())
    z["fc.weight"] += 1 / math.sqrt(z["fc.weight"].numel())
    client_of = {s: cid for cid, s in server.slot_of.items()}
    uploads = [Upload(client_of[s], 10.0 + s, {k: a * u[k] + b * z[k] for k in init}) for s, (a, b) in coords.items()]
    return uploads, u, z


# v0 = (1, 0), v1 = (1, 1), v2 = (0.2, 1), v3 = (-1, 0.1): cos(0,1) = 0.707, cos(0,2) = 0.196,
# cos(0,3) = -0.995, cos(1,2) = 0.832, cos(1,3) = -0.633, cos(2,3) = -0.098.
COORDS = [(1.0, 0.0), (1.0, 1.0), (0.2, 1.0), (-1.0, 0.1)]


@pytest.mark.parametrize("strategy,partners", [("0", [1, 2, 3, 0]), ("1", [3, 3, 3, 0]), ("2", [1, 2, 1, 2])])
def test_server_cross_aggregates_the_uploads(strategy, partners, digits_tiny_root):
    server = build(digits_tiny_root, "-jr", "0.8", "-ca", "0.75", "-cmss", strategy)
    assert server.k == 4
    server.round_idx = 0
    loop.send(server, server.select_clients())
    assert sorted(server.slot_of.values()) == [0, 1, 2, 3]
    uploads, u, z = toy_uploads(server, dict(enumerate(COORDS)))
    server.aggregate(uploads)
    assert server.partners == partners
    mixed = [[0.75 * COORDS[s][d] + 0.25 * COORDS[partners[s]][d] for d in (0, 1)] for s in range(4)]
    for s, (a, b) in enumerate(mixed):
        for k in u:
            torch.testing.assert_close(server.middleware[s][k], a * u[k] + b * z[k])
    a, b = (sum(m[d] for m in mixed) / 4 for d in (0, 1))  # uniform mean, not by samples
    for k, v in state(server.global_model).items():
        torch.testing.assert_close(v, a * u[k] + b * z[k])


def test_slots_without_an_upload_keep_their_middleware_model(digits_tiny_root):
    server = build(digits_tiny_root, "-jr", "0.8", "-ca", "0.75", "-cmss", "0")
    server.round_idx = 0
    loop.send(server, server.select_clients())
    init = state(server.global_model)
    uploads, u, z = toy_uploads(server, {0: COORDS[1], 2: COORDS[3]})  # slots 1 and 3 dropped out
    before = [dict(m) for m in server.middleware]
    server.aggregate(uploads)
    # in order at t = 0: 0 -> 1 and 2 -> 3, both kept (the initial model)
    for k, v in init.items():
        torch.testing.assert_close(server.middleware[0][k], 0.75 * (u[k] + z[k]) + 0.25 * v)
        torch.testing.assert_close(server.middleware[2][k], 0.75 * (-u[k] + 0.1 * z[k]) + 0.25 * v)
        glob = (server.middleware[0][k] + server.middleware[2][k] + 2 * v) / 4
        torch.testing.assert_close(server.global_model.state_dict()[k], glob)
    assert same(server.middleware[1], before[1]) and same(server.middleware[3], before[3])


def test_dropped_clients_leave_their_slot_as_it_was(digits_tiny_root):
    server = build(digits_tiny_root, "-cdr", "0.5", "--seed", "3")
    for t in range(3):
        before = [dict(m) for m in server.middleware]
        slots, uploads = play_round(server, t)
        uploaded = {slots[u.id] for u in uploads}
        assert 0 < len(uploaded) < server.k  # not vacuous: some slots upload, some do not
        for s in range(server.k):
            assert same(server.middleware[s], before[s]) == (s not in uploaded), (t, s)


# ---- α = 1: K independent models, each trained by the clients it is dispatched to -------------------------
def test_alpha_one_is_a_reference_loop_of_local_models(digits_tiny_root):
    server = build(digits_tiny_root, "-ca", "1")
    assert server.k == len(server.clients) == 5
    refs = [state(server.global_model) for _ in range(server.k)]
    params = [k for k, _ in server.global_model.named_parameters()]
    model = server.clients[0].model
    mappings = []
    for t in range(3):
        server.round_idx = t
        server.selected = server.select_clients()
        loop.send(server, server.selected)
        slots = dict(server.slot_of)
        mappings.append(tuple(sorted(slots.items())))
        gens = {c.id: c.batch_gen.get_state() for c in server.selected}
        loop.train_clients(server, server.selected)
        uploads = loop.receive(server, server.selected)
        server.aggregate(uploads)
        for u in uploads:  # each middleware model is exactly its client's local model
            assert same(server.middleware[slots[u.id]], u.state)
        for c in server.selected:  # reference: plain SGD from the slot's model on the client's batches
            ref = refs[slots[c.id]]
            gen = torch.Generator().set_state(gens[c.id])
            perm = torch.randperm(c.train_samples, generator=gen)
            for i in range(0, c.train_samples, 20):
                idx = perm[i:i + 20]
                p = {k: ref[k].clone().requires_grad_(True) for k in params}
                out = functional_call(model, {**ref, **p}, (c.x_train[idx],))
                grads = torch.autograd.grad(torch.nn.functional.cross_entropy(out, c.y_train[idx]), list(p.values()))
                ref.update({k: ref[k] - 0.1 * g for k, g in zip(params, grads)})
        for s in range(server.k):
            for k in params:
                torch.testing.assert_close(server.middleware[s][k], refs[s][k], atol=1e-5, rtol=1e-4)
        glob = state(server.global_model)
        for k in params:  # the global model is the plain mean of the K models
            torch.testing.assert_close(glob[k], sum(r[k] for r in refs) / server.k, atol=1e-5, rtol=1e-4)
    assert len(set(mappings)) == 3  # the dispatch order is drawn afresh each round


def test_clients_evaluate_the_global_model_and_train_their_middleware_model(digits_tiny_root):
    server = build(digits_tiny_root)
    play_round(server, 0)
    server.round_idx = 1
    loop.send(server, server.select_clients())
    glob = state(server.global_model)
    for k, v in glob.items():  # the global model is the mean of the middleware models
        torch.testing.assert_close(v, sum(m[k] for m in server.middleware) / server.k)
    for c in server.clients:
        assert same(state(c.eval_model()), glob)
        assert same(state(c.model), server.middleware[server.slot_of[c.id]])  # the training start
    assert not same(server.middleware[0], glob)


# ---- -fsb: a FedAvg first stage, counted in rounds -------------------------------------------------------
def test_first_stage_is_fedavg_for_fsb_rounds(digits_tiny_root):
    server = build(digits_tiny_root, "-fsb", "2")
    for t in range(3):
        _, uploads = play_round(server, t)
        if t < 2:  # every middleware model (and the global model) = the sample-weighted mean of the uploads
            total = sum(u.weight for u in uploads)
            for k, v in server.middleware[0].items():
                if v.is_floating_point():
                    torch.testing.assert_close(v, sum(u.weight * u.state[k] for u in uploads) / total)
            assert all(same(m, server.middleware[0]) for m in server.middleware)
            assert same(state(server.global_model), server.middleware[0])
        else:  # cross-aggregation from round fsb on: the middleware models part
            assert not same(server.middleware[0], server.middleware[1])


def test_fsb_zero_cross_aggregates_from_the_first_round(digits_tiny_root):
    server = build(digits_tiny_root)
    play_round(server, 0)
    assert not same(server.middleware[0], server.middleware[1])


# ---- flags, -jr, -ala, -dp ---------------------------------------------------------------------------------
def test_bad_flags_get_one_clear_line(digits_tiny_root, tmp_path, capsys):
    base = ("-algo", "FedCross", "-gr", "0", "--train_loss_eval", "off")
    assert main.main(cli(digits_tiny_root, tmp_path, *base, "-ca", "1.5")) == 2
    assert "-ca must be in [0, 1]" in capsys.readouterr().err
    assert main.main(cli(digits_tiny_root, tmp_path, *base, "-rjr")) == 2
    assert "drop -rjr" in capsys.readouterr().err
    cfg = parse_config(cli(digits_tiny_root, tmp_path, *base, "--collaberative_model_select_strategy", "2"))
    assert cfg.collaborative_model_select_strategy == 2  # PFLlib's spelling is accepted


def test_partial_participation_runs(digits_tiny_root, tmp_path):
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "FedCross", "-gr", "3", "-jr", "0.6", "-cdr", "0.3",
                         *FAST)) == 0
    acc = read_h5(tmp_path / "Digits_FedCross_test_0.h5")["rs_test_acc"]
    assert len(acc) == 4 and np.all(np.isfinite(acc))


def test_ala_initialises_the_training_start_from_the_middleware_model(digits_tiny_root, tmp_path):
    server = build(digits_tiny_root, "-ala")
    play_round(server, 0)
    trained = {c.id: state(c.model) for c in server.clients}
    server.round_idx = 1
    loop.send(server, server.select_clients())
    changed = 0
    for c in server.clients:
        start, middleware = state(c.model), server.middleware[server.slot_of[c.id]]
        assert same(state(c.eval_model()), state(server.global_model))
        assert not same(start, middleware) and not same(start, trained[c.id])  # ALA blended the two
        below = [k for k in start if not k.startswith("fc.")]  # ALA adapts the classifier only (-p 1)
        assert same({k: start[k] for k in below}, middleware)
        changed += 1
    assert changed == 5
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "FedCross", "-ala", "-gr", "2", *FAST)) == 0


@pytest.mark.parametrize("bn", ["shared", "local"])
def test_evaluated_batchnorm_statistics_are_the_global_or_the_clients_own(bn, digits_tiny_root):
    """The evaluated global model has the global parameters and, with --bn_stats shared, the global
    model's BatchNorm statistics; with local, the client's own."""
    server = build(digits_tiny_root, "-m", "BNCNN", "--bn_stats", bn)
    play_round(server, 0)
    server.round_idx = 1
    loop.send(server, server.select_clients())
    glob = dict(server.global_model.named_parameters())
    glob_buffers = dict(server.global_model.named_buffers())
    for c in server.clients:
        evaluated = c.eval_model()
        assert all(torch.equal(p, glob[k]) for k, p in evaluated.named_parameters())
        own = dict(c.model.named_buffers())
        want = own if bn == "local" else glob_buffers
        assert all(torch.equal(b, want[k]) for k, b in evaluated.named_buffers())
        mean = [k for k in own if k.endswith("running_mean")]
        assert mean and not torch.equal(own[mean[0]], glob_buffers[mean[0]])


def test_ala_blends_the_last_trained_model_even_after_a_drop_out(digits_tiny_root):
    """ALA's local model is what the client trained last, not a middleware model left by a round in which
    it was dispatched one and dropped out."""
    server = build(digits_tiny_root, "-ala", "-cdr", "0.5", "--seed", "3")
    last_upload, targets = {}, []
    for c in server.clients:
        def record(global_model, target, *args, _c=c, _run=c.ala.adaptive_local_aggregation, **kw):
            targets.append((_c.id, state(target), state(_c.model)))
            return _run(global_model, target, *args, **kw)
        c.ala.adaptive_local_aggregation = record
    stale = 0
    for t in range(4):
        targets.clear()
        before = {c.id: state(c.model) for c in server.clients}
        _, uploads = play_round(server, t)
        for cid, target, _ in targets:
            assert same(target, last_upload[cid]), (t, cid)
            stale += not same(before[cid], last_upload[cid])  # it had dropped out: self.model was a middleware model
        last_upload.update({u.id: {k: v.clone() for k, v in u.state.items()} for u in uploads})
    assert stale > 0
