"""Plug-ins: the features that cut across algorithms (attacks, robust aggregation, server optimizers, DP at
the sample and the client level, the DLG/IG privacy monitor, ALA), each one class in its own module here,
listed once in ``PLUGINS``. The round loop (flcore/servers/serverbase.py) names none of them: it calls every
built plug-in, in ``PLUGINS`` order, at its named points. A plug-in module imports no torch when it is loaded
(``-h`` lists its flags without torch); its math lives beside it (``aggregators.py``, ``attacks.py``,
``optimizers.py``) and is imported when the plug-in is built.

The interface (``Plugin``), in the spirit of Flower's wrapper strategies:

- ``add_flags(parser)``: its flags, in its own ``-h`` group (cli.py keeps only the common ones);
- ``check(cfg, server_cls, given)``: refuse what it cannot honour (``FLError``, one line) and return ``cfg``
  with its defaults resolved (``given``: the flags on the command line);
- ``build(cfg, server)``: the run's instance, or None when its flags leave it off;
- the round points, each a no-op by default:
    ``on_broadcast(server, payloads)``     what every client is sent this round, before it is sent
    ``before_training(server, active)``    the round's training clients, before they train
    ``on_uploads(server, active, uploads)``  the uploads, before aggregation; returns them (possibly changed)
    ``wrap_aggregate(server, step)``       the aggregation step as a whole; returns the step to run
    ``combine(server, uploads, keys, reference, target, prefix)``  inside ``Server.average_uploads`` (the
                                           model averaged into, its entries by upload name): the combined
                                           entries, or None to leave it to the next plug-in (default: the
                                           weighted mean)
    ``step(server, current, aggregate, params)``   inside ``average_uploads``, after ``combine``
    ``after_round(server)``                at the end of every round
    ``metrics(server, tests, trains)``     more series for each evaluation (a dict)
    ``describe(summary)``                  its figures on the round's printed line: (before the accuracy, after)
  and ``attackers(ids)``: how many of these upload ids it controls (Krum's f follows it);
- ``client_data(cfg, run, cid, data)`` and ``setup_client(cfg, client)`` (class methods): a client's data
  (``utils.data_utils.ClientData``) as it trains on it, and what the plug-in keeps on the client (DP-SGD's
  accountant), once at its construction, in the client's process;
- its state: its attributes, saved in checkpoints with the server's (runtime/state.py).

``averages``: True where the plug-in acts on ``average_uploads`` (an algorithm whose ``aggregate`` does not go
through it, and does not declare ``averaging_refusal``, then stops with one line).
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

from utils import fileio
from utils.errors import FLError

# The plug-ins, in the order the loop calls them at each point ("module:Class").
PLUGINS = (
    "plugins.attack:Attack",
    "plugins.dlg:DLGMonitor",
    "plugins.dp_sample:SampleDP",
    "plugins.dp_client:ClientDP",
    "plugins.robust:RobustAggregation",
    "plugins.server_opt:ServerOpt",
    "plugins.ala:AdaptiveLocalAggregation",
)


class Plugin:
    """The base of every plug-in: each method is a no-op (see the module docstring)."""

    averages = False

    @classmethod
    def add_flags(cls, parser) -> None:
        """Add this plug-in's flags to ``parser`` (an argument group)."""

    @classmethod
    def check(cls, cfg, server_cls, given: set[str]):
        """Refuse a configuration this plug-in cannot honour (``FLError``); return ``cfg``, its defaults resolved."""
        return cfg

    @classmethod
    def build(cls, cfg, server) -> "Plugin | None":
        """The run's instance (``server`` is being constructed: its clients exist), or None when off."""
        return None

    @classmethod
    def client_data(cls, cfg, run: int, cid: int, data):
        """Client ``cid``'s data (a ``ClientData``) as it trains on it."""
        return data

    @classmethod
    def setup_client(cls, cfg, client) -> None:
        """Set what this plug-in keeps on ``client`` (at the end of ``Client.__init__``)."""

    def on_broadcast(self, server, payloads: list) -> None:
        pass

    def before_training(self, server, active: list) -> None:
        pass

    def on_uploads(self, server, active: list, uploads: list) -> list:
        return uploads

    def wrap_aggregate(self, server, step):
        return step

    def combine(self, server, uploads: list, keys: list[str], reference: dict | None, target, prefix: str):
        return None

    def step(self, server, current: dict, aggregate: dict, params: list[str]) -> dict:
        return aggregate

    def after_round(self, server) -> None:
        pass

    def metrics(self, server, tests, trains) -> dict:
        return {}

    def describe(self, summary: dict) -> tuple[str, str]:
        return "", ""

    def attackers(self, ids: list[int]) -> int:
        return 0


def plugin_classes() -> list[type[Plugin]]:
    """Every plug-in class, in ``PLUGINS`` order."""
    out = []
    for entry in PLUGINS:
        module, name = entry.split(":")
        out.append(getattr(importlib.import_module(module), name))
    return out


def build_all(cfg, server) -> list[Plugin]:
    """The plug-ins a run's flags turn on, built for ``server``."""
    return [p for p in (cls.build(cfg, server) for cls in plugin_classes()) if p is not None]


def client_data(cfg, run: int, cid: int, data):
    """A client's data after every plug-in's ``client_data``."""
    for cls in plugin_classes():
        data = cls.client_data(cfg, run, cid, data)
    return data


def setup_client(cfg, client) -> None:
    """Every plug-in's ``setup_client``."""
    for cls in plugin_classes():
        cls.setup_client(cfg, client)


def declarations(module: str, decorator: str) -> list[tuple[str, dict]]:
    """(name, the decorator's keywords) for every ``@<decorator>("name", key=literal, ...)`` in
    ``plugins/<module>.py``, in source order, read with ``ast``: the module imports torch, and its names and
    defaults are what ``-h`` lists, without torch. Any other form of the decorator (a second positional
    argument, a name or a keyword that is not a literal) is refused, naming its line: what this reads must be
    all the decorator is given, or a run would act on a declaration it did not read."""
    path = Path(__file__).with_name(f"{module}.py")
    found = []
    for node in ast.parse(fileio.read_text(path, "source file"), filename=str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            for d in node.decorator_list:
                match d:
                    case ast.Call(func=ast.Name(id=called), args=[ast.Constant(value=str(name))], keywords=keys) \
                            if called == decorator and all(k.arg and literal(k.value) for k in keys):
                        found.append((name, {k.arg: ast.literal_eval(k.value) for k in keys}))
                    case ast.Call(func=ast.Name(id=called)) | ast.Name(id=called) if called == decorator:
                        raise FLError(f"{path.name} line {d.lineno}: write @{decorator}(\"name\", key=literal, ...): "
                                      "its name alone as a string, then only keywords with literal values")
    return found


def literal(node: ast.AST) -> bool:
    """Whether ``node`` is a Python literal (what ``ast.literal_eval`` reads)."""
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def registered(module: str, decorator: str) -> dict[str, dict]:
    """{name: its decorator's keywords} of ``declarations`` (one declaration per name)."""
    return dict(declarations(module, decorator))
