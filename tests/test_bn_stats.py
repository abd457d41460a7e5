"""--bn_stats: BatchNorm running statistics shared (averaged and received with the model, the default) or
local (parameters only, every client keeps its own statistics and ALA leaves them alone, as PFLlib).
Checked on -m BNCNN against the uploads of a round, for FedAvg, FedALA's ALA, FedRep and SCAFFOLD."""
import numpy as np
import pytest
import torch

from cli import parse_config
from conftest import cli
from flcore.registry import get_server_class
from utils.data_utils import load_split
from runtime import loop

FAST = ("-lbs", "20", "--train_loss_eval", "off", "-m", "BNCNN", "-lr", "0.05")


def make_server(root, algo, *flags):
    cfg = parse_config(cli(root, root, "--executor", "sequential", "-algo", algo, *FAST, *flags))
    return get_server_class(algo)(cfg.replace(num_classes=10), load_split("Digits", root))


def snapshot(module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def stat_keys(state) -> list[str]:
    return [k for k in state if k.endswith(("running_mean", "running_var", "num_batches_tracked"))]


def one_round(server, monkeypatch):
    """Run round 0 and return the uploads (id, weight, state) it aggregated."""
    uploads, aggregate = [], server.aggregate

    def record(ups):
        uploads.extend((u.id, u.weight, {k: v.detach().clone() for k, v in u.state.items()}) for u in ups)
        aggregate(ups)

    monkeypatch.setattr(server, "aggregate", record)
    loop.run_round(server, 0)
    return uploads


def weighted(uploads, key):
    w = np.array([u[1] for u in uploads], dtype=np.float64)
    return (w[:, None] * np.stack([u[2][key].double().reshape(-1).numpy() for u in uploads])).sum(0) / w.sum()


@pytest.mark.parametrize("mode", ["shared", "local"])
def test_fedavg_averages_statistics_only_when_shared(mode, digits_noniid_root, monkeypatch):
    server = make_server(digits_noniid_root, "FedAvg", "--bn_stats", mode)
    init = snapshot(server.global_model)
    uploads = one_round(server, monkeypatch)
    glob = server.global_model.state_dict()
    stats = [k for k in stat_keys(glob) if not k.endswith("num_batches_tracked")]
    assert len(stats) == 4
    for k, _ in server.global_model.named_parameters():  # parameters: the weighted mean either way
        assert np.allclose(glob[k].double().reshape(-1).numpy(), weighted(uploads, k), rtol=1e-5, atol=1e-7), k
    for k in stats:
        if mode == "shared":
            assert np.allclose(glob[k].double().reshape(-1).numpy(), weighted(uploads, k), rtol=1e-5, atol=1e-7)
        else:  # never averaged: the server's model keeps the statistics it started with
            assert torch.equal(glob[k], init[k])
    # the next broadcast: parameters are the global ones; statistics the global ones or the client's own
    loop.send(server, server.clients)
    for c, (_, _, up) in zip(server.clients, uploads):
        mine = c.model.state_dict()
        for k, _ in c.model.named_parameters():
            assert torch.equal(mine[k], glob[k])
        for k in stat_keys(mine):
            assert torch.equal(mine[k], glob[k] if mode == "shared" else up[k]), (c.id, k)
    clients = [np.stack([u[2][k].double().reshape(-1).numpy() for u in uploads]) for k in stats]
    assert max(np.ptp(s, axis=0).max() for s in clients) > 1e-2  # the clients' statistics differ


@pytest.mark.parametrize("mode", ["shared", "local"])
def test_ala_takes_the_global_statistics_only_when_shared(mode, digits_noniid_root):
    """Round 1 runs ALA on every client (all layers adapted, -p 0, so the whole network runs in ALA's
    forward passes): its statistics become the global model's (shared) or stay those it trained (local),
    and ALA's own train-mode forwards never change them."""
    server = make_server(digits_noniid_root, "FedALA", "--bn_stats", mode, "-p", "0", "--ala_max_epochs", "2")
    loop.run_round(server, 0)
    trained = {c.id: snapshot(c.model) for c in server.clients}
    glob = snapshot(server.global_model)
    server.round_idx = 1
    loop.send(server, server.clients)
    for c in server.clients:
        assert c.ala.last_epochs == 2  # ALA did run
        mine = c.model.state_dict()
        for k in stat_keys(mine):
            assert torch.equal(mine[k], glob[k] if mode == "shared" else trained[c.id][k]), (c.id, k)


def test_fedrep_and_scaffold_average_parameters_only_when_local(digits_noniid_root, monkeypatch):
    for algo in ("FedRep", "SCAFFOLD"):
        server = make_server(digits_noniid_root, algo, "--bn_stats", "local")
        init = snapshot(server.global_model)
        uploads = one_round(server, monkeypatch)
        glob = server.global_model.state_dict()
        assert stat_keys(glob)
        for k in stat_keys(glob):
            assert torch.equal(glob[k], init[k]), (algo, k)
        moved = [k for k, _ in server.global_model.named_parameters() if not torch.equal(glob[k], init[k])]
        assert moved, algo  # the parameters were aggregated
        loop.send(server, server.clients)
        for c, (_, _, up) in zip(server.clients, uploads):
            mine = c.model.state_dict()
            prefix = "base." if algo == "FedRep" else ""
            for k in stat_keys(up):
                assert torch.equal(mine[prefix + k], up[k]), (algo, c.id, k)
