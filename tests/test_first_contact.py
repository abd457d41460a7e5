"""The errors and output a newcomer meets first, each one line (exit 2) where it is an error: a missing split
is reported as missing before anything else, names in another case or misspelt are resolved or answered with
the closest names, a non-finite evaluation ends the run as diverged, ``-gr 0`` is marked untrained, and the
start-up output fits a screen."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import main
from cli import parse_config
from conftest import cli
from utils.results import read_h5
from scripts.run import table


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_missing_split_is_reported_before_an_existing_result(tmp_path, capsys):
    results = tmp_path / "r"
    results.mkdir()
    (results / "MNIST_FedAvg_test_0.h5").write_bytes(b"a result of an earlier run")
    assert main.main(["-data", "MNIST", "--dataset_root", str(tmp_path / "empty"), "--results_dir", str(results),
                      "-dev", "cpu"]) == 2
    line = error_line(capsys)
    assert "split 'MNIST' not found" in line and "python dataset/generate_MNIST.py" in line, line
    assert "--source FILE" in line and "already exists" not in line, line


def test_data_in_another_case_runs_that_split(digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-data", "digits", "-gr", "0")) == 0
    assert "-data digits: using split 'Digits'" in capsys.readouterr().out
    assert (tmp_path / "Digits_FedAvg_test_0.h5").exists()


@pytest.mark.parametrize("flag, given, closest", [("-algo", "FedAwg", "FedAvg"), ("-m", "resnet", "ResNet18"),
                                                  ("-algo", "fedpox", "FedProx"), ("--aggregator", "medain", "median")])
def test_a_misspelt_name_gets_the_closest_names(flag, given, closest, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_config([flag, given])
    assert stop.value.code == 2
    line = error_line(capsys)
    assert f"unknown value '{given}'; did you mean " in line and closest in line.split("did you mean")[1].split("?")[0]


def test_a_name_with_nothing_close_keeps_argparse_s_line(capsys):
    with pytest.raises(SystemExit):
        parse_config(["-algo", "Zzzzzz"])
    assert "invalid choice: 'Zzzzzz'" in error_line(capsys)


def nan_predict(model, x, batch_size):
    return torch.full((len(x), 10), float("nan"))


@pytest.mark.parametrize("where", ["outputs", "test outputs", "train loss"])
def test_a_non_finite_evaluation_ends_the_run_as_diverged(where, digits_tiny_root, tmp_path, capsys, monkeypatch):
    """"test outputs": the test split's check alone (no train loss evaluated, so its own check cannot stand
    in for it)."""
    from runtime import client_steps

    flags = ("--train_loss_eval", "off") if where == "test outputs" else ()
    if where != "train loss":  # the model's outputs: accuracy would be argmax over NaN
        monkeypatch.setattr(client_steps, "predict", nan_predict)
    else:  # a client's training loss evaluated as non-finite
        monkeypatch.setattr(client_steps, "train_metrics", lambda client: (float("inf"), client.train_samples))
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "2", "--executor", "sequential", *flags)) == 2
    line = error_line(capsys)
    want = {"outputs": "not finite", "test outputs": "outputs on its test split are not finite",
            "train loss": "evaluated train loss is inf"}[where]
    assert want in line, line
    sidecar = json.loads((tmp_path / "Digits_FedAvg_test_0.json").read_text())
    assert sidecar["status"] == "diverged", sidecar["status"]


def test_non_finite_outputs_on_one_clients_training_data_name_that_client_and_split(digits_tiny_root):
    """A NaN in client 2's training data (its test data finite): the evaluation of the training split says
    which client and which split, not only that the round's summed train loss is NaN."""
    from conftest import build_server
    from runtime import loop
    from utils.errors import Diverged

    server = build_server(digits_tiny_root, digits_tiny_root)
    c = server.clients[2]
    c.x_train = c.x_train.clone()
    c.x_train[0] = float("nan")
    with pytest.raises(Diverged, match="^client 2: the evaluated model's outputs on its training split are not finite"):
        loop.evaluate(server)


def test_gr_0_is_marked_untrained_and_tables_leave_it_out(digits_tiny_root, tmp_path):
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "0")) == 0
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", "-go", "trained")) == 0
    untrained = json.loads((tmp_path / "Digits_FedAvg_test_0.json").read_text())
    assert untrained["untrained"] is True and untrained["status"] == "finished"
    assert "untrained" not in json.loads((tmp_path / "Digits_FedAvg_trained_0.json").read_text())
    assert list(read_h5(tmp_path / "Digits_FedAvg_test_0.h5")["rs_round"]) == [0]
    warnings = []
    text = table.build_table([str(tmp_path)], ["algorithm", "goal"], ["best"], "md", warn=warnings.append)
    assert "trained" in text and "| test |" not in text, text
    assert any("Digits_FedAvg_test_0.h5 was not trained (-gr 0" in w for w in warnings), warnings
    both = table.build_table([str(tmp_path)], ["algorithm", "goal"], ["best"], "md", untrained=True,
                             warn=lambda m: None)
    assert "| test |" in both, both


def test_start_up_output_fits_a_screen_and_names_what_runs(digits_tiny_root, tmp_path, capsys):
    argv = ["-data", "Digits", "--dataset_root", str(digits_tiny_root), "--results_dir", str(tmp_path), "-dev", "cpu",
            "-algo", "FedALA", "-gr", "1", "--no-progress"]
    assert main.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    first_round = next(i for i, line in enumerate(out) if line.startswith("round    0"))
    assert first_round <= 25, out[:first_round]
    summary = next(line for line in out if line.startswith("FedALA on Digits"))
    assert "model FedAvgCNN" in summary and "ALA on" in summary and "auto" not in summary, summary
    assert main.main([*argv, "-algo", "FedAvg", "--print_config"]) == 0
    out = capsys.readouterr().out
    assert "configuration:" in out and "  local_learning_rate = " in out and "ALA off" in out
