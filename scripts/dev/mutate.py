"""Mutation testing of one module: does a realistic one-line bug in it fail the tests that guard it?

    python3 scripts/dev/mutate.py system/flcore/clients/clientfd.py      # mutate, test, write the results
    python3 scripts/dev/mutate.py system/utils/dp_sgd.py --list          # the guarding tests and mutants only
    python3 scripts/dev/mutate.py --table                                # docs/testing.md's kill-rate table
    python3 scripts/dev/mutate.py --write-doc                            # ... written into docs/testing.md
                                                                         #     and docs/mutation-survivors.md

Mutants come from cosmic-ray's operators (requirements-dev.txt), a curated subset of them (one opposite per
operator instead of every replacement: ``+`` -> ``-``, ``<`` -> ``<=``, ``==`` -> ``!=``, constants +-1, ``True``
<-> ``False``, ``and`` <-> ``or``, negated conditions, loops run zero times), plus four written here on cosmic-ray's
operator base: augmented assignments flipped (``+=`` -> ``-=``), a statement-level call dropped (``opt.step()``,
``buf.zero_()``), ``.detach()`` dropped, and two neighbouring positional arguments of a call swapped.

Each mutant is written into a private copy of the repository (the working tree is never touched) and the
module's guarding tests run against it with ``-x`` in a process forked from one that already imported torch, so
one mutant costs only its tests, and the tests that killed the module's earlier mutants run first (a mutant
is usually killed by the test that killed its neighbour, and ``-x`` then stops there); a test that runs
past three times its file's longest unmutated time (plus two minutes) stops the run as a timeout, a kill
(``limits_per_test``). Of the guarding tests,
a mutant runs only those that execute its line (``coverage_map``: one run of them under coverage.py, each test
its own context, followed into the processes it forks or starts; kept across runs while the module and its
tests are unchanged: ``cached_coverage_map``); a line that runs at import or in a fixture's set-up runs them
all (a line run at import, the tests that name one of its identifiers first: ``tests_naming_line``), and a
line that none runs survives without a run (in a ``REMOTE`` module, whose
code also runs where coverage.py does not follow, it runs the tests that ran the module). A module changed since its
last record runs each mutant first against the test that killed it then, alone, where that test passes alone
on the unmutated code; only the mutants it does not kill need the coverage run, so a change that leaves every
earlier kill standing costs no run of all the guarding tests. ``--all-tests`` runs every
guarding test for every mutant instead; ``--verify`` reruns each survivor with all of them. Which tests guard
a module is decided in one place, ``guards()`` below: the test files that import the module and the explicit
``EXTRA`` files, and for every algorithm whose server is (or imports) the module, the tests parametrized with
its name and the tests elsewhere that name it. Results go to ``docs/benchmarks/mutation/<module>.json``
(written after every mutant, so an interrupted run resumes); survivors judged equivalent are listed with the
reason in ``docs/benchmarks/mutation/equivalent.json``, matched by operator and the line before and after; a
mutant listed there is not run (e.g. ``super().add_args(parser)`` dropped where the base is ``Server``, whose
``add_args`` adds nothing: every guarding test would run to show it survives).
Run it under ``nice -n 19``: it keeps one core busy for minutes.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import datetime
import gc
import hashlib
import json
import keyword
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "benchmarks" / "mutation"
EQUIVALENT = RESULTS / "equivalent.json"

# Test files that guard a module without importing it (or beyond the ones that do).
PRIVACY_TESTS = ["tests/test_privacy.py", "tests/test_dp_client.py", "tests/test_dp_registry.py"]
# The attacks are exercised through the plug-in by tests that import the update math, the backdoor or the
# rules they are run against, not the plug-in modules themselves.
ATTACK_TESTS = ["tests/test_attacks.py", "tests/test_update_attacks.py", "tests/test_backdoor.py",
                "tests/test_robust.py", "tests/test_defenses.py"]
EXTRA = {
    **{f"system/utils/{m}.py": PRIVACY_TESTS for m in ("dp_sgd", "dp_client", "dp_support", "privacy_monitor")},
    "system/utils/aggregate.py": ["tests/test_aggregate.py", "tests/test_bn_stats.py", "tests/test_fedbn.py"],
    "system/utils/ALA.py": ["tests/test_ala.py", "tests/test_batched.py"],  # the batched ALA epoch
    "system/utils/dlg.py": ["tests/test_privacy.py", "tests/test_ig.py"],
    **{f"system/plugins/{m}.py": ATTACK_TESTS for m in ("attack", "attacks")},
    "system/plugins/robust.py": ["tests/test_no_bypass.py", "tests/test_robust.py", "tests/test_defenses.py"],
    **{f"system/plugins/{m}.py": PRIVACY_TESTS for m in ("dp_client", "dp_sample")},
    "system/plugins/dlg.py": ["tests/test_privacy.py", "tests/test_ig.py"],
    "system/plugins/ala.py": ["tests/test_ala.py", "tests/test_serverbase.py", "tests/test_eval_rule.py"],
    "system/plugins/server_opt.py": ["tests/test_server_opt.py"],
    "system/runtime/executors.py": ["tests/test_executors.py", "tests/test_faults.py"],
    "system/runtime/fork.py": ["tests/test_executors.py", "tests/test_faults.py"],
    "system/runtime/parking.py": ["tests/test_executors.py"],
    "system/runtime/checkpoint.py": ["tests/test_executors.py", "tests/test_reliability.py", "tests/test_security.py"],
    "system/runtime/faults.py": ["tests/test_faults.py", "tests/test_reliability.py"],
    "dataset/utils/partition.py": ["tests/test_dataset_partition.py", "tests/test_partition_pfllib.py"],
    "system/utils/proximal.py": ["tests/test_baselines_a.py", "tests/test_fedamp.py"],
    "system/utils/selection.py": ["tests/test_flags.py", "tests/test_run.py", "tests/test_fedcross.py"],
    "system/plugins/optimizers.py": ["tests/test_server_opt.py"],
    # docs/performance.md's table is checked there, through scripts/dev/docs_tables.py's lazy import
    "system/runtime/batched.py": ["tests/test_batched.py", "tests/test_documented_defaults.py"],
    # the base classes' own tests build their servers through tests/conftest.py and name no algorithm
    "system/flcore/servers/serverbase.py": ["tests/test_serverbase.py"],
    "system/flcore/clients/clientbase.py": ["tests/test_clientbase.py"],
}
# Modules with code that runs in processes coverage.py does not follow: a Ray actor imports its own copy of the
# library (shipped as the job's py_modules, under another path), so a line only the actors run shows as run by
# no test; its mutants run the tests that ran any line of the module (those that start the actors).
REMOTE = {"system/runtime/raypool.py"}
# Registry-parametrized tests left out of a module's selection: Ray's (they test the executor, at 20 s each) and
# the behaviour harness's training runs (seconds per algorithm; the full suite runs them).
SLOW = re.compile(r"test_ray_|\[(?:[^\]]*-)?ray\]$"
                  r"|test_behaviour\.py::test_(learns|personalized_beats|no_algorithm_is_local)")
REGISTRY_TESTS = ["tests/test_behaviour.py", "tests/test_comm.py",
                  "tests/test_documented_defaults.py", "tests/test_dp_client.py", "tests/test_dp_registry.py",
                  "tests/test_executors.py"]

# What mutation testing covers (docs/testing.md lists the modules not yet run, with their mutant counts): every
# algorithm pair, the plug-ins, the command line, the aggregation, privacy, ALA and DLG/IG utilities, the runtime,
# the partitioner.
SCOPE = ["system/flcore/clients/*.py", "system/flcore/servers/*.py", "system/flcore/prototypes.py",
         "system/utils/ALA.py", "system/utils/aggregate.py", "system/utils/personal_aggregation.py",
         "system/plugins/*.py", "system/flcore/flags.py", "system/cli.py", "system/utils/data_utils.py",
         "system/utils/entries.py", "system/utils/proximal.py",
         "system/utils/selection.py", "system/utils/dp_*.py", "system/utils/privacy_monitor.py",
         "system/utils/dlg.py", "system/runtime/*.py", "dataset/utils/partition.py"]
DOC = REPO / "docs" / "testing.md"
SURVIVORS_DOC = REPO / "docs" / "mutation-survivors.md"  # the per-mutant notes, generated in full

# cosmic-ray operators used: one opposite for each operator, so a module has tens of mutants, not hundreds.
CORE = ["ReplaceBinaryOperator_Add_Sub", "ReplaceBinaryOperator_Sub_Add", "ReplaceBinaryOperator_Mul_Div",
        "ReplaceBinaryOperator_Div_Mul", "ReplaceBinaryOperator_FloorDiv_Div", "ReplaceBinaryOperator_Pow_Mul",
        "ReplaceComparisonOperator_Lt_LtE", "ReplaceComparisonOperator_LtE_Lt", "ReplaceComparisonOperator_Gt_GtE",
        "ReplaceComparisonOperator_GtE_Gt", "ReplaceComparisonOperator_Eq_NotEq",
        "ReplaceComparisonOperator_NotEq_Eq", "ReplaceComparisonOperator_Is_IsNot",
        "ReplaceComparisonOperator_IsNot_Is", "ReplaceUnaryOperator_USub_UAdd", "ReplaceUnaryOperator_Delete_Not",
        "ReplaceTrueWithFalse", "ReplaceFalseWithTrue", "ReplaceAndWithOr", "ReplaceOrWithAnd", "AddNot",
        "NumberReplacer", "ZeroIterationForLoop", "ReplaceBreakWithContinue", "ReplaceContinueWithBreak"]
PREIMPORT = ["torch", "numpy", "scipy", "sklearn.datasets", "h5py", "ujson", "matplotlib.pyplot", "pytest",
             "hypothesis"]


def operators() -> dict:
    """name -> operator instance: the curated cosmic-ray operators and this file's four."""
    import parso
    from cosmic_ray.operators.operator import Example, Operator
    from cosmic_ray.plugins import get_operator

    def call_trailer(node):
        return node.type == "trailer" and node.children[0].value == "("

    class FlipAugAssign(Operator):
        FLIP = {"+=": "-=", "-=": "+=", "*=": "/=", "/=": "*="}

        def mutation_positions(self, node):
            if node.type == "operator" and node.value in self.FLIP and node.parent.type == "expr_stmt":
                yield node.start_pos, node.end_pos

        def mutate(self, node, index):
            node.value = self.FLIP[node.value]
            return node

        @classmethod
        def examples(cls):
            return (Example("x += 1", "x -= 1"),)

    class DropCall(Operator):
        """A statement that is only a method call (``opt.step()``, ``buf.zero_()``) becomes ``pass``."""

        def mutation_positions(self, node):
            if (node.type == "simple_stmt" and node.children[0].type in ("power", "atom_expr")
                    and call_trailer(node.children[0].children[-1])):
                yield node.start_pos, node.end_pos

        def mutate(self, node, index):
            first = node.children[0]
            node.children[0] = parso.python.tree.Keyword("pass", first.start_pos, first.get_first_leaf().prefix)
            return node

        @classmethod
        def examples(cls):
            return (Example("a.zero_()\n", "pass\n"),)

    class DropDetach(Operator):
        def mutation_positions(self, node):
            if node.type in ("power", "atom_expr"):
                kids = node.children
                for i in range(1, len(kids) - 1):
                    if (kids[i].type == "trailer" and kids[i].children[0].value == "."
                            and kids[i].children[1].value == "detach" and call_trailer(kids[i + 1])):
                        yield kids[i].start_pos, kids[i + 1].end_pos

        def mutate(self, node, index):
            kids = node.children
            at = [i for i in range(1, len(kids) - 1) if kids[i].type == "trailer" and kids[i].children[0].value == "."
                  and kids[i].children[1].value == "detach" and call_trailer(kids[i + 1])][index]
            node.children = kids[:at] + kids[at + 2:]
            return node

        @classmethod
        def examples(cls):
            return (Example("y = x.detach()", "y = x"),)

    class SwapArguments(Operator):
        """Two neighbouring positional arguments of a call trade places (where they differ)."""

        def pairs(self, node):
            if not call_trailer(node) or len(node.children) != 3 or node.children[1].type != "arglist":
                return []
            before = node.get_previous_sibling()
            if before is not None and before.type == "trailer" and before.children[-1].get_code() == "add_argument":
                return []  # a flag's option strings: their order means nothing to argparse
            args = [a for a in node.children[1].children if a.type != "operator"]
            pos = []
            for a in args:
                if a.type == "argument" or a.type == "star_expr" or a.get_code().lstrip().startswith("*"):
                    break
                pos.append(a)
            return [(a, b) for a, b in zip(pos, pos[1:]) if a.get_code().strip() != b.get_code().strip()]

        def mutation_positions(self, node):
            for a, b in self.pairs(node):
                yield a.start_pos, b.end_pos

        def mutate(self, node, index):
            a, b = self.pairs(node)[index]
            kids = node.children[1].children
            i, j = kids.index(a), kids.index(b)
            pa, pb = a.get_first_leaf().prefix, b.get_first_leaf().prefix
            kids[i], kids[j] = b, a
            b.get_first_leaf().prefix, a.get_first_leaf().prefix = pa, pb
            return node

        @classmethod
        def examples(cls):
            return (Example("f(a, b, c)", "f(b, a, c)"), Example("f(a, b, c)", "f(a, c, b)", occurrence=1))

    ops = {name.removeprefix("Replace"): get_operator("core/" + name)() for name in CORE}
    ops |= {"FlipAugAssign": FlipAugAssign(), "DropCall": DropCall(), "DropDetach": DropDetach(),
            "SwapArguments": SwapArguments()}
    return ops


