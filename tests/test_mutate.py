"""scripts/dev/mutate.py (mutation testing; cosmic-ray from requirements-dev.txt): the mutants this file's own
operators make on a small source, and which tests guard a module."""
import importlib.util
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("cosmic_ray") is None,
                                reason="needs cosmic-ray (pip install -r requirements-dev.txt)")


@pytest.fixture(autouse=True)
def coverage_cache_in_tmp(tmp_path, monkeypatch):
    """A mutation run keeps its coverage map (``cached_coverage_map``); under test, in the test's folder."""
    monkeypatch.setenv("MUTATE_CACHE", str(tmp_path / "mutate-cache"))


SOURCE = '''def f(a, b, opt, out):
    total = a + b
    total += 2
    opt.step()
    keep = out.detach().sum()
    return g(a, b, total)
'''


def test_mutants_of_a_small_source():
    from scripts.dev import mutate

    made = {(m["op"], m["to"]) for m in mutate.mutants(SOURCE)}
    for want in [("BinaryOperator_Add_Sub", "total = a - b"), ("FlipAugAssign", "total -= 2"),
                 ("NumberReplacer", "total += 3"), ("NumberReplacer", "total += 1"), ("DropCall", "pass"),
                 ("DropDetach", "keep = out.sum()"), ("SwapArguments", "return g(b, a, total)"),
                 ("SwapArguments", "return g(a, total, b)"), ("SwapArguments", "def f(a, b, opt, out):")]:
        if want[0] == "SwapArguments" and want[1].startswith("def"):
            assert want not in made  # a definition's parameters are not a call
        else:
            assert want in made, want
    lines = {m["line"] for m in mutate.mutants(SOURCE) if m["op"] == "DropCall"}
    assert lines == {4}  # only the statement that is a bare call
    for m in mutate.mutants(SOURCE):
        compile(m["code"], "mutant", "exec")  # every mutant is valid Python


def test_guards_of_a_utility_module_are_its_importers_and_the_listed_files():
    from scripts.dev import mutate

    files, nodes = mutate.guards("system/utils/aggregate.py")
    assert nodes == []  # no algorithm's server is (or imports) it
    assert {"tests/test_aggregate.py", "tests/test_bn_stats.py"} <= set(files)
    assert all(Path(mutate.REPO / f).is_file() for f in files)
    assert mutate.algorithms_of("system/flcore/clients/clientfd.py") == ["FD"]
    # a mixin no server imports is reached through the client modules that build on it
    assert {"FedPer", "FedRep", "LG-FedAvg"} <= set(mutate.algorithms_of("system/flcore/clients/partsharing.py"))
    assert "FedAvg" not in mutate.algorithms_of("system/flcore/clients/partsharing.py")
    assert mutate.dotted("dataset/utils/partition.py") == "dataset.utils.partition"
    # an algorithm's own tests in a file of several algorithms' (make_server(root, "Ditto"), or through a
    # helper that names it) guard its modules, and the other algorithms' tests there do not
    files, nodes = mutate.guards("system/flcore/clients/clientditto.py")
    assert "tests/test_baselines_a.py" not in files
    assert {"tests/test_baselines_a.py::test_ditto_personal_step_by_hand",
            "tests/test_baselines_a.py::test_ditto_personal_model_is_pulled_toward_the_global_model",
            "tests/test_behaviour.py::test_algorithm_learns[Ditto]",
            "tests/test_flag_bounds.py::test_each_bound_refuses_just_past_it_and_accepts_it[Ditto-pls=0]"} <= set(nodes)
    assert not any("fedrep" in n or "FedRep" in n or "[ray]" in n for n in nodes)


def test_a_packages_init_is_guarded_by_the_files_that_import_the_package():
    from scripts.dev import mutate

    assert mutate.dotted("system/plugins/__init__.py") == "plugins"
    assert mutate.dotted("system/plugins/robust.py") == "plugins.robust"
    files, nodes = mutate.guards("system/plugins/__init__.py")
    assert "tests/test_plugins.py" in files and nodes == []  # ``import plugins``


