"""PFLlib users' command lines carry over: lines from PFLlib's README, scripts and sweeps parse (and a few
run for a round on Digits); lines PFLlib would misread fail with one clear message."""
import pytest

import main
from cli import parse_config, print_config
from conftest import cli

# (PFLlib command line after "python main.py", with -data/-gr replaced for a tiny run) -> expected config values
PARSES = [
    ("-m CNN -algo FedAvg -did 0", {"algorithm": "FedAvg", "model": "CNN", "device_id": "0"}),
    ("-t 1 -jr 1 -nc 5 -nb 10 -m cnn -algo FedALA -et 1 -s 80 -did 0",
     {"algorithm": "FedALA", "model": "CNN", "num_classes": 10, "eta": 1.0, "rand_percent": 80}),
    ("-algo PerAvg -bt 0.001 -ld True", {"algorithm": "Per-FedAvg", "beta": 0.001, "learning_rate_decay": True}),
    ("-algo PerAvg -bt 0.0", {"algorithm": "Per-FedAvg", "beta": 0.0}),  # PFLlib's default: beta = -lr there and here
    ("-algo FedROD -ld False", {"algorithm": "FedRoD", "learning_rate_decay": False}),
    ("-algo FedProx -mu 0.01 -rjr True -ab True", {"mu": 0.01, "random_join_ratio": True, "auto_break": True}),
    ("-algo Ditto -mu 0.1 -pls 1", {"mu": 0.1, "plocal_epochs": 1}),
    ("-algo pFedMe -lam 15 -lrp 0.01 -bt 1 -K 5", {"lamda": 15.0, "p_learning_rate": 0.01, "beta": 1.0, "K": 5}),
    ("-algo MOON -mu 1 -tau 1", {"mu": 1.0, "tau": 1.0}),
    ("-algo FedGen -nd 32 -glr 0.0003 -hd 256 -se 5 -lf False",
     {"noise_dim": 32, "generator_learning_rate": 0.0003, "hidden_dim": 256, "server_epochs": 5}),
    ("-algo SCAFFOLD -slr 1", {"server_learning_rate": 1.0}),
    ("-algo FedCross -ca 0.99 -cmss 1 -fsb 0", {"first_stage_bound": 0}),
    ("-algo FedAvg -m resnet18", {"model": "ResNet18"}),
    ("-algo FedMTL -itk 4000", {"algorithm": "FedMTL", "itk": 4000}),
    ("-algo FedDyn -al 0.1", {"alpha": 0.1}), ("-algo FedNTD -bt 1 -tau 1", {"beta": 1.0, "tau": 1.0}),
    ("-algo APFL -al 0.5", {"alpha": 0.5}), ("-algo FedBN -m BNCNN", {"model": "BNCNN"}),
    ("-algo FedAvg -dlg True -dlgg 100", {"dlg_eval": True, "dlg_gap": 100}),
]


@pytest.mark.parametrize("line,expected", PARSES, ids=[p[0] for p in PARSES])
def test_pfllib_line_parses_with_its_meaning(line, expected, digits_root, tmp_path):
    cfg = parse_config(cli(digits_root, tmp_path, *line.split()))
    for key, value in expected.items():
        assert getattr(cfg, key) == value, (key, getattr(cfg, key))


# A shared sweep passes every algorithm's flags to every algorithm: accepted, with one warning naming them.
@pytest.mark.parametrize("line,unused,dests", [
    ("-algo FedAvg -mu 0.01", "-mu", ["mu"]),
    ("-algo FedALA -lam 15", "-lam", ["lamda"]),
    ("-algo Local -se 10 -tau 0.5 -hd 64 -al 0.1", "-al, -hd, -se, -tau", ["server_epochs", "tau", "hidden_dim", "alpha"]),
])
def test_other_algorithms_flags_are_accepted_with_a_warning(line, unused, dests, digits_root, tmp_path, capsys):
    cfg = parse_config(cli(digits_root, tmp_path, *line.split()))
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"warning: -algo {cfg.algorithm} does not use {unused}; ignored"], err
    assert not any(hasattr(cfg, d) for d in dests)  # nothing of theirs reaches the run's config
    assert cfg.rand_percent == 80 and cfg.times == 1 and cfg.model == "auto"  # -se is not -s, -tau not -t


