"""How many clients take part in a round (``-jr``, ``-rjr``): the one rule every reader uses.

PFLlib's semantics: ``-jr`` is the fraction of the N clients selected per round, at least one; with
``-rjr`` the count is drawn each round uniformly from [round(jr * N), N].
"""
from __future__ import annotations

import numpy as np


def join_count(join_ratio: float, n: int) -> int:
    """Clients per round at ratio ``join_ratio`` of ``n`` (rounded, at least one)."""
    return max(1, int(round(join_ratio * n)))


def draw_count(cfg, n: int, rng: np.random.Generator) -> int:
    """This round's number of participants; draws from ``rng`` only with ``-rjr``."""
    k = join_count(cfg.join_ratio, n)
    return int(rng.integers(k, n + 1)) if cfg.random_join_ratio else k


def expected_count(cfg, n: int) -> float:
    """The mean number of participants per round: round(jr * N), or with ``-rjr`` the mean of the uniform
    draw, (round(jr * N) + N) / 2."""
    k = join_count(cfg.join_ratio, n)
    return (k + n) / 2 if cfg.random_join_ratio else float(k)


def select(cfg, n: int, rng: np.random.Generator) -> np.ndarray:
    """The sorted ids of this round's participants, drawn without replacement from ``rng``."""
    return np.sort(rng.choice(n, size=draw_count(cfg, n, rng), replace=False))
