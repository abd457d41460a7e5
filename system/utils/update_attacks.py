"""Omniscient model-poisoning attacks in update space (``--attack alie|ipm|minmax|minsum``): pure functions
of the round's benign updates, stacked as the rows of an m x d float tensor, that return the update every
malicious client of the round uploads (all of them upload the same one, as in the papers).

The attacker is omniscient, as in the papers' evaluations: it sees every benign upload of the round
(``utils/attacks.py`` builds the rows as upload - global model, parameters only). With μ and σ the
coordinate-wise mean and standard deviation of the benign updates (σ with Bessel's correction, 0 for a
single row):

- ``alie``, "A Little Is Enough" (Baruch, Baruch & Goldberg, NeurIPS 2019): μ - z σ, where z comes from
  the n uploads of the round and the f malicious ones: s = floor(n/2 + 1) - f benign values must be "won
  over", and z = Φ⁻¹((n - s) / n) (Φ the standard normal CDF; n = 20, f = 4: s = 7, z = Φ⁻¹(0.65) ≈ 0.385).
- ``ipm``, inner-product manipulation (Xie, Koyejo & Gupta, UAI 2020): -ε μ; the paper's two settings are
  ε = 0.1 (small enough to pass median- and distance-based rules) and ε = 100 (to reverse the mean).
- ``minmax`` / ``minsum`` (Shejwalkar & Houmansadr, NDSS 2021, their AGR-agnostic attacks): μ + γ ∇p,
  with ∇p one of their perturbation vectors (``unit_vec`` -μ/||μ||, ``std`` -σ, ``sign`` -sign(μ)) and the
  largest γ their halving search finds such that the malicious update is no farther from the benign ones
  than they are from each other: Min-Max max_i ||m - b_i|| <= max_{i,j} ||b_i - b_j||, Min-Sum
  sum_i ||m - b_i||² <= max_i sum_j ||b_i - b_j||².

The papers state these on gradients; here they act on updates (about -lr times a gradient). The vectors
built from μ (IPM, ∇p's unit_vec and sign) mean the same thing in both spaces, since they are relative to
μ; σ has no direction, so μ - zσ (ALIE) and μ - γσ (the std perturbation) shift every coordinate the same
way by a multiple of its spread, which is the papers' construction with the sign taken on the updates.
"""
from __future__ import annotations

from statistics import NormalDist
from typing import Callable

import torch

PERTURBATIONS = ("unit_vec", "std", "sign")
GAMMA_INIT = 10.0  # Shejwalkar & Houmansadr's starting γ
GAMMA_TOL = 1e-5  # their stopping threshold τ on |γ_succ - γ|
MAX_HALVINGS = 200  # a cap the search never reaches: the step halves each time, so |γ_succ - γ| < τ long before


