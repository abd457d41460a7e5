"""system/cli.py, function by function, against values written by hand: the flag table of the README is the
parser's (names in the order -h shows them, the Config key, the default), and each helper of the command line
(value types, the one-line errors, ``--config`` files, the other algorithms' flags, the path checks, the start-up
print) gives the result worked out here. No run is started: every test parses only."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import pytest

import cli
from flcore.flags import FlagSpec
from utils.errors import FLError

README = Path(__file__).resolve().parents[1] / "README.md"
NUMBER = re.compile(r"[-+]?\d[\d.]*(?:e[-+]?\d+)?")
WORD = re.compile(r"[A-Za-z_][\w-]*")
# Flags whose parser default is None and whose documented number is the value once the feature is on.
RESOLVED = {"attack_frac": ["--attack", "signflip"]}


def flag_rows() -> list[tuple[list[str], str]]:
    """(names of one flag as the README writes them, its documented default) for each flag of the README's
    "Flag reference" table."""
    section = README.read_text().split("\n## Flag reference\n", 1)[1].split("\n## ", 1)[0]
    found = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        items = re.findall(r"`([^`]+)`", cells[0])
        values = [v.strip() for v in re.sub(r"\([^()]*\)", "", cells[1]).split(",")]
        assert len(items) == len(values), line  # one default per flag named in the row
        found += [(item.split("/"), value) for item, value in zip(items, values)]
    return found


def parse(tmp_path, *flags) -> "cli.Config":
    return cli.parse_config([*flags, "--results_dir", str(tmp_path)])


def test_every_common_flag_is_in_the_readme_table_with_its_names_and_default(tmp_path):
    parser = cli.base_parser()
    by_name = parser._option_string_actions
    documented = set()
    for names, value in flag_rows():
        action = by_name[names[0]]
        assert all(by_name[n] is action for n in names), names
        assert action.option_strings[0] == names[0], (names, action.option_strings)  # -h shows it first
        longs = [n for n in action.option_strings if n.startswith("--")]
        assert action.option_strings == [n for n in action.option_strings if n not in longs] + longs, names
        assert all(action.dest == n[2:] for n in names if n.startswith("--")), (names, action.dest)
        documented.add(action.dest)
        default = action.default
        if default is None and action.dest in RESOLVED:
            default = getattr(parse(tmp_path, *RESOLVED[action.dest]), action.dest)
        if value == "on":
            assert default is True, names
        elif value == "off":
            assert default is False or default is None or default == "off", names
        elif value == "—":
            assert default in (None, ""), names
        elif NUMBER.fullmatch(value) and isinstance(default, str):
            assert default == value, (names, default)  # a string flag (-did) keeps its text
        elif NUMBER.fullmatch(value):
            assert not isinstance(default, bool) and default == pytest.approx(float(value)), (names, default)
        elif WORD.fullmatch(value) and default is not None:
            assert default == value, (names, default)
    assert {a.dest for a in parser.flags} - {"help"} == documented


def test_the_row_reader_sees_the_table():
    rows = dict((tuple(n), v) for n, v in flag_rows())
    assert rows[("-lr", "--local_learning_rate")] == "0.005" and rows[("--val_ratio",)] == "0"
    assert rows[("-tth",)] == "10000" and rows[("--print_config",)] == "off" and len(rows) > 90


def test_an_algorithm_default_set_on_its_group_reaches_the_config(tmp_path):
    """FedFomo's own default of the common --val_ratio (README: "0 (FedFomo: 0.2)"), set through its flag group."""
    assert parse(tmp_path, "-algo", "FedFomo").val_ratio == 0.2 and parse(tmp_path).val_ratio == 0.0


@pytest.mark.parametrize("given, known", [("cnn", "CNN"), ("CNN", "CNN"), ("resnet-18", "ResNet18"),
                                          ("MobileNetV2", "MobileNet"), ("AUTO", "auto"), ("NoSuchNet", "NoSuchNet")])
