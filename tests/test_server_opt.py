"""Server optimizers (--server_opt, plugins/optimizers.py; FedAvgM, FedAdagrad, FedAdam, FedYogi): three rounds of
a real server against a reference loop written here, BatchNorm statistics averaged, a split model's shared part,
-slr's resolution and the refusal of algorithms that average no model. Resume equality: tests/test_executors.py
(RESUMED)."""
import pytest
import torch

import main
from cli import parse_config
from conftest import cli, plugin
from flcore.servers.serverbase import Server
from test_executors import build
from utils.errors import FLError
from runtime import loop

# Unequal hyper-parameters, so that a swapped pair shows.
HYPER = ("-slr", "0.05", "--server_momentum", "0.8", "--server_beta2", "0.95", "--server_tau", "0.01")
LR, B1, B2, TAU = 0.05, 0.8, 0.95, 0.01


def reference_step(name: str, x: float, mean: float, m: float, v: float) -> tuple[float, float, float]:
    """One server step on one coordinate, written from Reddi et al.'s Algorithm 2 (FedAvgM: Hsu et al.)."""
    g = x - mean
    if name == "avgm":
        m = B1 * m + g
        return x - LR * m, m, v
    m = B1 * m + (1 - B1) * g
    if name == "adagrad":
        v = v + g * g
    elif name == "adam":
        v = B2 * v + (1 - B2) * g * g
    else:
        v = v - (1 - B2) * g * g * (1.0 if v > g * g else -1.0 if v < g * g else 0.0)
    return x - LR * m / (v ** 0.5 + TAU), m, v


def spy_on_averages(server, monkeypatch) -> list:
    """Record, at every aggregation, the server's model before it and the plain sample-weighted mean of the
    uploads (computed here)."""
    seen = []
    average = server.average_uploads

    def spy(uploads, target=None, prefix=""):
        total = sum(u.weight for u in uploads)
        mean = {k: sum(u.state[k].double() * u.weight for u in uploads) / total for k in uploads[0].state}
        model = server.global_model if target is None else target
        before = {k: v.clone() for k, v in model.state_dict().items()}
        seen.append((before, mean))
        average(uploads, target, prefix)

    monkeypatch.setattr(server, "average_uploads", spy)
    return seen


@pytest.mark.parametrize("name", ["avgm", "adagrad", "adam", "yogi"])
def test_three_rounds_match_the_reference_loop(name, digits_tiny_root, monkeypatch):
    server = build(digits_tiny_root, "FedAvg", "--server_opt", name, *HYPER, "-m", "BNCNN", "--train_loss_eval", "off")
    seen = spy_on_averages(server, monkeypatch)
    for t in range(3):
        loop.run_round(server, t)
    after = server.global_model.state_dict()
    params = {k for k, _ in server.global_model.named_parameters()}
    assert any("running_mean" in k for k in after) and len(seen) == 3
    for k in params:  # the reference loop, coordinate by coordinate, from the round-0 model
        x = seen[0][0][k].double().flatten().tolist()
        m, v = [0.0] * len(x), [TAU ** 2] * len(x)
        for t in range(3):
            mean = seen[t][1][k].flatten().tolist()
            x, m, v = map(list, zip(*(reference_step(name, *c) for c in zip(x, mean, m, v))))
            got = (seen[t + 1][0][k] if t < 2 else after[k]).double().flatten()
            assert torch.allclose(got, torch.tensor(x, dtype=torch.float64), rtol=1e-5, atol=1e-6), (name, k, t)
    for k in after.keys() - params:  # BatchNorm statistics and counters: the mean, never a step
        assert torch.allclose(after[k].double(), seen[2][1][k].round() if not after[k].is_floating_point()
                              else seen[2][1][k], atol=1e-6), k
    opt = plugin(server, "ServerOpt").optimizer
    assert set(opt.m) == params and (name == "avgm") == (not opt.v)


def test_the_registered_algorithms_are_fedavg_with_their_optimizer(digits_tiny_root, tmp_path):
    for algo, opt, lr in (("FedAvgM", "avgm", 1.0), ("FedAdagrad", "adagrad", 0.1), ("FedAdam", "adam", 0.01),
                          ("FedYogi", "yogi", 0.01)):
        cfg = parse_config(cli(digits_tiny_root, tmp_path, "-algo", algo))
        assert (cfg.server_opt, cfg.server_learning_rate, cfg.server_momentum) == (opt, lr, 0.9), algo
        assert (cfg.server_beta2, cfg.server_tau) == (0.99, 1e-3)
    given = parse_config(cli(digits_tiny_root, tmp_path, "-algo", "FedAdam", "-slr", "0.2"))
    assert given.server_learning_rate == 0.2
    # plain server SGD defaults to eta = 1, which is FedAvg (the module docstring's claim)
    sgd = parse_config(cli(digits_tiny_root, tmp_path, "-algo", "FedAvg", "--server_opt", "sgd"))
    assert sgd.server_learning_rate == 1.0


