"""The registry imports one algorithm: the other algorithms' flags are read from their source
(flcore/flags.py), and that reading is what each server's imported ``add_args`` declares."""
from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli
from flcore.flags import FlagSpec, algorithm_flags
from flcore.registry import ALGORITHMS, get_server_class


class Recorder:
    """Stands in for an argument group and records each ``add_argument`` as a ``FlagSpec``."""

    def __init__(self):
        self.specs: list[FlagSpec] = []

    def add_argument(self, *names, **kw):
        dest = kw.get("dest") or next((n for n in names if n.startswith("--")), names[0]).lstrip("-")
        action = kw.get("action", "store")
        action = "optional" if action is argparse.BooleanOptionalAction else action
        kind = {float: "float", int: "int"}.get(kw.get("type"), "str")
        choices = kw.get("choices")
        self.specs.append(FlagSpec(tuple(names), dest.replace("-", "_"), kind, action,
                                   None if choices is None else tuple(choices)))

    def set_defaults(self, **kw):
        pass


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_flags_read_from_the_source_are_those_add_args_declares(name):
    recorded = Recorder()
    get_server_class(name).add_args(recorded)
    read = {s.dest: s for s in algorithm_flags(name)}
    declared = {s.dest: s for s in recorded.specs}
    assert set(read) == set(declared), name
    for dest, spec in declared.items():
        got = read[dest]
        assert (got.names, got.type, got.action) == (spec.names, spec.type, spec.action), (name, dest)
        assert got.choices is None or got.choices == spec.choices, (name, dest)


def test_the_reader_follows_super_through_imported_bases():
    """FedProx-C's flags are fine-tuning's (from finetune.py) and FedProx's (from serverprox.py)."""
    assert {s.dest for s in algorithm_flags("FedProx-C")} == {"mu", "fine_tuning_epochs"}
    assert algorithm_flags("FedAvg") == ()


RUN_IMPORTS = """
import sys
sys.path.insert(0, {system!r})
import main
assert main.main({argv!r}) == 0
print(sorted(m for m in sys.modules if m.startswith(("flcore.servers.", "flcore.clients."))))
"""


def test_a_fedavg_run_imports_one_algorithm(digits_tiny_root, tmp_path):
    """A whole run (parsing with another algorithm's flag, one round, the final evaluation) in a fresh
    process loads FedAvg's two files and the two bases, no other algorithm."""
    system = str(Path(__file__).resolve().parents[1] / "system")
    argv = cli(digits_tiny_root, tmp_path, "-algo", "FedAvg", "-gr", "1", "--executor", "sequential", "-mu", "0.1")
    done = subprocess.run([sys.executable, "-c", RUN_IMPORTS.format(system=system, argv=argv)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "does not use -mu" in done.stderr
    loaded = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert loaded == ["flcore.clients.clientavg", "flcore.clients.clientbase", "flcore.servers.serveravg",
                      "flcore.servers.serverbase"], loaded


def test_a_declaration_read_from_source_keeps_its_string_names_and_falls_back_to_the_first():
    """``_spec`` on add_argument calls written by hand: only string constants are names (a stray number is
    not), the dest is the first ``--`` name's, else the first name's; a spec is frozen and hashable."""
    import dataclasses

    from flcore import flags

    def spec(code: str):
        return flags._spec(ast.parse(code).body[0].value)

    got = spec('p.add_argument("-x", 3, "--long-name", type=int)')
    assert (got.names, got.dest, got.type) == (("-x", "--long-name"), "long_name", "int")
    assert spec('p.add_argument("-a", "-b")').dest == "a"
    assert len({got, spec('p.add_argument("-x", 3, "--long-name", type=int)')}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.dest = "other"


def test_a_subclass_reads_its_bases_flags_only_through_super_and_each_dest_once(tmp_path, monkeypatch):
    """On a made-up module: a class whose ``add_args`` calls ``super().add_args`` gets its base's flags
    first, one that does not (though it calls a method on a call's result) gets only its own, and an
    algorithm's list keeps each dest once, the first declaration's."""
    from flcore import flags

    (tmp_path / "madeup_flags.py").write_text(
        "class Base:\n"
        "    def add_args(parser):\n"
        "        parser.add_argument('--alpha', type=float)\n\n\n"
        "class Child(Base):\n"
        "    def add_args(parser):\n"
        "        super().add_args(parser)\n"
        "        parser.add_argument('--beta')\n"
        "        parser.add_argument('--alpha', type=int)\n\n\n"
        "class Alone(Base):\n"
        "    def add_args(parser):\n"
        "        parser.flag_group('x').set_defaults(gamma=1)\n"
        "        parser.add_argument('--gamma')\n")
    monkeypatch.setattr(flags, "SYSTEM", tmp_path)
    monkeypatch.setitem(flags.ALGORITHMS, "MadeUpChild", "madeup_flags:Child")

    def dests(name):
        return [(s.dest, s.type) for s in flags._class_flags(*flags._class_def("madeup_flags", name))]

    assert dests("Child") == [("alpha", "float"), ("beta", "str"), ("alpha", "int")]
    assert dests("Alone") == [("gamma", "str")]
    assert [(s.dest, s.type) for s in flags.algorithm_flags("MadeUpChild")] == [("alpha", "float"), ("beta", "str")]