def test_the_tests_that_name_an_algorithm_in_their_code_or_through_a_helper():
    import re

    from scripts.dev import mutate

    text = ('def helper(root):\n    return build(root, "Ditto")\n\n\n'
            'def test_a(root):\n    assert helper(root)\n\n\n'
            'def test_b():\n    assert make("Ditto")\n\n\n'
            'def test_c():\n    assert make("FedRep")\n\n\n'
            'class TestD:\n    def test_e(self):\n        assert make("Ditto")\n\n\n'
            'def prepared(root):\n    return helper(root), 1\n\n\n'
            'def test_f(root):\n    assert prepared(root)\n\n\n'
            'def test_helpers_name():\n    assert "helper"\n')
    assert mutate.tests_naming(text, re.compile(r'["\']Ditto["\']')) == {"test_a", "test_b", "TestD", "test_f"}


def test_the_doc_lists_the_modules_in_scope_not_yet_run_and_keeps_its_text_outside_the_blocks(tmp_path,
                                                                                              monkeypatch):
    import json

    from scripts.dev import mutate

    repo, results = tmp_path / "repo", tmp_path / "repo" / "results"
    (repo / "pkg").mkdir(parents=True)
    results.mkdir()
    (repo / "pkg" / "a.py").write_text(SOURCE)
    (repo / "pkg" / "b.py").write_text("x = 1 + 2\n")
    (repo / "pkg" / "__init__.py").write_text("")  # nothing to mutate: not listed
    (results / "a.json").write_text(json.dumps({"module": "pkg/a.py", "sha": "", "date": "d", "mutants": []}))
    doc, notes = tmp_path / "testing.md", tmp_path / "mutation-survivors.md"
    doc.write_text("intro\n<!-- mutation-table:begin -->\nSTALE\n<!-- mutation-table:end -->\nmiddle\n")
    notes.write_text("head\n<!-- mutation-survivors:begin -->\nSTALE\n<!-- mutation-survivors:end -->\nend\n")
    for name, value in (("REPO", repo), ("RESULTS", results), ("EQUIVALENT", results / "equivalent.json"),
                        ("DOC", doc), ("SURVIVORS_DOC", notes), ("SCOPE", ["pkg/*.py"])):
        monkeypatch.setattr(mutate, name, value)
    # b.py: "1 + 2" -> "1 - 2", and each constant +- 1: 5 mutants
    assert mutate.not_yet_run() == ("Not yet run (1 modules, 5 mutants; a later run adds each with the command "
                                    "above): `pkg/b.py` (5).")
    mutate.write_doc()
    text = doc.read_text()
    assert text.startswith("intro\n<!-- mutation-table:begin -->\nBy folder:\n\n| family |") and "STALE" not in text
    assert "\nBy module:\n\n| module |" in text
    assert text.endswith("\n<!-- mutation-table:end -->\nmiddle\n") and "`pkg/b.py` (5)" in text
    assert "STALE" not in notes.read_text() and notes.read_text().startswith("head\n<!-- mutation-survivors:begin")


def test_the_folder_summary_adds_its_modules_first_runs_and_current_counts(tmp_path, monkeypatch):
    """Two modules of pkg/ and one of lib/, their counts made up: the first runs' killed / mutants summed
    (one module of pkg/ unfinished, with no first run), the current killed / mutants, the equivalent ones
    (listed survivors only) and killed / (mutants - equivalent), worked out by hand."""
    import json

    from scripts.dev import mutate

    results = tmp_path / "results"
    results.mkdir()

    def rows(killed, survived, listed=()):
        return ([{"op": "Op", "from": "a", "to": f"k{i}", "outcome": "killed"} for i in range(killed)]
                + [{"op": "Op", "from": "a", "to": t, "outcome": "survived"} for t in listed]
                + [{"op": "Op", "from": "a", "to": f"s{i}", "outcome": "survived"} for i in range(survived)])

    records = {"p1": {"module": "pkg/one.py", "mutants": rows(8, 0, ["e1", "e2"]),
                      "first": {"killed": 6, "mutants": 10}},
               "p2": {"module": "pkg/two.py", "mutants": rows(3, 1)},  # unfinished: no first run yet
               "l1": {"module": "lib/x.py", "mutants": rows(9, 1), "first": {"killed": 5, "mutants": 10}}}
    for name, record in records.items():
        (results / f"{name}.json").write_text(json.dumps(record))
    equivalent = {"pkg/one.py": [{"op": "Op", "from": "a", "to": t, "why": "made up"} for t in ("e1", "e2")]}
    (results / "equivalent.json").write_text(json.dumps(equivalent))
    monkeypatch.setattr(mutate, "RESULTS", results)
    monkeypatch.setattr(mutate, "EQUIVALENT", results / "equivalent.json")
    lines = mutate.families().splitlines()
    assert lines[2:] == ["| `lib/` | 1 | 5/10 (50 %) | 9/10 (90 %) | 0 | 90 % |",
                         "| `pkg/` | 2 (1 unfinished) | 6/10 (60 %) | 11/14 (79 %) | 2 | 92 % |"]