def mutants(source: str) -> list[dict]:
    """Every mutant of ``source``: operator, occurrence, line, the line before and after, the mutated code.
    Mutants whose code another mutant already produced are kept once."""
    from cosmic_ray.ast import Visitor, get_ast
    from cosmic_ray.mutating import mutate_code

    class Positions(Visitor):
        def __init__(self, op):
            self.op, self.found = op, []

        def visit(self, node):
            self.found.extend(start for start, _ in self.op.mutation_positions(node))
            return node

    lines, seen, out = source.splitlines(), {source}, []
    for name, op in operators().items():
        finder = Positions(op)
        finder.walk(get_ast(source))
        for k, (line, _) in enumerate(finder.found):
            code = mutate_code(source, op, k)
            if code is None or code in seen:
                continue
            seen.add(code)
            new = code.splitlines()
            changed = next((i for i, (a, b) in enumerate(zip(lines, new)) if a != b), line - 1)
            out.append({"op": name, "k": k, "line": changed + 1, "from": lines[changed].strip(),
                        "to": new[changed].strip(), "code": code})
    return sorted(out, key=lambda m: (m["line"], m["op"], m["k"]))


def dotted(module: str) -> str:
    """The name ``module`` is imported by: a package's ``__init__.py`` by the package's own name (``import
    plugins``, ``from plugins import robust`` both run it)."""
    path = Path(module).with_suffix("")
    parts = path.parts[1:] if path.parts[0] == "system" else path.parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def algorithms_of(module: str) -> list[str]:
    """Registered algorithms whose server module is ``module`` or reaches it through flcore's imports (the
    server's client module, and the mixins that one builds on: ``clients/partsharing.py`` reaches FedPer
    through ``clientper.py``); ``module`` in flcore/ (a utility's importers are too many to run: its tests are
    the files that import it, and ``EXTRA``)."""
    if not module.startswith("system/flcore/"):
        return []
    source = (REPO / "system" / "flcore" / "registry.py").read_text()
    table = ast.literal_eval(re.search(r"ALGORITHMS = (\{.*?\})", source, re.S).group(1))
    name, found, reach = dotted(module), [], {}

    def reaches(mod: str) -> set[str]:
        """``mod`` and every flcore module it imports, directly or through another."""
        if mod not in reach:
            reach[mod] = {mod}
            file = (REPO / "system" / Path(*mod.split("."))).with_suffix(".py")
            text = file.read_text() if file.is_file() else ""  # a package's name: its modules are imported by name
            for target in re.findall(r"^\s*from\s+(flcore\.[\w.]+)\s+import", text, re.M):
                reach[mod] |= reaches(target)
        return reach[mod]

    for algo, target in table.items():
        if name in reaches(target.split(":")[0]):
            found.append(algo)
    return found


