"""Client-level DP (``-dp --dp_level client``: DP-FedAvg, McMahan et al. 2018; adaptive clipping, Andrew et al.
2021): the server's release by hand, the accountant against an independent computation, and, for every
registered algorithm (new ones join automatically), either a refusal with exit code 2 and one line, or a run
whose recorded epsilon is the accountant's on the releases counted here, whose noise is applied (another
noise stream gives another global model) and whose clipping is applied (clip norm and noise ~0: the global
model does not move)."""
from __future__ import annotations

import functools
import math
import types
from collections import Counter

import pytest
import torch
from torch import nn

import main
from cli import parse_config
from conftest import build_server, cli, plugin
from flcore.clients.clientbase import Upload
from flcore.registry import ALGORITHMS, get_server_class
from utils import dp_client
from utils.errors import FLError
from utils.seeding import torch_gen
from runtime import client_steps, loop

pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha")
NC = "3"


def stub_cfg(**kw):
    base = dict(dp_clip=1.0, dp_sigma=1.0, dp_quantile=None, dp_secure_rng=False, seed=0, device="cpu")
    return types.SimpleNamespace(**{**base, **kw})


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential()
    m.add_module("body", nn.Linear(3, 2))
    m.add_module("fc", nn.Linear(2, 2))
    return m


def uploads_with(model: nn.Module, deltas: list[float]) -> list[Upload]:
    """One upload per entry of ``deltas``: the model with every parameter moved by a fixed direction
    scaled so that the whole update has L2 norm ``deltas[i]``."""
    ref = model.state_dict()
    direction = {k: torch.randn(v.shape, generator=torch_gen(5, 0, k)) for k, v in ref.items()}
    norm = math.sqrt(sum(float(d.pow(2).sum()) for d in direction.values()))
    return [Upload(i, 10.0 + i, {k: ref[k] + direction[k] * (s / norm) for k in ref}) for i, s in enumerate(deltas)]


# ---- the release by hand ---------------------------------------------------------------------------
def test_clip_update_bounds_the_norm_and_keeps_small_updates():
    big = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([[12.0]])}  # norm 13
    clipped, norm = dp_client.clip_update(big, 1.3)
    assert norm == pytest.approx(13.0)
    assert torch.allclose(clipped["a"], torch.tensor([0.3, 0.4])) and torch.allclose(clipped["b"], torch.tensor([[1.2]]))
    small = {"a": torch.tensor([0.3, 0.4])}
    same, norm = dp_client.clip_update(small, 1.0)
    assert norm == pytest.approx(0.5) and torch.equal(same["a"], small["a"])


def test_release_is_the_clipped_mean_plus_noise_of_the_formula():
    """W' = W + (sum_i clip_S(D_i)) / m + (z S / m) xi, xi regenerated from the seeded stream; the
    denominator m is the selection (4 here, one of whom dropped), sample counts play no part."""
    model = tiny_model()
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    ups = uploads_with(model, [0.2, 3.0, 7.5])
    clip, z, m = 0.5, 1.3, 4
    dp = dp_client.ClientLevelDP(stub_cfg(dp_clip=clip, dp_sigma=z), run=0)
    out = dp.release("T", ups, model, m=m, n_clients=10)
    gen = torch_gen(0, 0, "dp-client-noise")
    for k in ref:
        total = sum((u.state[k] - ref[k]) * min(1.0, clip / n) for u, n in zip(ups, (0.2, 3.0, 7.5)))
        noise = torch.randn(ref[k].shape, generator=gen)
        want = ref[k] + total / m + z * clip / m * noise
        for u in out:
            assert torch.allclose(u.state[k], want, atol=1e-6), k
    assert all(u.weight == 1.0 for u in out) and [u.id for u in out] == [0, 1, 2]
    assert dp.last["std"] == pytest.approx(z * clip / m)
    assert dp.last["norms"] == pytest.approx([0.2, 3.0, 7.5], rel=1e-5)
    assert dp.history == [(z, 0.4, 1)]  # q = m / N


