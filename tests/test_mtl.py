"""FedMTL against hand computations: the client's penalty has the gradient of R(W, Ω) = λ1 tr(W Ω W^T) +
λ2 ||W||_F^2 in its own column (autograd on the whole R, and the mean-regularised closed form
2 λ1 (w_t - w̄) + 2 λ2 w_t); the server's couplings c_t = Σ_{s≠t} Ω_ts w_s; models stay the clients'
own; λ = 0 is Local; -ala refused, -dp runs."""
import numpy as np
import pytest
import torch

import main
from cli import parse_config
from conftest import cli
from flcore.clients.clientmtl import mtl_penalty
from flcore.registry import get_server_class
from utils.data_utils import load_split
from utils.errors import FLError
from utils.results import read_h5
from runtime import loop
from runtime import client_steps

SEQ = ("--executor", "sequential")


def build(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedMTL", *SEQ, "-lr", "0.1", *flags))
    data = load_split("Digits", root, None, "cpu")
    return get_server_class("FedMTL")(cfg.replace(num_classes=data.num_classes), data, 0, None)


def full_regulariser(W: torch.Tensor, omega: torch.Tensor, lam1: float, lam2: float) -> torch.Tensor:
    return lam1 * torch.trace(W @ omega @ W.T) + lam2 * (W * W).sum()


@pytest.mark.parametrize("kind", ["mean", "random"])
def test_penalty_gradient_is_the_regulariser_gradient_in_its_column(kind):
    g = torch.Generator().manual_seed(0)
    d, m, t, lam1, lam2 = 7, 4, 2, 0.3, 0.05
    W = torch.randn(d, m, generator=g, dtype=torch.float64)
    if kind == "mean":
        omega = torch.eye(m, dtype=torch.float64) - 1.0 / m
    else:
        a = torch.randn(m, m, generator=g, dtype=torch.float64)
        omega = a @ a.T
    Wq = W.clone().requires_grad_(True)
    want = torch.autograd.grad(full_regulariser(Wq, omega, lam1, lam2), Wq)[0][:, t]
    # The client's view: its column as two named tensors, the coupling from the other columns.
    params = {"a": W[:3, t].clone().requires_grad_(True), "b": W[3:, t].clone().requires_grad_(True)}
    others = sum(omega[t, s] * W[:, s] for s in range(m) if s != t)
    coupling = {"a": others[:3], "b": others[3:]}
    got = torch.autograd.grad(mtl_penalty(params, coupling, float(omega[t, t]), lam1, lam2), list(params.values()))
    torch.testing.assert_close(torch.cat(got), want)
    if kind == "mean":  # closed form: 2 λ1 (w_t - w̄) + 2 λ2 w_t
        hand = 2 * lam1 * (W[:, t] - W.mean(1)) + 2 * lam2 * W[:, t]
        torch.testing.assert_close(torch.cat(got), hand)


def test_server_couplings_and_models_stay_local(digits_tiny_root):
    server = build(digits_tiny_root)
    loop.run_round(server, 0)
    m = len(server.clients)
    own = [{k: v.clone() for k, v in c.model.state_dict().items()} for c in server.clients]
    loop.send(server, server.clients)
    for c, state in zip(server.clients, own):  # the broadcast leaves every model as it was
        for k, v in c.model.state_dict().items():
            assert torch.equal(v, state[k]), k
        assert c.omega_tt == pytest.approx(1 - 1 / m)
        for k, _ in c.model.named_parameters():  # Ω_ts = -1/m: c_t = -(1/m) Σ_{s≠t} w_s
            want = -sum(own[s][k] for s in range(m) if s != c.id) / m
            torch.testing.assert_close(c.coupling[k], want, atol=1e-6, rtol=1e-5)
    assert any(not torch.equal(own[0][k], own[1][k]) for k in own[0])
    for k, v in server.global_model.state_dict().items():  # the global model is the plain mean
        if v.is_floating_point():
            torch.testing.assert_close(v, sum(s[k] for s in own) / m, atol=1e-6, rtol=1e-5)


def test_one_step_adds_the_regulariser_gradient(digits_tiny_root):
    server = build(digits_tiny_root, "-lam", "0.5", "--lamda2", "0.1", "-lbs", "10000")  # one batch per round
    loop.run_round(server, 0)
    loop.send(server, server.clients)
    c = server.clients[1]
    w = {k: p.detach().clone() for k, p in c.model.named_parameters()}
    wbar = {k: sum(s[k] for s in server.models) / len(server.models) for k in w}
    wq = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    from torch.func import functional_call

    ce = torch.nn.functional.cross_entropy(functional_call(c.model, wq, (c.x_train,)), c.y_train)
    g = dict(zip(wq, torch.autograd.grad(ce, list(wq.values()))))
    client_steps.train(c, 1)
    for k, p in c.model.named_parameters():
        want = w[k] - 0.1 * (g[k] + 2 * 0.5 * (w[k] - wbar[k]) + 2 * 0.1 * w[k])
        torch.testing.assert_close(p.detach(), want, atol=1e-5, rtol=1e-4)


def test_lambda_zero_is_local(digits_tiny_root, tmp_path):
    common = ("-gr", "3", "-lr", "0.1", *SEQ)
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "Local", *common)) == 0
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "FedMTL", "-lam", "0", *common)) == 0
    local = read_h5(tmp_path / "Digits_Local_test_0.h5")
    mtl = read_h5(tmp_path / "Digits_FedMTL_test_0.h5")
    assert np.array_equal(local["rs_test_acc"], mtl["rs_test_acc"])
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "FedMTL", *common, "-go", "lam")) == 0
    assert not np.array_equal(local["rs_test_acc"], read_h5(tmp_path / "Digits_FedMTL_lam_0.h5")["rs_test_acc"])


@pytest.mark.optional_deps("opacus")
def test_ala_refused_and_dp_runs(digits_tiny_root, tmp_path):
    with pytest.raises(FLError, match="-ala"):
        parse_config(cli(digits_tiny_root, tmp_path, "-algo", "FedMTL", "-ala"))
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "FedMTL", "-dp", "-gr", "2", "-lr", "0.1")) == 0
    assert read_h5(tmp_path / "Digits_FedMTL_test_0.h5")["rs_dp_epsilon_max"][-1] > 0


@pytest.mark.parametrize("flags", [("-lam", "-0.1"), ("--lamda2", "-0.1")])
def test_negative_weights_end_with_one_line(flags, digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "FedMTL", "-gr", "1", *flags)) == 2
    err = capsys.readouterr().err.strip()
    assert "-lam >= 0 and --lamda2 >= 0" in err and len(err.splitlines()) == 1, err


def test_itk_is_accepted_with_a_warning_and_only_when_given(digits_tiny_root, capsys):
    parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedMTL"))
    assert capsys.readouterr().err == ""
    parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedMTL", "-itk", "4000"))
    assert "-itk 4000 has no effect" in capsys.readouterr().err
