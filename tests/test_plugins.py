"""The plug-ins (system/plugins/): what -h lists is what is registered, each plug-in owns its flags, the loop
names none of them, and a rule's degenerate round says so."""
from __future__ import annotations

import ast
import keyword
import tempfile
from pathlib import Path
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cli
import plugins
from plugins import aggregators, attack, attacks, optimizers, robust, server_opt
from utils.errors import FLError

SYSTEM = Path(__file__).resolve().parents[1] / "system"


def test_names_read_without_torch_are_the_registered_ones():
    """Adding a rule, an attack or an optimizer is one decorated function in one file: the names the flags
    offer (read from the source) are the functions registered there."""
    assert robust.AGGREGATORS == tuple(aggregators.RULES)
    assert set(attack.ATTACKS) == set(attacks.ATTACKS)
    assert all(attack.ATTACKS[n]["roles"] == set(attacks.ATTACKS[n]) for n in attacks.ATTACKS)
    assert attack.ATTACKS["backdoor"]["roles"] == {"data", "upload"} and attack.ATTACKS["labelflip"]["roles"] == {"data"}
    assert robust.F_RULES == ("krum", "multikrum", "bulyan")
    assert tuple(server_opt.OPTIMIZERS) == tuple(optimizers.OPTIMIZERS)
    parser = cli.base_parser()
    choices = {a.dest: a.choices for a in parser.flags}
    assert choices["aggregator"] == list(aggregators.RULES)
    assert choices["attack"] == list(attacks.ATTACKS)
    assert choices["server_opt"] == ["off", *optimizers.OPTIMIZERS]


IDENT = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True).filter(lambda k: k not in keyword.kwlist)
LITERAL = st.one_of(st.booleans(), st.integers(-5, 5), st.floats(0.001, 100.0), st.text("abc", max_size=3))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(IDENT, st.dictionaries(IDENT, LITERAL, max_size=3)), max_size=4))
def test_declarations_read_exactly_what_each_decorator_is_given(decls):
    """Names and defaults are read from the source without torch (``plugins.declarations``): every
    ``@rule("name", key=literal)`` comes back as written, in order, and nothing else in the file counts."""
    source = "import x\n\n"
    for i, (name, keys) in enumerate(decls):
        args = "".join(f", {k}={v!r}" for k, v in keys.items())
        source += f"@other({name!r})\n@rule({name!r}{args})\ndef f{i}(a):\n    return rule(a, 1)\n\n"
    with tempfile.TemporaryDirectory() as folder, mock.patch.object(plugins, "__file__", f"{folder}/__init__.py"):
        (Path(folder) / "fake.py").write_text(source)
        assert plugins.declarations("fake", "rule") == [(name, keys) for name, keys in decls]


@pytest.mark.parametrize("form", ['@rule("krum", True)', '@rule(NAME)', '@rule("krum", **KEYS)', "@rule",
                                  '@rule("krum", takes_f=TAKES)', '@rule(name="krum")', '@rule("a", "b")'])
def test_a_declaration_the_source_reader_cannot_read_whole_is_refused_with_its_line(tmp_path, monkeypatch, form):
    """A positional default (``@rule("krum", True)``) would register at run time while ``-h`` and the checks
    read ``takes_f`` as False: such a form stops at start-up instead, naming the line."""
    (tmp_path / "fake.py").write_text(f"import x\n\n\n{form}\ndef f(a):\n    return a\n")
    monkeypatch.setattr(plugins, "__file__", str(tmp_path / "__init__.py"))
    with pytest.raises(FLError, match=r"^fake.py line 4: write @rule\("):
        plugins.declarations("fake", "rule")


@pytest.mark.parametrize("decorate", [lambda: aggregators.rule("krum", True), lambda: attacks.attack("x", "data"),
                                      lambda: optimizers.optimizer("adam", 0.01)])
def test_the_decorators_take_their_defaults_by_keyword_only(decorate):
    with pytest.raises(TypeError):
        decorate()