def test_the_wrapped_aggregation_sees_only_the_release():
    """DP-FedAvg wraps the aggregation step: the wrapped ``aggregate`` is called once, on the release (every
    upload replaced by W + (clipped mean + noise), weight 1), never on the clients' own updates."""
    model = tiny_model()
    ups = uploads_with(model, [0.2, 3.0])
    seen = []
    dp = dp_client.ClientLevelDP(stub_cfg(dp_clip=0.5, dp_sigma=1.3), run=0)
    dp.aggregate(seen.append, "T", ups, model, m=3, n_clients=10)
    gen, ref = torch_gen(0, 0, "dp-client-noise"), model.state_dict()
    (got,) = seen
    for k in ref:
        total = sum((u.state[k] - ref[k]) * min(1.0, 0.5 / n) for u, n in zip(ups, (0.2, 3.0)))
        want = ref[k] + total / 3 + 1.3 * 0.5 / 3 * torch.randn(ref[k].shape, generator=gen)
        assert all(torch.allclose(u.state[k], want, atol=1e-6) for u in got), k
    assert [u.weight for u in got] == [1.0, 1.0]


@pytest.mark.optional_deps("opacus")
def test_the_round_aggregates_through_the_wrapper(digits_tiny_root, tmp_path):
    """``--dp_level client`` wraps the round's aggregation step in one place: the algorithm's ``aggregate``
    receives the release (one model, weight 1 each) instead of the uploads (which differ without DP)."""
    from utils.data_utils import load_split

    seen = {}
    for level in ("client", None):
        extra = ("-dp", "--dp_level", "client") if level else ()
        cfg = parse_config(cli(digits_tiny_root, tmp_path, "-algo", "FedAvg", "-gr", "1", "-nc", NC,
                                    "--executor", "sequential", *extra))
        server = get_server_class("FedAvg")(cfg.replace(num_classes=10), load_split("Digits", digits_tiny_root, int(NC)))
        server.aggregate = lambda uploads, level=level: seen.setdefault(level, uploads)
        loop.run_round(server, 0)
    states = [torch.cat([v.flatten() for v in u.state.values()]) for u in seen["client"]]
    assert len(states) == int(NC) and all(torch.equal(s, states[0]) for s in states)
    assert [u.weight for u in seen["client"]] == [1.0] * int(NC)
    own = [torch.cat([v.flatten() for v in u.state.values()]) for u in seen[None]]
    assert not torch.equal(own[0], own[1]) and [u.weight for u in seen[None]] != [1.0] * int(NC)


def test_each_clipped_update_has_norm_at_most_s():
    model = tiny_model()
    ref = model.state_dict()
    ups = uploads_with(model, [0.1, 2.0, 50.0])
    dp = dp_client.ClientLevelDP(stub_cfg(dp_clip=1.0, dp_sigma=1e-12), run=0)  # noise ~0: the mean of clipped
    out = dp.release("T", ups, model, m=1, n_clients=3)  # m = 1: the release is the sum, one update at a time
    for u in ups:
        delta = {k: u.state[k] - ref[k] for k in ref}
        clipped, _ = dp_client.clip_update(delta, 1.0)
        assert math.sqrt(sum(float(c.pow(2).sum()) for c in clipped.values())) <= 1.0 + 1e-6
    total = math.sqrt(sum(float((out[0].state[k] - ref[k]).pow(2).sum()) for k in ref))
    assert total == pytest.approx(0.1 + 1.0 + 1.0, rel=1e-4)  # same direction: the norms add up