def guards(module: str, full: bool = False) -> tuple[list[str], list[str]]:
    """(test files, test nodes) that guard ``module``: whole, the files that import it and its ``EXTRA``
    files; as nodes, the registry-parametrized tests of its algorithms, and in the other files that name one
    of its algorithms as a string (``get_server_class("FD")``, ``"-algo", "FD"``, ``make_server(root, "FD")``)
    the tests that name it, in their code or their parameters (a file of many algorithms' tests, such as
    ``test_baselines_a.py``, guards each algorithm with its own tests only; a test parametrized over the
    algorithms guards each with its own cases)."""
    name = dotted(module)
    parent, stem = name.rpartition(".")[::2]
    imports = re.compile(rf"^\s*(from\s+{re.escape(name)}\s+import|import\s+{re.escape(name)}\b"
                         rf"|from\s+{re.escape(parent)}\s+import\s+[^#\n]*\b{re.escape(stem)}\b)", re.M)
    algos = algorithms_of(module)
    tests = {f"tests/{p.name}": p.read_text() for p in sorted((REPO / "tests").glob("test_*.py"))}
    files = sorted({f for f, text in tests.items() if imports.search(text)} | set(EXTRA.get(module, ())))
    if not algos:
        return files, []
    named = re.compile("|".join(rf'["\']{re.escape(a)}["\']' for a in algos))
    naming = {f: text for f, text in tests.items() if f not in files and named.search(text)}
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=",
                             "-p", "no:cacheprovider", *sorted(set(REGISTRY_TESTS) | set(naming))], cwd=REPO,
                            capture_output=True, text=True).stdout.splitlines()
    ids = re.compile(r"\[(?:[^\]]*-)?(%s)(?:-[^\]]*)?\]$" % "|".join(map(re.escape, algos)))
    by_code = {f"{f}::{fn}" for f, text in naming.items() for fn in tests_naming(text, named)}
    nodes = []
    for n in listed:
        f, _, rest = n.partition("::")
        if not rest or f in files or (SLOW.search(n) and not full):
            continue
        function = re.split(r"[\[:]", rest)[0]  # a test function or class: its node id's first name
        if ids.search(n) or f in naming and f"{f}::{function}" in by_code:
            nodes.append(n)
    return files, nodes


