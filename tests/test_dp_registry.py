"""-dp for every registered algorithm (new ones join automatically): either the run is refused at start-up
with exit code 2 and one line, or every DP-SGD step is counted and really privatised:

(a) the epsilon each evaluation records equals opacus' RDP accountant applied, here, to the DP-SGD steps
    counted in this test (each call of the one DP backward, with its sigma and sampling rate);
(b) the trained models differ from those of the same run with another noise stream (noise is applied);
(c) with clip norm and sigma 1e-6 no model moves in a round (clipping is applied to every data step).

Also: what each algorithm's epsilon does not cover is listed in docs/privacy.md and warned about at start-up,
and a -dp run whose training bypasses DP-SGD is an error, never an epsilon of 0."""
from __future__ import annotations

import functools
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

import main
from cli import parse_config
from conftest import REPO, cli
from flcore.registry import ALGORITHMS, get_server_class
from flcore.clients.clientbase import Client
from utils import dp_sgd
from plugins.dp_sample import SampleDP
from utils import dp_support
from utils.data_utils import load_split
from utils.errors import FLError
from runtime import loop

DOC = REPO / "docs" / "privacy.md"
pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha")
NC = "3"  # the first 3 clients of the tiny split: every check below runs each algorithm in well under a second


FLAGS = {"FedBABU": ("-fte", "1")}  # one fine-tuning epoch per evaluation (5 by default): time only


def flags(algo: str, root: Path, *extra: str) -> list[str]:
    return cli(root, root, "--executor", "sequential", "-algo", algo, "-dp", "-nc", NC, "-lbs", "20",
               "--train_loss_eval", "off", *FLAGS.get(algo, ()), *extra)


def refused(algo: str, root: Path) -> bool:
    try:
        parse_config(flags(algo, root, "-gr", "1"))
    except FLError:
        return True
    return False


class Counted:
    """A server built in-process, every DP-SGD step (``Client.dp_backward``, the one seam) counted as (client id,
    sigma, q) with q =
    max(-lbs, batch) / (the samples the client's batches are drawn from: its ``train_indices``, else its whole
    training split), and each evaluation's summary kept with the number of calls made before it."""

    def __init__(self, algo: str, root: Path, monkeypatch, *extra: str):
        from utils.data_utils import load_split

        self.cfg = parse_config(flags(algo, root, *extra))
        self.calls: list[tuple[int, float, float]] = []
        self.records: list[tuple[dict, int]] = []
        backward = dp_sgd.dp_backward
        bs = self.cfg.batch_size

        def counting(client, objective, optimizer, x, y, modules=None, noise=None):
            pool = client.train_indices()  # what ``utils.batching.batches`` draws from (None: the whole training split)
            n = len(client.y_train) if pool is None else len(pool)
            self.calls.append((client.id, client.dp.sigma, min(1.0, max(bs, len(x)) / n)))
            return backward(client, objective, optimizer, x, y, modules, noise)

        monkeypatch.setattr(dp_sgd, "dp_backward", counting)
        data = load_split("Digits", root, int(NC))
        self.server = get_server_class(algo)(self.cfg.replace(num_classes=10), data)
        record, mine = loop.record, self.server
        monkeypatch.setattr(loop, "record", lambda server, summary: (
            server is mine and self.records.append((summary, len(self.calls))), record(server, summary)))
        self.start = self.params()

    def params(self) -> dict[str, torch.Tensor]:
        """Every parameter of the global model and of every model a client holds (trained, personal,
        evaluated), flat, by name."""
        out = {"global": self.server.global_model}
        for c in self.server.clients:
            out |= {f"{c.id}.{k}": m for k, m in vars(c).items() if isinstance(m, torch.nn.Module) and list(m.parameters())}
        return {k: torch.cat([p.detach().flatten().double() for p in m.parameters()]) for k, m in out.items()}

    def rounds(self, first: int, last: int, final: bool = False) -> dict[str, torch.Tensor]:
        for t in range(first, last):
            loop.run_round(self.server, t)
        if final:
            loop.final_evaluation(self.server, last)
        return self.params()