def test_partial_uploads_are_aligned_and_refusals_are_one_line():
    model = tiny_model()
    body = {k: v + 1.0 for k, v in model.body.state_dict().items()}  # FedRep-style: names relative to a part
    dp = dp_client.ClientLevelDP(stub_cfg(dp_clip=10.0, dp_sigma=1e-12), run=0)
    out = dp.release("T", [Upload(0, 5, body)], model, m=1, n_clients=1)
    assert set(out[0].state) == {"weight", "bias"}
    assert torch.allclose(out[0].state["weight"], model.body.weight + 1.0, atol=1e-5)
    with pytest.raises(FLError, match="upload no model update"):
        dp.release("T", [Upload(0, 5)], model, m=1, n_clients=1)
    with pytest.raises(FLError, match="upload dc beside"):
        dp.release("T", [Upload(0, 5, model.state_dict(), {"dc": 1})], model, m=1, n_clients=1)
    with pytest.raises(FLError, match="sends each client its own model"):
        dp.check_broadcast("T", [model, tiny_model()])
    dp.check_broadcast("T", [model, model, (model, 3)][:2])


def test_adaptive_clipping_follows_the_papers_update():
    """Andrew et al.: b = (#{||D_i|| <= S} + N(0, sigma_b^2)) / m, S <- S exp(-eta (b - gamma)), sigma_b = m/20,
    and the update noise multiplier z_D = (z^-2 - (2 sigma_b)^-2)^(-1/2)."""
    assert dp_client.update_noise_multiplier(1.0, 1.0) == pytest.approx(1 / math.sqrt(1 - 0.25))
    with pytest.raises(FLError, match="adaptive clipping needs"):
        dp_client.update_noise_multiplier(2.0, 1.0)
    model = tiny_model()
    ref = model.state_dict()
    norms = [0.1, 0.3, 0.6, 2.0] * 10
    m, z, gamma, clip = 40, 1.0, 0.5, 0.5
    dp = dp_client.ClientLevelDP(stub_cfg(dp_clip=clip, dp_sigma=z, dp_quantile=gamma), run=0)
    out = dp.release("T", uploads_with(model, norms), model, m=m, n_clients=100)
    sigma_b = m / 20
    zd = (z ** -2 - (2 * sigma_b) ** -2) ** -0.5
    gen = torch_gen(0, 0, "dp-client-noise")
    for k in ref:  # the update noise first, at z_D
        noise = torch.randn(ref[k].shape, generator=gen)
        total = sum((u.state[k] - ref[k]) * min(1.0, clip / n) for u, n in zip(uploads_with(model, norms), norms))
        assert torch.allclose(out[0].state[k], ref[k] + total / m + zd * clip / m * noise, atol=1e-5)
    b = (20 + sigma_b * float(torch.randn((), generator=gen))) / m  # 20 of the 40 norms are <= 0.5
    assert dp.clip == pytest.approx(clip * math.exp(-0.2 * (b - gamma)), rel=1e-9)
    assert dp.history == [(z, 0.4, 1)]  # accounted at z: both releases together



def test_update_noise_multiplier_and_its_refusal_by_hand():
    # z = 1.5, sigma_b = 2: (1/2.25 - 1/16)^(-1/2) = (0.381944...)^(-1/2) = 1.618080...
    assert dp_client.update_noise_multiplier(1.5, 2.0) == pytest.approx(1.6180797, rel=1e-6)
    # m = 10 clients: sigma_b = 0.5, 2 sigma_b = 1 <= z = 1.2: refused, the message's numbers worked out
    with pytest.raises(FLError) as e:
        dp_client.update_noise_multiplier(1.2, 0.5)
    assert "-dps < 2 sigma_b = m / 10 (here 1 for m = 10 clients per round)" in str(e.value)


def test_clip_update_below_one_and_at_zero():
    # a norm under 1 above the clip is still clipped; a zero update stays zero (no division by its norm)
    clipped, norm = dp_client.clip_update({"a": torch.tensor([0.6, 0.0]), "b": torch.tensor([0.8])}, 0.5)
    assert norm == pytest.approx(1.0)
    clipped, norm = dp_client.clip_update({"a": torch.tensor([0.48, 0.0]), "b": torch.tensor([0.64])}, 0.5)
    assert norm == pytest.approx(0.8)
    assert torch.allclose(clipped["a"], torch.tensor([0.3, 0.0])) and torch.allclose(clipped["b"], torch.tensor([0.4]))
    zero, norm = dp_client.clip_update({"a": torch.zeros(2)}, 0.5)
    assert norm == 0.0 and torch.equal(zero["a"], torch.zeros(2))


