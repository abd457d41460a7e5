"""Files are data, writes stay in the run's folder (docs/security.md): a crafted checkpoint or parked-client
file runs no code (the pickle's marker file is never created) and is refused with one line, as is a damaged
one; a symlink planted where a temporary file goes is never followed; nothing is written outside
--results_dir; runs sharing --client_state_dir do not see each other's files; --resume never replaces a
finished result it cannot continue; docs/security.md's table of every case tried names tests that exist."""
import multiprocessing
import os
import pickle
import shutil
import sys

import pytest
import torch

import main
from conftest import REPO, cli
from runtime.state import read_file, write_file
from utils.results import read_h5

STEM = "Digits_FedAvg_test_0"
SEQ = ("--executor", "sequential")


class Plant:
    """A pickle that, when loaded by plain pickle, creates ``path`` (what a malicious file would do)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture(scope="module")
def checkpointed_run(digits_tiny_root, tmp_path_factory):
    """A run of 2 rounds with its checkpoint (the files --resume continues), run once per module."""
    out = tmp_path_factory.mktemp("checkpointed")
    assert main.main(cli(digits_tiny_root, out, "-gr", "2", "--checkpoint_every", "1", *SEQ)) == 0
    return out


@pytest.fixture
def checkpointed(checkpointed_run, tmp_path):
    """A copy of that run's files in this test's folder (its results folder); the checkpoint's path."""
    shutil.copytree(checkpointed_run, tmp_path, dirs_exist_ok=True)
    return tmp_path / f"{STEM}.ckpt"


def resume(root, out):
    return main.main(cli(root, out, "-gr", "3", "--checkpoint_every", "1", "--resume", *SEQ))


def test_a_crafted_checkpoint_runs_no_code(digits_tiny_root, tmp_path, checkpointed, capsys):
    marker = tmp_path / "pwned"
    write_file({"format": 2, "server": Plant(marker)}, checkpointed)  # with a valid checksum line
    assert not marker.exists()
    capsys.readouterr()
    assert resume(digits_tiny_root, tmp_path) == 2
    assert "holds objects other than tensors and plain values" in one_line(capsys)
    assert not marker.exists()
    with open(checkpointed, "wb") as f:  # a plain pickle, not torch's format
        pickle.dump(Plant(marker), f)
    assert resume(digits_tiny_root, tmp_path) == 2
    one_line(capsys)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing_keys", "fewer_clients", "wrong_shape",
                                    "unknown_kind", "plain_for_model", "plain_for_tensor", "not_a_dict",
                                    "other_format", "client_not_a_dict", "no_results"])
