"""scripts/mutate.py (mutation testing; cosmic-ray from requirements-dev.txt): the mutants this file's own
operators make on a small source, and which tests guard a module."""
import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
pytestmark = pytest.mark.skipif(importlib.util.find_spec("cosmic_ray") is None,
                                reason="needs cosmic-ray (pip install -r requirements-dev.txt)")

SOURCE = '''def f(a, b, opt, out):
    total = a + b
    total += 2
    opt.step()
    keep = out.detach().sum()
    return g(a, b, total)
'''


def test_mutants_of_a_small_source():
    import mutate

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
    import mutate

    files, nodes = mutate.guards("system/utils/aggregate.py")
    assert nodes == []  # no algorithm's server is (or imports) it
    assert {"tests/test_aggregate.py", "tests/test_bn_stats.py"} <= set(files)
    assert all(Path(mutate.REPO / f).is_file() for f in files)
    assert mutate.algorithms_of("system/flcore/clients/clientfd.py") == ["FD"]
    assert mutate.dotted("dataset/utils/partition.py") == "dataset.utils.partition"


def test_the_doc_lists_the_modules_in_scope_not_yet_run_and_keeps_its_text_outside_the_blocks(tmp_path,
                                                                                              monkeypatch):
    import json

    import mutate

    repo, results = tmp_path / "repo", tmp_path / "repo" / "results"
    (repo / "pkg").mkdir(parents=True)
    results.mkdir()
    (repo / "pkg" / "a.py").write_text(SOURCE)
    (repo / "pkg" / "b.py").write_text("x = 1 + 2\n")
    (repo / "pkg" / "__init__.py").write_text("")  # nothing to mutate: not listed
    (results / "a.json").write_text(json.dumps({"module": "pkg/a.py", "sha": "", "date": "d", "mutants": []}))
    doc = tmp_path / "testing.md"
    doc.write_text("intro\n<!-- mutation-table:begin -->\nold\n<!-- mutation-table:end -->\nmiddle\n"
                   "<!-- mutation-survivors:begin -->\nold\n<!-- mutation-survivors:end -->\nend\n")
    for name, value in (("REPO", repo), ("RESULTS", results), ("EQUIVALENT", results / "equivalent.json"),
                        ("DOC", doc), ("SCOPE", ["pkg/*.py"])):
        monkeypatch.setattr(mutate, name, value)
    # b.py: "1 + 2" -> "1 - 2", and each constant +- 1: 5 mutants
    assert mutate.not_yet_run() == ("Not yet run (1 modules, 5 mutants; a later run adds each with the command "
                                    "above): `pkg/b.py` (5).")
    mutate.write_doc()
    text = doc.read_text()
    assert text.startswith("intro\n<!-- mutation-table:begin -->\n| module |") and "old" not in text
    assert "\n<!-- mutation-table:end -->\nmiddle\n<!-- mutation-survivors:begin -->\n" in text
    assert text.endswith("<!-- mutation-survivors:end -->\nend\n") and "`pkg/b.py` (5)" in text


def test_earlier_killers_run_first_latest_first_and_nothing_is_dropped():
    from types import SimpleNamespace

    import mutate

    items = [SimpleNamespace(nodeid=n) for n in ("t.py::a", "t.py::b", "t.py::c", "u.py::d", "u.py::e")]
    # killed in this order: d, then b, then d again: d is the latest killer, b the one before
    mutate.KillersFirst(["u.py::d", "t.py::b", "u.py::d", "gone.py::x"]).pytest_collection_modifyitems(items)
    assert [i.nodeid for i in items] == ["u.py::d", "t.py::b", "t.py::a", "t.py::c", "u.py::e"]
    mutate.KillersFirst([]).pytest_collection_modifyitems(items)  # no killer yet: the order is kept
    assert [i.nodeid for i in items] == ["u.py::d", "t.py::b", "t.py::a", "t.py::c", "u.py::e"]