def test_broadcast_identity_is_the_ids_of_its_modules_and_tensors():
    model, t = nn.Linear(1, 1), torch.zeros(1)
    holder = types.SimpleNamespace(net=model, k=2)
    assert dp_client._leaves(model) == (id(model),)
    assert dp_client._leaves({"a": t, "b": [model, 3]}) == (id(t), id(model), 3)
    assert dp_client._leaves((t, "x", None)) == (id(t), "x", None)
    assert dp_client._leaves(holder) == (id(model), 2)
    other = object()
    assert dp_client._leaves(other) == (id(other),)


def test_uploads_with_different_entries_are_refused():
    model = tiny_model()
    full, body = model.state_dict(), {f"body.{k}": v for k, v in model.body.state_dict().items()}
    dp = dp_client.ClientLevelDP(stub_cfg(), run=0)
    with pytest.raises(FLError, match="not entries of its global model"):
        dp.release("T", [Upload(0, 5, full), Upload(1, 5, body)], model, m=2, n_clients=2)


def test_the_secure_generator_is_seeded_from_the_system_and_the_default_from_seed_and_run():
    a = dp_client.ClientLevelDP(stub_cfg(dp_secure_rng=True), run=0).generator.initial_seed()
    b = dp_client.ClientLevelDP(stub_cfg(dp_secure_rng=True), run=0).generator.initial_seed()
    assert a != b and a != torch.Generator().initial_seed()  # fresh system entropy each time, never the default
    plain = dp_client.ClientLevelDP(stub_cfg(seed=3), run=1).generator
    assert torch.equal(torch.randn(4, generator=plain), torch.randn(4, generator=torch_gen(3, 1, "dp-client-noise")))
    cfg = stub_cfg()  # a cfg without the flag (a library caller's): the seeded stream
    del cfg.dp_secure_rng
    seeded = dp_client.ClientLevelDP(cfg, run=0).generator
    assert torch.equal(torch.randn(4, generator=seeded), torch.randn(4, generator=torch_gen(0, 0, "dp-client-noise")))

# ---- the accountant --------------------------------------------------------------------------------
OPACUS_ALPHAS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))


def hand_epsilon(z: float, rounds: int, delta: float) -> float:
    """No subsampling (q = 1): the Gaussian mechanism's RDP is alpha / (2 z^2) per release (Mironov 2017),
    composed by summing, converted to (epsilon, delta) by Balle et al. 2020's bound, minimised over alpha."""
    return min(rounds * a / (2 * z * z) + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1)
               for a in OPACUS_ALPHAS)


@pytest.mark.optional_deps("opacus")
def test_epsilon_without_subsampling_matches_a_hand_computation():
    model = tiny_model()
    dp = dp_client.ClientLevelDP(stub_cfg(dp_sigma=2.0), run=0)
    for _ in range(5):
        dp.release("T", uploads_with(model, [1.0, 2.0]), model, m=2, n_clients=2)
    assert dp.history == [(2.0, 1.0, 5)]
    assert dp.epsilon(1e-5) == pytest.approx(hand_epsilon(2.0, 5, 1e-5), rel=1e-9)


@pytest.mark.optional_deps("opacus")
def test_a_declared_refusal_is_one_line_at_start_up(monkeypatch):
    import dataclasses

    from utils.dp_support import DPSupport

    fedavg = get_server_class("FedAvg")
    declared = fedavg.declares
    monkeypatch.setattr(fedavg, "declares", dataclasses.replace(declared, dp_support=DPSupport(
        client_refusal="it aggregates per client")))
    with pytest.raises(FLError, match="^--dp_level client: FedAvg is refused: it aggregates per client; use"):
        parse_config(["-algo", "FedAvg", "-dp", "--dp_level", "client"])
    parse_config(["-algo", "FedAvg", "-dp"])  # sample-level DP is not affected
    monkeypatch.setattr(fedavg, "declares", dataclasses.replace(declared, dp_support=DPSupport(
        refusal="it uploads its data")))  # every level
    for level in ("sample", "client"):
        with pytest.raises(FLError, match="^-dp: FedAvg is refused: it uploads its data; drop -dp$"):
            parse_config(["-algo", "FedAvg", "-dp", "--dp_level", level])


