"""Every random draw of a run comes from here.

A stream is named by (seed, run, *keys), e.g. (1, 0, "batches", 7) for client 7's batch order in run 0.
Streams are independent of each other, so one algorithm's extra draws never shift another stream (who gets
selected, which batches a client sees). Nothing is seeded at import time.
"""
from __future__ import annotations

import contextlib
import zlib

import numpy as np
import torch


def _key(k) -> int:
    if isinstance(k, (int, np.integer)):
        return int(k)
    return zlib.crc32(str(k).encode())


def derive_seed(seed: int, run: int, *keys) -> int:
    """A 63-bit integer seed for the stream (seed, run, *keys)."""
    ss = np.random.SeedSequence([int(seed) + int(run), *(_key(k) for k in keys)])
    return int(ss.generate_state(2, dtype=np.uint32).astype(np.uint64) @ np.array([1 << 31, 1], np.uint64))


def np_rng(seed: int, run: int, *keys) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, run, *keys))


def torch_gen(seed: int, run: int, *keys, device="cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(seed, run, *keys))
    return g


@contextlib.contextmanager
def torch_seeded(seed: int, run: int, *keys):
    """Run a block (model construction, whose initialisers draw from the global torch RNG) under a derived
    seed, restoring the global RNG state afterwards so nothing outside the block depends on it."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, run, *keys))
        yield