def tests_naming(text: str, named: re.Pattern) -> set[str]:
    """The top-level test functions and test classes of a test file whose code matches ``named``, or calls a
    top-level helper of the file that does, directly or through other helpers (``prepared()`` calling
    ``make_server()``)."""
    defs = [node for node in ast.parse(text).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    code = {node.name: ast.get_source_segment(text, node) or "" for node in defs}
    reaching, added = set(), {n for n in code if named.search(code[n])}
    while added:  # then the helpers' callers, until none is added
        reaching |= added
        helpers = [h for h in added if not h.startswith(("test", "Test"))]
        calls = re.compile("|".join(rf"\b{re.escape(h)}\(" for h in helpers)) if helpers else None
        added = {n for n in code if n not in reaching and calls is not None and calls.search(code[n])}
    return {n for n in reaching if n.startswith(("test", "Test"))}


def copy_repo(dest: Path) -> Path:
    """The repository's tracked and untracked-but-not-ignored files under dest/repo; shared/ beside it as
    beside the repository, so tests that need real data run as they would."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    root = dest / "repo"
    for f in filter(None, files):
        if (REPO / f).is_file():
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, root / f)
    if (REPO.parent / "shared").exists():
        (dest / "shared").symlink_to(REPO.parent / "shared")
    return root


WORD = re.compile(r"\b[A-Za-z_]\w{3,}\b")
COMMON = {*keyword.kwlist, *dir(builtins), "self", "cls"}  # words that name nothing of the module


def tests_naming_line(root: Path, tests: list[str], line: str) -> set[str]:
    """``file::name`` of the top-level test functions and classes among ``tests`` (their files) whose code
    names an identifier of ``line`` (of four characters or more, not a keyword or builtin), directly or
    through a helper: a line that runs at import (a constant, a class attribute) reaches a test only through
    a name it defines or reads, so these are the tests likeliest to fail on its mutant."""
    words = sorted(set(WORD.findall(line)) - COMMON)
    if not words:
        return set()
    named = re.compile(r"\b(?:" + "|".join(map(re.escape, words)) + r")\b")
    return {f"{f}::{name}" for f in sorted({t.split("::")[0] for t in tests})
            for name in tests_naming((root / f).read_text(), named)}


class KillersFirst:
    """A pytest plugin that runs the tests which killed this module's earlier mutants first, the latest
    killer first, then the others fastest first (``durations``: seconds per node id in the unmutated run;
    without it their collected order): a mutant near one already killed usually fails the same test, and
    with ``-x`` the run stops at the first failure, so a mutant no earlier killer catches is found by the
    cheapest test that fails. ``named`` (``file::function`` or ``file::Class``), for a mutant on a line that
    runs at import, go before the killers: the tests that name what the line defines (``tests_naming_line``);
    without them such a mutant ran every cheaper test first. Only the order changes, never the set."""

    def __init__(self, killers: list[str], durations: dict[str, float] | None = None, named: Iterable[str] = ()):
        self.rank: dict[str, int] = {}
        self.durations = durations or {}
        self.named = set(named)
        for node in reversed(killers):
            self.rank.setdefault(node, len(self.rank))

    def _named(self, nodeid: str) -> bool:
        return "::".join(nodeid.split("[")[0].split("::")[:2]) in self.named

    @pytest.hookimpl(trylast=True)  # after conftest's own hook: this order is the one that runs
    def pytest_collection_modifyitems(self, items):
        items.sort(key=lambda item: (not self._named(item.nodeid), self.rank.get(item.nodeid, len(self.rank)),
                                     self.durations.get(item.nodeid, 0.0)))


class Deadlines:
    """A pytest plugin that tells the parent, through the pipe ``fd``, each test's own time limit as the test
    starts (``allowed``: seconds per node id, for set-up, call and teardown; a test not listed has none) and
    ``inf`` as it ends, so that a mutant which hangs in one test is stopped at that test's limit instead of
    the limit of the whole run."""

    def __init__(self, fd: int, allowed: dict[str, float]):
        self.fd, self.allowed = fd, allowed

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        os.write(self.fd, f"{self.allowed.get(item.nodeid, math.inf)}\n".encode())
        yield
        os.write(self.fd, b"inf\n")


def forked_pytest(root: Path, argv: list[str], timeout: float, log: Path, plugins: list = (),
                  cover: Path | None = None, allowed: dict[str, float] | None = None) -> tuple[int | None, float]:
    """Run pytest on ``argv`` in ``root``, in a child forked from this process (torch already imported), its
    output in ``log`` and its temporary files in ``log``'s folder (``--basetemp``, emptied by each run: a
    child stopped at its time limit cannot leave them in the system's temporary folder); under coverage.py
    with the configuration ``cover`` when given, each test its own context (``TestContexts``), and the
    processes it starts measured too. (exit code or None after ``timeout``, or after one test ran past its own
    limit in ``allowed`` (``Deadlines``), seconds)."""
    read, write = os.pipe() if allowed else (None, None)
    pid = os.fork()
    if pid == 0:
        code = 99
        gc.freeze()  # the inherited heap is never garbage: pytest's collections at exit skip it (seconds each)
        try:
            if allowed:
                os.close(read)
                plugins = [*plugins, Deadlines(write, allowed)]
            os.setpgid(0, 0)
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__  # the descriptors, even under a capture
            os.chdir(root)
            cov = None
            if cover is not None:
                import coverage

                # Python processes the tests start (``python system/main.py ...``) measure themselves too
                # (coverage's .pth file starts it where COVERAGE_PROCESS_START is set); forked ones save
                # theirs at os._exit (the configuration's patch).
                os.environ.update(MUTATE_TEST="", COVERAGE_PROCESS_START=str(cover))
                cov = coverage.Coverage(config_file=str(cover))
                cov.start()
                plugins = [*plugins, TestContexts(cov, durations_file(cover))]
            try:
                # hypothesis is imported before the fork (PREIMPORT): pytest cannot rewrite its asserts and says so
                code = int(pytest.main(["-q", "--tb=short", "-p", "no:cacheprovider", "-o", "addopts=",
                                        "--basetemp", str(log.parent / "pytest-tmp"),
                                        "-W", "ignore::pytest.PytestAssertRewriteWarning", *argv],
                                       plugins=list(plugins)))
            finally:
                if cov is not None:
                    cov.stop()
                    cov.save()
        finally:
            os._exit(code)
    if allowed:
        os.close(write)
        os.set_blocking(read, False)
    try:
        return wait_for(pid, timeout, read)
    finally:
        if allowed:
            os.close(read)


def wait_for(pid: int, timeout: float, deadlines: int | None) -> tuple[int | None, float]:
    """(exit code, seconds) of the child ``pid``, or (None, seconds) once it ran past ``timeout`` or its test
    of the moment past the limit last read from the pipe ``deadlines`` (``Deadlines``); it is killed then."""
    elapsed, last, pending, in_test, limit = 0.0, time.monotonic(), b"", 0.0, math.inf
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        now = time.monotonic()
        step = running_time(now - last)
        elapsed, in_test, last = elapsed + step, in_test + step, now
        if done:
            return os.waitstatus_to_exitcode(status), elapsed
        with contextlib.suppress(BlockingIOError):
            while deadlines is not None and (chunk := os.read(deadlines, 4096)):
                *lines, pending = (pending + chunk).split(b"\n")
                if lines:
                    in_test, limit = 0.0, float(lines[-1])
        if elapsed > timeout or in_test > limit:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None, elapsed
        time.sleep(0.05)


STOPPED_S = 10.0  # a wait of 0.05 s that took longer than this was the lane being stopped (SIGSTOP)


def running_time(step: float) -> float:
    """The part of one step of the wait loop that counts toward a mutant's time limit: all of it, unless
    the step took over ``STOPPED_S``, which only happens when the lane was stopped (``kill -STOP`` to give
    a measurement a quiet machine, then ``-CONT``): that pause is not the mutant's, and counting it turned
    mutants that were running across it into timeouts (kills)."""
    return step if step <= STOPPED_S else 0.0


def run_tests(root: Path, args: list[str], timeout: float, log: Path, killers: list[str] = (),
              durations: dict[str, float] | None = None, named: Iterable[str] = ()) -> tuple[str, float]:
    """Run the tests ``args`` with ``-x``, ``named`` then ``killers`` first, then fastest first
    (``KillersFirst``), the whole run within ``timeout`` and each test within its own limit where
    ``durations`` know it (``limits_per_test``); outcome, seconds."""
    code, seconds = forked_pytest(root, ["-x", *args], timeout, log, [KillersFirst(list(killers), durations, named)],
                                  allowed=limits_per_test(durations) if durations else None)
    if code is None:
        return "timeout", seconds
    if code == 0:
        return "survived", seconds
    if code == 5:
        raise SystemExit("mutate: the selection ran no test")
    return "killed", seconds


ALL = "*"  # in a coverage map: the line runs at import or in a fixture's set-up, so every guarding test
COVERAGE_RC = """[run]
data_file = {data}
parallel = True
include = {module}
context = ${{MUTATE_TEST}}
patch = _exit
"""


class TestContexts:
    """A pytest plugin that records each test's lines under its own coverage context: its node id while it
    runs, ``<node id>|setup`` / ``|teardown`` around it. ``MUTATE_TEST`` carries the same label into the
    processes the test forks or starts (the coverage configuration's static context). Each test's seconds,
    set-up to teardown, go to the JSON file ``durations`` at the end of the session."""

    def __init__(self, cov, durations: Path):
        self.cov, self.path, self.seconds, self.started = cov, durations, {}, {}

    def switch(self, label: str) -> None:
        os.environ["MUTATE_TEST"] = label
        self.cov.switch_context(label)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        self.started[item.nodeid] = time.monotonic()
        self.switch(item.nodeid + "|setup")
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        self.switch(item.nodeid)
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item):
        self.switch(item.nodeid + "|teardown")
        yield
        self.switch("")
        self.seconds[item.nodeid] = round(time.monotonic() - self.started.pop(item.nodeid), 3)

    def pytest_sessionfinish(self):
        self.path.write_text(json.dumps(self.seconds))


def durations_file(cover: Path) -> Path:
    """Where a run under the coverage configuration ``cover`` writes each test's seconds."""
    return Path(cover).with_name("durations.json")


def coverage_map(root: Path, module: str, args: list[str],
                 tmp: Path) -> tuple[dict[int, set[str]], float, dict[str, float]]:
    """Run ``args`` (the guarding tests) once under coverage.py, measuring ``module`` only, in this process and
    in every process a test forks or starts; line -> the node ids of the tests that ran it (``ALL`` where it ran
    outside a test's own call: at import, or in a fixture's set-up or teardown, whose results other tests
    share), the seconds the run took, and each test's seconds in it. Raises SystemExit if a test fails."""
    import coverage

    cov_dir = tmp / "coverage"
    shutil.rmtree(cov_dir, ignore_errors=True)
    cov_dir.mkdir()
    rc = tmp / "coverage.ini"
    rc.write_text(COVERAGE_RC.format(data=cov_dir / ".coverage", module=root / module))
    code, seconds = forked_pytest(root, args, 3 * 3600, tmp / "coverage.log", cover=rc)
    if code != 0:
        sys.stdout.write((tmp / "coverage.log").read_text()[-3000:])
        raise SystemExit("mutate: the guarding tests fail on the unmutated code under coverage")
    cov = coverage.Coverage(config_file=str(rc))
    cov.combine([str(cov_dir)])
    by_line = cov.get_data().contexts_by_lineno(str(root / module))
    label = re.compile(r"\|(setup|teardown)$")
    return ({line: {ALL if not c or label.search(c) else c for c in contexts} for line, contexts in by_line.items()},
            seconds, json.loads(durations_file(rc).read_text()))


def coverage_key(root: Path, module: str, args: list[str]) -> str:
    """What a coverage run of ``module`` under the guarding tests ``args`` depends on and a later run can
    compare: the module's source, the test files the node ids name and the tests' conftest."""
    files = sorted({a.split("::")[0] for a in args} | {"tests/conftest.py"})
    text = "\0".join([module, (root / module).read_text(), *args,
                      *(f + "\0" + (root / f).read_text() for f in files if (root / f).exists())])
    return sha(text)


def cached_coverage_map(root: Path, module: str, args: list[str], tmp: Path,
                        cache: Path | None = None) -> tuple[dict[int, set[str]], float, dict[str, float]]:
    """``coverage_map``, kept in ``cache`` (``$MUTATE_CACHE``, else ``~/.cache/pfl-mutate``) under
    ``coverage_key``, so an interrupted run resumes without repeating the coverage run (half an hour for a
    module most tests run). Only the module and its tests are in the key: a change elsewhere that makes a test
    run a line it did not run before leaves that test out of the line's selection until the module or its tests
    change. That can only turn a kill into a survivor, never the reverse (a kill is always a test seen failing),
    and ``--verify`` reruns every survivor with all the guarding tests."""
    cache = cache or Path(os.environ.get("MUTATE_CACHE") or Path.home() / ".cache" / "pfl-mutate")
    path = cache / f"{dotted(module)}-{coverage_key(root, module, args)}.json"
    if path.exists():
        kept = json.loads(path.read_text())
        return ({int(line): set(tests) for line, tests in kept["map"].items()}, kept["seconds"],
                kept["durations"])
    cmap, seconds, durations = coverage_map(root, module, args, tmp)
    cache.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(".part")
    part.write_text(json.dumps({"map": {str(line): sorted(tests) for line, tests in cmap.items()},
                                "seconds": seconds, "durations": durations}))
    part.replace(path)
    return cmap, seconds, durations


def statement_lines(source: str) -> dict[int, range | None]:
    """line -> the lines whose execution can show a mutant on it: those of the innermost statement that holds
    it (of a compound statement, its header: ``if``/``for`` up to its body; coverage.py records a statement
    under any of its lines); for the ``def`` line (defaults, annotations) of a function defined at import,
    its body, since only a call can see them; None where the statement runs at import (constants, class
    attributes, a function's decorators: a registration, keywords read from the source), whose effect every
    later test shares, whichever test imported it."""
    out: dict[int, range | None] = {}
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.stmt, ast.excepthandler)):
                body = [c.lineno for c in ast.iter_child_nodes(child) if isinstance(c, ast.stmt)]
                first = min([child.lineno] + [d.lineno for d in getattr(child, "decorator_list", [])])
                end = max(child.lineno, min(body) - 1) if body else child.end_lineno
                shown = range(first, end + 1) if in_function else None
                if isinstance(child, functions) and not in_function:
                    shown = range(min(body), child.end_lineno + 1)
                for line in range(first, end + 1):
                    out[line] = None if isinstance(child, functions) and line < child.lineno else shown
            visit(child, in_function or isinstance(child, (*functions, ast.Lambda)))

    visit(ast.parse(source), False)
    return out