@pytest.mark.optional_deps("opacus")
def test_flags_are_checked():
    with pytest.raises(FLError, match="--dp_level client needs -dp"):
        parse_config(["--dp_level", "client"])
    with pytest.raises(FLError, match="needs -dp --dp_level client"):
        parse_config(["-dp", "--dp_quantile", "0.5"])
    with pytest.raises(FLError, match=r"^--dp_quantile 1.5 is out of range: it takes \[1e-30, 1\)"):
        parse_config(["-dp", "--dp_level", "client", "--dp_quantile", "1.5"])


# ---- every registered algorithm --------------------------------------------------------------------
def flags(algo: str, root, *extra: str) -> list[str]:
    # S = 0.05: the noise (z S / m per coordinate) stays small enough for every algorithm to train on 3 clients
    return cli(root, root / "dpc", "--executor", "sequential", "-algo", algo, "-dp", "--dp_level", "client",
               "--dp_clip", "0.05", "-nc", NC, "-lbs", "20", "--train_loss_eval", "off", *extra)


@functools.lru_cache(maxsize=None)
def accountant_epsilon(steps: tuple, delta: float) -> float:
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    for (sigma, q), n in sorted(Counter(steps).items()):
        for _ in range(n):
            acc.step(noise_multiplier=sigma, sample_rate=q)
    return acc.get_epsilon(delta) if steps else 0.0


class Counted:
    """A server built in-process; every release counted as (z, m / N), every evaluation kept with the
    number of releases before it."""

    def __init__(self, algo: str, root, monkeypatch, *extra: str):
        from utils.data_utils import load_split

        self.cfg = parse_config(flags(algo, root, *extra))
        self.releases: list[tuple[float, float]] = []
        self.records: list[tuple[dict, int]] = []
        release = dp_client.ClientLevelDP.release

        def counting(dp, algorithm, uploads, reference, m, n_clients):
            out = release(dp, algorithm, uploads, reference, m, n_clients)
            if uploads:
                self.releases.append((dp.sigma, m / n_clients))
            return out

        monkeypatch.setattr(dp_client.ClientLevelDP, "release", counting)
        data = load_split("Digits", root, int(NC))
        self.server = get_server_class(algo)(self.cfg.replace(num_classes=10), data)
        record, mine = loop.record, self.server
        monkeypatch.setattr(loop, "record", lambda server, s: (
            server is mine and self.records.append((s, len(self.releases))), record(server, s)))

    def global_params(self) -> torch.Tensor:
        return torch.cat([p.detach().flatten().double() for p in self.server.global_model.parameters()])

    def rounds(self, first: int, last: int, final: bool = False) -> torch.Tensor:
        for t in range(first, last):
            loop.run_round(self.server, t)
        if final:
            loop.final_evaluation(self.server, last)
        return self.global_params()


@pytest.mark.optional_deps("opacus")
def test_a_server_that_sends_clients_different_models_is_refused_at_its_broadcast(digits_tiny_root, monkeypatch):
    # the backstop behind the declared refusals: an algorithm that does not declare one, yet gives a client its
    # own payload, stops at that broadcast, before any client trains
    server = Counted("FedAvg", digits_tiny_root, monkeypatch).server
    own = tiny_model()
    monkeypatch.setattr(server, "broadcast", lambda c: own if c.id == 1 else server.global_model)
    trained = []
    monkeypatch.setattr(client_steps, "train", lambda client, r=0: trained.append(client.id))
    with pytest.raises(FLError, match="--dp_level client: FedAvg sends each client its own model"):
        loop.run_round(server, 0)
    assert trained == []


