"""Files written under an earlier schema: the committed exports under docs/benchmarks/ and the sweep files
under scripts/ still load through the readers' schemas; a checkpoint of an earlier format is refused with
one line (it does not say which run it holds)."""

import pytest

import main
from conftest import REPO, cli
from utils import fileio

from scripts.run import sweep

EXPORTS = sorted((REPO / "docs" / "benchmarks").glob("*.json"))
SWEEPS = sorted(p for p in (REPO / "scripts" / "experiments").glob("*.json")
                if isinstance(d := fileio.read_json(p), dict) and ("grids" in d or "base" in d))


def test_there_are_files_of_both_kinds():
    assert len(EXPORTS) >= 10 and len(SWEEPS) >= 5


@pytest.mark.parametrize("path", EXPORTS, ids=lambda p: p.name)
def test_a_committed_export_still_loads(path):
    data = fileio.read_json(path, "export")
    if isinstance(data, dict) and "splits" in data:
        assert isinstance(sweep.exported_runs(path), frozenset)


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_a_committed_sweep_file_still_loads(path):
    assert isinstance(sweep.load_config_file(path), dict)


def test_a_checkpoint_of_an_earlier_format_is_refused_with_one_line(digits_tiny_root, tmp_path, capsys):
    from runtime.state import read_file, write_file

    flags = ("--checkpoint_every", "1", "--executor", "sequential")
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", *flags)) == 0
    path = tmp_path / "Digits_FedAvg_test_0.ckpt"
    ckpt = read_file(path)
    assert ckpt["format"] == 3  # this version's: a change of layout is a new number, and older files are refused
    del ckpt["identity"]
    ckpt["format"] = 2
    write_file(ckpt, path)
    capsys.readouterr()
    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "2", "--resume", *flags)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "written by an earlier version (format 2" in err[0], err


def test_the_numeric_flags_table_of_the_docs_is_the_codes():
    from scripts.dev import docs_tables

    assert docs_tables.write_bounds(check=True), "run python scripts/dev/docs_tables.py"