def test_earlier_killers_run_first_latest_first_and_nothing_is_dropped():
    from types import SimpleNamespace

    from scripts.dev import mutate

    items = [SimpleNamespace(nodeid=n) for n in ("t.py::a", "t.py::b", "t.py::c", "u.py::d", "u.py::e")]
    # killed in this order: d, then b, then d again: d is the latest killer, b the one before
    mutate.KillersFirst(["u.py::d", "t.py::b", "u.py::d", "gone.py::x"]).pytest_collection_modifyitems(items)
    assert [i.nodeid for i in items] == ["u.py::d", "t.py::b", "t.py::a", "t.py::c", "u.py::e"]
    mutate.KillersFirst([]).pytest_collection_modifyitems(items)  # no killer yet: the order is kept
    assert [i.nodeid for i in items] == ["u.py::d", "t.py::b", "t.py::a", "t.py::c", "u.py::e"]
    # with the unmutated run's seconds: the killers first all the same, then the others fastest first
    seconds = {"u.py::d": 9.0, "t.py::b": 5.0, "t.py::a": 3.0, "t.py::c": 0.5, "u.py::e": 1.0}
    mutate.KillersFirst(["t.py::b"], seconds).pytest_collection_modifyitems(items)
    assert [i.nodeid for i in items] == ["t.py::b", "t.py::c", "u.py::e", "t.py::a", "u.py::d"]
    # a line that runs at import: the tests naming what it defines first (a parametrized one by its
    # function, a method by its class), then the killers, then the others fastest first
    items += [SimpleNamespace(nodeid=n) for n in ("v.py::f[1]", "v.py::K::g", "v.py::h")]
    mutate.KillersFirst(["t.py::b"], seconds, named={"v.py::f", "v.py::K", "u.py::d"}
                        ).pytest_collection_modifyitems(items)
    assert [i.nodeid for i in items] == ["v.py::f[1]", "v.py::K::g", "u.py::d", "t.py::b", "v.py::h", "t.py::c",
                                         "u.py::e", "t.py::a"]


def test_the_tests_that_name_an_import_time_lines_identifiers(tmp_path):
    from scripts.dev import mutate

    (tmp_path / "t.py").write_text(
        "def helper():\n    return NORM_MAX\n\n\n"
        "def test_direct():\n    assert STD_MIN < 1\n\n\n"
        "def test_through_a_helper():\n    assert helper()\n\n\n"
        "class TestK:\n    def test_m(self):\n        assert NORM_MAXIMUM\n\n\n"
        "def test_other():\n    assert min(1, 2) and True\n")
    line = "STD_MIN, NORM_MAX = 1e-6, 1e6  # min bounds"
    assert mutate.tests_naming_line(tmp_path, ["t.py", "t.py::test_other"], line) == {
        "t.py::test_direct", "t.py::test_through_a_helper"}  # a longer name is another name
    assert mutate.tests_naming_line(tmp_path, ["t.py"], "    return self.x if True else None") == set()


MODULE = '''K = 2


def inproc(x):
    return x + K


def in_fork(x):
    return (x *
            3)


def in_subprocess(x):
    return x - 1


def unused(x):
    if x:
        return -x
    return x


class C:
    LIMIT = 4

    def method(self, y=1):
        return y


def fixture_made():
    return 7
'''

