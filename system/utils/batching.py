"""How a client's samples are cut into training batches: one rule for local training and ALA.

Every sample is used once per epoch (PFLlib drops the last, smaller batch instead). One exception keeps
BatchNorm models trainable: a last batch of a single sample would give BatchNorm one value per channel
wherever a layer's output is 1x1 (ResNet-18's last stage on 32x32 inputs), which it cannot normalise, so
for such models that sample joins the previous batch.
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