def test_model_names_in_any_case_and_aliases(given, known):
    assert cli.canonical_model(given) == known


def choice_error(value: str, choices: str) -> str:
    return f"argument -m/--model: invalid choice: '{value}' (choose from {choices})"


@pytest.mark.parametrize("value, choices, close", [
    ("FedAwg", "'FedAvg', 'FedALA', 'FedProx'", "FedAvg or FedALA"),
    # four above difflib's cutoff: the three closest (ties: the later name first); none left for prefixes
    ("resnet", "'ResNet10', 'ResNet18', 'ResNet34', 'ResNet50x'", "ResNet34 or ResNet18 or ResNet10"),
    # three close ones fill the list: the prefix match abcdzzzzzz is not added
    ("abcd", "'abce', 'abcf', 'abdd', 'abcdzzzzzz'", "abdd or abcf or abce"),
    ("cn", "CNN, DNN", "CNN"),  # choices written without quotes; DNN is neither close nor a prefix
    ("ab", "'abxxxxxx1', 'abxxxxxx2', 'abxxxxxx3', 'abxxxxxx4'", "abxxxxxx1 or abxxxxxx2 or abxxxxxx3"),
])
def test_an_unknown_choice_names_the_closest_then_the_prefixed(value, choices, close):
    listed = ", ".join(c.strip().strip("'") for c in choices.split(","))
    assert cli.did_you_mean(choice_error(value, choices)) == (
        f"argument -m/--model: unknown value '{value}'; did you mean {close}? (choices: {listed})")


@pytest.mark.parametrize("message", [choice_error("zzz", "'CNN', 'DNN'"), "argument -lr: expected a number, got 'x'"])
def test_a_message_with_nothing_to_suggest_is_unchanged(message):
    assert cli.did_you_mean(message) == message


@pytest.mark.parametrize("text, ids", [("0", "0"), ("0,1", "0,1"), ("0, 2", "0,2"), (" 3 ,, 01,", "3,1")])
def test_device_lists_are_written_back_plainly(text, ids):
    assert cli.device_list(text) == ids


@pytest.mark.parametrize("text", ["", ",", " , ", "a", "0,x", "-1", "1.5", "\u0663"])  # \u0663: an Arabic-Indic 3
def test_device_lists_refuse_anything_but_indices(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected device indices"):
        cli.device_list(text)


@pytest.mark.parametrize("text, value", [("true", True), ("1", True), ("YES", True), (" on ", True),
                                         ("False", False), ("0", False), ("no", False), ("off", False)])
def test_boolean_values(text, value):
    assert cli.parse_bool(text) is value


def test_a_boolean_value_that_is_neither_is_refused():
    with pytest.raises(argparse.ArgumentTypeError, match="expected true/false/1/0, got 'maybe'"):
        cli.parse_bool("maybe")


@pytest.mark.parametrize("argv, value", [([], False), (["-ld"], True), (["-ld", "True"], True),
                                         (["-ld", "false"], False), (["-ld=0"], False), (["-ld", "-ab"], True)])
def test_a_switch_takes_an_optional_value(argv, value):
    args = cli.base_parser().parse_args(argv)
    assert args.learning_rate_decay is value and args.auto_break is ("-ab" in argv)


def test_a_required_switch_must_be_given():
    parser = cli.OneLineParser()
    parser.add_argument("--sw", action="store_true", required=True)
    assert parser.parse_args(["--sw"]).sw is True
    with pytest.raises(SystemExit):
        parser.parse_args([])


def test_help_gives_each_flag_one_default():
    parser = cli.base_parser()
    formatter = cli.OneDefaultFormatter("main.py")
    shown = {a.dest: formatter._get_help_string(a) for a in parser.flags}
    assert shown["local_learning_rate"] == "client SGD learning rate (default: %(default)s)"
    assert shown["num_clients"] == "clients to use (default: all in the split)"  # its own words, once
    assert shown["help"] == "show this help message and exit"  # a suppressed default is not shown
    bare = argparse.Action(["--x"], "x", default=3)
    assert formatter._get_help_string(bare) == "(default: %(default)s)"


@pytest.mark.parametrize("text, value", [("0.5", 0.5), ("-2", -2.0), ("1e-3", 1e-3)])
def test_finite_numbers(text, value):
    assert cli.finite_float(text) == value


@pytest.mark.parametrize("text, message", [("nan", "expected a finite number, got 'nan'"),
                                           ("-inf", "expected a finite number, got '-inf'"),
                                           ("x", "expected a number, got 'x'")])
def test_numbers_that_are_not_finite_are_refused(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
        cli.finite_float(text)


def parser_error(capsys, argv) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        cli.base_parser().parse_args(argv)
    return e.value.code, capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["-lr", "nan"], "argument -lr/--local_learning_rate: expected a finite number, got 'nan'"),
    (["--global_round", "3"], "unrecognized arguments: --global_round 3"),  # no prefix of a long flag
    (["-fte", "2"], "unrecognized arguments: -fte 2"),  # nor of a short one (-ften)
    (["-algo", "FedAwg"], "argument -algo/--algorithm: unknown value 'FedAwg'; did you mean FedAvg"),
])
def test_a_bad_flag_is_one_line_and_exit_code_2(capsys, argv, message):
    code, err = parser_error(capsys, argv)
    assert code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1
    assert err.endswith(" (python system/main.py -h lists the flags)\n")


