"""scripts/run/plot.py: the curves' mean ± std against hand values, and smoke tests of every figure (the PNG
exists, opens, has a plausible size and is not blank)."""
from pathlib import Path

import numpy as np
import pytest

from scripts.run import plot
from scripts.run import table
from test_table import write_run


@pytest.fixture
def runs_dir(tmp_path):
    clients = [[0.1, 0.2, 0.3]] * 2 + [[0.5, 0.7, 0.9]]
    write_run(tmp_path, "FedAvg", 0, [0.1, 0.4, 0.5], round_time=(1.0, 3.0), clients=clients)
    write_run(tmp_path, "FedAvg", 1, [0.1, 0.6, 0.7], round_time=(2.0, 2.0), clients=clients)
    write_run(tmp_path, "FedALA", 0, [0.1, 0.8, 0.9], clients=clients)
    return tmp_path


def check_png(path: Path, min_size=(200, 300)):
    import matplotlib.image

    assert path.exists() and path.with_suffix(".pdf").exists()
    img = matplotlib.image.imread(path)
    h, w = img.shape[:2]
    assert h >= min_size[0] and w >= min_size[1] and h < 4000 and w < 4000, img.shape
    assert img[..., :3].std() > 0.01  # something is drawn


def test_curve_is_mean_and_std_over_seeds(runs_dir):
    (row, _) = table.aggregate(table.load_runs([str(runs_dir)]), ["algorithm"])
    xs, mean, std = plot.curve(row.runs, "test_acc", "round")
    assert list(xs) == [0, 1, 2]
    assert mean == pytest.approx([10, 50, 60]) and std == pytest.approx([0, 10, 10])
    # wall time at an evaluation: the rounds before it, averaged over seeds (1+3 and 2+2 s in all)
    xs, _, _ = plot.curve(row.runs, "test_acc", "time")
    assert xs == pytest.approx([0.0, 1.5, 4.0])


def test_curves_clients_and_split_figures(runs_dir, digits_tiny_root, tmp_path, capsys):
    out = tmp_path / "fig"
    assert plot.main(["curves", str(runs_dir), "--out", str(out)]) == 0
    check_png(out / "test_acc_vs_round.png")
    check_png(out / "train_loss_vs_round.png")
    assert plot.main(["curves", str(runs_dir), "--x", "time", "--metrics", "test_acc,nothing", "--out", str(out)]) == 0
    check_png(out / "test_acc_vs_time.png")
    assert "no run recorded nothing" in capsys.readouterr().err
    assert plot.main(["clients", str(runs_dir), "--out", str(out)]) == 0
    check_png(out / "client_accuracy.png")
    assert plot.main(["split", "Digits", "--dataset_root", str(digits_tiny_root), "--out", str(out)]) == 0
    check_png(out / "split_Digits.png")


def test_split_counts_are_the_files_labels(digits_tiny_root):
    import json

    counts = plot.label_counts(digits_tiny_root / "Digits", "all")
    config = json.loads((digits_tiny_root / "Digits" / "config.json").read_text())
    assert counts.shape == (5, 10)
    assert counts.sum(axis=1).tolist() == [a + b for a, b in zip(config["train_samples"], config["test_samples"])]
    train = plot.label_counts(digits_tiny_root / "Digits", "train")
    y0 = np.load(digits_tiny_root / "Digits" / "train" / "0.npz")["y"]
    assert train[0].tolist() == np.bincount(y0, minlength=10).tolist()


def test_client_spread_quantiles_by_hand(runs_dir, tmp_path):
    """FedAvg's two seeds pool 6 clients per evaluation: at round 2 (0.5, 0.7, 0.9) twice, sorted
    50, 50, 70, 70, 90, 90: worst 50, 10th percentile 50 (position 0.5), median 70 (position 2.5), 90th
    percentile 90 (position 4.5), best 90; at rounds 0 and 1 (0.1, 0.2, 0.3) twice."""
    (row, _) = table.aggregate(table.load_runs([str(runs_dir)]), ["algorithm"])
    rounds, q = plot.client_quantiles(row.runs)
    assert list(rounds) == [0, 1, 2]
    assert q[2] == pytest.approx([50, 50, 70, 90, 90])
    assert q[0] == pytest.approx([10, 10, 20, 30, 30]) and q[1] == pytest.approx(q[0])
    assert plot.main(["spread", str(runs_dir), "--out", str(tmp_path / "fig")]) == 0
    check_png(tmp_path / "fig" / "client_spread_vs_round.png")
