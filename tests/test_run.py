"""End-to-end runs through main.py: learning, determinism, result files, client selection."""
import copy
import json
import os

import numpy as np
import pytest
import torch

import main
from cli import parse_config
from conftest import SHARED_DATA, cli
from utils.results import read_h5
from runtime import loop


def run_and_read(root, out, *extra, stem="Digits_FedAvg_test_0"):
    assert main.main(cli(root, out, *extra)) == 0
    return read_h5(out / f"{stem}.h5"), json.loads((out / f"{stem}.json").read_text())


def test_fedavg_learns_on_digits(digits_root, tmp_path):
    h5, meta = run_and_read(digits_root, tmp_path, "-gr", "3", "-lr", "0.1")
    acc = h5["rs_test_acc"]
    assert len(acc) == 4 and acc[0] < 0.2  # untrained model: near chance (10 classes)
    assert acc[-1] > 0.6, acc  # only real learning gets here
    assert np.all(np.isfinite(h5["rs_train_loss"])) and h5["rs_train_loss"][-1] < h5["rs_train_loss"][0]


def test_result_files_complete(digits_root, tmp_path):
    h5, meta = run_and_read(digits_root, tmp_path, "-gr", "2", "-lr", "0.05", "-eg", "2")
    for key in ("rs_test_acc", "rs_test_auc", "rs_train_loss", "rs_test_acc_mean", "rs_test_acc_std",
                "rs_round", "rs_client_test_acc", "rs_round_time"):
        assert key in h5, key
    assert list(h5["rs_round"]) == [0, 2]
    assert h5["rs_client_test_acc"].shape == (2, 5)
    assert len(h5["rs_round_time"]) == 2
    # the pooled accuracy is the test-sample-weighted mean of the per-client accuracies, with the
    # clients' test sizes read from the split itself; the unweighted mean is recorded beside it
    n_test = np.array([len(np.load(digits_root / "Digits" / "test" / f"{i}.npz", allow_pickle=False)["y"])
                       for i in range(5)], dtype=float)
    per_client = h5["rs_client_test_acc"]
    assert np.allclose(h5["rs_test_acc"], per_client @ n_test / n_test.sum(), rtol=0, atol=1e-12)
    assert np.allclose(h5["rs_test_acc_mean"], per_client.mean(1), rtol=0, atol=1e-12)
    assert np.all((per_client >= 0) & (per_client <= 1)) and len(set(n_test)) > 1
    assert np.all((h5["rs_test_auc"] > 0.5) & (h5["rs_test_auc"] <= 1))
    assert meta["config"]["algorithm"] == "FedAvg" and meta["seed"] == 0
    # the executor that ran, not "auto": fork on a machine with several cores (the documented default)
    assert meta["config"]["executor"] == ("fork" if len(os.sched_getaffinity(0)) > 1 else "sequential")
    assert meta["split"]["config_hash"] and meta["library_version"]
    assert len(meta["round_time_s"]) == 2 and meta["evaluations"] == 2
    assert not list(tmp_path.glob("*.tmp"))


def test_same_seed_same_curve_different_seed_differs(digits_root, tmp_path):
    a, _ = run_and_read(digits_root, tmp_path / "a", "-gr", "2", "-lr", "0.05")
    b, _ = run_and_read(digits_root, tmp_path / "b", "-gr", "2", "-lr", "0.05")
    c, _ = run_and_read(digits_root, tmp_path / "c", "-gr", "2", "-lr", "0.05", "--seed", "5")
    assert np.array_equal(a["rs_test_acc"], b["rs_test_acc"])
    assert np.array_equal(a["rs_train_loss"], b["rs_train_loss"])
    assert not np.array_equal(a["rs_train_loss"], c["rs_train_loss"])


def test_several_runs_use_consecutive_seeds(digits_root, tmp_path, capsys):
    assert main.main(cli(digits_root, tmp_path, "-gr", "1", "-lr", "0.05", "-t", "2")) == 0
    metas = [json.loads((tmp_path / f"Digits_FedAvg_test_{r}.json").read_text()) for r in (0, 1)]
    assert [m["seed"] for m in metas] == [0, 1]
    assert "2 runs: best" in capsys.readouterr().out


def test_join_ratio_and_drop_rate(digits_root):
    cfg = parse_config(cli(digits_root, digits_root, "-jr", "0.4", "-cdr", "0.5", "-gr", "1",
                                "--executor", "sequential"))
    from flcore.servers.serveravg import FedAvgServer
    from utils.data_utils import load_split

    server = FedAvgServer(cfg.replace(device="cpu", num_classes=10), load_split("Digits", digits_root))
    sizes = [len(server.select_clients()) for _ in range(50)]
    assert set(sizes) == {2}  # int(0.4 * 5)
    kept = [len(loop.active_clients(server, server.clients)) for _ in range(400)]
    assert abs(np.mean(kept) / 5 - 0.5) < 0.05  # about half of the participants train