def test_a_one_letter_flag_takes_its_value_attached():
    args = cli.base_parser().parse_args(["-s50", "-p", "3"])
    assert (args.rand_percent, args.layer_idx) == (50, 3)


def test_the_flags_list_holds_every_added_flag_and_the_groups_flags():
    parser = cli.OneLineParser()
    parser.add_argument("--a", type=int, default=1)
    group = parser.flag_group("extra")
    group.add_argument("--b", default="x")
    group.set_defaults(b="y")
    assert [a.dest for a in parser.flags] == ["help", "a", "b"]
    assert vars(parser.parse_args([])) == {"a": 1, "b": "y"}
    assert "extra" in [g.title for g in parser._action_groups]


def test_parser_for_adds_only_the_named_algorithms_flags():
    assert "-mu" in cli.parser_for("FedProx")._option_string_actions
    assert "-mu" not in cli.parser_for("FedAvg")._option_string_actions
    assert [a.dest for a in cli.parser_for(None).flags] == [a.dest for a in cli.base_parser().flags]
    assert [a.dest for a in cli.parser_for("NoSuchAlgo").flags] == [a.dest for a in cli.base_parser().flags]


FAKE = {  # a registry of three algorithms' flags, as flcore/flags.py reads them
    "A": [FlagSpec(("-x", "--xx"), "xx", "int", "store", None)],
    "B": [FlagSpec(("-x", "--xb"), "xb", "float", "store", None), FlagSpec(("--sw",), "sw", "str", "store_true", None),
          FlagSpec(("--opt",), "opt", "str", "optional", None), FlagSpec(("--ch",), "ch", "str", "store", ("u", "v")),
          FlagSpec(("--name",), "name", "str", "store", None)],
    "C": [FlagSpec(("-go", "--cc"), "cc", "int", "store", None)],
}


@pytest.fixture
def fake_registry(monkeypatch):
    import flcore.flags

    monkeypatch.setattr(cli, "ALGORITHMS", dict.fromkeys(FAKE))
    monkeypatch.setattr(flcore.flags, "algorithm_flags", lambda name: FAKE[name])