def select(cmap: dict[int, set[str]] | None, lines: dict[int, range | None], line: int,
           tests: list[str], remote: bool = False) -> list[str]:
    """The guarding tests a mutant on ``line`` runs: those that ran its statement; all of them where it runs
    at import or ran in a fixture, or where the map or the statement is unknown; [] where no guarding test
    ran it, unless the module is ``remote`` (in ``REMOTE``): then the tests that ran any of its lines."""
    if cmap is None or lines.get(line) is None:
        return tests
    ran = set().union(*(cmap.get(n, set()) for n in lines[line]))
    if not ran and remote:
        ran = set().union(*cmap.values()) - {ALL}
    if ALL in ran:
        return tests
    # a node id belongs to a guard given as its file or as itself
    return [t for t in sorted(ran) if t in tests or t.split("::")[0] in tests]


SLACK_S = 120.0  # added to a time limit: start-up, and a slow run on a loaded machine, never count as a hang


def time_limit(tests: list[str], durations: dict[str, float] | None, base: float) -> float:
    """Seconds a mutant's run of ``tests`` may take before it counts as a timeout (a kill): three times what
    those tests took in the unmutated run under coverage, which is the slower, plus two minutes of start-up;
    three times the whole unmutated run where a test's own time is unknown (a file given as a guard, or no
    coverage run)."""
    known = [durations.get(t) for t in tests] if durations else [None]
    return 3 * (base if None in known else sum(known)) + SLACK_S