TESTS = '''import multiprocessing
import subprocess
import sys

import pytest

from pkg import mod


@pytest.fixture(scope="module")
def made():
    return mod.fixture_made()


def test_inproc():
    assert mod.inproc(1) == 3


def test_fork():
    proc = multiprocessing.get_context("fork").Process(target=mod.in_fork, args=(2,))
    proc.start()
    proc.join()
    assert proc.exitcode == 0


def test_subprocess():
    subprocess.run([sys.executable, "-c", "from pkg import mod; mod.in_subprocess(1)"], check=True)


def test_uses_the_fixture(made):
    assert made == 7
'''


def test_statement_lines_give_each_line_its_statement_and_none_at_import():
    from scripts.dev import mutate

    lines = mutate.statement_lines(MODULE)
    assert lines[1] is None  # K = 2: runs at import
    assert lines[4] == lines[5] == range(5, 6)  # a def line's defaults: seen only by calls, i.e. its body
    assert lines[8] == range(9, 11)
    assert lines[9] == lines[10] == range(9, 11)  # one statement over two lines
    assert lines[18] == range(18, 19) and lines[19] == range(19, 20)  # an if's header, then its body
    assert lines[24] is None  # a class attribute
    assert lines[26] == lines[27] == range(27, 28)


def test_a_decorators_arguments_run_at_import_and_a_def_line_in_calls():
    """A decorator registers its function when the module is imported, and its keywords may be read from the
    source (plugins.declarations): every test can see them. The def line's defaults only a call sees."""
    from scripts.dev import mutate

    source = ("REG = {}\n\n\ndef rule(name, **kw):\n    return lambda f: REG.setdefault(name, f)\n\n\n"
              "@rule('x',\n      lr=1.0)\ndef f(a=2):\n    return a\n")
    lines = mutate.statement_lines(source)
    assert lines[8] is None and lines[9] is None
    assert lines[10] == lines[11] == range(11, 12)
    assert lines[4] == range(5, 6)


@pytest.mark.skipif(importlib.util.find_spec("coverage") is None,
                    reason="needs coverage (pip install -r requirements-dev.txt)")
