"""The import structure of system/, read with ``ast`` (nothing is imported): the project's own modules
import each other without cycles, and the generic layers (utils/, runtime/, plugins/) never reach into the
algorithms (flcore/). Every ``import`` statement counts, including those inside functions; the lazy
registry's "module:Class" strings are not imports."""
from __future__ import annotations

import ast
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