def test_other_algorithms_flags_keep_their_kinds_and_skip_taken_names(fake_registry):
    parser = cli.base_parser()
    taken = cli.add_other_algorithms_flags(parser, "C")
    o = cli.OTHER
    assert taken == {o + "xx": ["-x", "--xx"], o + "xb": ["--xb"], o + "sw": ["--sw"], o + "opt": ["--opt"],
                     o + "ch": ["--ch"], o + "name": ["--name"]}  # B's -x is A's; C's are skipped
    args = vars(parser.parse_args(["-x", "4", "--xb", "1.5", "--sw", "--no-opt", "--ch", "u", "--name", "7"]))
    assert {k: v for k, v in args.items() if k.startswith(o)} == {
        o + "xx": 4, o + "xb": 1.5, o + "sw": True, o + "opt": False, o + "ch": "u", o + "name": "7"}
    assert not any(k.startswith(o) for k in vars(parser.parse_args([])))  # never given a default


def test_the_chosen_algorithms_flags_are_not_the_hidden_ones(fake_registry):
    taken = cli.add_other_algorithms_flags(cli.base_parser(), "A")
    assert taken[cli.OTHER + "xb"] == ["-x", "--xb"] and cli.OTHER + "xx" not in taken
    assert cli.OTHER + "cc" in taken and taken[cli.OTHER + "cc"] == ["--cc"]  # -go is a common flag's


def test_another_algorithms_choice_is_checked(fake_registry, capsys):
    parser = cli.base_parser()
    cli.add_other_algorithms_flags(parser, "A")
    with pytest.raises(SystemExit):
        parser.parse_args(["--ch", "w"])
    assert "--ch: invalid choice: 'w'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, name", [
    ([], "FedAvg"), (["-gr", "1"], "FedAvg"), (["-algo", "fedprox"], "FedProx"), (["--algorithm", "Ditto"], "Ditto"),
    (["--algorithm=perAvg"], "Per-FedAvg"), (["-algo", "FedProx", "-algo", "MOON"], "MOON"),
    (["-gr", "1", "-algo"], "FedAvg"), (["-algo", "FedProx", "-gr", "3"], "FedProx"), (["--algorithm=a=b"], "a=b"),
])
def test_the_algorithm_is_read_before_parsing(argv, name):
    assert cli.algorithm_arg(argv) == name


def test_without_algo_and_without_a_default_there_is_no_name():
    assert cli.algorithm_arg(["-gr", "1"], default=None) is None
    assert cli.algorithm_arg(["x", "-algo", "Ditto"], default=None) == "Ditto"


@pytest.mark.parametrize("flag", ["-ts", "--time_select", "--time_select=1", "-ts=0"])
def test_pfllibs_unused_time_select_is_refused_with_its_reason(tmp_path, capsys, flag):
    with pytest.raises(SystemExit) as e:
        parse(tmp_path, "-gr", "1", flag)
    assert e.value.code == 2 and cli._TS in capsys.readouterr().err


def write(tmp_path, name, text) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_json_config_gives_the_flags_and_the_command_line_overrides_it(tmp_path):
    path = write(tmp_path, "run.json", json.dumps({
        "num_clients": None, "global_rounds": 7, "dataset": "Digits_X", "learning_rate_decay": True,
        "progress": False, "print_config": True, "local_learning_rate": 0.25, "ala": False}))
    for argv in (["--config", path], [f"--config={path}"], ["-gr", "9", "--config", path]):
        cfg = parse(tmp_path, *argv)
        assert cfg.global_rounds == (9 if "-gr" in argv else 7) and cfg.num_clients is None
        assert (cfg.dataset, cfg.learning_rate_decay, cfg.progress, cfg.print_config) == ("Digits_X", True, False, True)
        assert cfg.local_learning_rate == 0.25 and cfg.ala is False and cfg.config == path
    assert cli.config_file_flags(["-gr", "9", "--config", path])[:4] == [
        "--global_rounds=7", "--dataset=Digits_X", "--learning_rate_decay=true", "--no-progress"]
    assert cli.config_file_flags(["-gr", "9"]) == ["-gr", "9"]


def test_the_config_names_the_algorithm_when_the_command_line_does_not(tmp_path):
    path = write(tmp_path, "prox.json", '{"algorithm": "FedProx", "mu": 0.5}')
    assert parse(tmp_path, "--config", path).mu == 0.5
    path = write(tmp_path, "noalgo.json", '{"algorithm": null, "global_rounds": 3}')
    assert parse(tmp_path, "--config", path).algorithm == "FedAvg"