def test_local_keeps_models_apart(digits_noniid_root, tmp_path):
    h5, _ = run_and_read(digits_noniid_root, tmp_path, "-gr", "3", "-lr", "0.05", "-algo", "Local",
                         stem="Digits_Local_test_0")
    assert h5["rs_test_acc"][-1] > 0.8  # two classes per client: local models are easy
    # Two rounds on a server built here: every client ends with its own model, the one plain SGD gives
    # on its data alone from the common initial model, with the batches its own stream draws.
    from flcore.servers.serverlocal import LocalServer
    from utils.data_utils import load_split

    cfg = parse_config(cli(digits_noniid_root, digits_noniid_root, "-algo", "Local", "-gr", "2", "-lr",
                                "0.05", "-lbs", "10", "-ls", "1", "--executor", "sequential"))
    server = LocalServer(cfg.replace(num_classes=10), load_split("Digits", digits_noniid_root))
    starts = [(copy.deepcopy(c.model), c.batch_gen.get_state()) for c in server.clients]
    first = [p.detach() for p in starts[0][0].parameters()]
    assert all(torch.equal(p, q) for m, _ in starts[1:] for p, q in zip(first, m.parameters()))
    for t in range(2):
        loop.run_round(server, t)
    flat = [torch.cat([p.detach().flatten() for p in c.model.parameters()]) for c in server.clients]
    for i in range(len(flat)):
        for j in range(i + 1, len(flat)):
            assert not torch.equal(flat[i], flat[j]), (i, j)
    for c, (model, state) in zip(server.clients, starts):
        gen = torch.Generator()
        gen.set_state(state)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        model.train()
        for _ in range(2):  # two rounds of one epoch, batches of 10 (the last one smaller)
            perm = torch.randperm(len(c.y_train), generator=gen)
            for k in range(0, len(perm), 10):
                idx = perm[k:k + 10]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(c.x_train[idx]), c.y_train[idx]).backward()
                opt.step()
        for (name, got), want in zip(c.model.named_parameters(), model.parameters()):
            torch.testing.assert_close(got, want, msg=f"client {c.id}: {name}")


@pytest.mark.shared_data
def test_fedavg_on_real_mnist(tmp_path):
    """FedAvg on a 6,000-image MNIST sample from the shared data (Dir(0.5) over 10 clients)."""
    from dataset import generate_MNIST

    with np.load(SHARED_DATA / "mnist.npz") as f:
        np.savez(tmp_path / "mnist6k.npz", x=f["x"][:6000], y=f["y"][:6000])
    assert generate_MNIST.main(["--root", str(tmp_path), "--out", "MNIST6k", "--source",
                                str(tmp_path / "mnist6k.npz"), "--num-clients", "10", "--partition", "dir",
                                "--alpha", "0.5"]) == 0
    out = tmp_path / "res"
    assert main.main(["-data", "MNIST6k", "--dataset_root", str(tmp_path), "--results_dir", str(out), "-dev",
                      "cpu", "--no-progress", "-m", "CNN", "-gr", "2", "-lr", "0.05"]) == 0
    acc = read_h5(out / "MNIST6k_FedAvg_test_0.h5")["rs_test_acc"]
    assert acc[-1] > 0.65, acc  # chance is 0.1


def test_get_mean_std_groups_by_algorithm(tmp_path, capsys):
    """Per (algorithm, dataset) mean ± std of best and last accuracy; never one mean over two algorithms;
    .json sidecars are read as readily as .h5 files."""
    import get_mean_std
    from utils.results import RunRecorder

    runs = {"FedAvg": [[0.1, 0.5, 0.4], [0.2, 0.7, 0.6]], "FedALA": [[0.3, 0.9, 0.8], [0.3, 0.7, 0.8]]}
    for algo, curves in runs.items():
        for i, acc in enumerate(curves):
            cfg = {"algorithm": algo, "dataset": "Digits", "global_rounds": 2, "seed": i}
            rec = RunRecorder(f"Digits_{algo}_t_{i}", {"config": cfg, "label": algo, "seed": i}, tmp_path)
            for r, a in enumerate(acc):
                rec.add(r, {"test_acc": a})
            rec.finish("finished")
    assert get_mean_std.main([str(tmp_path / "*.h5")]) == 0
    out = capsys.readouterr().out
    # FedAvg best: 0.5, 0.7 -> 60 ± 10; last: 0.4, 0.6 -> 50 ± 10. FedALA best 0.9, 0.8 -> 85 ± 5; last 80 ± 0
    assert "FedAvg on Digits, 2 runs: best 60.00 ± 10.00, last 50.00 ± 10.00" in out
    assert "FedALA on Digits, 2 runs: best 85.00 ± 5.00, last 80.00 ± 0.00" in out
    assert get_mean_std.main([str(tmp_path / "Digits_FedAvg_t_0.json"), str(tmp_path / "Digits_FedAvg_t_1.json")]) == 0
    assert capsys.readouterr().out.strip() == "FedAvg on Digits, 2 runs: best 60.00 ± 10.00, last 50.00 ± 10.00"
    assert get_mean_std.main([str(tmp_path / "nope.h5")]) == 2


def test_sidecar_says_what_was_built_and_by_what(digits_tiny_root, tmp_path):
    from flcore.trainmodel.models import build_model

    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "0", "--executor", "sequential")) == 0
    meta = json.loads((tmp_path / "Digits_FedAvg_test_0.json").read_text())
    model = build_model("CNN", (1, 8, 8), 10)  # what -m auto resolves to for images
    assert meta["model_built"] == type(model).__name__
    assert meta["model_parameters"] == sum(p.numel() for p in model.parameters())
    assert meta["torch_version"] == torch.__version__ and meta["status"] == "finished"
    assert meta["git_commit"] is None or len(meta["git_commit"].split("+")[0]) == 40


def test_sidecar_holds_each_clients_training_times(digits_tiny_root, tmp_path):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "3", "-jr", "0.4", "--executor", "fork")) == 0
    meta = json.loads((tmp_path / "Digits_FedAvg_test_0.json").read_text())
    times = meta["client_train_time_s"]
    assert len(times) == 5 and sum(map(len, times)) == 3 * 2  # int(0.4 * 5) = 2 clients train per round
    assert all(t > 0 for ts in times for t in ts)
