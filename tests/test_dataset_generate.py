"""End-to-end checks of the dataset generators (files, config.json, CLI, errors)."""

import hashlib
import json
import subprocess
import sys
import urllib.error
from pathlib import Path

import numpy as np
import pytest

from dataset import generate_Cifar10, generate_Digits, generate_MNIST, generate_Synthetic
from dataset.utils import dataset_utils as du

REPO = Path(__file__).resolve().parents[1]
SHARED_MNIST = Path(__file__).resolve().parents[2] / "shared/data/mnist.npz"  # conftest.SHARED_DATA


def tagged_images(n, shape, seed=0):
    """Random uint8 images whose first two pixels encode the row number, so stored rows can be traced back."""
    x = np.random.default_rng(seed).integers(0, 256, (n, *shape)).astype(np.uint8)
    flat = x.reshape(n, -1)
    flat[:, 0], flat[:, 1] = np.arange(n) % 256, np.arange(n) // 256
    return x


def row_ids(x):
    """Invert tagged_images on stored [n, C, H, W] arrays (channels first: pixel (0, 0, 0) and (0, 0, 1))."""
    flat = x.reshape(len(x), -1)
    return flat[:, 0].astype(np.int64) + 256 * flat[:, 1].astype(np.int64)


@pytest.fixture
def gray_npz(tmp_path):
    """400 gray 28x28 images (HxW, no channel axis), 40 per class, with an is_test mask like the shared files."""
    y = np.repeat(np.arange(10), 40).astype(np.int64)
    path = tmp_path / "gray.npz"
    np.savez(path, x=tagged_images(400, (28, 28)), y=y, is_test=np.arange(400) >= 300)
    return path


@pytest.fixture
def color_npz(tmp_path):
    """300 colour 32x32 images stored HWC, as torchvision keeps CIFAR."""
    x = np.random.default_rng(1).integers(0, 256, (300, 32, 32, 3)).astype(np.uint8)
    x[:, 0, 0, 0], x[:, 0, 1, 0] = np.arange(300) % 256, np.arange(300) // 256
    path = tmp_path / "color.npz"
    np.savez(path, x=x, y=np.repeat(np.arange(10), 30).astype(np.int64))
    return path


def load_split(out):
    """Return config and per-client (x, y) lists for train and test."""
    config = json.loads((out / "config.json").read_text())
    parts = {}
    for part in ("train", "test"):
        parts[part] = []
        for i in range(config["num_clients"]):
            with np.load(out / part / f"{i}.npz", allow_pickle=False) as f:
                assert sorted(f.files) == ["x", "y"]
                parts[part].append((f["x"], f["y"]))
    return config, parts


def gen_mnist(root, source, *args):
    return generate_MNIST.main([*args, "--source", str(source), "--root", str(root)])


def test_gray_source_files_and_config(tmp_path, gray_npz):
    gen_mnist(tmp_path, gray_npz, "noniid", "-", "pat", "--num-clients", "5", "--least-samples", "10")
    config, parts = load_split(tmp_path / "MNIST")
    src_y = np.repeat(np.arange(10), 40)
    ids = []
    for x, y in parts["train"] + parts["test"]:
        assert x.dtype == np.uint8 and x.shape[1:] == (1, 28, 28) and y.dtype == np.int64
        np.testing.assert_array_equal(y, src_y[row_ids(x)])
        ids.append(row_ids(x))
    np.testing.assert_array_equal(np.sort(np.concatenate(ids)), np.arange(400))
    assert config["source"] == "gray.npz"
    assert config["source_sha256"] == hashlib.sha256(gray_npz.read_bytes()).hexdigest()
    assert config["input_shape"] == [1, 28, 28] and config["x_dtype"] == "uint8"
    assert config["normalize"] == {"mean": [0.5], "std": [0.5]}
    assert config["partition"] == "pat" and config["class_per_client"] == 2 and config["alpha"] is None
    assert config["format_version"] == 1 and config["seed"] == 1 and config["num_classes"] == 10
    assert [len(y) for _, y in parts["train"]] == config["train_samples"]
    assert [len(y) for _, y in parts["test"]] == config["test_samples"]
    for (_, ytr), (_, yte), counts in zip(parts["train"], parts["test"], config["label_counts"]):
        assert counts == np.bincount(np.concatenate([ytr, yte]), minlength=10).tolist()
        assert np.count_nonzero(counts) == 2
        assert len(ytr) == round(0.75 * (len(ytr) + len(yte)))