def limits_per_test(durations: dict[str, float]) -> dict[str, float]:
    """Seconds each test may take on a mutant, set-up to teardown, before the run counts as a timeout: three
    times the longest test of its file in the unmutated run, plus two minutes. The file's longest, not the
    test's own time: a module-scoped fixture is paid by whichever of the file's tests runs first, and the
    order of a mutant's run (``KillersFirst``) is not the unmutated run's."""
    file = {node: node.split("::")[0] for node in durations}
    longest: dict[str, float] = {}
    for node, seconds in durations.items():
        longest[file[node]] = max(longest.get(file[node], 0.0), seconds)
    return {node: 3 * longest[file[node]] + SLACK_S for node in durations}


def equivalent_notes(module: str) -> dict:
    notes = json.loads(EQUIVALENT.read_text()) if EQUIVALENT.exists() else {}
    return {(n["op"], n["from"], n["to"]): n["why"] for n in notes.get(module, [])}


def result_path(module: str) -> Path:
    return RESULTS / f"{dotted(module)}.json"


@contextlib.contextmanager
def mutated(path: Path, code: str, source: str):
    """``path`` holds the mutant ``code`` inside the block and its own ``source`` again after it."""
    path.write_text(code)
    try:
        yield
    finally:
        path.write_text(source)


class Selection:
    """Which of the guarding tests a mutant runs (``pick``) and how long it may take (``limit``). The unmutated
    run that decides both (under coverage, or of every guarding test with ``all_tests``; none with ``only``,
    the tests given) is made the first time a mutant needs it, not before."""

    def __init__(self, root: Path, module: str, guard: list[str], tmp: Path, lines: dict, all_tests: bool,
                 only: list[str] | None, earlier_base: float | None):
        self.root, self.module, self.guard, self.tmp, self.lines = root, module, guard, tmp, lines
        self.all_tests, self.only = all_tests, only
        self.cmap, self.durations, self.base = None, None, None
        if only is not None:
            self.base = earlier_base

    def ready(self) -> None:
        if self.base is not None:
            return
        if self.all_tests:
            outcome, self.base = run_tests(self.root, self.guard, 3600, self.tmp / "pytest.log")
            if outcome != "survived":
                sys.stdout.write((self.tmp / "pytest.log").read_text()[-3000:])
                raise SystemExit(f"mutate: the guarding tests fail on the unmutated code ({outcome})")
        else:  # the unmutated run, under coverage: which test runs which line
            self.cmap, self.base, self.durations = cached_coverage_map(self.root, self.module, self.guard, self.tmp)
        print(f"{self.module}: {len(self.guard)} guarding test files and nodes, {self.base:.0f} s unmutated"
              + ("" if self.all_tests else " under coverage"), flush=True)

    def pick(self, line: int, remote: bool) -> list[str]:
        if self.only is not None:
            return self.only
        self.ready()
        return self.guard if self.all_tests else select(self.cmap, self.lines, line, self.guard, remote)

    def limit(self, tests: list[str]) -> float:
        self.ready()
        return time_limit(tests, self.durations, self.base)


