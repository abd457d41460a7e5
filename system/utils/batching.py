"""How a client's samples are cut into training batches: one rule for local training and ALA.

Every sample is used once per epoch (PFLlib drops the last, smaller batch instead). One exception keeps
BatchNorm models trainable: a last batch of a single sample would give BatchNorm one value per channel
wherever a layer's output is 1x1 (ResNet-18's last stage on 32x32 inputs), which it cannot normalise, so
for such models that sample joins the previous batch.

A client's training batches are functions of the client: ``batches(client, epochs)`` (what its
``run_epochs`` and an algorithm's own loops draw), ``batches_per_epoch(client)`` and ``train_count(client)``,
all from the samples its ``train_indices`` hook names.
"""
from __future__ import annotations

import threading

import torch
from torch import nn


def has_batch_norm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def batch_bounds(n: int, batch_size: int, merge_single: bool = False) -> list[tuple[int, int]]:
    """(start, end) of each batch of ``n`` samples in batches of ``batch_size``, the last one smaller;
    with ``merge_single``, a last batch of one sample is merged into the one before it (when there is one)."""
    bounds = [(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]
    if merge_single and len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], n)]
    return bounds


def batches_of(perm: torch.Tensor, batch_size: int, merge_single: bool = False):
    """The index batches of a permutation, cut by ``batch_bounds``."""
    for a, b in batch_bounds(len(perm), batch_size, merge_single):
        yield perm[a:b]


# ---- a client's training batches ------------------------------------------------------------------------
def train_count(client) -> int:
    """How many samples one epoch of ``client``'s local training passes over: those its ``train_indices``
    names (all of its training split when it names None)."""
    pool = client.train_indices()
    return client.train_samples if pool is None else len(pool)


def batches_per_epoch(client, batch_size: int | None = None) -> int:
    """How many batches ``batches`` cuts one epoch of ``client``'s into (of ``batch_size``, default ``-lbs``)."""
    return len(batch_bounds(train_count(client), batch_size or client.cfg.batch_size, client.merge_single))


def batches(client, epochs: int, batch_size: int | None = None, generator: torch.Generator | None = None):
    """Index batches for ``epochs`` passes over ``client``'s training data (its ``train_indices``), shuffled
    from the client's own batch stream (or from ``generator``, for draws that must not shift it, e.g.
    evaluation-time fine-tuning). The last batch of an epoch may be smaller (every sample is used; PFLlib
    drops it); for a model with BatchNorm a last batch of one sample joins the one before it."""
    bs = batch_size or client.cfg.batch_size
    gen = client.batch_gen if generator is None else generator
    pool = client.train_indices()
    for _ in range(epochs):
        perm = torch.randperm(client.train_samples if pool is None else len(pool), generator=gen).to(client.device)
        yield from batches_of(perm if pool is None else pool[perm], bs, client.merge_single)


def sgd_step(params: dict, grads: dict, lrs: dict) -> dict:
    """Plain SGD on stacked entries, p - lr g: the batched executor's step (a client's ``declares.batch_step``
    by default)."""
    return {k: p - lrs[k] * grads[k] for k, p in params.items()}


# ---- the batched executor's seam (runtime/batched.py) ---------------------------------------------------
# While the batched executor runs a client method, the thread running it holds that executor's session
# here; the three computations it batches across clients (a ``run_epochs`` phase, an evaluation's
# ``predict``, an ALA weight epoch) hand their work to it instead of computing it themselves. Outside
# that executor this is always None and nothing changes.
_local = threading.local()


def session():
    """The batched executor's session of this thread, or None."""
    return getattr(_local, "session", None)


def set_session(value) -> None:
    _local.session = value