def test_color_hwc_source_is_stored_channels_first(tmp_path, color_npz):
    generate_Cifar10.main(["noniid", "-", "dir", "--num-clients", "4", "--source", str(color_npz),
                           "--root", str(tmp_path), "--out", "c10"])
    config, parts = load_split(tmp_path / "c10")
    with np.load(color_npz) as f:
        src = f["x"]
    for x, _ in parts["train"]:
        assert x.shape[1:] == (3, 32, 32)
        np.testing.assert_array_equal(x, src[row_ids(x)].transpose(0, 3, 1, 2))
    assert config["input_shape"] == [3, 32, 32]
    assert config["normalize"] == {"mean": [0.5] * 3, "std": [0.5] * 3}
    assert sum(config["train_samples"]) + sum(config["test_samples"]) == 300


def parse(argv, num_classes=10, default_k=2):
    parser = du.common_parser("test")
    return du.resolve_partition(parser, parser.parse_args(argv), num_classes, default_k)


@pytest.mark.parametrize("positional,named", [
    (["noniid", "-", "dir"], ["--partition", "dir"]),
    (["noniid", "-", "-"], ["--partition", "pat", "--no-balance"]),
    (["noniid", "balance", "pat"], ["--partition", "pat", "--balance"]),
    (["noniid", "-", "exdir"], ["--partition", "exdir", "--alpha", "0.1", "--class-per-client", "2"]),
    (["iid", "balance", "-"], ["--partition", "iid", "--balance"]),
    (["iid", "-", "dir"], ["--partition", "iid"]),
    ([], ["--partition", "pat"]),
])
def test_positional_form_equals_named_flags(positional, named):
    assert parse(positional) == parse(named)


def test_named_flags_override_positional_and_dataset_default_k():
    assert parse(["noniid", "-", "dir", "--partition", "exdir"])["partition"] == "exdir"
    assert parse(["noniid", "balance", "pat", "--no-balance"])["balance"] is False
    assert parse(["noniid", "-", "pat"], num_classes=100, default_k=10)["class_per_client"] == 10
    assert parse(["--partition", "iid"])["class_per_client"] == 10


@pytest.mark.parametrize("argv", [["noniid", "-", "pat", "--alpha", "0.5"], ["--partition", "dir", "--balance"],
                                  ["iid", "-", "-", "--class-per-client", "3"]])
