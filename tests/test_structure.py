"""The library's structure, read from the registry and the source (``ast``): an algorithm's files hold only
that algorithm. What several algorithms share (a family base, a helper) lives in its own module; an algorithm
file may take from another algorithm's files only that algorithm's registered server or client class, to
combine whole algorithms (FedProx-C is FedProx plus fine-tuned evaluation)."""
from __future__ import annotations

import ast
import inspect
import sys

from flcore.registry import ALGORITHMS, get_server_class, pfllib_flag_defaults


def owners() -> dict[str, str]:
    """Module name -> the registered algorithm whose server or client it defines."""
    owned = {}
    for name in ALGORITHMS:
        server = get_server_class(name)
        for cls in (server, server.declares.client_class):
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
            whole = {server.__name__, server.declares.client_class.__name__}
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
    fedrep = get_server_class("FedRep").declares.client_class.__module__
    fedper = get_server_class("FedPer").declares.client_class.__module__
    fedproto = get_server_class("FedProto").declares.client_class.__module__
    altered = module_source(fedrep).replace("from flcore.clients.partsharing import PartSharingClient",
                                            f"from {fedper} import PartSharingClient\nimport {fedproto}")
    assert altered != module_source(fedrep)
    bad = cross_algorithm_uses(owned, lambda m: altered if m == fedrep else module_source(m))
    assert len(bad) == 2 and "PartSharingClient" in bad[0] and "FedPer" in bad[0] and "FedProto" in bad[1], bad


def test_model_names_listed_without_torch_are_the_built_ones():
    from flcore.trainmodel import models, names

    assert tuple(models.MODEL_SPECS) == names.MODELS
    assert all(target in names.MODELS for target in names.ALIASES.values())


def test_each_algorithm_declares_pfllib_defaults_only_for_its_own_flags():
    import argparse

    for name in ALGORITHMS:
        server = get_server_class(name)
        parser = argparse.ArgumentParser()
        server.add_args(parser.add_argument_group())
        own = vars(parser.parse_args([]))
        assert set(pfllib_flag_defaults(server)) <= set(own), name
    # FedProx-C has both parents' (FedProx's -mu, fine-tuned evaluation's -fte)
    assert pfllib_flag_defaults(get_server_class("FedProx-C")) == {"mu": 0.0, "fine_tuning_epochs": 10}


HELP_IMPORTS = """
import sys
sys.path.insert(0, {system!r})
import main
try:
    main.main({argv!r})
except SystemExit:
    pass
print(sorted(m for m in sys.modules if m == "torch" or m.startswith(("flcore.servers.", "flcore.clients."))))
"""


def help_imports(argv) -> list[str]:
    import subprocess
    from pathlib import Path

    system = str(Path(__file__).resolve().parents[1] / "system")
    done = subprocess.run([sys.executable, "-c", HELP_IMPORTS.format(system=system, argv=argv)],
                          capture_output=True, text=True, timeout=120, check=True)
    assert "usage:" in done.stdout
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def test_help_imports_no_algorithm_it_does_not_show_and_plain_help_not_torch():
    assert help_imports(["-h"]) == []
    shown = help_imports(["-algo", "FedProx", "-h"])
    algorithm_files = [m for m in shown if m.rsplit(".", 1)[-1].startswith(("server", "client"))
                       and not m.endswith(("serverbase", "clientbase"))]
    assert sorted(algorithm_files) == ["flcore.clients.clientprox", "flcore.servers.serverprox"], shown


def algorithm_level_modules() -> list[str]:
    """Every module an algorithm is written in: the algorithms' files and the family bases beside them."""
    import pkgutil

    import flcore.clients
    import flcore.servers

    found = ["flcore.prototypes"]
    for pkg in (flcore.servers, flcore.clients):
        found += [f"{pkg.__name__}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)
                  if m.name not in ("serverbase", "clientbase")]
    return found


def base_private_members() -> set[str]:
    """The bases' private members, and the loop's steps they used to carry (now runtime/loop.py's)."""
    from flcore.clients.clientbase import Client
    from flcore.servers.serverbase import MOVED, Server

    private = {n for cls in (Server, Client) for n in vars(cls) if n.startswith("_") and not n.startswith("__")}
    return private | {n for n in MOVED if n.startswith("_")}


def reaches_into_the_loop(source: str, private: set[str]) -> list[str]:
    """Lines of ``source`` that name the executor, or use or override a private member of the bases."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and (node.attr == "executor" or node.attr in private):
            bad.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.FunctionDef) and node.name in private:
            bad.append(f"line {node.lineno}: def {node.name}")
    return bad


def test_no_algorithm_file_names_the_executor_or_a_private_base_member():
    import importlib

    private = base_private_members()
    assert {"_send_models", "_train_clients", "_sgd_step"} <= private
    for module in algorithm_level_modules():
        importlib.import_module(module)
        assert reaches_into_the_loop(module_source(module), private) == [], module


def test_the_loop_check_reports_the_executor_and_private_members():
    private = base_private_members()
    source = ("class S:\n    def _send_models(self, p):\n        super()._send_models(p)\n"
              "    def prepare_broadcast(self, p):\n        self.executor.map(p, 'x')\n")
    assert reaches_into_the_loop(source, private) == ["line 2: def _send_models", "line 3: ._send_models",
                                                      "line 5: .executor"]


def readme_hooks() -> set[str]:
    """The names in the hook column of README's "Adding an algorithm" table."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme[readme.index("| side | hook | default |"):]
    table = table[:table.index("\n\n")]
    return {name for row in table.splitlines()[2:] for name in re.findall(r"`(\w+)", row.split("|")[2])}


def test_algorithms_override_only_the_hooks_the_readme_lists():
    from flcore.clients.clientbase import Client
    from flcore.servers.serverbase import Server

    hooks = readme_hooks()
    assert {"broadcast", "aggregate", "receive", "local_update", "declares"} <= hooks
    assert hooks <= set(vars(Server)) | set(vars(Client)), hooks - set(vars(Server)) - set(vars(Client))
    outside = set()
    for name in ALGORITHMS:
        server = get_server_class(name)
        for cls, base in ((server, Server), (server.declares.client_class, Client)):
            for c in cls.__mro__[:cls.__mro__.index(base)]:
                outside |= {f"{c.__name__}.{m}" for m in vars(c)  # (_own_declares: set by the base, utils/declares.py)
                            if m in vars(base) and not m.startswith("__") and m not in hooks and m != "_own_declares"}
    assert outside == set()


def test_the_parser_records_every_flag_scripts_read():
    """``parser.flags`` (what scripts/run/sweep.py and scripts/run/table.py read instead of argparse's internals) is
    the parser's whole list of flags, in order, with an algorithm's own flags too."""
    import cli

    for name in (None, "FedProx", "FedBABU"):
        parser = cli.parser_for(name)
        assert parser.flags == parser._actions, name
    assert any("-mu" in a.option_strings for a in cli.parser_for("FedProx").flags)
