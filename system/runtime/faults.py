"""Simulated slow clients (PFLlib's ``-tsr`` / ``-ssr`` / ``-tth``), with no real sleeping.

``int(-tsr * N)`` clients are slow to train and ``int(-ssr * N)`` slow to send, chosen once per run
without replacement from their own seeded streams (PFLlib draws with replacement, so fewer distinct
clients end up slow). Each round a client gets a simulated time, drawn from a stream of (seed, run,
client id, round), so it is the same on every executor and after a resume:

    train: a train-slow client waits 0.1·u seconds per local step, u ~ U(0, 1), i.e. PFLlib's per-batch
           ``time.sleep(0.1 * rand)``, summed over the client's ``steps_per_round()`` (its algorithm's
           count of local steps that move the model it uploads);
    send:  a send-slow client waits 0.1·u seconds per transfer, twice (model down, update up);
    others: 0 (real compute time is not part of the simulation, so results never depend on the machine).

A client whose simulated train + send time exceeds ``-tth`` seconds still trains (its local model
advances, as in PFLlib) but its upload misses the round: it is left out of aggregation. PFLlib compares
the running mean of measured times instead, so its outcome depends on the machine's speed. ``-tth``
defaults to PFLlib's 10000 s, i.e. nobody is ever late. Client drop-out (``-cdr``) is separate
(``Server._active_clients``): dropped clients neither train nor upload.
"""
from __future__ import annotations

import numpy as np

from utils.seeding import np_rng

STEP_DELAY = 0.1  # seconds, the scale of PFLlib's per-batch and per-send sleep


def choose(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """A mask of ``int(rate * n)`` distinct clients."""
    mask = np.zeros(n, dtype=bool)
    mask[rng.choice(n, size=int(rate * n), replace=False)] = True
    return mask


class SlowClients:
    def __init__(self, cfg, run: int, steps: list[int]):
        """``steps``: each client's local steps per round (``Client.steps_per_round``)."""
        n = len(steps)
        self.seed, self.run, self.threshold = cfg.seed, run, cfg.time_threshold
        self.train_slow = choose(n, cfg.train_slow_rate, np_rng(cfg.seed, run, "slow-train"))
        self.send_slow = choose(n, cfg.send_slow_rate, np_rng(cfg.seed, run, "slow-send"))
        self.steps = list(steps)

    def time_cost(self, cid: int, round_idx: int) -> float:
        """Simulated seconds client ``cid`` needs in round ``round_idx`` (train + send)."""
        if not (self.train_slow[cid] or self.send_slow[cid]):
            return 0.0
        rng = np_rng(self.seed, self.run, "delay", cid, round_idx)
        train = STEP_DELAY * rng.random(self.steps[cid]).sum() if self.train_slow[cid] else 0.0
        send = STEP_DELAY * rng.random(2).sum() if self.send_slow[cid] else 0.0
        return float(train + send)

    def late(self, cids, round_idx: int) -> set[int]:
        """The clients among ``cids`` whose simulated time exceeds the threshold this round."""
        return {c for c in cids if self.time_cost(c, round_idx) > self.threshold}