def test_the_plugins_that_act_on_the_averaging_seam_are_the_rule_and_the_optimizer():
    """``averages``: an algorithm whose aggregate bypasses ``average_uploads`` stops under these two only
    (the attack, DP, the privacy monitor and ALA do not need the seam)."""
    assert [c.__name__ for c in plugins.plugin_classes() if c.averages] == ["RobustAggregation", "ServerOpt"]


def test_each_plugin_declares_its_own_flags_and_cli_none_of_them():
    parser = cli.base_parser()
    owner = {}
    for cls in plugins.plugin_classes():
        group = cli.OneLineParser()
        cls.add_flags(group)
        for action in group.flags:
            if action.dest != "help":
                assert owner.setdefault(action.dest, cls.__name__) == cls.__name__, action.dest
    central = {a.dest for a in parser.flags} - set(owner)
    assert {"aggregator", "attack", "server_opt", "privacy", "dlg_eval", "ala", "dp_quantile"} <= set(owner)
    assert not central & set(owner)
    source = (SYSTEM / "cli.py").read_text()
    for dest in ("--aggregator", "--attack", "--server_opt", "--dp_quantile", "--dlg_iters", "--ala_window"):
        assert f'"{dest}"' not in source, dest


LOOP = ["flcore/servers/serverbase.py", "flcore/clients/clientbase.py", "runtime/executors.py",
        "runtime/checkpoint.py", "runtime/loop.py", "runtime/client_steps.py", "main.py"]