def std_rows(x: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise standard deviation of the rows (Bessel's correction), zeros for fewer than two rows."""
    return x.std(dim=0) if x.shape[0] > 1 else torch.zeros_like(x[0])


def alie_z(n: int, f: int) -> float:
    """ALIE's z for n uploads of which f are malicious: s = floor(n/2 + 1) - f, z = Φ⁻¹((n - s) / n)."""
    s = n // 2 + 1 - f
    if not 0 < s < n:
        raise ValueError(f"ALIE: n = {n} uploads with f = {f} malicious gives s = {s}; it needs 0 < s < n")
    return NormalDist().inv_cdf((n - s) / n)


def alie(benign: torch.Tensor, n: int, f: int) -> torch.Tensor:
    """μ - z σ of the benign rows, z = ``alie_z(n, f)``."""
    return benign.mean(dim=0) - alie_z(n, f) * std_rows(benign)


def ipm(benign: torch.Tensor, eps: float) -> torch.Tensor:
    """-ε μ of the benign rows."""
    return -eps * benign.mean(dim=0)


def perturbation(benign: torch.Tensor, kind: str) -> torch.Tensor:
    """Shejwalkar & Houmansadr's ∇p: ``unit_vec`` -μ/||μ|| (zeros when μ = 0), ``std`` -σ, ``sign`` -sign(μ)."""
    mu = benign.mean(dim=0)
    if kind == "unit_vec":
        norm = float(mu.norm())
        return -mu / norm if norm > 0 else torch.zeros_like(mu)
    if kind == "std":
        return -std_rows(benign)
    if kind == "sign":
        return -torch.sign(mu)
    raise ValueError(f"unknown perturbation '{kind}'; choose one of {', '.join(PERTURBATIONS)}")


def halving_search(accept: Callable[[float], bool], gamma_init: float = GAMMA_INIT, tol: float = GAMMA_TOL) -> float:
    """The largest γ the oracle ``accept`` takes, by Shejwalkar & Houmansadr's search: γ starts at
    ``gamma_init`` and moves up (accepted) or down (refused) by gamma_init/2, gamma_init/4, ... until the
    last accepted γ and the current one differ by at most ``tol``; returns the last accepted γ (0 if none)."""
    gamma, step, best = gamma_init, gamma_init, 0.0
    for _ in range(MAX_HALVINGS):
        if abs(best - gamma) <= tol:
            break
        if accept(gamma):
            best = gamma
            gamma += step / 2
        else:
            gamma -= step / 2
        step /= 2
    return best


def _spread(benign: torch.Tensor, dev: torch.Tensor):
    """μ, and for m = μ + γ ∇p the squared distance to each benign row as a function of γ:
    ||b_i - μ||² - 2γ (b_i - μ)·∇p + γ² ||∇p||², from three precomputed terms (each oracle call of the
    halving search is then O(rows), not a pass over the m x d matrix)."""
    mu = benign.mean(dim=0)
    c = benign - mu
    a, b, e = c.pow(2).sum(dim=1), c @ dev, float(dev @ dev)
    return mu, lambda g: (a - 2 * g * b + g * g * e).clamp_min(0)


def _benign_distances(benign: torch.Tensor) -> torch.Tensor:
    """Squared distances between the benign rows (0 on the diagonal), from their Gram matrix."""
    from utils.aggregate import squared_distances

    return squared_distances(benign).fill_diagonal_(0.0)


def min_max(benign: torch.Tensor, kind: str = "std", gamma_init: float = GAMMA_INIT,
            tol: float = GAMMA_TOL) -> torch.Tensor:
    """μ + γ ∇p with the largest γ for which max_i ||m - b_i|| <= max_{i,j} ||b_i - b_j||."""
    dev = perturbation(benign, kind)
    mu, dist2 = _spread(benign, dev)
    bound = float(_benign_distances(benign).max())
    gamma = halving_search(lambda g: float(dist2(g).max()) <= bound, gamma_init, tol)
    return mu + gamma * dev


def min_sum(benign: torch.Tensor, kind: str = "std", gamma_init: float = GAMMA_INIT,
            tol: float = GAMMA_TOL) -> torch.Tensor:
    """μ + γ ∇p with the largest γ for which sum_i ||m - b_i||² <= max_i sum_j ||b_i - b_j||²."""
    dev = perturbation(benign, kind)
    mu, dist2 = _spread(benign, dev)
    bound = float(_benign_distances(benign).sum(dim=1).max())
    gamma = halving_search(lambda g: float(dist2(g).sum()) <= bound, gamma_init, tol)
    return mu + gamma * dev


def malicious_update(kind: str, benign: torch.Tensor, n: int, f: int, eps: float = 0.1,
                     dev: str = "std") -> torch.Tensor:
    """The update each of the round's f malicious clients uploads under attack ``kind``, from the m benign
    updates (rows of ``benign``) of a round of n uploads."""
    if kind == "alie":
        return alie(benign, n, f)
    if kind == "ipm":
        return ipm(benign, eps)
    if kind == "minmax":
        return min_max(benign, dev)
    if kind == "minsum":
        return min_sum(benign, dev)
    raise ValueError(f"'{kind}' is not an update-space attack; choose alie, ipm, minmax or minsum")