@pytest.mark.optional_deps("opacus")
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_client_dp_is_refused_or_counted_and_applied(algo, digits_tiny_root, monkeypatch, capsys):
    root = digits_tiny_root
    try:
        run = Counted(algo, root, monkeypatch, "-gr", "2")
        start = run.global_params()
        run.rounds(0, 1)
        after_one = run.global_params()
        run.rounds(1, 2, final=True)
    except FLError as e:  # refused: at start-up, or at the first per-client broadcast / upload without an update
        assert "--dp_level client" in str(e) or "-dp" in str(e), (algo, str(e))
        capsys.readouterr()
        assert main.main(flags(algo, root, "-gr", "2")) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "-dp" in err, err
        return
    assert all(c.dp is None for c in run.server.clients)  # no DP-SGD on the clients
    assert len(run.releases) == 2 and len(run.records) == 3
    for summary, n in run.records:  # (a) the recorded epsilon is the accountant's on the releases so far
        want = accountant_epsilon(tuple(run.releases[:n]), run.cfg.dp_delta)
        assert summary["dp_epsilon_max"] == pytest.approx(want, rel=1e-9), (algo, n)
        assert list(summary["dp_client_epsilon"]) == pytest.approx([want] * int(NC), rel=1e-9)
    assert run.records[-1][0]["dp_epsilon_max"] > 0
    # (b) noise applied: another noise stream, another global model after one round
    other = Counted(algo, root, monkeypatch, "-gr", "1", "--dp_secure_rng").rounds(0, 1)
    assert not torch.equal(other, after_one), f"{algo}: the server's noise does not change the global model"
    assert float((after_one - start).abs().max()) > 1e-4
    # (c) clipping applied: clip norm and noise ~0, the released global model stays where it was
    tiny = Counted(algo, root, monkeypatch, "-gr", "1", "--dp_clip", "1e-7", "-dps", "1e-6")
    begin = tiny.global_params()
    shift = float((tiny.rounds(0, 1) - begin).abs().max())
    assert shift < 1e-5, f"{algo}: the global model moved by {shift} with every update clipped to 1e-7"


@pytest.mark.optional_deps("opacus")
def test_resume_continues_the_noise_stream_and_the_accountant(digits_tiny_root, tmp_path, stop_in_round):
    """The server's noise stream, clip norm (adaptive) and accountant history are checkpointed: a run that
    crashes in round 2 and resumes ends exactly as the uninterrupted run."""
    from utils.results import read_h5

    extra = ("-gr", "3", "--checkpoint_every", "2", "-dps", "0.3", "--dp_quantile", "0.5", "-nc", "5")

    def run(out):
        return main.main(cli(digits_tiny_root, out, "--executor", "sequential", "-algo", "FedAvg", "-dp", "--dp_level",
                             "client", "--dp_clip", "0.05", "-lbs", "20", "--train_loss_eval", "off", *extra,
                             *(("--resume",) if out.name == "crash" and (out / "Digits_FedAvg_test_0.ckpt").exists()
                               else ())))

    assert run(tmp_path / "base") == 0
    stop_in_round(2)
    with pytest.raises(RuntimeError, match="killed"):
        run(tmp_path / "crash")
    stop_in_round(None)
    assert run(tmp_path / "crash") == 0
    base = read_h5(tmp_path / "base" / "Digits_FedAvg_test_0.h5")
    resumed = read_h5(tmp_path / "crash" / "Digits_FedAvg_test_0.h5")
    for key in ("rs_test_acc", "rs_dp_epsilon_max", "rs_dp_clip_norm"):
        assert list(resumed[key]) == list(base[key]), key
    assert base["rs_dp_clip_norm"][-1] != 0.05  # adaptive clipping moved the clip norm