def test_a_config_path_with_an_equals_sign(tmp_path):
    path = write(tmp_path, "a=b.json", '{"global_rounds": 4}')
    assert parse(tmp_path, f"--config={path}").global_rounds == 4


def test_a_yaml_config(tmp_path):
    pytest.importorskip("yaml")
    path = write(tmp_path, "run.yaml", "global_rounds: 5\nlocal_epochs: 2\n")
    cfg = parse(tmp_path, "--config", path)
    assert (cfg.global_rounds, cfg.local_epochs) == (5, 2)


@pytest.mark.parametrize("text, message", [
    ('{"config": "other.json"}', "a config file cannot name another (config: other.json)"),
    ('{"no_such_flag": 1}', "'no_such_flag' is not a flag of -algo FedAvg (keys are long flag names"),
    ('{"help": true}', "'help' is not a flag of -algo FedAvg"),
    ('{"mu": 0.1}', "'mu' is not a flag of -algo FedAvg"),
    ('{"global_rounds": [1, 2]}', "'global_rounds' must be a single value (got list)"),
    ('{"global_rounds": {"a": 1}}', "'global_rounds' must be a single value (got dict)"),
    ('[1, 2]', "expected a mapping of flag names to values"),
])
def test_a_bad_config_file_is_one_line(tmp_path, text, message):
    path = write(tmp_path, "bad.json", text)
    with pytest.raises(FLError) as e:
        parse(tmp_path, "--config", path)
    assert str(e.value).startswith(f"--config {path}: {message}")


def test_a_config_file_that_cannot_be_read_names_the_path_as_given(tmp_path):
    with pytest.raises(FLError) as e:
        cli.read_config_file(str(tmp_path / "missing.json"))
    assert str(e.value).startswith(f"--config {tmp_path / 'missing.json'}: ")
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"goal": "\xe9"}')
    with pytest.raises(FLError, match="cannot read it"):
        cli.read_config_file(str(path))


def test_a_switch_value_that_is_not_a_boolean_is_refused(tmp_path, capsys):
    path = write(tmp_path, "bad.json", '{"progress": "sometimes"}')
    with pytest.raises(SystemExit) as e:
        parse(tmp_path, "--config", path)
    assert e.value.code == 2 and "--progress" in capsys.readouterr().err


def test_flags_come_from_sys_argv_when_none_are_passed(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["main.py", "-gr", "3", "--results_dir", str(tmp_path)])
    assert cli.parse_config().global_rounds == 3


