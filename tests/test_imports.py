"""The import structure of system/, read with ``ast`` (nothing is imported): the project's own modules
import each other without cycles, and the generic layers (utils/, runtime/, plugins/) never reach into the
algorithms (flcore/). Every ``import`` statement counts, including those inside functions; the lazy
registry's "module:Class" strings are not imports."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

SYSTEM = Path(__file__).resolve().parents[1] / "system"
PACKAGES = ("flcore", "plugins", "runtime", "utils")
SCRIPTS = ("main.py", "cli.py", "get_mean_std.py")


def find_modules(root: Path, packages=PACKAGES, scripts=SCRIPTS) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is_package) for every module of ``packages`` and the top-level ``scripts``."""
    found = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            found[".".join(parts)] = (path, is_pkg)
    for script in scripts:
        if (root / script).exists():
            found[Path(script).stem] = (root / script, False)
    return found


def import_nodes(tree: ast.AST, lazy: bool = True):
    """The import statements of a module; with ``lazy=False`` only those run when it is loaded (not the
    ones inside functions)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif lazy or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def imported_names(tree: ast.AST, module: str, is_pkg: bool, lazy: bool = True) -> list[str]:
    """Every dotted name a module's import statements may load (for ``from x import y``, both ``x`` and
    ``x.y``: the caller keeps the ones that are modules). Relative imports are made absolute."""
    names = []
    for node in import_nodes(tree, lazy):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module
            if prefix:
                names.append(prefix)
            names.extend(f"{prefix}.{alias.name}" if prefix else alias.name for alias in node.names)
    return names


def import_graph(root: Path, packages=PACKAGES, scripts=SCRIPTS, lazy: bool = True) -> dict[str, set[str]]:
    """Module -> the project's own modules it imports (``lazy=False``: only when it is loaded)."""
    modules = find_modules(root, packages, scripts)
    graph = {}
    for name, (path, is_pkg) in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[name] = {t for t in imported_names(tree, name, is_pkg, lazy) if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search with an explicit stack)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


@pytest.fixture(scope="module")
def graph():
    return import_graph(SYSTEM)


# ---- the reader itself, on a tree built here ------------------------------------------------------------
def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_reader_resolves_relative_lazy_and_submodule_imports(tmp_path):
    write(tmp_path, {
        "pkg/__init__.py": "from . import a\n",
        "pkg/a.py": "import os\nfrom .sub import b\nfrom pkg.sub.b import thing\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "def f():\n    from ..c import g\n    import pkg.sub\n",
        "pkg/c.py": "from pkg import a as alias\n",
        "run.py": "import pkg.c\nfrom pkg.sub import b, missing\n",
    })
    g = import_graph(tmp_path, packages=("pkg",), scripts=("run.py",))
    assert g == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.sub", "pkg.sub.b"},
        "pkg.sub": set(),
        "pkg.sub.b": {"pkg.c", "pkg.sub"},
        "pkg.c": {"pkg", "pkg.a"},
        "run": {"pkg.c", "pkg.sub", "pkg.sub.b"},
    }
    # pkg.a -> pkg.sub.b -> pkg.c -> pkg.a: a cycle, closed by the import inside f()
    cycle = find_cycle(g)
    assert cycle is not None and cycle[0] == cycle[-1] and "pkg.sub.b" in cycle
    assert all(b in g[a] for a, b in zip(cycle, cycle[1:]))
    loaded = import_graph(tmp_path, packages=("pkg",), scripts=("run.py",), lazy=False)
    assert loaded["pkg.sub.b"] == set() and find_cycle(loaded) is None
    assert find_cycle({"x": {"y"}, "y": {"z"}, "z": set(), "w": {"x", "z"}}) is None


# ---- the project --------------------------------------------------------------------------------------
def test_every_module_is_read(graph):
    for name in ("main", "cli", "get_mean_std", "flcore.registry", "flcore.servers.serverbase",
                 "flcore.clients.clientbase", "flcore.trainmodel.models", "runtime.executors", "runtime.faults",
                 "utils.seeding", "utils.ALA"):
        assert name in graph, name
    # edges the reader must see: absolute, `from package import module`, and imports inside functions
    assert "flcore.clients.clientbase" in graph["flcore.servers.serverbase"]
    assert "runtime.checkpoint" in graph["flcore.servers.serverbase"]  # from runtime import checkpoint
    assert "runtime.choose" in graph["main"]  # inside run()
    assert "utils.ALA" in graph["flcore.clients.clientbase"]  # inside Client.__init__


def test_no_import_cycles(graph):
    cycle = find_cycle(graph)  # imports inside functions included
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("layer", ["utils", "runtime", "plugins"])
def test_generic_layers_do_not_import_algorithms(graph, layer):
    bad = sorted(f"{m} imports {t}" for m, targets in graph.items() if m.split(".")[0] == layer
                 for t in targets if t.split(".")[0] == "flcore")
    assert not bad, bad


def path_edits(source: str) -> list[int]:
    """Lines of ``source`` that change ``sys.path`` (a call on it, or an assignment to it or a slice)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        target = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            target = target.value if isinstance(target, ast.Subscript) else target
        if isinstance(target, ast.Attribute) and target.attr == "path" and getattr(target.value, "id", "") == "sys":
            lines.append(node.lineno)
    return sorted(lines)


def test_no_module_under_system_edits_the_search_path():
    """python system/main.py and cd system && python main.py put system/ on the path themselves; the
    library's modules never change it."""
    bad = {str(p.relative_to(SYSTEM)): path_edits(p.read_text()) for p in SYSTEM.rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}
    assert path_edits("import sys\nsys.path.insert(0, 'x')\nsys.path[:0] = ['y']\nsys.path += ['z']\n") == [2, 3, 4]


