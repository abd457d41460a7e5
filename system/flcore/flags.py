"""Every algorithm's own flags, read from the source of its server's ``add_args`` with ``ast``: nothing is
imported (no torch, no algorithm), so a run of one algorithm can accept the flags PFLlib command lines pass
for the others (a shared sweep passes ``-mu`` to every algorithm) without loading them.

The author writes ``add_args`` as usual, in the server file; what is read from each
``parser.add_argument("-x", "--xx", type=float, ...)`` call there is its names, ``dest``, ``type``
(``float``, ``int`` or a string), ``action`` (``store_true`` or ``argparse.BooleanOptionalAction``) and
literal ``choices``. ``super().add_args(parser)`` adds the bases' flags, found through the file's imports.
tests/test_flags_index.py checks, for every registered algorithm, that this reading equals what its
imported ``add_args`` declares.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path

from flcore.registry import ALGORITHMS
from utils import fileio

SYSTEM = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    """One flag as ``add_argument`` declares it: its names, dest, value type ("float", "int" or "str"),
    action ("store" for a value, "store_true" for a switch, "optional" for ``BooleanOptionalAction``) and
    choices (a tuple, or None where the source does not spell them as a literal)."""
    names: tuple[str, ...]
    dest: str
    type: str = "str"
    action: str = "store"
    choices: tuple | None = None


@functools.lru_cache(maxsize=None)
def _module_tree(module: str) -> ast.Module | None:
    path = SYSTEM.joinpath(*module.split(".")).with_suffix(".py")
    return ast.parse(fileio.read_text(path, "source file"), filename=str(path)) if path.exists() else None


def _class_def(module: str, name: str) -> tuple[str, ast.ClassDef] | None:
    """(module, class definition) of ``name`` as seen from ``module``: defined there or imported from
    another of the project's modules."""
    tree = _module_tree(module)
    if tree is None:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _class_def(node.module, alias.name)
    return None


def _literal(node: ast.expr):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _spec(call: ast.Call) -> FlagSpec:
    names = tuple(a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    kw = {k.arg: k.value for k in call.keywords}
    dest = (_literal(kw["dest"]) if "dest" in kw
            else next((n for n in names if n.startswith("--")), names[0]).lstrip("-"))
    kind = "str"
    if isinstance(kw.get("type"), ast.Name) and kw["type"].id in ("float", "int"):
        kind = kw["type"].id
    action = "store"
    if "action" in kw:
        text = ast.unparse(kw["action"])
        action = ("store_true" if text == "'store_true'" else "optional" if text.endswith("BooleanOptionalAction")
                  else text)
    choices = _literal(kw["choices"]) if "choices" in kw else None
    return FlagSpec(names, dest.replace("-", "_"), kind, action, None if choices is None else tuple(choices))


def _class_flags(module: str, cls: ast.ClassDef) -> list[FlagSpec]:
    method = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_args"), None)
    own, inherit = [], method is None
    for node in ast.walk(method) if method is not None else ():
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "add_argument":
                own.append(_spec(node))
            elif node.func.attr == "add_args" and isinstance(node.func.value, ast.Call):  # super().add_args
                inherit = True
    found = []
    if inherit:
        for base in cls.bases:
            if isinstance(base, ast.Name) and (resolved := _class_def(module, base.id)) is not None:
                found += _class_flags(*resolved)
    return found + own


@functools.lru_cache(maxsize=None)
def algorithm_flags(name: str) -> tuple[FlagSpec, ...]:
    """The flags registered algorithm ``name``'s server declares in ``add_args`` (its bases' included),
    read from the source."""
    module, cls = ALGORITHMS[name].split(":")
    resolved = _class_def(module, cls)
    if resolved is None:
        raise KeyError(f"{ALGORITHMS[name]}: class not found in the source")
    seen, out = set(), []
    for spec in _class_flags(*resolved):
        if spec.dest not in seen:
            seen.add(spec.dest)
            out.append(spec)
    return tuple(out)