def moved(now: dict, start: dict) -> float:
    """The largest change of any parameter from ``start`` (a model made later, e.g. a fine-tuned copy, is
    compared with the global model it was copied from)."""
    return max(float((v - start.get(k, start["global"])).abs().max()) for k, v in now.items()
               if v.shape == start.get(k, start["global"]).shape)


def rdp_epsilon(steps: list[tuple[float, float]], delta: float) -> float:
    """opacus' RDP accountant on the steps given as (sigma, q) (0 without any). RDP composes by summing,
    so the steps are counted per (sigma, q) first."""
    return _rdp_epsilon(tuple(sorted(Counter(steps).items())), delta) if steps else 0.0


@functools.lru_cache(maxsize=None)
def _rdp_epsilon(counts: tuple, delta: float) -> float:
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    for (sigma, q), n in counts:
        for _ in range(n):
            acc.step(noise_multiplier=sigma, sample_rate=q)
    return acc.get_epsilon(delta)


@pytest.mark.optional_deps("opacus")
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_dp_is_refused_or_counted_and_applied(algo, digits_tiny_root, monkeypatch, capsys):
    root = digits_tiny_root
    if refused(algo, root):
        capsys.readouterr()
        assert main.main(flags(algo, root, "-gr", "2")) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "-dp" in err, err  # one line, no traceback, naming the flag
        return
    run = Counted(algo, root, monkeypatch, "-gr", "2")
    after_one = run.rounds(0, 1)
    run.rounds(1, 2, final=True)
    # (a) every recorded epsilon equals the accountant on the steps counted before that evaluation
    assert run.calls, f"{algo}: -dp took no DP-SGD step"
    clients = [c.id for c in run.server.clients]
    for summary, n_calls in run.records:
        want = [rdp_epsilon([(s, q) for cid, s, q in run.calls[:n_calls] if cid == k], run.cfg.dp_delta)
                for k in clients]
        assert list(summary["dp_client_epsilon"]) == pytest.approx(want, rel=1e-9), (algo, n_calls)
    final = run.records[-1][0]["dp_client_epsilon"]
    assert len(run.records) == 3 and all(e > 0 for e in final), (algo, final)
    # (b) another noise stream (--dp_secure_rng), same seed otherwise: other models after one round
    other = Counted(algo, root, monkeypatch, "-gr", "2", "--dp_secure_rng").rounds(0, 1)
    assert any(not torch.equal(v, other[k]) for k, v in after_one.items() if k in other), \
        f"{algo}: the noise stream does not change the trained models"
    # (c) clip norm and sigma 1e-6: one round leaves every model (global, trained, evaluated) where it started
    tiny = Counted(algo, root, monkeypatch, "-gr", "1", "--dp_clip", "1e-6", "-dps", "1e-6")
    shift = moved(tiny.rounds(0, 1, final=True), tiny.start)
    assert shift < 1e-5, f"{algo}: a model moved by {shift} with every per-sample gradient clipped to 1e-6"
    assert moved(after_one, run.start) > 1e-3  # without it, one round does move them


def test_docs_table_is_the_declarations():
    """docs/privacy.md's per-algorithm table is generated from the servers' ``dp_support``
    (scripts/dev/dp_coverage.py)."""
    from scripts.dev import dp_coverage

    _, table, _ = dp_coverage.split_doc(DOC.read_text())
    assert table == dp_coverage.expected_table(), "run python scripts/dev/dp_coverage.py"
    assert "| FedProto | refused: " in table and "| FedAvg |" not in table


@pytest.mark.optional_deps("opacus")
def test_a_declared_refusal_is_what_refuses():
    """Every algorithm refuses exactly the -dp levels its ``dp_support`` names, with that reason."""
    for algo in ALGORITHMS:
        support = get_server_class(algo).declares.dp_support
        for level, reason in (("sample", support.refusal), ("client", support.refusal or support.client_refusal)):
            argv = ["-algo", algo, "-gr", "1", "-dp", "--dp_level", level]
            if reason:
                with pytest.raises(FLError, match=re.escape(reason)):
                    parse_config(argv)
            else:
                parse_config(argv)