@pytest.mark.optional_deps("opacus")
def test_a_server_round_with_dropped_clients_releases_the_formula_over_the_selection(digits_tiny_root, monkeypatch):
    """Through the server: 5 selected, some dropped (-cdr); the global model moves by Σ clip_S(D_i) / m + z S / m ξ
    with m = 5 (the selection, not the uploads), every update clipped to S, the noise the seeded stream's."""
    from utils.data_utils import load_split

    cfg = parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedAvg", "--executor", "sequential",
                                "-lr", "0.1", "-lbs", "20", "-nc", "5", "-cdr", "0.5", "-dp", "--dp_level", "client",
                                "--dp_clip", "0.1", "-dps", "0.7"))
    data = load_split("Digits", digits_tiny_root, 5)
    server = get_server_class("FedAvg")(cfg.replace(num_classes=data.num_classes), data, 0, None)
    start = {k: v.clone() for k, v in server.global_model.state_dict().items()}
    raw = []
    receive = loop.receive
    monkeypatch.setattr(loop, "receive", lambda srv, cs: raw.extend(receive(srv, cs)) or raw[-len(cs):])
    loop.run_round(server, 0)
    assert len(server.selected) == 5 and 0 < len(raw) < 5, (len(server.selected), len(raw))
    deltas = [{k: u.state[k].detach() - start[k] for k in start} for u in raw]
    norms = [math.sqrt(sum(float(d.pow(2).sum()) for d in delta.values())) for delta in deltas]
    assert min(norms) > 0.1  # every update is clipped
    gen = torch_gen(cfg.seed, 0, "dp-client-noise")
    for k, v in server.global_model.state_dict().items():
        total = sum(d[k] * (0.1 / n) for d, n in zip(deltas, norms))
        want = start[k] + total / 5 + 0.7 * 0.1 / 5 * torch.randn(start[k].shape, generator=gen)
        torch.testing.assert_close(v, want, atol=1e-6, rtol=1e-5)


@pytest.mark.optional_deps("opacus")
def test_a_round_of_part_of_the_clients_divides_by_the_selection_and_samples_at_its_rate(digits_tiny_root):
    """-jr 0.4 of 5 clients: 2 selected, so the release divides by m = 2 and the accountant steps at
    q = m / N = 2 / 5 (m and N equal whenever every client is selected)."""
    server = build_server(digits_tiny_root, digits_tiny_root, "-jr", "0.4", "-dp", "--dp_level", "client",
                          "--dp_clip", "0.1", "-dps", "0.7")
    loop.run_round(server, 0)
    dp = plugin(server, "ClientDP").dp
    assert (len(server.clients), len(server.selected)) == (5, 2)
    assert dp.last["m"] == 2 and dp.last["std"] == pytest.approx(0.7 * 0.1 / 2) and dp.history == [(0.7, 0.4, 1)]


def test_accountant_steps_by_hand_over_changing_rates():
    """One step per release at q = m / N; equal consecutive rates extend the last entry only."""
    model = tiny_model()
    dp = dp_client.ClientLevelDP(stub_cfg(dp_sigma=0.7), run=0)
    for m, n in ((1, 4), (1, 2), (2, 4), (1, 2), (1, 1), (1, 4)):
        dp.release("T", uploads_with(model, [0.1] * m), model, m=m, n_clients=n)
    assert dp.history == [(0.7, 0.25, 1), (0.7, 0.5, 3), (0.7, 1.0, 1), (0.7, 0.25, 1)]


def test_a_norm_equal_to_the_clip_counts_as_clipped_below():
    """Adaptive clipping counts ||D_i|| <= S (Andrew et al.): an update of norm exactly S is counted."""
    model = tiny_model()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    ref = model.state_dict()
    state = {k: torch.zeros_like(v) for k, v in ref.items()}
    state["fc.bias"] = torch.tensor([3.0, 4.0])  # norm 5, exactly
    dp = dp_client.ClientLevelDP(stub_cfg(dp_clip=5.0, dp_sigma=0.01, dp_quantile=0.5), run=0)
    dp.release("T", [Upload(0, 1.0, state)], model, m=1, n_clients=10)
    gen = torch_gen(0, 0, "dp-client-noise")
    for k in ref:  # the update noise is drawn first, then the count's
        torch.randn(ref[k].shape, generator=gen)
    assert dp.last["norms"] == [5.0]
    assert dp.last["fraction"] == pytest.approx(1 + 0.05 * float(torch.randn((), generator=gen)), rel=1e-9)