@pytest.mark.parametrize("module", LOOP)
def test_no_module_of_the_loop_names_a_plugin(module):
    """No attribute, import or name of the loop's modules refers to a particular plug-in."""
    named = {"attack", "privacy", "server_opt", "robust", "aggregators", "attacks", "optimizers", "dlg",
             "dp_client", "dp_sample", "client_dp", "privacy_monitor", "Attack", "RobustAggregation", "ServerOpt",
             "ClientDP", "SampleDP", "DLGMonitor"}
    tree = ast.parse((SYSTEM / module).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in named:
            found.add(node.attr)
        elif isinstance(node, ast.Name) and node.id in named:
            found.add(node.id)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(("plugins.", "utils.")):
            found |= {node.module} & {f"plugins.{n}" for n in named} | {f"utils.{n}" for n in named} & {node.module}
    assert found == set(), found


def test_a_degenerate_round_says_so_once(capsys):
    states = [{"w": torch.tensor([float(i)])} for i in range(4)]
    notes = []
    out = aggregators.aggregate(states, [1, 1, 1, 1], "trimmed_mean", trim_frac=0.2, note=notes.append)
    assert out["w"].item() == 1.5 and notes == ["k = floor(0.2 x 4) = 0: nothing is trimmed (the unweighted mean)"]
    plugin = robust.RobustAggregation()
    cfg = type("Cfg", (), {"aggregator": "trimmed_mean"})()
    plugin.note(cfg, "k = 0")
    plugin.note(cfg, "k = 0")
    assert capsys.readouterr().err == "warning: --aggregator trimmed_mean: k = 0 (said once per run)\n"


def test_krum_f_follows_the_round_uploads_from_malicious_clients():
    """f is the number of this round's uploads that come from malicious clients, not the population's."""
    bad = attack.Attack.__new__(attack.Attack)
    bad.malicious = [1, 4, 7]
    assert bad.attackers([0, 1, 2, 4]) == 2 and bad.attackers([0, 2]) == 0


def _declaring(**refusals):
    """A server class declaring only the given refusals, as an algorithm's ``declares`` does."""
    from types import SimpleNamespace
    return SimpleNamespace(declares=SimpleNamespace(**{"averaging_refusal": "", "robust_refusal": "", **refusals}))


def _robust_cfg(**flags):
    from types import SimpleNamespace
    base = {"algorithm": "X", "aggregator": "mean", "krum_f": None, "cclip_tau": 10.0, "cclip_iters": 1,
            "norm_bound": None}
    return SimpleNamespace(**{**base, **flags})


def test_robust_refusal_refuses_every_rule_but_the_mean():
    """An algorithm declaring ``robust_refusal`` runs with the plain mean and is refused, with its reason,
    under any other rule."""
    from utils.errors import FLError

    server_cls = _declaring(robust_refusal="its server reads every upload")
    cfg = _robust_cfg()
    assert robust.RobustAggregation.check(cfg, server_cls, set()) is cfg
    for rule in ("median", "krum", "cclip"):
        with pytest.raises(FLError, match=r"^--aggregator: X cannot take it: its server reads every upload$"):
            robust.RobustAggregation.check(_robust_cfg(aggregator=rule), server_cls, set())


def test_krum_f_without_a_rule_that_takes_it_names_the_rules_that_do():
    from utils.errors import FLError

    with pytest.raises(FLError, match=r"^--krum_f needs --aggregator krum, multikrum or bulyan$"):
        robust.RobustAggregation.check(_robust_cfg(krum_f=1), _declaring(), set())
    cfg = _robust_cfg(aggregator="bulyan", krum_f=1)
    assert robust.RobustAggregation.check(cfg, _declaring(), set()) is cfg


def test_an_aggregate_that_ignores_the_uploads_under_a_rule_stops_the_round(digits_tiny_root, monkeypatch):
    """The robust rule acts on ``average_uploads``: a server whose ``aggregate`` never calls it (here: one that
    keeps its model) would silently ignore --aggregator, so the round stops with one line instead."""
    from flcore.servers.serverbase import Server
    from runtime import loop
    from test_executors import build
    from utils.errors import FLError

    server = build(digits_tiny_root, "FedAvg", "--aggregator", "median")
    monkeypatch.setattr(Server, "aggregate", lambda self, uploads: None)
    with pytest.raises(FLError, match="does not go through average_uploads; it must declare averaging_refusal"):
        loop.run_round(server, 0)


def test_a_plugin_acts_at_every_round_point_in_order(digits_tiny_root, tmp_path):
    """The loop calls a run's plug-ins at the named round points, in the round's order: the broadcast (the
    payloads sent), the evaluation (its figures join the summary), before training (the active clients), on
    the uploads (what it returns is what is aggregated), the aggregation (wrapped, then, through
    ``average_uploads``, ``combine`` and ``step``) and after the round. No plug-in of the library uses every
    point; one written against any of them is called there."""
    from conftest import build_server
    from runtime import loop

    calls = []

    class Recording(plugins.Plugin):
        def on_broadcast(self, server, payloads):
            calls.append(("broadcast", len(payloads)))

        def metrics(self, server, tests, trains):
            calls.append(("metrics", len(tests)))
            return {"recorded": 1.0}

        def before_training(self, server, active):
            calls.append(("before_training", [c.id for c in active]))

        def on_uploads(self, server, active, uploads):
            calls.append(("uploads", len(uploads)))
            return uploads[:1]

        def wrap_aggregate(self, server, step):
            def wrapped(uploads):
                calls.append(("aggregate", len(uploads)))
                step(uploads)
            return wrapped

        def combine(self, server, uploads, keys, reference, target, prefix):
            calls.append(("combine", len(uploads)))

        def step(self, server, current, aggregate, params):
            calls.append(("step", len(params)))
            return aggregate

        def after_round(self, server):
            calls.append(("after_round", server.round_idx))

    server = build_server(digits_tiny_root, tmp_path, "-algo", "FedAvg", clients=3)
    server.plugins.append(Recording())
    loop.run_round(server, 0)
    params = len(list(server.global_model.parameters()))
    assert calls == [("broadcast", 3), ("metrics", 3), ("before_training", [0, 1, 2]), ("uploads", 3),
                     ("aggregate", 1), ("combine", 1), ("step", params), ("after_round", 0)]
    assert loop.evaluate(server)["recorded"] == 1.0