def test_each_line_maps_to_the_tests_that_run_it_in_this_process_a_fork_or_a_subprocess(tmp_path):
    from scripts.dev import mutate

    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text(MODULE)
    (root / "tests" / "test_a.py").write_text(TESTS)
    (root / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    cmap, _, seconds = mutate.coverage_map(root, "pkg/mod.py", ["tests/test_a.py"], tmp_path)
    # each test's seconds in the unmutated run, set-up to teardown: test_subprocess starts a Python process
    assert set(seconds) == {f"tests/test_a.py::{t}" for t in ("test_inproc", "test_fork", "test_subprocess",
                                                                 "test_uses_the_fixture")}
    assert all(s > 0 for s in seconds.values())
    assert seconds["tests/test_a.py::test_subprocess"] > seconds["tests/test_a.py::test_inproc"]
    lines = mutate.statement_lines(MODULE)
    tests = ["tests/test_a.py"]

    def chosen(line):
        return mutate.select(cmap, lines, line, tests)

    assert chosen(5) == chosen(4) == ["tests/test_a.py::test_inproc"]  # its def line: the tests that call it
    assert chosen(9) == chosen(10) == ["tests/test_a.py::test_fork"]  # in a forked child
    assert chosen(14) == ["tests/test_a.py::test_subprocess"]  # in a Python subprocess
    assert chosen(18) == chosen(19) == []  # no test runs it: the mutant survives unrun
    # ... unless the module's code also runs where coverage does not follow (REMOTE): every test that ran it
    assert mutate.select(cmap, lines, 19, tests, remote=True) == [
        f"tests/test_a.py::{t}" for t in ("test_fork", "test_inproc", "test_subprocess")]
    assert mutate.select(cmap, lines, 5, tests, remote=True) == chosen(5)  # a line run here: its own tests
    assert chosen(1) == chosen(24) == tests  # at import: every test
    assert chosen(26) == []  # a method no test calls: its defaults cannot matter
    assert chosen(31) == tests  # in a module-scoped fixture, whose result other tests share
    assert mutate.select(None, lines, 5, tests) == tests  # no map (--all-tests): every test
    # a mutant runs its selection: killed by the test that runs its line; unrun where no test does
    (root / "pkg" / "mod.py").write_text(MODULE.replace("return x + K", "return x - K"))
    outcome, _, by = mutate.run_mutant(root, chosen(5), 120, tmp_path / "log", [])
    assert (outcome, by) == ("killed", "tests/test_a.py::test_inproc")
    (root / "pkg" / "mod.py").write_text(MODULE.replace("return -x", "return x"))
    assert mutate.run_mutant(root, chosen(19), 120, tmp_path / "log", []) == ("survived", 0.0, "")
    assert mutate.run_tests(root, tests, 120, tmp_path / "log") == ("survived", pytest.approx(0, abs=120))


def test_a_killer_that_fails_alone_on_the_unmutated_code_is_not_believed(tmp_path, monkeypatch):
    """test_second passes after test_first only: a mutant it "killed" when run alone is run again with every
    guarding test, in which it survives (the mutant, in a function no test calls, changes nothing)."""
    from scripts.dev import mutate

    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text(MODULE)
    (root / "tests" / "test_b.py").write_text("STATE = []\n\n\ndef test_first():\n    STATE.append(1)\n\n\n"
                                               "def test_second():\n    assert STATE\n")
    (root / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    monkeypatch.setattr(mutate, "RESULTS", tmp_path / "results")
    mutant = {"line": 14, "op": "BinaryOperator_Sub_Add", "from": "return x - 1", "to": "return x + 1"}
    found = [{**mutant, "code": MODULE.replace("return x - 1", "return x + 1")}]
    record = {"module": "pkg/mod.py", "mutants": [
        {**mutant, "outcome": "killed", "s": 1.0, "ran": 1, "by": "tests/test_b.py::test_second"}]}
    mutate.recheck_killers(root, "pkg/mod.py", found, record, ["tests/test_b.py"], 120, tmp_path / "log")
    row = record["mutants"][0]
    assert (row["outcome"], row["ran"], row["by"]) == ("survived", "all", "")
    assert (root / "pkg" / "mod.py").read_text() == MODULE  # the unmutated module is back


def one_line_repo(tmp_path, monkeypatch, test: str, equivalent: dict):
    """A made-up git repository: pkg/mod.py is "return x + 1" (three mutants: "x - 1", "x + 2", "x + 0"),
    tests/test_mod.py holds ``test``; scripts/dev/mutate.py pointed at it."""
    import json
    import subprocess

    from scripts.dev import mutate

    repo, results = tmp_path / "repo", tmp_path / "repo" / "results"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    results.mkdir()
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "mod.py").write_text("def f(x):\n    return x + 1\n")
    (repo / "tests" / "test_mod.py").write_text(f"from pkg import mod\n\n\ndef test_f():\n    {test}\n")
    (repo / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (results / "equivalent.json").write_text(json.dumps(equivalent))
    for name, value in (("REPO", repo), ("RESULTS", results), ("EQUIVALENT", results / "equivalent.json")):
        monkeypatch.setattr(mutate, name, value)
    return repo


def test_a_module_no_test_guards_is_refused_not_recorded(tmp_path, monkeypatch):
    from scripts.dev import mutate

    repo = one_line_repo(tmp_path, monkeypatch, "assert True", {})
    (repo / "pkg" / "other.py").write_text("def g(x):\n    return x - 1\n")
    with pytest.raises(SystemExit, match="no test guards pkg/other.py"):
        mutate.mutate("pkg/other.py", full=False, fresh=True)
    assert not mutate.result_path("pkg/other.py").exists()


def test_a_mutant_listed_as_equivalent_is_not_run(tmp_path, monkeypatch):
    """mutate() end to end: the test kills all three mutants, but "x + 2", listed as equivalent before the
    run, is recorded unrun."""
    from scripts.dev import mutate

    one_line_repo(tmp_path, monkeypatch, "assert mod.f(1) == 2", {"pkg/mod.py": [
        {"op": "NumberReplacer", "from": "return x + 1", "to": "return x + 2", "why": "made up"}]})
    record = mutate.mutate("pkg/mod.py", full=False, fresh=True)
    rows = {m["to"]: (m["outcome"], m["ran"]) for m in record["mutants"]}
    assert rows == {"return x - 1": ("killed", 1), "return x + 2": ("survived", 0), "return x + 0": ("killed", 1)}
    assert mutate.summary(record) == {"mutants": 3, "killed": 2, "equivalent": 1, "survived": 0, "rate": 1.0}


def test_survivors_rerun_against_the_tests_given_without_the_coverage_run(tmp_path, monkeypatch):
    """A weak test leaves "x + 2" and "x + 0" alive; a test written since, given with --with, kills "x + 2"
    (recorded with it, as an earlier survivor) and misses "x + 0", which stays a survivor; the killed
    mutant of the first run is kept without a run, and no coverage run is made."""
    from scripts.dev import mutate

    repo = one_line_repo(tmp_path, monkeypatch, "assert mod.f(1) > 0", {})
    first = mutate.mutate("pkg/mod.py", full=False, fresh=True)
    assert [m["outcome"] for m in first["mutants"]] == ["killed", "survived", "survived"]
    (repo / "tests" / "test_new.py").write_text("from pkg import mod\n\n\ndef test_not_three():\n"
                                                "    assert mod.f(1) != 3\n")

    def no_coverage_run(*args):
        raise AssertionError("the coverage run was made")

    monkeypatch.setattr(mutate, "coverage_map", no_coverage_run)
    record = mutate.mutate("pkg/mod.py", full=False, fresh=False, only=["tests/test_new.py"])
    rows = {m["to"]: (m["outcome"], m.get("by"), m.get("was")) for m in record["mutants"]}
    assert rows == {"return x - 1": ("killed", "tests/test_mod.py::test_f", None),
                    "return x + 2": ("killed", "tests/test_new.py::test_not_three", "survived"),
                    "return x + 0": ("survived", None, None)}
    assert record["first"]["killed"] == 1  # the first run's kill rate is kept
    (repo / "pkg" / "mod.py").write_text("def f(x):\n    return x + 1  # changed\n")
    with pytest.raises(SystemExit, match="same source"):
        mutate.mutate("pkg/mod.py", full=False, fresh=False, only=["tests/test_new.py"])


def test_a_changed_module_runs_each_mutant_against_its_earlier_killer_alone_first(tmp_path, monkeypatch):
    """Both tests kill every mutant; test_f is the faster, so a first run records it as every killer. On the
    module changed elsewhere, each mutant runs against its earlier killer alone first: the slow test for
    "x - 1", as an edited record says, and test_f for "x + 0"; "x + 2", whose recorded killer no longer
    exists, runs its coverage selection instead (the latest killer, the slow test, first). When every earlier killer kills again, no coverage run is
    made at all."""
    import json

    from scripts.dev import mutate

    repo = one_line_repo(tmp_path, monkeypatch, "assert mod.f(1) == 2", {})
    (repo / "tests" / "test_slow.py").write_text("import time\n\nfrom pkg import mod\n\n\ndef test_slow():\n"
                                                 "    time.sleep(0.3)\n    assert mod.f(1) == 2\n")
    first = mutate.mutate("pkg/mod.py", full=False, fresh=True)
    assert {m["to"]: m["by"] for m in first["mutants"]} == dict.fromkeys(
        ["return x - 1", "return x + 2", "return x + 0"], "tests/test_mod.py::test_f")
    first["mutants"][0]["by"] = "tests/test_slow.py::test_slow"
    first["mutants"][1]["by"] = "tests/test_mod.py::test_gone"
    mutate.result_path("pkg/mod.py").write_text(json.dumps(first))
    (repo / "pkg" / "mod.py").write_text("def f(x):\n    return x + 1\n\n\nNAME = 'changed elsewhere'\n")
    runs = []
    monkeypatch.setattr(mutate, "coverage_map", lambda *a, real=mutate.coverage_map: runs.append(a) or real(*a))
    record = mutate.mutate("pkg/mod.py", full=False, fresh=False)
    assert {m["to"]: (m["by"], m["ran"]) for m in record["mutants"]} == {
        "return x - 1": ("tests/test_slow.py::test_slow", 1), "return x + 2": ("tests/test_slow.py::test_slow", 2),
        "return x + 0": ("tests/test_mod.py::test_f", 1)}
    assert len(runs) == 1 and record["baseline_s"] > 0
    (repo / "pkg" / "mod.py").write_text("def f(x):\n    return x + 1\n\n\nNAME = 'changed again'\n")
    again = mutate.mutate("pkg/mod.py", full=False, fresh=False)
    assert [(m["outcome"], m["ran"]) for m in again["mutants"]] == [("killed", 1)] * 3
    assert len(runs) == 1 and again["baseline_s"] == record["baseline_s"]  # kept: no unmutated run this time


def test_the_killer_is_read_whole_from_the_summary_line():
    from scripts.dev import mutate

    log = ("F\n=== short test summary info ===\n"
           "FAILED tests/t.py::test_x[Ditto -mu -0.5] - Failed: DID NOT RAISE <class 'FLError'>\n"
           "FAILED tests/t.py::test_y - assert 1 == 2\n")
    assert mutate.first_failure(log) == "tests/t.py::test_x[Ditto -mu -0.5]"
    assert mutate.first_failure("ERROR tests/t.py::test_z\n") == "tests/t.py::test_z"
    assert mutate.first_failure("1 passed\n") == ""


def test_a_mutants_time_limit_follows_the_tests_it_runs():
    from scripts.dev import mutate

    durations = {"tests/t.py::test_a": 2.0, "tests/t.py::test_b[x]": 10.0, "tests/u.py::test_c": 50.0}
    assert mutate.time_limit(["tests/t.py::test_a", "tests/t.py::test_b[x]"], durations, 500.0) == 3 * 12 + 120
    assert mutate.time_limit(["tests/u.py::test_c"], durations, 500.0) == 3 * 50 + 120
    # a guard given as a file, or no coverage run: the whole unmutated run's time
    assert mutate.time_limit(["tests/t.py"], durations, 500.0) == 3 * 500 + 120
    assert mutate.time_limit(["tests/t.py::test_a"], None, 500.0) == 3 * 500 + 120


def test_each_tests_limit_is_three_times_its_files_longest_plus_two_minutes():
    from scripts.dev import mutate

    durations = {"tests/t.py::test_a": 2.0, "tests/t.py::test_b[x::y]": 10.0, "tests/u.py::test_c": 50.0}
    assert mutate.limits_per_test(durations) == {"tests/t.py::test_a": 3 * 10 + 120,
                                                 "tests/t.py::test_b[x::y]": 3 * 10 + 120,
                                                 "tests/u.py::test_c": 3 * 50 + 120}


def test_a_test_that_hangs_is_stopped_at_its_own_limit_not_the_runs(tmp_path, monkeypatch):
    from scripts.dev import mutate

    (tmp_path / "test_t.py").write_text("import time\n\n"
                                        "def test_quick():\n    time.sleep(0.05)\n\n"
                                        "def test_hangs():\n    while True:\n        time.sleep(0.01)\n")
    log = tmp_path / "log"
    # each test within its limit: the run ends by itself
    code, _ = mutate.forked_pytest(tmp_path, ["test_t.py::test_quick"], 60, log,
                                   allowed={"test_t.py::test_quick": 5.0})
    assert code == 0
    started = time.monotonic()
    code, seconds = mutate.forked_pytest(tmp_path, ["test_t.py"], 60, log,
                                         allowed={"test_t.py::test_quick": 5.0, "test_t.py::test_hangs": 0.5})
    assert code is None and 0.5 < seconds < 10 and time.monotonic() - started < 10
    # run_tests gives each test its limit from the unmutated run's durations
    monkeypatch.setattr(mutate, "SLACK_S", 0.3)
    started = time.monotonic()
    assert mutate.run_tests(tmp_path, ["test_t.py"], 60, log, durations={"test_t.py::test_quick": 0.05,
                                                                         "test_t.py::test_hangs": 0.1})[0] == "timeout"
    assert time.monotonic() - started < 10
    # a test with no limit of its own runs to the whole run's
    code, seconds = mutate.forked_pytest(tmp_path, ["test_t.py"], 1.5, log, allowed={"test_t.py::test_quick": 5.0})
    assert code is None and seconds >= 1.5


def test_a_forked_run_keeps_its_temporary_files_beside_its_log(tmp_path):
    """pytest's temporary folders of a mutant's run lie in the run's own folder, emptied by the next run, so a
    child stopped at its limit (no exit handler runs) leaves nothing in the system's temporary folder."""
    from scripts.dev import mutate

    (tmp_path / "test_t.py").write_text("def test_where(tmp_path):\n"
                                        "    (tmp_path / 'mark').write_text('x')\n"
                                        "    open('where.txt', 'w').write(str(tmp_path))\n")
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "log"
    for stray in (None, tmp_path / "logs" / "pytest-tmp" / "left by the run before"):
        if stray is not None:
            stray.write_text("x")
        assert mutate.forked_pytest(tmp_path, ["test_t.py"], 60, log)[0] == 0
        where = Path((tmp_path / "where.txt").read_text())
        assert where.is_relative_to(tmp_path / "logs" / "pytest-tmp") and (where / "mark").exists()
    assert not stray.exists()


def test_time_the_lane_spent_stopped_is_not_the_mutants():
    from scripts.dev import mutate

    assert mutate.running_time(0.06) == 0.06 and mutate.running_time(mutate.STOPPED_S) == mutate.STOPPED_S
    assert mutate.running_time(738.0) == 0.0  # the wait loop itself was stopped (kill -STOP, then -CONT)


def test_the_coverage_run_is_kept_until_the_module_or_its_tests_change(tmp_path, monkeypatch):
    from scripts.dev import mutate

    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "tests" / "test_a.py").write_text("def test_a():\n    pass\n")
    runs = []

    def coverage_map(root, module, args, tmp):
        runs.append(args)
        return {1: {"tests/test_a.py::test_a"}, 3: {mutate.ALL}}, 2.5, {"tests/test_a.py::test_a": 0.5}

    monkeypatch.setattr(mutate, "coverage_map", coverage_map)
    cache = tmp_path / "cache"
    args = ["tests/test_a.py"]
    first = mutate.cached_coverage_map(root, "pkg/mod.py", args, tmp_path, cache)
    assert first == ({1: {"tests/test_a.py::test_a"}, 3: {mutate.ALL}}, 2.5, {"tests/test_a.py::test_a": 0.5})
    assert mutate.cached_coverage_map(root, "pkg/mod.py", args, tmp_path, cache) == first  # read back, same types
    assert len(runs) == 1
    (root / "tests" / "test_a.py").write_text("def test_a():\n    assert True\n")  # a guarding test changed
    mutate.cached_coverage_map(root, "pkg/mod.py", args, tmp_path, cache)
    (root / "pkg" / "mod.py").write_text("x = 2\n")  # the module changed
    mutate.cached_coverage_map(root, "pkg/mod.py", args, tmp_path, cache)
    mutate.cached_coverage_map(root, "pkg/mod.py", ["tests/test_a.py::test_a"], tmp_path, cache)  # other tests
    assert len(runs) == 4
    assert not list(cache.glob("*.part"))


def test_a_mutant_of_an_import_time_line_runs_the_tests_naming_it_first(tmp_path, monkeypatch):
    """mutate() end to end: LIMIT's mutants (a module constant: every guarding test runs them) fail the slow
    test that names LIMIT, which now runs before the faster test that does not name it; that test writes the
    limit it saw each time it runs, and never sees a mutated one."""
    from scripts.dev import mutate

    repo = one_line_repo(tmp_path, monkeypatch, "assert mod.f(1) == 2", {})
    (repo / "pkg" / "mod.py").write_text("LIMIT = 3\n\n\ndef f(x):\n    return min(x + 1, LIMIT)\n")
    seen = tmp_path / "seen.txt"
    (repo / "tests" / "test_count.py").write_text(
        f"from pkg import mod\n\n\ndef test_counted():\n    with open({str(seen)!r}, 'a') as f:\n"
        f"        f.write(f'{{mod.f(10)}}\\n')\n    assert mod.f(0) == 1\n")  # f(10) is the limit, unnamed
    (repo / "tests" / "test_limit.py").write_text("import time\n\nfrom pkg import mod\n\n\ndef test_limit():\n"
                                                  "    time.sleep(0.3)\n    assert mod.LIMIT == 3\n")
    record = mutate.mutate("pkg/mod.py", full=False, fresh=True)
    limit = {m["to"]: (m["outcome"], m["by"]) for m in record["mutants"] if m["line"] == 1}
    assert limit == dict.fromkeys(["LIMIT = 4", "LIMIT = 2"], ("killed", "tests/test_limit.py::test_limit"))
    assert set(seen.read_text().split()) == {"3"}
