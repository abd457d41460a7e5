"""The library's structure, read from the registry and the source (``ast``): an algorithm's files hold only
that algorithm. What several algorithms share (a family base, a helper) lives in its own module; an algorithm
file may take from another algorithm's files only that algorithm's registered server or client class, to
combine whole algorithms (FedProx-C is FedProx plus fine-tuned evaluation)."""
from __future__ import annotations

import ast
import inspect
import sys

from flcore.registry import ALGORITHMS, get_server_class


def owners() -> dict[str, str]:
    """Module name -> the registered algorithm whose server or client it defines."""
    owned = {}
    for name in ALGORITHMS:
        server = get_server_class(name)
        for cls in (server, server.client_class):
            assert owned.setdefault(cls.__module__, name) == name, f"{cls.__module__} holds two algorithms"
    return owned


def module_source(module: str) -> str:
    return inspect.getsource(sys.modules[module])


def flcore_imports(source: str):
    """(line, imported module, [names]) for every ``from flcore... import`` and ``import flcore...``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flcore."):
            yield node.lineno, node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name, ["*"]) for a in node.names if a.name.startswith("flcore."))


def cross_algorithm_uses(owned: dict[str, str], source=module_source) -> list[str]:
    """Every name an algorithm's file takes from another algorithm's file that is not that algorithm's
    registered server or client class."""
    bad = []
    for module, algo in owned.items():
        for line, imported, names in flcore_imports(source(module)):
            other = owned.get(imported)
            if other is None or other == algo:
                continue
            server = get_server_class(other)
            whole = {server.__name__, server.client_class.__name__}
            bad += [f"{module}:{line} ({algo}) takes {n} from {imported} ({other})" for n in names if n not in whole]
    return bad


def test_no_algorithm_file_holds_what_another_algorithm_uses():
    owned = owners()
    assert len(set(owned.values())) == len(ALGORITHMS)  # every algorithm found its files
    assert cross_algorithm_uses(owned) == []


def test_the_check_reports_a_family_base_taken_from_an_algorithm_file():
    """FedRep's client taking the model-splitting base from FedPer's file, or a prototype helper from
    FedProto's, is reported; FedProx-C taking FedProx's whole client is not."""
    owned = owners()
    fedrep = get_server_class("FedRep").client_class.__module__
    fedper = get_server_class("FedPer").client_class.__module__
    fedproto = get_server_class("FedProto").client_class.__module__
    altered = module_source(fedrep).replace("from flcore.clients.partsharing import PartSharingClient",
                                            f"from {fedper} import PartSharingClient\nimport {fedproto}")
    assert altered != module_source(fedrep)
    bad = cross_algorithm_uses(owned, lambda m: altered if m == fedrep else module_source(m))
    assert len(bad) == 2 and "PartSharingClient" in bad[0] and "FedPer" in bad[0] and "FedProto" in bad[1], bad