# How a generator or a script run as a file finds the code (docs/architecture.md, "Finding the code"): the
# _paths.py of its own folder, imported first when it runs as __main__, the one module that edits sys.path.
REPO = SYSTEM.parent
ENTRY_FOLDERS = ("dataset", "scripts/run", "scripts/experiments", "scripts/dev")
REPOSITORY_NAMES = {"dataset", "scripts", *PACKAGES, *(Path(s).stem for s in SCRIPTS)}  # what _paths makes importable


def entry_scripts() -> list[Path]:
    """The generators and scripts a user runs as files."""
    return sorted(p for p in [*(REPO / "dataset").glob("generate*.py"), *(REPO / "scripts").glob("*/*.py")]
                  if p.name not in ("_paths.py", "__init__.py"))


def bootstrap_line(tree: ast.Module) -> int | None:
    """The line of the module-level ``if __name__ == "__main__": import _paths``, or None."""
    for node in tree.body:
        if (isinstance(node, ast.If) and ast.unparse(node.test) in ("__name__ == '__main__'",)
                and len(node.body) == 1 and isinstance(node.body[0], ast.Import)
                and [a.name for a in node.body[0].names] == ["_paths"] and not node.orelse):
            return node.lineno
    return None


def finding_the_code(path: Path) -> list[str]:
    """What breaks the documented way in one generator or script (empty when nothing)."""
    source = path.read_text()
    tree = ast.parse(source)
    problems = [f"line {n} edits sys.path" for n in path_edits(source)]
    boot = bootstrap_line(tree)
    siblings = {p.stem for p in [*(REPO / "scripts").glob("*/*.py"), *(REPO / "dataset").glob("*.py")]}
    for node in import_nodes(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            continue
        for name in [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]:
            top = name.split(".")[0]
            if top == "_paths":
                if node.lineno != (boot or 0) + 1:
                    problems.append(f"line {node.lineno} imports _paths outside the bootstrap")
            elif top in siblings:
                problems.append(f"line {node.lineno} imports {name} by its bare name (from scripts.<role> "
                                f"import ..., from dataset import ...)")
            elif top in REPOSITORY_NAMES and boot is None:
                problems.append(f"line {node.lineno} imports {name} without the _paths bootstrap")
            elif top in REPOSITORY_NAMES and node in tree.body and node.lineno < boot:
                problems.append(f"line {node.lineno} imports {name} before the _paths bootstrap")
    return problems


def test_only_the_paths_helpers_edit_the_search_path():
    """No module under system/, dataset/ or scripts/ changes sys.path but the _paths.py of each entry folder,
    and those copies are one file."""
    files = [*SYSTEM.rglob("*.py"), *(REPO / "dataset").rglob("*.py"), *(REPO / "scripts").rglob("*.py")]
    helpers = sorted(p for p in files if p.name == "_paths.py")
    assert helpers == sorted(REPO / f / "_paths.py" for f in ENTRY_FOLDERS)
    assert len({p.read_bytes() for p in helpers}) == 1, "the _paths.py copies differ"
    bad = {str(p.relative_to(REPO)): path_edits(p.read_text()) for p in files if p.name != "_paths.py"}
    assert {k: v for k, v in bad.items() if v} == {}


def test_no_module_loads_the_code_by_its_file():
    """The repository's modules reach each other by import, not by loading a file by its path (a second copy
    of a module, with its own classes: an exception of one is not caught as the other's)."""
    loaders = {"spec_from_file_location", "run_path", "load_source", "SourceFileLoader"}
    files = [*SYSTEM.rglob("*.py"), *(REPO / "dataset").rglob("*.py"), *(REPO / "scripts").rglob("*.py")]
    bad = sorted(f"{p.relative_to(REPO)}:{n.lineno}" for p in files for n in ast.walk(ast.parse(p.read_text()))
                 if isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) in loaders)
    assert bad == []


def test_generators_and_scripts_find_the_code_one_way():
    """Every generator and script that imports the repository's code runs its folder's _paths first (as
    __main__ only) and imports other scripts by package, never by a bare name off its own folder."""
    scripts = entry_scripts()
    assert len(scripts) > 40
    bad = {str(p.relative_to(REPO)): problems for p in scripts if (problems := finding_the_code(p))}
    assert bad == {}


def test_the_check_sees_a_planted_violation(tmp_path):
    boot = 'if __name__ == "__main__":\n    import _paths\n'
    cases = {"import sys\nsys.path.insert(0, 'system')\nimport utils\n": ["edits sys.path", "without"],
             "import utils\n" + boot: ["before the _paths"],
             boot + "from utils import fileio\nimport table\n": ["bare name"],
             boot + "from scripts.run import table\n\ndef f():\n    from utils import fileio\n": []}
    for source, expected in cases.items():
        (tmp_path / "s.py").write_text(source)
        found = finding_the_code(tmp_path / "s.py")
        assert len(found) == len(expected) and all(e in f for e, f in zip(expected, found)), (source, found)


@pytest.mark.parametrize("cwd, command", [
    ("", ["dataset/generate_Digits.py", "--help"]),
    ("dataset", ["generate_Digits.py", "--help"]),
    ("tests", ["../scripts/run/table.py", "--help"]),
    ("system", ["../scripts/experiments/hetero_report.py", "--help"]),
])
def test_run_as_a_file_from_any_folder(cwd, command):
    """The README's forms run as written, with no PYTHONPATH: the folder's _paths.py finds the rest."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, *command], cwd=REPO / cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]