def mutate(module: str, full: bool, fresh: bool, all_tests: bool = False, verify: bool = False,
           only: list[str] | None = None) -> dict:
    """Run the module's mutants (the survivors of an earlier run on the same source, unless ``fresh``) and
    record them. ``only``: tests written against an earlier run's survivors; those survivors run against
    them alone, without the coverage run (a kill by any test is a kill; one they miss stays a survivor)."""
    source = (REPO / module).read_text()
    lines = statement_lines(source)
    files, nodes = guards(module, full)
    if not files and not nodes:
        raise SystemExit(f"mutate: no test guards {module} (no test file imports it and no registered algorithm "
                         "reaches it): name its tests in EXTRA")
    found = mutants(source)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    out = result_path(module)
    previous = json.loads(out.read_text()) if out.exists() else {}
    # Resuming: a mutant already killed on this very source stays killed (tests are only ever added), and so
    # does a survivor recorded as equivalent (no test can kill it); the other survivors are run again, so a
    # new test shows at once. --fresh runs everything.
    same = not fresh and previous.get("sha") == sha(source)
    if only is not None and not same:
        raise SystemExit(f"mutate: --with reruns the survivors of an earlier run of {module} on the same source, "
                         "and there is none: run it without --with")
    if only is not None and "first" not in previous:  # its mutants not yet run would be judged by these tests alone
        raise SystemExit(f"mutate: the run of {module} is unfinished: resume it without --with first")
    equivalent = equivalent_notes(module)
    done = {} if not same else {
        (m["op"], m["from"], m["to"], m["line"]): m for m in previous["mutants"]
        if m["outcome"] != "survived" or (m["op"], m["from"], m["to"]) in equivalent}
    # An earlier run's survivors, matched by operator and the line before and after even when the file has
    # changed elsewhere, so a mutant that a test written since kills keeps saying so.
    survivors = {(m["op"], m["from"], m["to"]) for m in previous.get("mutants", [])
                 if m["outcome"] == "survived" or m.get("was") == "survived"}
    # The test that killed each mutant in the earlier run: a changed file runs all its mutants again, and most
    # fall to the same test.
    earlier = {(m["op"], m["from"], m["to"]): m["by"] for m in previous.get("mutants", []) if m.get("by")}
    for name in PREIMPORT:
        try:
            __import__(name)
        except ImportError:
            pass
    with tempfile.TemporaryDirectory(prefix="mutate-") as tmp:
        root = copy_repo(Path(tmp))
        log = Path(tmp) / "pytest.log"
        guard = files + nodes
        tests = Selection(root, module, guard, Path(tmp), lines, all_tests, only, previous.get("baseline_s"))
        # A changed module's mutants run against their earlier killer alone first, where that test still passes
        # alone on the unmutated code (timed there): a mutant it kills needs no selection, and a run whose every
        # mutant falls that way makes no unmutated run of all the guarding tests.
        wanted = {(m["op"], m["from"], m["to"]) for m in found}  # an earlier killer of a mutant that is gone: none
        first = {} if same or only is not None else {k: t for k, t in earlier.items() if k in wanted}
        passing = {t: seconds for t in sorted(set(first.values()))
                   for outcome, seconds in [run_tests(root, [t], 3600, log)] if outcome == "survived"}
        record = {"module": module, "tool": "cosmic-ray " + version(), "date": str(datetime.date.today()),
                  "commit": commit, "sha": sha(source), "tests": guard,
                  "baseline_s": previous.get("baseline_s"), "mutants": []}
        print(f"{module}: {len(found)} mutants, {len(done)} kept from the earlier run on this source, "
              f"{len(passing)} earlier killers to try first", flush=True)
        for i, m in enumerate(found):
            key = (m["op"], m["from"], m["to"], m["line"])
            if key in done:
                record["mutants"].append(done[key])
                continue
            if key[:3] in equivalent:  # judged equivalent, with its reason, before it ran: no test can kill it
                record["mutants"].append({k: m[k] for k in ("line", "op", "from", "to")}
                                         | {"outcome": "survived", "s": 0.0, "ran": 0})
                print(f"[{i + 1}/{len(found)}] equivalent (listed, not run)  L{m['line']} {m['op']}: {m['to']}",
                      flush=True)
                write(record)
                continue
            outcome, seconds, by, chosen = "survived", 0.0, "", None
            if first.get(key[:3]) in passing:
                chosen = [first[key[:3]]]
                with mutated(root / module, m["code"], source):
                    outcome, seconds, by = run_mutant(root, chosen, time_limit(chosen, passing, 0.0), log, [])
            if outcome == "survived":
                chosen = tests.pick(m["line"], module in REMOTE)  # on the unmutated code, its first time
                killers = [r["by"] for r in record["mutants"] if r.get("by")] + [earlier.get(key[:3], "")]
                named = tests_naming_line(root, chosen, m["from"]) if lines.get(m["line"]) is None else ()
                with mutated(root / module, m["code"], source):
                    outcome, more, by = run_mutant(root, chosen, tests.limit(chosen), log, killers,
                                                   tests.durations, named)
                    seconds += more
                    if outcome == "survived" and verify and chosen != guard:
                        outcome, more, by = run_mutant(root, guard, tests.limit(guard), log, killers,
                                                       tests.durations)
                        seconds += more
                record["baseline_s"] = round(tests.base, 1)
            row = {k: m[k] for k in ("line", "op", "from", "to")} | {"outcome": outcome, "s": round(seconds, 1),
                                                                    "ran": "all" if chosen == guard else len(chosen)}
            if outcome == "killed":
                row["by"] = by
            if outcome != "survived" and key[:3] in survivors:
                row["was"] = "survived"  # an earlier run's survivor: ``by`` is the test that now kills it
            record["mutants"].append(row)
            print(f"[{i + 1}/{len(found)}] {outcome:8s} {seconds:5.1f}s  L{m['line']} {m['op']}: {m['to']}",
                  flush=True)
            write(record)
        recheck_killers(root, module, found, record, guard, time_limit(guard, None, record["baseline_s"] or 0), log,
                        passing)
    # The kill rate before the tests written against this run's survivors: kept from the first run.
    killed = sum(m["outcome"] != "survived" for m in record["mutants"])
    record["first"] = previous.get("first") or {"mutants": len(record["mutants"]), "killed": killed,
                                                "survived": len(record["mutants"]) - killed, "date": record["date"]}
    write(record)
    return record


def run_mutant(root: Path, tests: list[str], timeout: float, log: Path, killers: list[str],
               durations: dict[str, float] | None = None, named: Iterable[str] = ()) -> tuple[str, float, str]:
    """(outcome, seconds, the failing test) of the mutant written in ``root``; no tests: it survives unrun."""
    if not tests:
        return "survived", 0.0, ""
    outcome, seconds = run_tests(root, tests, timeout, log, killers, durations, named)
    return outcome, seconds, first_failure(log.read_text()) if outcome == "killed" else ""


def first_failure(log: str) -> str:
    """The node id of the first test pytest's short summary reports failed (``FAILED <id> - <message>``);
    an id may hold spaces (a parametrized value's)."""
    found = re.search(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", log, re.M)
    return found.group(1) if found else ""


def recheck_killers(root: Path, module: str, found: list[dict], record: dict, guard: list[str], timeout: float,
                    log: Path, passing: Iterable[str] = ()) -> None:
    """A mutant killed by a selection of the tests counts only if its killer passes on the unmutated code when
    run as selected (alone, not after the tests that ran before it in the full run); the mutants of a killer
    that does not are run again with every guarding test. ``found``: the module's mutants (``mutants()``);
    ``passing``: tests already seen passing alone on the unmutated code in this run."""
    selected = [m for m in record["mutants"] if m.get("by") and m.get("ran") not in (None, "all")]
    bad = {test for test in {m["by"] for m in selected} - set(passing)
           if run_tests(root, [test], timeout, log)[0] != "survived"}
    source = (root / module).read_text()
    code = {(m["op"], m["from"], m["to"], m["line"]): m["code"] for m in found}
    for row in selected:
        if row["by"] in bad:
            print(f"mutate: {row['by']} fails alone on the unmutated code: L{row['line']} rerun with every test")
            with mutated(root / module, code[(row["op"], row["from"], row["to"], row["line"])], source):
                row["outcome"], seconds, row["by"] = run_mutant(root, guard, timeout, log, [])
            row["s"], row["ran"] = round(row["s"] + seconds, 1), "all"
            write(record)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def version() -> str:
    from importlib.metadata import version as v

    return v("cosmic-ray")


def write(record: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = result_path(record["module"]).with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=0) + "\n")
    tmp.replace(result_path(record["module"]))


def summary(record: dict) -> dict:
    notes = equivalent_notes(record["module"])
    n = len(record["mutants"])
    killed = sum(m["outcome"] in ("killed", "timeout") for m in record["mutants"])
    survivors = [m for m in record["mutants"] if m["outcome"] == "survived"]
    equivalent = sum((m["op"], m["from"], m["to"]) in notes for m in survivors)
    live = n - equivalent
    return {"mutants": n, "killed": killed, "equivalent": equivalent, "survived": len(survivors) - equivalent,
            "rate": killed / live if live else 1.0}