def test_slr_keeps_its_meaning_for_scaffold_and_fedgh_and_is_ignored_elsewhere(digits_tiny_root, tmp_path, capsys):
    def slr(*flags):
        return parse_config(cli(digits_tiny_root, tmp_path, *flags)).server_learning_rate

    assert slr("-algo", "SCAFFOLD") == 1.0 and slr("-algo", "FedGH", "-slr", "0.1") == 0.1
    assert capsys.readouterr().err == ""
    assert slr("-algo", "FedALA", "-slr", "2") is None
    assert capsys.readouterr().err.strip() == "warning: -algo FedALA does not use -slr without --server_opt; ignored"


def test_a_split_models_shared_part_is_stepped_and_the_head_left_alone(digits_tiny_root, monkeypatch):
    server = build(digits_tiny_root, "FedRep", "--server_opt", "sgd", "-slr", "0.5", "-pls", "1")
    seen = spy_on_averages(server, monkeypatch)
    head = {k: v.clone() for k, v in server.global_model.head.state_dict().items()}
    loop.run_round(server, 0)
    before, mean = seen[0]
    for k, v in server.global_model.base.state_dict().items():  # x - 0.5 (x - mean), by hand
        assert torch.allclose(v.double(), before[k].double() - 0.5 * (before[k].double() - mean[k]), atol=1e-6), k
    assert all(torch.equal(v, head[k]) for k, v in server.global_model.head.state_dict().items())


@pytest.mark.parametrize("algo,flags", [("FD", ("--server_opt", "adam")), ("FedProto", ("--aggregator", "median")),
                                        ("SCAFFOLD", ("--attack", "signflip"))])
def test_algorithms_that_average_no_model_are_refused(algo, flags, digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", algo, "-gr", "1", *flags)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{algo} cannot take it" in err[0], err
    assert not list(tmp_path.glob("*.h5"))


@pytest.mark.parametrize("flags,message", [
    (("--server_opt", "avgm"), "does not go through average_uploads; it must declare averaging_refusal"),
    (("--aggregator", "median"), "reads its uploads' model entries outside average_uploads; declare robust_refusal"),
])
def test_an_aggregate_that_bypasses_average_uploads_is_caught(flags, message, digits_tiny_root, monkeypatch):
    """The run-time guards behind the declarations: an averaging server whose aggregate does not go
    through average_uploads stops with a clear line instead of silently ignoring the flags; under a robust
    rule its first read of an upload's content outside the seam does."""
    server = build(digits_tiny_root, "FedAvg", *flags)

    def plain(self, uploads):
        self.load_aggregate(self.global_model, uploads[0].state)

    monkeypatch.setattr(Server, "aggregate", plain)
    with pytest.raises(FLError, match=message):
        loop.run_round(server, 0)


def test_yogi_leaves_v_unchanged_where_it_equals_the_squared_pseudo_gradient():
    """Yogi's sign(v - g²) is 0 where v = g² exactly (here v starts at τ² = 0.25 and g = 0.5): v stays 0.25 and
    the step is η m / (√v + τ) = 1 * 0.05 / (0.5 + 0.5), by hand."""
    from plugins.optimizers import ServerOptimizer

    opt = ServerOptimizer("yogi", lr=1.0, beta1=0.9, beta2=0.5, tau=0.5)
    out = opt.step({"w": torch.tensor([0.5])}, {"w": torch.tensor([0.0])}, ["w"])
    assert opt.v["w"].item() == 0.25
    assert out["w"].item() == pytest.approx(0.5 - 0.05, abs=1e-7)


def test_the_constructors_defaults_are_the_papers_and_the_clis(digits_tiny_root, tmp_path):
    """Reddi et al. fix β1 = 0.9 and β2 = 0.99; τ = 1e-3 is this library's default. Built directly (a
    researcher's script) or from the command line, an optimizer gets the same values."""
    from plugins.optimizers import ServerOptimizer

    direct = ServerOptimizer("adam", 0.01)
    assert (direct.beta1, direct.beta2, direct.tau) == (0.9, 0.99, 1e-3)
    from plugins.server_opt import ServerOpt

    built = ServerOpt.build(parse_config(cli(digits_tiny_root, tmp_path, "-algo", "FedAdam")), None).optimizer
    assert (built.beta1, built.beta2, built.tau, built.lr) == (0.9, 0.99, 1e-3, 0.01)


@pytest.mark.parametrize("name, rate", [("sgd", 1.0), ("avgm", 1.0), ("adagrad", 0.1), ("adam", 0.01), ("yogi", 0.01)])
def test_each_optimizers_server_rate_defaults_to_the_documented_one(tmp_path, name, rate):
    """-slr left out: the README's defaults (1 for sgd and avgm, 0.1 adagrad, 0.01 adam and yogi), which
    plugins/optimizers.py declares in its ``@optimizer`` lines."""
    cfg = parse_config(cli(tmp_path, tmp_path, "-algo", "FedAvg", "--server_opt", name))
    assert cfg.server_learning_rate == rate