def test_flags_the_algorithm_uses_are_not_warned_about(digits_root, tmp_path, capsys):
    cfg = parse_config(cli(digits_root, tmp_path, "-algo", "FedProx", "-mu", "0.1"))
    assert cfg.mu == 0.1 and capsys.readouterr().err == ""


def test_one_round_of_pfllib_lines_runs(digits_root, tmp_path):
    for line in ("-m CNN -algo PerAvg -ld True", "-algo FedAvg -mu 0.01 -ab True -tc 5"):
        assert main.main(cli(digits_root, tmp_path, "-gr", "1", "--executor", "sequential", *line.split())) == 0


@pytest.mark.parametrize("line,message", [
    ("-algo FedNope", "unknown value 'FedNope'; did you mean"),
    ("-m VGG99", "invalid choice: 'VGG99'"),
    ("-ld maybe", "expected true/false/1/0, got 'maybe'"),
    ("-algo FedAvg -mu abc", "expected a number, got 'abc'"),
    ("-did ,", "expected device indices such as 0 or 0,1, got ','"),
    ("-did cuda:1", "expected device indices such as 0 or 0,1, got 'cuda:1'"),
    ("-did -1", "expected device indices such as 0 or 0,1, got '-1'"),
    ("-algo fedavg -ts True", "-ts/--time_select is not a flag here: PFLlib declares it and never reads it"),
])
def test_bad_lines_fail_with_one_line(line, message, digits_root, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        parse_config(cli(digits_root, tmp_path, *line.split()))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("flags,names", [
    (("-p", "2"), ["fc.weight", "fc.bias"]),  # FedALA's run_me.sh: PFLlib's -p counts tensors
    (("-p", "4"), ["fc1.0.weight", "fc1.0.bias", "fc.weight", "fc.bias"]),
    (("-p", "1"), ["fc.bias"]),
    (("--ala_layers", "1"), ["fc.weight", "fc.bias"]),  # the paper's p, in layers
    (("--ala_layers", "2"), ["fc1.0.weight", "fc1.0.bias", "fc.weight", "fc.bias"]),
])
def test_p_means_what_it_means_in_pfllib(flags, names, digits_root, tmp_path):
    from flcore.registry import get_server_class
    from runtime.executors import SequentialExecutor
    from utils.data_utils import load_split

    cfg = parse_config(cli(digits_root, tmp_path, "-algo", "FedALA", "-et", "1", "-s", "80", *flags))
    server = get_server_class("FedALA")(cfg.replace(num_classes=10), load_split("Digits", digits_root), 0, None,
                                        SequentialExecutor())
    assert server.clients[0].ala.names == names


def test_startup_print_marks_values_that_differ_from_pfllib(digits_root, tmp_path, capsys):
    cfg = parse_config(cli(digits_root, tmp_path, "-algo", "MOON", "-p", "2"))
    print_config(cfg)
    out = capsys.readouterr().out.splitlines()
    assert "  mu = 5.0   (PFLlib default: 0.0)" in out and "  tau = 0.5   (PFLlib default: 1.0)" in out
    assert "  layer_idx = 2" in out and "  local_learning_rate = 0.005" in out  # same as PFLlib: unmarked


@pytest.mark.parametrize("given,kept,device", [("1", "1", "cuda:1"), ("2, 0", "2,0", "cuda:2"), (" 3 ,1", "3,1", "cuda:3"),
                                               ("01", "1", "cuda:1"), ("0, ", "0", "cuda:0"), ("1,,2", "1,2", "cuda:1")])
def test_device_ids_are_written_without_spaces_and_the_first_is_the_device(given, kept, device, digits_root,
                                                                           tmp_path, monkeypatch):
    import torch

    cfg = parse_config(cli(digits_root, tmp_path, "-dev", "cuda", "-did", given))
    assert cfg.device_id == kept
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with GPUs, as far as this goes
    assert main.resolve_device(cfg).device == device
