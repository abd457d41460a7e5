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