def test_flags_the_scheme_does_not_use_are_rejected(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(argv)
    assert exit_info.value.code == 2
    assert "is not used by the" in capsys.readouterr().err


def test_positional_and_named_write_the_same_split(tmp_path, gray_npz):
    gen_mnist(tmp_path, gray_npz, "noniid", "-", "dir", "--num-clients", "4", "--out", "a")
    gen_mnist(tmp_path, gray_npz, "--partition", "dir", "--alpha", "0.1", "--num-clients", "4", "--out", "b")
    (ca, pa), (cb, pb) = load_split(tmp_path / "a"), load_split(tmp_path / "b")
    assert ca == cb
    for part in ("train", "test"):
        for (xa, ya), (xb, yb) in zip(pa[part], pb[part]):
            assert xa.tobytes() == xb.tobytes() and ya.tobytes() == yb.tobytes()


def test_same_seed_identical_files_different_seed_different_split(tmp_path, gray_npz):
    for out, seed in (("s1", "3"), ("s1b", "3"), ("s2", "4")):
        gen_mnist(tmp_path, gray_npz, "noniid", "-", "dir", "--num-clients", "5", "--seed", seed, "--out", out)
    for i in range(5):
        for part in ("train", "test"):
            a, b = (np.load(tmp_path / o / part / f"{i}.npz") for o in ("s1", "s1b"))
            assert a["x"].tobytes() == b["x"].tobytes() and a["y"].tobytes() == b["y"].tobytes()
            a.close(), b.close()
    assert load_split(tmp_path / "s1")[0]["label_counts"] != load_split(tmp_path / "s2")[0]["label_counts"]


def test_regeneration_skipped_only_when_all_parameters_match(tmp_path, gray_npz, capsys):
    out = tmp_path / "MNIST"
    base = ["noniid", "-", "pat", "--num-clients", "6", "--least-samples", "10"]
    gen_mnist(tmp_path, gray_npz, *base)
    stamp = (out / "train" / "0.npz").stat().st_mtime_ns
    capsys.readouterr()
    gen_mnist(tmp_path, gray_npz, *base)
    assert "split MNIST already exists with the same parameters; skipping" in capsys.readouterr().out
    assert (out / "train" / "0.npz").stat().st_mtime_ns == stamp
    for change, key, value in ((["--train-ratio", "0.8"], "train_ratio", 0.8),
                               (["--class-per-client", "3"], "class_per_client", 3),
                               (["--seed", "9"], "seed", 9)):
        before = json.loads((out / "config.json").read_text())
        # another split under the same name is refused (runs on the two would share a name), files untouched
        line = run_cli_error(capsys, generate_MNIST.main, ["--root", str(tmp_path), "--source", str(gray_npz),
                                                           *base, *change])
        assert line.startswith("error: split MNIST already exists with other parameters (") and key in line
        assert f"-> {value!r}" in line and "--overwrite" in line
        assert json.loads((out / "config.json").read_text()) == before
        gen_mnist(tmp_path, gray_npz, *base, *change, "--overwrite")
        assert "skipping" not in capsys.readouterr().out
        assert json.loads((out / "config.json").read_text())[key] == value
        base = [*base, *change]
    gen_mnist(tmp_path, gray_npz, "noniid", "-", "pat", "--num-clients", "5", "--least-samples", "10", "--overwrite")
    assert sorted(p.name for p in (out / "train").iterdir()) == [f"{i}.npz" for i in range(5)]


def test_changed_source_content_is_refused_until_overwrite(tmp_path, gray_npz, capsys):
    gen_mnist(tmp_path, gray_npz, "--num-clients", "5")
    with np.load(gray_npz) as f:
        x, y = f["x"], f["y"]
    np.savez(gray_npz, x=255 - x, y=y)
    capsys.readouterr()
    line = run_cli_error(capsys, generate_MNIST.main, ["--root", str(tmp_path), "--source", str(gray_npz),
                                                       "--num-clients", "5"])
    assert "source_sha256" in line
    gen_mnist(tmp_path, gray_npz, "--num-clients", "5", "--overwrite")
    assert "skipping" not in capsys.readouterr().out


def run_cli_error(capsys, main, argv):
    """Run a generator through run_cli; return its one stderr line after checking exit code 2."""
    with pytest.raises(SystemExit) as exit_info:
        du.run_cli(main, argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_source_errors_are_one_clear_line(tmp_path, capsys):
    np.savez(tmp_path / "nolabels.npz", x=np.zeros((10, 28, 28), np.uint8))
    np.savez(tmp_path / "objects.npz", x=np.array([np.zeros(3), "a"], dtype=object), y=np.zeros(2, np.int64))
    np.savez(tmp_path / "float.npz", x=np.zeros((10, 28, 28), np.float32), y=np.zeros(10, np.int64))
    (tmp_path / "broken.npz").write_bytes(b"not a zip")
    cases = {"nolabels.npz": "lacks array(s) y", "objects.npz": "not a plain-array npz",
             "float.npz": "uint8",
             "broken.npz": "broken.npz is not an npz (File is not a zip file)", "missing.npz": "does not exist"}
    for name, expected in cases.items():
        line = run_cli_error(capsys, generate_MNIST.main, ["--source", str(tmp_path / name), "--root", str(tmp_path)])
        assert line.startswith("error: ") and expected in line
    assert not (tmp_path / "MNIST" / "config.json").exists()


def test_wrong_image_shape_and_too_many_clients(tmp_path, color_npz, gray_npz, capsys):
    line = run_cli_error(capsys, generate_MNIST.main, ["--source", str(color_npz), "--root", str(tmp_path)])
    assert "expected images of shape [1, 28, 28]" in line
    line = run_cli_error(capsys, generate_MNIST.main, ["--num-clients", "300", "--source", str(gray_npz),
                                                       "--root", str(tmp_path)])
    assert "use fewer clients" in line


def test_offline_download_is_one_clear_line(tmp_path, capsys, monkeypatch):
    datasets = pytest.importorskip("torchvision.datasets")

    class Offline:
        def __init__(self, *args, **kwargs):
            raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(datasets, "MNIST", Offline)
    line = run_cli_error(capsys, generate_MNIST.main, ["noniid", "-", "dir", "--root", str(tmp_path)])
    assert line.startswith("error: could not download MNIST (offline?); make MNIST's arrays into an npz once")
    assert "pass --source FILE.npz" in line and "README's 'Generating client splits'" in line


def test_torchvision_download_path_merges_train_and_test(tmp_path, monkeypatch):
    datasets = pytest.importorskip("torchvision.datasets")
    calls = []

    class FakeMNIST:
        classes = [f"{d} - digit" for d in range(10)]

        def __init__(self, root, train, download):
            calls.append((Path(root), train, download))
            n = 300 if train else 100
            self.data = tagged_images(n, (28, 28), seed=int(train))
            self.targets = list(np.arange(n) % 10)

    monkeypatch.setattr(datasets, "MNIST", FakeMNIST)
    generate_MNIST.main(["--num-clients", "5", "--root", str(tmp_path)])
    config, _ = load_split(tmp_path / "MNIST")
    assert calls == [(tmp_path / "MNIST" / "rawdata", True, True), (tmp_path / "MNIST" / "rawdata", False, True)]
    assert config["source"] == "torchvision" and len(config["source_sha256"]) == 64
    assert sum(config["train_samples"]) + sum(config["test_samples"]) == 400


def test_synthetic_labels_come_from_each_client_model():
    sizes = [50, 80, 120]
    xs, ys, models = generate_Synthetic.synthetic_clients(sizes, 1.0, 1.0, False, np.random.default_rng(0))
    for n, x, y, (w, b) in zip(sizes, xs, ys, models):
        assert x.shape == (n, 60) and x.dtype == np.float32 and y.dtype == np.int64
        logits = x.astype(np.float64) @ w + b
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        np.testing.assert_array_equal(y, np.argmax(probs / probs.sum(axis=1, keepdims=True), axis=1))
    assert not np.allclose(models[0][0], models[1][0])
    _, _, shared = generate_Synthetic.synthetic_clients(sizes, 1.0, 1.0, True, np.random.default_rng(0))
    assert all(np.array_equal(m[0], shared[0][0]) and np.array_equal(m[1], shared[0][1]) for m in shared)


def test_synthetic_generator_shapes_and_determinism(tmp_path):
    for out, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        generate_Synthetic.main(["--num-clients", "6", "--seed", seed, "--out", out, "--root", str(tmp_path)])
    (ca, pa), (cb, pb), (cc, _) = (load_split(tmp_path / o) for o in "abc")
    assert ca == cb and ca["source_sha256"] != cc["source_sha256"]
    assert ca["input_shape"] == [60] and ca["x_dtype"] == "float32" and ca["normalize"] is None
    assert ca["source"] == "generated" and ca["alpha_syn"] == 1.0 and ca["beta_syn"] == 1.0
    for (xa, ya), (xb, yb), n_tr, n_te in zip(pa["train"], pb["train"], ca["train_samples"], ca["test_samples"]):
        assert xa.dtype == np.float32 and xa.shape == (n_tr, 60) and xa.tobytes() == xb.tobytes()
        assert np.array_equal(ya, yb)
        assert ca["least_samples"] <= n_tr + n_te <= ca["max_samples"]


def test_digits_end_to_end_20_clients_with_plot(tmp_path):
    generate_Digits.main(["--root", str(tmp_path), "--plot"])
    config, parts = load_split(tmp_path / "Digits")
    assert config["num_clients"] == 20 and config["source"] == "sklearn" and config["input_shape"] == [1, 8, 8]
    sizes = np.array(config["train_samples"]) + np.array(config["test_samples"])
    assert sizes.sum() == 1797 and sizes.min() >= config["least_samples"] >= 2
    assert all(np.count_nonzero(c) == 2 for c in config["label_counts"])
    x = np.concatenate([x for x, _ in parts["train"]])
    assert x.dtype == np.uint8 and x.max() == 255
    assert (tmp_path / "Digits" / "label_distribution.png").stat().st_size > 0
    generate_Digits.main(["noniid", "-", "dir", "--root", str(tmp_path), "--out", "DigitsDir"])
    assert sum(json.loads((tmp_path / "DigitsDir" / "config.json").read_text())["train_samples"]) > 1300


def test_generator_runs_as_a_script_from_another_directory(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "dataset" / "generate_Synthetic.py"), "--num-clients", "3",
                           "--root", "out"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "total: 3 clients" in done.stdout
    assert (tmp_path / "out" / "Synthetic" / "config.json").is_file()


@pytest.mark.shared_data
def test_real_mnist_dir_split(tmp_path):
    gen_mnist(tmp_path, SHARED_MNIST, "noniid", "-", "dir")
    config = json.loads((tmp_path / "MNIST" / "config.json").read_text())
    sizes = np.array(config["train_samples"]) + np.array(config["test_samples"])
    assert sizes.sum() == 70000 and len(sizes) == 20 and sizes.min() >= config["least_samples"] == 40
    assert np.array(config["label_counts"]).sum(axis=0).tolist() == [6903, 7877, 6990, 7141, 6824, 6313, 6876,
                                                                      7293, 6825, 6958]


def test_subsample_keeps_class_shares_and_is_recorded(tmp_path):
    from dataset import generate_Digits
    from dataset.utils.dataset_utils import stratified_subsample

    y = np.repeat(np.arange(4), [50, 30, 15, 5])
    keep = stratified_subsample(y, 20, np.random.default_rng(0))
    assert len(np.unique(keep)) == 20
    assert np.bincount(y[keep]).tolist() == [10, 6, 3, 1]
    assert generate_Digits.main(["--root", str(tmp_path), "--num-clients", "4", "--partition", "iid",
                                 "--subsample", "400"]) == 0
    cfg = json.loads((tmp_path / "Digits" / "config.json").read_text())
    assert cfg["subsample"] == 400 and sum(cfg["train_samples"]) + sum(cfg["test_samples"]) == 400


def test_a_failed_download_removes_only_the_folders_it_made(tmp_path, monkeypatch):
    datasets = pytest.importorskip("torchvision.datasets")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep me")

    class Offline:  # a partial download: a file and a link out, then the network fails
        def __init__(self, root, train, download):
            (Path(root) / "MNIST").mkdir(exist_ok=True)
            (Path(root) / "MNIST" / "part").write_bytes(b"x")
            if not (Path(root) / "link").is_symlink():
                (Path(root) / "link").symlink_to(outside)
            raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(datasets, "MNIST", Offline)
    fresh = tmp_path / "fresh"  # --root itself is made by this download: all of it goes again
    with pytest.raises(du.DatasetError, match="could not download MNIST"):
        du.download_torchvision("MNIST", fresh / "MNIST" / "rawdata", "MNIST")
    assert not fresh.exists()
    (tmp_path / "had" / "MNIST").mkdir(parents=True)  # --out was there, with a file of its own: kept
    (tmp_path / "had" / "MNIST" / "config.json").write_text("{}")
    with pytest.raises(du.DatasetError, match="could not download MNIST"):
        du.download_torchvision("MNIST", tmp_path / "had" / "MNIST" / "rawdata", "MNIST")
    assert sorted(p.name for p in (tmp_path / "had" / "MNIST").iterdir()) == ["config.json"]
    (tmp_path / "had" / "MNIST" / "rawdata").mkdir()  # a download folder that was there: left as it is
    with pytest.raises(du.DatasetError, match="could not download MNIST"):
        du.download_torchvision("MNIST", tmp_path / "had" / "MNIST" / "rawdata", "MNIST")
    assert (tmp_path / "had" / "MNIST" / "rawdata" / "MNIST" / "part").is_file()
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]  # the link was removed, never followed