def test_a_damaged_checkpoint_is_one_line(digits_tiny_root, tmp_path, checkpointed, capsys, damage):
    before = read_h5(tmp_path / f"{STEM}.h5")["rs_test_acc"]
    blob = bytearray(checkpointed.read_bytes())
    if damage in ("flip", "truncate"):
        if damage == "flip":
            for i in range(len(blob) // 3, len(blob) // 3 + 64):
                blob[i] ^= 0xA5
        else:
            del blob[len(blob) // 2:]
        checkpointed.write_bytes(bytes(blob))
    else:
        ckpt = read_file(checkpointed)
        if damage == "missing_keys":
            del ckpt["server"], ckpt["recorder"]
        elif damage == "fewer_clients":
            ckpt["clients"] = ckpt["clients"][:-1]
        elif damage == "wrong_shape":
            ckpt["clients"][0]["model"]["state"]["fc.weight"] = torch.zeros(3, 3)
        elif damage == "plain_for_model":  # the run's global model replaced by a string
            ckpt["server"]["global_model"] = "model"
        elif damage == "plain_for_tensor":  # a weight replaced by a number
            ckpt["clients"][0]["model"]["state"]["fc.weight"] = 0.0
        elif damage == "not_a_dict":  # tensors and plain values, but not a checkpoint's dict
            ckpt = [ckpt["round"], ckpt["split"]]
        elif damage == "other_format":  # another version's layout
            ckpt["format"] = 99
        elif damage == "client_not_a_dict":
            ckpt["clients"][0] = 5
        elif damage == "no_results":  # resuming would drop the two rounds' results
            ckpt["recorder"] = None
        else:
            ckpt["clients"][0]["model"]["__state__"] = "code"
        write_file(ckpt, checkpointed)
    capsys.readouterr()
    assert resume(digits_tiny_root, tmp_path) == 2
    line = one_line(capsys)
    assert str(checkpointed) in line and "delete it" in line, line
    if damage in ("fewer_clients", "client_not_a_dict", "no_results"):  # caught when read, before any is loaded
        assert "is damaged (it holds" in line, line
    assert list(read_h5(tmp_path / f"{STEM}.h5")["rs_test_acc"]) == list(before)  # nothing measured is lost


def test_a_crafted_parked_client_file_runs_no_code(digits_tiny_root, tmp_path, monkeypatch, capsys):
    from runtime import parking

    marker = tmp_path / "pwned"
    park = parking.ClientStore.park

    def park_then_replace(self, c):  # someone rewrites the file between parking and unparking
        park(self, c)
        write_file({"model": Plant(marker)}, self.path(c))

    monkeypatch.setattr(parking.ClientStore, "park", park_then_replace)
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", "-jr", "0.4", "--client_state", "disk", *SEQ)) == 2
    assert "parked client file" in one_line(capsys)
    assert not marker.exists()


def test_a_planted_symlink_is_not_followed(digits_tiny_root, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    for name in (f"{STEM}.json.tmp", f"{STEM}.h5.tmp", f"{STEM}.ckpt.tmp"):
        (out / name).symlink_to(victim)
    assert main.main(cli(digits_tiny_root, out, "-gr", "1", "--checkpoint_every", "1", *SEQ)) == 0
    assert victim.read_text() == "keep me"
    assert sorted(p.name for p in out.iterdir() if not p.is_symlink()) == [f"{STEM}.ckpt", f"{STEM}.h5",
                                                                           f"{STEM}.json"]


@pytest.mark.parametrize("flags,expected", [(("-sfn", "../x"), "-sfn must be a folder under --results_dir"),
                                            (("-sfn", "/tmp/x"), "-sfn must be a folder under --results_dir"),
                                            (("-go", "../../x"), "-go is part of the result file names")])
def test_names_that_would_escape_are_refused(digits_tiny_root, tmp_path, capsys, flags, expected):
    out = tmp_path / "a" / "out"
    assert main.main(cli(digits_tiny_root, out, "-gr", "1", *flags, *SEQ)) == 2
    assert expected in one_line(capsys)
    assert list(tmp_path.rglob("*")) == []  # refused before any work: not even --results_dir is made


def test_data_given_as_a_path_writes_results_to_the_results_dir(digits_tiny_root, tmp_path):
    out = tmp_path / "out"
    for data in (str(digits_tiny_root / "Digits"), "Digits/"):
        argv = cli(digits_tiny_root, out, "-gr", "0", *SEQ)
        argv[argv.index("-data") + 1] = data
        assert main.main(argv) == 0
        assert (out / f"{STEM}.h5").exists()
    assert not list((digits_tiny_root).glob("*.h5")) and not list((digits_tiny_root / "Digits").glob("*.h5"))


def quiet_main(argv):
    """A forked process's run: main's exit code is the process's, its printed rounds go nowhere."""
    sys.stdout = open(os.devnull, "w")
    sys.exit(main.main(argv))


def test_runs_sharing_a_client_state_dir_do_not_see_each_other(digits_tiny_root, tmp_path):
    shared = tmp_path / "parked"
    flags = ("-jr", "0.4", "--client_state", "disk", "--client_state_dir", str(shared), *SEQ)
    solo = {}
    for lr in ("0.1", "0.05"):
        assert main.main(cli(digits_tiny_root, tmp_path / f"solo{lr}", "-gr", "2", "-lr", lr, *flags)) == 0
        solo[lr] = read_h5(tmp_path / f"solo{lr}" / f"{STEM}.h5")["rs_test_acc"]
    fork = multiprocessing.get_context("fork")  # two processes at the same time, without importing torch again
    runs = {lr: fork.Process(target=quiet_main, args=(cli(digits_tiny_root, tmp_path / f"both{lr}", "-gr", "2",
                                                          "-lr", lr, *flags),)) for lr in solo}
    for p in runs.values():
        p.start()
    for p in runs.values():
        p.join(timeout=300)
    codes = {lr: p.exitcode for lr, p in runs.items()}
    assert codes == {"0.1": 0, "0.05": 0}
    for lr, acc in solo.items():
        assert list(read_h5(tmp_path / f"both{lr}" / f"{STEM}.h5")["rs_test_acc"]) == list(acc)
    assert list(shared.iterdir()) == []  # each run removed its own folder


def test_resume_starts_over_a_run_interrupted_before_its_first_checkpoint(digits_tiny_root, tmp_path, capsys,
                                                                         stop_in_round):
    argv = cli(digits_tiny_root, tmp_path, "-gr", "3", *SEQ)
    argv.remove("--overwrite")
    stop_in_round(1, KeyboardInterrupt)
    assert main.main(argv) == 130
    assert len(read_h5(tmp_path / f"{STEM}.h5")["rs_round"]) == 2  # rounds 0-1 kept, no checkpoint written
    stop_in_round(None)
    capsys.readouterr()
    assert main.main(argv + ["--resume"]) == 0  # nothing to continue from: the run starts over
    assert main.main(cli(digits_tiny_root, tmp_path / "fresh", "-gr", "3", *SEQ)) == 0
    resumed, fresh = read_h5(tmp_path / f"{STEM}.h5"), read_h5(tmp_path / "fresh" / f"{STEM}.h5")
    assert list(resumed["rs_test_acc"]) == list(fresh["rs_test_acc"]) and len(fresh["rs_test_acc"]) == 4
    # once it has finished, the same --resume refuses to replace it (the next test's case)
    assert main.main(argv + ["--resume"]) == 2


def test_resume_does_not_replace_a_finished_result_without_checkpoint(digits_tiny_root, tmp_path, capsys):
    argv = cli(digits_tiny_root, tmp_path, "-gr", "2", *SEQ)
    argv.remove("--overwrite")
    assert main.main(argv) == 0
    before = (tmp_path / f"{STEM}.h5").read_bytes()
    capsys.readouterr()
    assert main.main(argv + ["--resume"]) == 2
    assert "has no checkpoint" in one_line(capsys)
    assert (tmp_path / f"{STEM}.h5").read_bytes() == before


def test_the_case_table_names_tests_that_exist():
    """docs/security.md's table of cases: rows 1..N without a gap, each naming tests that exist (a test
    function of tests/, a case of test_fuzz_inputs.py's BAD table), so a renamed test cannot leave it stale."""
    import re

    from test_fuzz_inputs import BAD

    text = (REPO / "docs" / "security.md").read_text()
    table = [r for r in text[text.index("## Every case tried"):].splitlines() if re.match(r"\| \d", r)]
    cases = []
    for row in table:
        first, last = re.match(r"\| (\d+)(?:-(\d+))? ", row).groups()
        cases += range(int(first), int(last or first) + 1)
    assert cases == list(range(1, len(cases) + 1)), cases
    defined = {m for f in (REPO / "tests").glob("test_*.py") for m in re.findall(r"^def (test_\w+)\(", f.read_text(),
                                                                                  re.M)}
    for row in table:
        named = re.findall(r"\b(test_\w+)\b(?!\.py)", row.split(" | ")[-1])
        bad = re.findall(r"BAD\[([^\]]+)\]", row)
        assert named or bad, row
        assert [n for n in named if n not in defined] == [] and [k for k in bad if k not in BAD] == [], row
    assert f"({len(cases)} cases)" in (REPO / "README.md").read_text()