@pytest.mark.optional_deps("opacus")
def test_each_uncovered_step_is_in_docs_and_warned(digits_tiny_root, capsys):
    """What each algorithm's epsilon leaves out (``dp_support.uncovered``, ALA with -ala) is in docs/privacy.md's
    table, and a -dp run prints it as one warning line at start-up."""
    doc = DOC.read_text()
    table = {m.group(1): m.group(2) for m in re.finditer(r"^\| (\S+) \| (.+?) \| .+? \|$", doc, re.M)}
    for algo in sorted(ALGORITHMS):
        if refused(algo, digits_tiny_root):
            assert table.get(algo, "").startswith("refused"), algo
            continue
        cfg = parse_config(["-algo", algo, "-gr", "1"]).replace(privacy=True)
        server_cls = get_server_class(algo)
        for step in dp_support.uncovered_steps(cfg, server_cls):
            assert algo in table and step in table[algo], (algo, step)
        with_ala = dp_support.uncovered_steps(cfg.replace(ala=True), server_cls)
        assert dp_support.ALA_UNCOVERED in with_ala
    assert dp_support.uncovered_steps(parse_config(["-algo", "FedAvg"]).replace(privacy=True),
                                   get_server_class("FedAvg")) == []
    assert "-ala" in table and dp_support.ALA_UNCOVERED in table["-ala"]
    capsys.readouterr()
    assert main.main(flags("FedFomo", digits_tiny_root, "-gr", "1", "--results_dir",
                           str(digits_tiny_root / "warn"))) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: -dp")]
    assert err == [f"warning: -dp: FedFomo's epsilon does not cover: {get_server_class('FedFomo').declares.dp_support.uncovered} "
                   f"(see docs/privacy.md)"]
    # once per invocation, from its first run (-pv 1 -t 3: runs 1 and 2), and never without -dp
    fomo = get_server_class("FedFomo")
    cfg = parse_config(["-algo", "FedFomo", "-dlg", "-pv", "1", "-t", "3"]).replace(num_classes=10)
    warned = []
    for run, privacy in ((1, True), (2, True), (1, False)):
        server = object.__new__(fomo)  # what the plug-in reads of the server being built: its class and run
        server.run = run
        SampleDP.build(cfg.replace(privacy=privacy), server)
        warned.append(sum(line.startswith("warning: -dp") for line in capsys.readouterr().err.splitlines()))
    assert warned == [1, 0, 0]


@pytest.mark.optional_deps("opacus")
def test_training_that_bypasses_dp_is_an_error(digits_tiny_root, monkeypatch):
    """The guard: a client that trained under -dp with an empty accountant stops the run (no epsilon 0)."""
    monkeypatch.setattr(Client, "local_update", lambda self, r: None)  # trains without any DP-SGD step
    with pytest.raises(FLError, match="DP accountant is empty"):
        main.run(parse_config(flags("FedAvg", digits_tiny_root, "-gr", "1", "--results_dir",
                                         str(digits_tiny_root / "guard"))))


@pytest.mark.optional_deps("opacus")
def test_secure_rng_differs_between_runs_seeded_noise_does_not(digits_tiny_root, monkeypatch):
    runs = {}
    for name, extra in (("seeded", ()), ("seeded2", ()), ("secure", ("--dp_secure_rng",)),
                        ("secure2", ("--dp_secure_rng",))):
        runs[name] = Counted("FedAvg", digits_tiny_root, monkeypatch, "-gr", "1", *extra).rounds(0, 1)["global"]
    assert torch.equal(runs["seeded"], runs["seeded2"])  # the default is reproducible
    assert not torch.equal(runs["secure"], runs["secure2"])  # OS-seeded: two runs differ
    with pytest.raises(FLError, match="--dp_secure_rng needs -dp"):
        parse_config(["--dp_secure_rng"])


def test_a_declaration_cannot_be_changed_in_place():
    """The base server's declaration is shared by every algorithm that declares none: it is frozen, so no
    algorithm can change what the others declare."""
    import dataclasses

    from flcore.servers.serverbase import Server

    assert get_server_class("FedAvg").declares.dp_support is Server.declares.dp_support
    with pytest.raises(dataclasses.FrozenInstanceError):
        Server.declares.dp_support.refusal = "changed"
    assert Server.declares.dp_support == dp_support.DPSupport()
