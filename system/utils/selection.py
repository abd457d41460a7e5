"""How many clients take part in a round (``-jr``, ``-rjr``): the one rule every reader uses.

PFLlib's semantics: ``-jr`` is the fraction of the N clients selected per round, k = int(jr * N)
(truncated, as PFLlib computes it), at least one (PFLlib would select none when jr * N < 1); with ``-rjr``
the count is drawn each round uniformly from [k, N].
"""
from __future__ import annotations

import numpy as np


def join_count(join_ratio: float, n: int) -> int:
    """Clients per round at ratio ``join_ratio`` of ``n``: int(jr * n) as PFLlib, at least one."""
    return max(1, int(join_ratio * n))


def draw_count(cfg, n: int, rng: np.random.Generator) -> int:
    """This round's number of participants; draws from ``rng`` only with ``-rjr``."""
    k = join_count(cfg.join_ratio, n)
    return int(rng.integers(k, n + 1)) if cfg.random_join_ratio else k


def expected_count(cfg, n: int) -> float:
    """The mean number of participants per round: k = ``join_count``, or with ``-rjr`` the mean of the
    uniform draw over [k, N], (k + N) / 2."""
    k = join_count(cfg.join_ratio, n)
    return (k + n) / 2 if cfg.random_join_ratio else float(k)


def select(cfg, n: int, rng: np.random.Generator) -> np.ndarray:
    """The sorted ids of this round's participants, drawn without replacement from ``rng``."""
    return np.sort(rng.choice(n, size=draw_count(cfg, n, rng), replace=False))
