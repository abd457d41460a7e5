"""How the code is laid out, in numbers: lines of Python per layer and the Server base class's public methods,
at one or more git revisions (docs/architecture.md's figures).

    python scripts/dev/layout_figures.py 8377893 HEAD

Lines are every line of the ``.py`` files of a layer at that revision (comments and docstrings included). A
public method is one of ``class Server`` in ``system/flcore/servers/serverbase.py`` whose name has no leading
underscore; "overridden" counts those that some other class under ``system/flcore/servers/`` (an algorithm or
a family base) defines again.
"""
from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS = {"main/cli": ["system/main.py", "system/cli.py"], "flcore/servers": ["system/flcore/servers"],
          "flcore/clients": ["system/flcore/clients"], "utils": ["system/utils"], "runtime": ["system/runtime"],
          "scripts": ["scripts"]}
SERVERS = "system/flcore/servers"


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout


def python_files(rev: str, paths: list[str]) -> list[str]:
    return [f for f in git("ls-tree", "-r", "--name-only", rev, "--", *paths).splitlines() if f.endswith(".py")]


def lines(rev: str, paths: list[str]) -> int:
    return sum(len(git("show", f"{rev}:{f}").splitlines()) for f in python_files(rev, paths))


def methods(tree: ast.Module, cls: str | None = None) -> set[str]:
    """Names of the methods of class ``cls`` (every class when None) in a parsed file."""
    return {f.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and cls in (None, node.name)
            for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}


def hooks(rev: str) -> tuple[int, int]:
    """(public methods of Server, how many of them another server class defines again)."""
    public = {m for m in methods(ast.parse(git("show", f"{rev}:{SERVERS}/serverbase.py")), "Server")
              if not m.startswith("_")}
    others = set()
    for f in python_files(rev, [SERVERS]):
        if not f.endswith("/serverbase.py"):
            others |= methods(ast.parse(git("show", f"{rev}:{f}")))
    return len(public), len(public & others)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("revs", nargs="+", help="git revisions (commits, branches, HEAD)")
    args = p.parse_args(argv)
    revs = [git("rev-parse", "--short", r).strip() for r in args.revs]
    print("| layer | " + " | ".join(revs) + " |")
    print("|---|" + "---:|" * len(revs))
    for name, paths in LAYERS.items():
        print(f"| {name} | " + " | ".join(str(lines(r, paths)) for r in revs) + " |")
    counts = [hooks(r) for r in revs]
    print("| public `Server` methods | " + " | ".join(str(n) for n, _ in counts) + " |")
    print("| ... overridden by some server | " + " | ".join(str(k) for _, k in counts) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
