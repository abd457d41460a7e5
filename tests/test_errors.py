"""Every user error ends with one clear line (exit code 2), and results already measured are kept."""
import pytest

import main
from cli import parse_config
from conftest import cli
from utils.results import read_h5


def error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1]


def test_unknown_algorithm_lists_choices(digits_root, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main.main(cli(digits_root, tmp_path, "-algo", "FedNope"))
    assert e.value.code == 2
    line = error_line(capsys)
    assert "FedNope" in line and "FedAvg" in line


def test_unknown_model_lists_choices(digits_root, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main.main(cli(digits_root, tmp_path, "-m", "VGG99"))
    assert "CNN" in error_line(capsys)


def test_missing_split_prints_generator_command(tmp_path, capsys):
    assert main.main(["-data", "MNIST", "--dataset_root", str(tmp_path), "-dev", "cpu"]) == 2
    line = error_line(capsys)
    assert line.startswith("error:") and "python dataset/generate_MNIST.py" in line


def test_missing_digits_is_generated(tmp_path, capsys):
    assert main.main(["-data", "Digits", "--dataset_root", str(tmp_path / "d"), "--results_dir",
                      str(tmp_path / "r"), "-dev", "cpu", "-gr", "0", "--no-progress"]) == 0
    assert "generating it with default settings" in capsys.readouterr().out
    assert (tmp_path / "d" / "Digits" / "config.json").exists()


def test_too_many_clients(digits_root, tmp_path, capsys):
    assert main.main(cli(digits_root, tmp_path, "-nc", "50")) == 2
    assert "-nc 50" in error_line(capsys)


def test_bad_flag_values(digits_root, tmp_path, capsys):
    assert main.main(cli(digits_root, tmp_path, "-jr", "1.5")) == 2
    assert "-jr" in error_line(capsys)
    with pytest.raises(SystemExit):
        main.main(cli(digits_root, tmp_path, "-ld", "maybe"))  # a boolean takes true/false/1/0 or no value
    assert "expected true/false/1/0, got 'maybe'" in error_line(capsys)


@pytest.mark.parametrize("given,value", [((), False), (("-ld",), True), (("-ld", "True"), True),
                                         (("-ld", "false"), False), (("-ld", "1"), True), (("-ld", "0"), False),
                                         (("-ld", "-ls", "2"), True)])
def test_boolean_flags_take_an_optional_value(digits_root, tmp_path, given, value):
    cfg = parse_config(cli(digits_root, tmp_path, *given))
    assert cfg.learning_rate_decay is value


def test_nan_loss_stops_and_keeps_results(digits_root, tmp_path, capsys):
    assert main.main(cli(digits_root, tmp_path, "-gr", "3", "-lr", "1e30")) == 2
    assert "lower -lr" in error_line(capsys)
    h5 = read_h5(tmp_path / "Digits_FedAvg_test_0.h5")
    assert len(h5["rs_test_acc"]) == 1  # the round-0 evaluation survived


def test_corrupt_client_file(digits_root, tmp_path, capsys):
    import shutil

    root = tmp_path / "root"
    shutil.copytree(digits_root / "Digits", root / "Digits")
    (root / "Digits" / "train" / "3.npz").write_bytes(b"not an npz")
    assert main.main(cli(root, tmp_path, "-gr", "1")) == 2
    assert "corrupt" in error_line(capsys)


def test_config_is_read_only(digits_root):
    cfg = parse_config(cli(digits_root, digits_root))
    with pytest.raises(AttributeError):
        cfg.local_learning_rate = 1.0
    assert cfg.replace(local_learning_rate=1.0).local_learning_rate == 1.0


def test_missing_split_generated_from_source(tmp_path, capsys):
    import numpy as np

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "tiny.npz", x=rng.integers(0, 256, (300, 28, 28), dtype=np.uint8),
             y=np.repeat(np.arange(10), 30).astype(np.int64))
    argv = ["-data", "MNIST", "--dataset_root", str(tmp_path / "d"), "--results_dir", str(tmp_path / "r"),
            "-dev", "cpu", "-gr", "0", "--no-progress", "-nc", "3", "--source", str(tmp_path / "tiny.npz")]
    assert main.main(argv) == 0
    assert "generating it with default settings" in capsys.readouterr().out
    assert (tmp_path / "d" / "MNIST" / "config.json").exists()