def help_text(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        cli.parse_config(list(argv))
    assert e.value.code == 0
    return capsys.readouterr().out


def test_help_without_an_algorithm_says_how_to_see_one(capsys):
    for flag in ("-h", "--help"):
        text = help_text(capsys, flag)
        assert "-algo NAME -h adds that algorithm's own flags" in text and "FedAvg flags" not in text


def test_help_with_an_algorithm_lists_its_flags_only(capsys):
    text = help_text(capsys, "-algo", "FedProx", "-h")
    assert "FedProx flags:" in text and "-mu" in text and "-algo NAME -h" not in text
    assert "flags of other algorithms" not in text


def test_another_algorithms_flags_are_accepted_with_one_warning(tmp_path, capsys):
    cfg = parse(tmp_path, "-mu", "0.1", "-K5", "--lamda=2", "-gr", "2")
    err = capsys.readouterr().err
    assert err == "warning: -algo FedAvg does not use --lamda, -K, -mu; ignored\n"
    assert not hasattr(cfg, "mu") and not any(k.startswith(cli.OTHER) for k in vars(cfg))
    cfg = parse(tmp_path, "-algo", "FedProx", "-mu", "0.1")
    assert cfg.mu == 0.1 and capsys.readouterr().err == ""


def test_the_config_is_checked_before_it_is_returned(tmp_path, capsys):
    for flags, message in [(["-ls", "0"], "-ls 0 is out of range: it takes [1, 10000]"),
                           (["-pv", "1"], "need -pv < -t (got -pv 1, -t 1)"),
                           (["-go", "a/b"], "-go is part of the result file names"),
                           (["-algo", "FedProto", "--client_models", "CNN,"], "--client_models 'CNN,': give a preset"),
                           (["--client_models", "HtFE-cnn"], "--client_models: FedAvg is refused"),
                           (["-nnc", "1", "-algo", "FD"], "-nnc: FD cannot evaluate new clients:"),
                           (["-algo", "FedProx", "-mu", "-1"], "-mu")]:
        with pytest.raises(FLError) as e:
            parse(tmp_path, *flags)
        assert str(e.value).startswith(message), (flags, str(e.value))
    assert parse(tmp_path, "-pv", "1", "-t", "2").prev == 1
    assert parse(tmp_path, "-nnc", "1").num_new_clients == 1
    assert parse(tmp_path, "-algo", "FedProto", "--client_models", "HtFE-cnn").client_models == "HtFE-cnn"


def test_the_plugins_see_which_names_were_typed(tmp_path, capsys):
    parse(tmp_path, "-slr=0.5")
    assert "does not use -slr without --server_opt" in capsys.readouterr().err
    parse(tmp_path, "--server_learning_rate", "0.5")
    assert "does not use --server_learning_rate without --server_opt" in capsys.readouterr().err
    assert parse(tmp_path, "--attack", "signflip").attack_frac == 0.2


def tensorboard_installed(monkeypatch, present: bool) -> None:
    """The tensorboard package found (or not) by parse_config's check, whatever this machine has."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if present else None) if name == "tensorboard" else real(name, *a))


@pytest.mark.parametrize("folder, message", [
    ("/abs", "--tensorboard must be a folder under --results_dir"), ("../up", "--tensorboard must be a folder"),
    ("", "--tensorboard must be a folder under --results_dir, a relative name without '..' (got '')")])
def test_tensorboard_writes_under_the_results_folder(tmp_path, monkeypatch, folder, message):
    tensorboard_installed(monkeypatch, True)
    with pytest.raises(FLError, match=re.escape(message)):
        parse(tmp_path, "--tensorboard", folder)
    assert parse(tmp_path, "--tensorboard", "tb").tensorboard == "tb"


def test_tensorboard_without_the_package_is_one_line(tmp_path, monkeypatch):
    tensorboard_installed(monkeypatch, False)
    with pytest.raises(FLError, match="--tensorboard needs the tensorboard package"):
        parse(tmp_path, "--tensorboard", "tb")


@pytest.mark.parametrize("data, dataset, root", [("Digits", "Digits", "R"), ("Digits/", "Digits", "R"),
                                                 ("../splits/Cifar10", "Cifar10", "R/../splits"),
                                                 ("a/b/c", "c", "R/a/b")])
def test_a_dataset_path_names_the_folder(tmp_path, data, dataset, root):
    cfg = cli.split_data_path(parse(tmp_path, "--dataset_root", "R").replace(dataset=data))
    assert (cfg.dataset, cfg.dataset_root) == (dataset, root)


def test_a_plain_dataset_name_leaves_the_root_as_written(tmp_path):
    assert parse(tmp_path, "--dataset_root", "R/", "-data", "Digits").dataset_root == "R/"


@pytest.mark.parametrize("data", ["", ".", "..", "a/.."])
def test_a_dataset_path_without_a_folder_is_refused(tmp_path, data):
    with pytest.raises(FLError, match="-data must name a split folder"):
        cli.split_data_path(parse(tmp_path).replace(dataset=data))


def test_results_go_to_results_dir_else_the_repository(tmp_path):
    assert cli.results_folder(parse(tmp_path)) == tmp_path
    assert cli.results_folder(parse(tmp_path).replace(results_dir=None)) == cli.RESULTS_DIR


@pytest.mark.parametrize("goal", ["", ".", "..", "a/b", "a\\b", "a\0b", "a\x1fb", "x" * 101, "\u00e9" * 51])
def test_a_goal_that_is_not_a_file_name_part_is_refused(tmp_path, goal):
    with pytest.raises(FLError) as e:
        parse(tmp_path, "-go", goal)
    assert str(e.value).endswith(f"(got {goal[:60]!r})") and "at most 100 bytes" in str(e.value)


@pytest.mark.parametrize("goal", ["a b", "x" * 100, "\u00e9" * 50, "run-1_v2"])
def test_a_goal_within_the_rules_is_taken(tmp_path, goal):
    assert parse(tmp_path, "-go", goal).goal == goal


@pytest.mark.parametrize("key, flag", [("dataset", "-data"), ("save_folder_name", "-sfn"),
                                       ("client_state_dir", "--client_state_dir"), ("source", "--source")])
def test_a_path_with_a_control_character_is_refused(tmp_path, key, flag):
    value = "ab" * 40 + "\x1f"
    with pytest.raises(FLError) as e:
        cli.check_paths(parse(tmp_path).replace(**{key: value}))
    assert str(e.value) == (f"--{key} holds a control character (NUL, line break, ...): not a path the run can use "
                            f"(got {value[:60]!r})")
    assert cli.check_paths(parse(tmp_path).replace(**{key: "a b"})) is None  # a space is not a control character


@pytest.mark.parametrize("sfn", ["/abs", "../up", "a/../../b"])
def test_the_save_folder_stays_under_the_results_folder(tmp_path, sfn):
    with pytest.raises(FLError, match=re.escape(f"-sfn must be a folder under --results_dir, a relative name "
                                                f"without '..' (got '{sfn}')")):
        parse(tmp_path, "-sfn", sfn)
    assert parse(tmp_path, "-sfn", "models/a").save_folder_name == "models/a"


def test_the_results_folder_must_be_a_writable_folder(tmp_path, monkeypatch):
    assert parse(tmp_path / "new" / "deeper").results_dir == str(tmp_path / "new" / "deeper")  # made later
    (tmp_path / "file").write_text("")
    with pytest.raises(FLError, match=re.escape(f"--results_dir {tmp_path}/file/x: {tmp_path}/file is not a folder")):
        cli.parse_config(["--results_dir", str(tmp_path / "file" / "x")])
    monkeypatch.setattr(os, "access", lambda path, mode: not (Path(path) == tmp_path and mode == os.W_OK | os.X_OK))
    with pytest.raises(FLError, match=re.escape(f"--results_dir {tmp_path}/a: {tmp_path} is not writable")):
        cli.parse_config(["--results_dir", str(tmp_path / "a")])


def test_pfllibs_defaults_of_the_common_flags():
    """PFLlib's system/main.py defaults, where they differ from this library's."""
    assert cli.PFLLIB_DEFAULTS == {
        "dataset": "MNIST", "model": "CNN", "num_classes": 10, "num_clients": 20, "save_folder_name": "items",
        "layer_idx": 2, "dp_sigma": 0.0, "bn_stats": "local", "ala_clients": "all", "server_learning_rate": 1.0}


def test_the_startup_print_marks_what_differs_from_pfllib(tmp_path, capsys):
    cfg = parse(tmp_path, "-algo", "FedProx", "-ncl", "10", "-nc", "3", "-mu", "0.0", "-dps", "2")
    cli.print_config(cfg)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "configuration:" and len(lines) == len(vars(cfg)) + 1
    assert "  num_classes = 10" in lines and "  mu = 0.0" in lines  # PFLlib's own values: no mark
    assert "  num_clients = 3   (PFLlib default: 20)" in lines and "  dp_sigma = 2.0   (PFLlib default: 0.0)" in lines
    assert "  dataset = Digits   (PFLlib default: MNIST)" in lines
    assert "  server_learning_rate = None" in lines  # unset: not compared
