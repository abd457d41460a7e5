"""Robust aggregation rules (``--aggregator``): pure functions on lists of state dicts and on stacked flat
updates, kept apart from the orchestration so tests can check them by hand.

Each rule takes the n uploads of a round as rows of an n x d float64 matrix (every floating entry the
algorithm averages, parameters and BatchNorm statistics alike, flattened in name order) and returns one
d-vector; integer entries (BatchNorm's ``num_batches_tracked``) always get the rounded sample-weighted mean
of ``weighted_average``. Which rules use the sample counts:

- ``mean``: the sample-weighted mean (FedAvg; exactly ``weighted_average``).
- ``median``: the coordinate-wise median, unweighted (Yin et al., ICML 2018); for even n the mean of the
  two middle values.
- ``trimmed_mean``: per coordinate, the k = floor(β n) largest and k smallest values dropped and the rest
  averaged, unweighted (Yin et al. 2018, β = ``--trim_frac``); needs 2k < n.
- ``krum``: the one upload whose score, the sum of squared distances to its n - f - 2 nearest other
  uploads, is lowest (Blanchard et al., NeurIPS 2017; f = ``--krum_f``); needs n > 2f + 2. Ties go to the
  lower index.
- ``multikrum``: the m = n - f uploads of lowest Krum score, averaged with their sample weights (with
  f = 0 that is FedAvg).
- ``geomed``: the sample-weighted geometric median, argmin_z sum_i w_i ||z - x_i||, by Weiszfeld's
  iteration from the weighted mean (RFA, Pillutla et al., IEEE TSP 2022), each distance floored at
  ``nu`` so that an iterate on a point does not divide by zero; it stops when a step moves z by at most
  ``tol`` x max(1, ||z||), or after ``max_iter`` steps.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from utils.aggregate import weighted_average

RULES = ("mean", "median", "trimmed_mean", "krum", "multikrum", "geomed")


def coordinate_median(x: torch.Tensor) -> torch.Tensor:
    """Per column of the n x d ``x``: the middle value (odd n) or the mean of the two middle ones (even n)."""
    s = x.sort(dim=0).values
    n = s.shape[0]
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def trimmed_mean(x: torch.Tensor, k: int) -> torch.Tensor:
    """Per column: the mean of the values left after the k smallest and k largest are dropped."""
    n = x.shape[0]
    if not 0 <= 2 * k < n:
        raise ValueError(f"trimmed mean: dropping {k} from each end of {n} values leaves none")
    return x.sort(dim=0).values[k:n - k].mean(dim=0)


def krum_scores(x: torch.Tensor, f: int) -> torch.Tensor:
    """Krum's score of each row: the sum of its squared distances to its n - f - 2 nearest other rows."""
    n = x.shape[0]
    if n <= 2 * f + 2:
        raise ValueError(f"Krum needs more than 2f + 2 = {2 * f + 2} uploads, got {n}")
    d2 = torch.stack([(x - row).pow(2).sum(dim=1) for row in x])  # exact squares, not a rounded norm squared
    d2.fill_diagonal_(float("inf"))  # a row is not its own neighbour
    return d2.sort(dim=1).values[:, :n - f - 2].sum(dim=1)


def krum_select(x: torch.Tensor, f: int, m: int) -> list[int]:
    """Indices of the m rows of lowest Krum score (ties: the lower index first)."""
    return torch.sort(krum_scores(x, f), stable=True).indices[:m].tolist()


def geometric_median(x: torch.Tensor, weights: torch.Tensor, tol: float = 1e-7, max_iter: int = 1000,
                     nu: float = 1e-10) -> torch.Tensor:
    """argmin_z sum_i w_i ||z - x_i|| by Weiszfeld's iteration (see the module docstring)."""
    w = weights / weights.sum()
    z = w @ x
    for _ in range(max_iter):
        dist = (x - z).norm(dim=1).clamp_min(nu)
        beta = w / dist
        new = beta @ x / beta.sum()
        moved = float((new - z).norm())
        z = new
        if moved <= tol * max(1.0, float(z.norm())):
            break
    return z


def aggregate(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float], rule: str = "mean",
              keys=None, trim_frac: float = 0.2, krum_f: int = 0) -> dict[str, torch.Tensor]:
    """The ``rule`` aggregate of the entries ``keys`` (default: all) of ``states`` (see the module
    docstring); ``mean`` is ``weighted_average`` itself."""
    if rule == "mean":
        return weighted_average(states, weights, keys)
    keys = list(keys if keys is not None else states[0].keys())
    n = len(states)
    if rule in ("krum", "multikrum"):
        floating = [k for k in keys if states[0][k].is_floating_point()]
        chosen = krum_select(flatten(states, floating), krum_f, 1 if rule == "krum" else n - krum_f)
        return weighted_average([states[i] for i in chosen], [weights[i] for i in chosen], keys)
    out = weighted_average(states, weights, [k for k in keys if not states[0][k].is_floating_point()])
    floating = [k for k in keys if states[0][k].is_floating_point()]
    if not floating:
        return out
    x = flatten(states, floating)
    if rule == "median":
        flat = coordinate_median(x)
    elif rule == "trimmed_mean":
        flat = trimmed_mean(x, int(trim_frac * n))
    elif rule == "geomed":
        flat = geometric_median(x, torch.as_tensor([float(w) for w in weights], dtype=torch.float64))
    else:
        raise ValueError(f"unknown aggregator '{rule}'; choose one of {', '.join(RULES)}")
    out.update(unflatten(flat, states[0], floating))
    return {k: out[k] for k in keys}


def flatten(states: Sequence[Mapping[str, torch.Tensor]], keys: Sequence[str]) -> torch.Tensor:
    """n x d float64 matrix: row i is state i's entries ``keys`` flattened and concatenated."""
    return torch.stack([torch.cat([s[k].detach().reshape(-1).to(torch.float64) for k in keys]) for s in states])


def unflatten(flat: torch.Tensor, like: Mapping[str, torch.Tensor], keys: Sequence[str]) -> dict:
    """The inverse of ``flatten`` for one row: entries ``keys`` shaped and typed as in ``like``."""
    out, at = {}, 0
    for k in keys:
        ref = like[k]
        out[k] = flat[at:at + ref.numel()].reshape(ref.shape).to(ref.dtype)
        at += ref.numel()
    return out