def families() -> str:
    """Each folder's modules together: the first run's kill rate (killed / mutants, before any test written
    against its survivors and before any was found equivalent) beside the current one, raw and over the
    non-equivalent mutants (the target's measure)."""
    groups: dict[str, list[dict]] = {}
    for path in sorted(RESULTS.glob("*.json")):
        if path != EQUIVALENT:
            record = json.loads(path.read_text())
            groups.setdefault(record["module"].rsplit("/", 1)[0], []).append(record)
    rows = ["| family | modules | first run: killed / mutants | now: killed / mutants | equivalent | kill rate now |",
            "|---|---|---|---|---|---|"]
    for family, records in groups.items():
        s = [summary(r) for r in records]
        first = [r["first"] for r in records if "first" in r]
        f_killed, f_all = sum(f["killed"] for f in first), sum(f["mutants"] for f in first)
        killed, n, eq = (sum(x[k] for x in s) for k in ("killed", "mutants", "equivalent"))
        unfinished = len(records) - len(first)
        rows.append(f"| `{family}/` | {len(records)}{f' ({unfinished} unfinished)' if unfinished else ''} "
                    f"| {f_killed}/{f_all} ({100 * f_killed / max(f_all, 1):.0f} %) "
                    f"| {killed}/{n} ({100 * killed / max(n, 1):.0f} %) | {eq} "
                    f"| {100 * killed / max(n - eq, 1):.0f} % |")
    return "\n".join(rows)


def table() -> str:
    rows = ["| module | mutants | killed | equivalent | survivors | kill rate | first run | date |",
            "|---|---|---|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("*.json")):
        if path == EQUIVALENT:
            continue
        record = json.loads(path.read_text())
        s = summary(record)
        first = record.get("first", {})
        current = (REPO / record["module"]).read_text() if (REPO / record["module"]).exists() else ""
        stale = "" if record.get("sha") == sha(current) else " (file changed since: rerun)"
        stale += "" if "first" in record else " (unfinished: rerun to resume)"
        before = f"{first['killed']}/{first['mutants']}" if first else ""
        rows.append(f"| `{record['module']}` | {s['mutants']} | {s['killed']} | {s['equivalent']} | {s['survived']} "
                    f"| {100 * s['rate']:.0f} % | {before} | {record['date']}{stale} |")
    return "\n".join(rows)


def not_yet_run() -> str:
    """The modules of SCOPE that no record holds, with how many mutants each has (what a run will cost)."""
    recorded = {json.loads(p.read_text())["module"] for p in RESULTS.glob("*.json") if p != EQUIVALENT}
    todo = {}
    for pattern in SCOPE:
        for path in sorted(REPO.glob(pattern)):
            module = path.relative_to(REPO).as_posix()
            if module not in recorded and module not in todo:
                todo[module] = len(mutants(path.read_text()))
    todo = {m: n for m, n in todo.items() if n}  # an empty __init__.py has nothing to mutate
    if not todo:
        return "Every module in scope has been run."
    return (f"Not yet run ({len(todo)} modules, {sum(todo.values())} mutants; a later run adds each with the "
            "command above): " + ", ".join(f"`{m}` ({n})" for m, n in todo.items()) + ".")


def write_doc() -> None:
    """Replace the generated blocks: docs/testing.md's table with the modules not yet run, and
    docs/mutation-survivors.md's survivors."""
    from scripts.experiments.benchmark_report import write_block

    write_block(DOC, "mutation-table", "By folder:\n\n" + families() + "\n\nBy module:\n\n" + table() + "\n\n"
                + not_yet_run())
    write_block(SURVIVORS_DOC, "mutation-survivors", survivors_report())


def survivors_report() -> str:
    """For docs/mutation-survivors.md: each module's survivors, equivalent (why) or live, and the earlier survivors
    that a test written since kills (which test)."""
    out = []
    for path in sorted(RESULTS.glob("*.json")):
        if path == EQUIVALENT:
            continue
        record = json.loads(path.read_text())
        notes = equivalent_notes(record["module"])
        rows = []
        for m in record["mutants"]:
            what = f"L{m['line']} {m['op']}: `{m['from']}` → `{m['to']}`"
            if m["outcome"] == "survived":
                why = notes.get((m["op"], m["from"], m["to"]))
                rows.append(f"- {what}: " + (f"equivalent: {why}" if why else "**survives**"))
            elif m.get("was") == "survived":
                rows.append(f"- {what}: killed by `{m.get('by') or 'the tests'}`")
        if rows:
            out += [f"`{record['module']}`", "", *rows, ""]
    return "\n".join(out).strip()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("module", nargs="?", help="a .py file, relative to the repository root")
    p.add_argument("--list", action="store_true", help="print the guarding tests and the mutants; run nothing")
    p.add_argument("--table", action="store_true",
                   help="print the kill-rate table of all recorded modules and their survivors")
    p.add_argument("--write-doc", action="store_true",
                   help="write the table, the modules not yet run and the survivors into docs/testing.md")
    p.add_argument("--fresh", action="store_true", help="rerun every mutant, not only the survivors")
    p.add_argument("--full", action="store_true", help="also run the slow registry tests (Ray, behaviour)")
    p.add_argument("--all-tests", action="store_true",
                   help="run every guarding test for every mutant, not only those that execute its line")
    p.add_argument("--verify", action="store_true",
                   help="rerun each survivor of a selection with every guarding test before recording it")
    p.add_argument("--with", dest="only", nargs="+", metavar="TEST",
                   help="rerun an earlier run's survivors (same source) against these tests only, without the "
                        "coverage run: the tests written against them")
    args = p.parse_args(argv)
    if args.table:
        print(families() + "\n\n" + table() + "\n\n" + not_yet_run() + "\n\n" + survivors_report())
        return 0
    if args.write_doc:
        write_doc()
        return 0
    if not args.module or not (REPO / args.module).is_file() or not args.module.endswith(".py"):
        print(f"mutate: give a module as a .py path relative to the repository root (got {args.module!r})",
              file=sys.stderr)
        return 2
    module = Path(args.module).as_posix()
    if args.list:
        files, nodes = guards(module, args.full)
        print("\n".join(files + nodes))
        for m in mutants((REPO / module).read_text()):
            print(f"L{m['line']} {m['op']}: {m['from']}  ->  {m['to']}")
        return 0
    record = mutate(module, args.full, args.fresh, args.all_tests, args.verify, args.only)
    s = summary(record)
    print(f"{module}: {s['killed']}/{s['mutants']} killed, {s['equivalent']} equivalent, {s['survived']} "
          f"survived: {100 * s['rate']:.0f} %")
    for m in record["mutants"]:
        if m["outcome"] == "survived" and (m["op"], m["from"], m["to"]) not in equivalent_notes(module):
            print(f"  survived L{m['line']} {m['op']}: {m['from']}  ->  {m['to']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
