"""The plug-ins (system/plugins/): what -h lists is what is registered, each plug-in owns its flags, the loop
names none of them, and a rule's degenerate round says so."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import cli
import plugins
from plugins import aggregators, attack, attacks, optimizers, robust, server_opt

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
