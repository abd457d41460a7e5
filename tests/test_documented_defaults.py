"""Every algorithm's own flags default to the values its row in docs/algorithms.md gives for them (the papers'
where they give one): a changed default, in the code or in its ``table_row``, fails here; the doc's table is
written from the classes by ``python scripts/dev/docs_tables.py`` and checked to match. Each "`-flag` [symbol]
value" of a row's flags column with a number or on/off is checked, outside parentheses (which name
alternatives). A default of None means "resolved from other flags" (FedAMP's per-kernel ξ_ii and σ, FedKD's
-mlr = -lr): their own tests check the resolution."""
import re

import pytest
import cli

import main
from flcore.registry import ALGORITHMS, get_server_class, pfllib_flag_defaults
from scripts.dev import docs_tables

ROWS = {}  # -algo name -> the flags cell of its row, as written into docs/algorithms.md
for line in docs_tables.algorithms_table().splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 5 and cells[0] in ALGORITHMS:
        ROWS[cells[0]] = cells[3]
# "`-mu` μ 5", "`-pls` 10 head epochs", "`--adapt_alpha` on": the flag, an optional symbol, the value
PAIR = re.compile(r"`(-{1,2}[\w-]+)`\s+(?:[^\s`\d(=-][^\s`(]*\s+)?(on|off|[-+]?\d[\d.]*(?:e[-+]?\d+)?)\b")


def documented(algo: str) -> list[tuple[str, str]]:
    return PAIR.findall(re.sub(r"\([^()]*\)", "", ROWS[algo]))


def test_the_docs_tables_are_the_ones_the_declarations_make(capsys):
    assert docs_tables.main(["--check"]) == 0, capsys.readouterr().err


def test_a_class_without_a_declared_row_gets_one_from_its_docstring_and_flags():
    """A new algorithm's row needs no hand edit: its docstring's second line is the paper, ``personalized``
    the family, and its own flags with their defaults the flags cell."""
    from flcore.servers.serverbase import Declares
    from flcore.servers.serverprox import FedProxServer

    class NewServer(FedProxServer):
        declares = Declares(personalized=True)

    NewServer.__module__ = FedProxServer.__module__  # as if defined in a server file with that docstring

    row = docs_tables.algorithm_row("New", NewServer)
    assert row == ("| New | Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith. MLSys 2020. https://arxiv.org/abs/1812.06127 "
                   "| pFL | `-mu` 0.01 | — |\n")


def test_every_algorithm_has_a_row_and_the_rows_are_read():
    assert set(ROWS) == set(ALGORITHMS)
    assert documented("MOON") == [("-mu", "5"), ("-tau", "0.5")]
    assert ("--adapt_alpha", "on") in documented("APFL") and ("-lf", "off") in documented("FedGen")
    assert sum(len(documented(a)) for a in ALGORITHMS) > 60


@pytest.mark.parametrize("algo", sorted(a for a in ALGORITHMS if PAIR.search(ROWS.get(a, ""))))
def test_defaults_are_the_documented_ones(algo):
    parser = cli.base_parser()
    get_server_class(algo).add_args(parser)
    cfg = cli.parse_config(["-algo", algo])
    for flag, value in documented(algo):
        dest = parser._option_string_actions[flag].dest
        got = getattr(cfg, dest)
        if got is None:
            continue
        if value in ("on", "off"):
            assert got is (value == "on"), (algo, flag, got)
        else:
            assert got == pytest.approx(float(value)), (algo, flag, got)


# PFLlib's system/main.py defaults of the algorithm flags it shares (by argparse dest), as --pfllib applies them.
PFLLIB = {"beta": 0.0, "lamda": 1.0, "mu": 0.0, "K": 5, "p_learning_rate": 0.01, "M": 5, "itk": 4000, "alphaK": 1.0,
          "sigma": 1.0, "alpha": 1.0, "plocal_epochs": 1, "tau": 1.0, "fine_tuning_epochs": 10,
          "dr_learning_rate": 0.0, "L": 1.0, "noise_dim": 512, "generator_learning_rate": 0.005, "hidden_dim": 512,
          "server_epochs": 1000, "server_learning_rate": 1.0, "eta": 1.0, "rand_percent": 80, "layer_idx": 2,
          "mentee_learning_rate": 0.005, "T_start": 0.95, "T_end": 0.98, "momentum": 0.1, "kl_weight": 0.0,
          "first_stage_bound": 0, "fedcross_alpha": 0.99, "collaborative_model_select_strategy": 1}


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_pfllib_defaults_are_pfllibs(algo):
    for dest, value in pfllib_flag_defaults(get_server_class(algo)).items():
        assert dest in PFLLIB, (algo, dest, "not in the table of PFLlib's defaults above")
        assert value == PFLLIB[dest], (algo, dest, value)
