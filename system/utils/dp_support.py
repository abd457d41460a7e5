"""The privacy declarations: which DP level a run asks for (``sample_level``, ``client_level``), each algorithm's
one declaration (its server's ``dp_support``, a ``DPSupport``), the start-up check (``check_support``), the
data-dependent steps a reported epsilon leaves out (``uncovered_steps``) and docs/privacy.md's per-algorithm table
generated from the declarations (``coverage_table``). Plain data, no torch: every server module imports it."""
from __future__ import annotations

import dataclasses

from utils.errors import FLError


def client_level(cfg) -> bool:
    """``-dp --dp_level client``: the server clips and noises model updates (no DP-SGD on the clients)."""
    return bool(cfg.privacy) and getattr(cfg, "dp_level", "sample") == "client"


def sample_level(cfg) -> bool:
    """``-dp`` with ``--dp_level sample`` (the default): DP-SGD on every client."""
    return bool(cfg.privacy) and getattr(cfg, "dp_level", "sample") == "sample"


ALA_UNCOVERED = "ALA's weight learning on local training data (-ala / FedALA)"


@dataclasses.dataclass(frozen=True)
class DPSupport:
    """An algorithm's one privacy declaration (its server's ``dp_support``), each field one line, "" for none:

    - ``refusal``: why it refuses ``-dp`` at every level (its data-dependent steps or uploads lie outside what
      DP-SGD and the update release can privatise);
    - ``client_refusal``: why it refuses ``--dp_level client`` only (the release needs one model update per
      client, averaged into one global model);
    - ``uncovered``: the data-dependent steps its DP-SGD epsilon does not cover (a warning at start-up).

    ``check_support`` enforces it at start-up, ``uncovered_steps`` reads it, and docs/privacy.md's coverage
    table is ``coverage_table`` of every registered algorithm's (tests/test_dp_registry.py)."""
    refusal: str = ""
    client_refusal: str = ""
    uncovered: str = ""


def check_support(cfg, server_cls) -> None:
    """Refuse ``-dp`` (any level) or ``--dp_level client`` where the algorithm's ``dp_support`` says why."""
    support = server_cls.declares.dp_support
    if cfg.privacy and support.refusal:
        raise FLError(f"-dp: {cfg.algorithm} is refused: {support.refusal}; drop -dp")
    if client_level(cfg) and support.client_refusal:
        raise FLError(f"--dp_level client: {cfg.algorithm} is refused: {support.client_refusal}; "
                      f"use --dp_level sample")


def uncovered_steps(cfg, cls) -> list[str]:
    """The data-dependent steps of this configuration (``cls``: its server class) that the reported
    epsilon does not cover: its ``dp_support.uncovered`` and, with ALA, its weight learning. The one list
    the start-up warning and docs/privacy.md's table are built from. With ``--dp_level client`` every local
    step is covered (the clipped update bounds a client's whole contribution): nothing is listed."""
    if client_level(cfg):
        return []
    steps = [cls.declares.dp_support.uncovered] if cls.declares.dp_support.uncovered else []
    client_ala = cls.declares.client_class.declares.use_ala
    if (cfg.ala or client_ala) and ALA_UNCOVERED not in steps:
        steps.append(ALA_UNCOVERED)
    return steps


def coverage_table(servers: dict) -> str:
    """docs/privacy.md's per-algorithm table, from the declarations of ``servers`` (-algo name -> server
    class, in registry order): every algorithm that refuses a level or whose epsilon leaves a step out, and
    ``-ala`` (any algorithm)."""
    rows = ["| algorithm | `-dp` (DP-SGD) | `-dp --dp_level client` (DP-FedAvg) |", "|---|---|---|"]
    for name, cls in servers.items():
        s = cls.declares.dp_support
        uncovered = s.uncovered or (ALA_UNCOVERED if cls.declares.client_class.declares.use_ala else "")
        if not (s.refusal or s.client_refusal or uncovered):
            continue
        sample = f"refused: {s.refusal}" if s.refusal else (
            f"not covered by the reported epsilon: {uncovered}" if uncovered else "covered")
        client = ("refused (as `-dp`)" if s.refusal else f"refused: {s.client_refusal}" if s.client_refusal
                  else "covered")
        rows.append(f"| {name} | {sample} | {client} |")
    rows.append(f"| -ala | not covered by the reported epsilon: {ALA_UNCOVERED} | covered |")
    return "\n".join(rows) + "\n"
