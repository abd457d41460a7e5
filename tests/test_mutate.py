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
