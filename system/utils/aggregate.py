"""Aggregation math, kept apart from the orchestration so tests can check it by hand."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch


def weighted_average(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float],
                     keys=None) -> dict[str, torch.Tensor]:
    """Weighted mean of every entry of several state dicts (weights are normalised here).

    Floating entries (parameters and BatchNorm running statistics alike) are averaged; integer entries
    such as BatchNorm's ``num_batches_tracked`` get the rounded weighted mean. ``keys`` restricts the
    average to a subset of entries (e.g. FedRep's body).
    """
    if len(states) == 0:
        raise ValueError("weighted_average needs at least one state")
    if len(states) != len(weights):
        raise ValueError(f"{len(states)} states but {len(weights)} weights")
    w = torch.as_tensor([float(x) for x in weights], dtype=torch.float64)
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {list(weights)}")
    w = w / w.sum()
    out = {}
    for k in (keys if keys is not None else states[0].keys()):
        ref = states[0][k]
        stacked = torch.stack([s[k].detach() for s in states]).to(torch.float64)
        avg = torch.tensordot(w.to(stacked.device), stacked, dims=1)
        out[k] = (avg if ref.is_floating_point() else avg.round()).to(ref.dtype)
    return out


def squared_distances(x: torch.Tensor) -> torch.Tensor:
    """n x n matrix of squared distances between the rows of ``x``, +inf on the diagonal (a row is not its
    own neighbour). From the Gram matrix G of the rows taken relative to the first one: G_ii + G_jj - 2 G_ij,
    floored at 0. One matrix product instead of n passes over n x d differences (20 uploads of the CNN:
    about 0.1 s instead of 2 s a round); translating by a row keeps the cancellation to the uploads' spread
    and small integers stay exact. Equal rows are 0 apart up to the product's rounding (its entries for two
    equal rows need not be computed alike: about 1e-7 of the rows' squared norms)."""
    c = x - x[0]
    g = c @ c.T
    g = (g + g.T) / 2  # the product need not be symmetric to the last bit
    sq = g.diagonal()
    return (sq[:, None] + sq[None, :] - 2 * g).clamp_min(0).fill_diagonal_(float("inf"))
