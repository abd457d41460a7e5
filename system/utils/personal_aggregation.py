"""Math of the personalised-aggregation baselines (FedAMP, FedFomo, APPLE, PartialFed), as small pure
functions the client/server hooks call and the tests check by hand. Models travel as state dicts."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from utils.aggregate import weighted_average

State = Mapping[str, torch.Tensor]


def flat(state: State, keys: Sequence[str]) -> torch.Tensor:
    """The entries ``keys`` of ``state`` as one float64 vector."""
    return torch.cat([state[k].detach().reshape(-1).to(torch.float64) for k in keys])


def pairwise_sq_dists(states: Sequence[State], keys: Sequence[str]) -> torch.Tensor:
    """N x N matrix of ||w_i - w_j||^2 over the entries ``keys``."""
    w = torch.stack([flat(s, keys) for s in states])
    return torch.cdist(w, w).pow(2)


def lerp_state(base: State, target: State, s: float) -> dict[str, torch.Tensor]:
    """base + s (target - base) on floating entries (s may exceed 1: an extrapolation); integer entries
    (BatchNorm's step counter) are kept from ``base``."""
    return {k: (v + s * (target[k] - v)) if v.is_floating_point() else v.clone() for k, v in base.items()}


# ---- FedAMP ------------------------------------------------------------------------------------------
def amp_attention(sq_dists: torch.Tensor, alpha_k: float, sigma: float) -> torch.Tensor:
    """FedAMP's message-passing weights (Huang et al., AAAI 2021, with the paper's A(x) = 1 - exp(-x/σ)):
    ξ_ij = α_k A'(||w_i - w_j||^2) = α_k exp(-||w_i - w_j||^2 / σ) / σ for j ≠ i and ξ_ii = 1 - Σ_{j≠i} ξ_ij,
    so every row sums to one and closer clients get more weight. ξ_ii < 0 (α_k too large for σ) makes
    u_i an extrapolation, as the paper's gradient step on A allows; α_k <= σ / (N - 1) keeps it convex."""
    xi = alpha_k * torch.exp(-sq_dists / sigma) / sigma
    xi.fill_diagonal_(0.0)
    xi += torch.diag(1.0 - xi.sum(1))
    return xi


# ---- FedFomo -----------------------------------------------------------------------------------------
def fomo_scores(own_loss: float, losses: Sequence[float], dists: Sequence[float]) -> torch.Tensor:
    """FedFomo's first-order scores (Zhang et al., ICLR 2021, Eq. 6): (L(θ_i) - L(θ_n)) / ||θ_n - θ_i||,
    negative for a neighbour that raises the validation loss."""
    gain = own_loss - torch.as_tensor(losses, dtype=torch.float64)
    return gain / torch.as_tensor(dists, dtype=torch.float64).clamp_min(1e-12)


def fomo_weights(scores: torch.Tensor) -> torch.Tensor:
    """The update's weights: max(0, score), normalised to sum to one; all zeros when no neighbour lowers
    the validation loss."""
    w = scores.clamp_min(0.0)
    total = w.sum()
    return w / total if total > 0 else w


def fomo_affinity_step(scores: torch.Tensor) -> torch.Tensor:
    """What each neighbour's affinity changes by: its score over |Σ scores| (at least 1e-9), as the official
    code does, so a neighbour that raises the loss loses affinity."""
    return scores / scores.sum().abs().clamp_min(1e-9)


# ---- APPLE -------------------------------------------------------------------------------------------
def apple_lambda(round_idx: int, total_rounds: int, frac: float, schedule: str = "cosine") -> float:
    """APPLE's proximal-term schedule λ(r) over the first int(L R) rounds (L = ``frac``, ``-L``), 0 from
    then on, hence always 0 when int(L R) = 0 (Luo & Wu, IJCAI 2022): cosine (cos(π r / int(L R)) + 1) / 2,
    or exponential 0.001^(r / int(L R)) (both, and the int, as in the official code)."""
    horizon = int(frac * total_rounds)
    if round_idx >= horizon:
        return 0.0
    if schedule == "cosine":
        return (math.cos(math.pi * round_idx / horizon) + 1) / 2
    return 0.001 ** (round_idx / horizon)


# ---- PartialFed --------------------------------------------------------------------------------------
def gumbel_straight_through(logits: torch.Tensor, tau: float, generator: torch.Generator) -> torch.Tensor:
    """A hard one-hot sample per row of ``logits`` (L x 2) whose gradient is that of the Gumbel-softmax
    relaxation at temperature ``tau`` (straight-through estimator); noise from ``generator``."""
    u = torch.rand(logits.shape, generator=generator).to(logits.device).clamp(1e-10, 1 - 1e-10)
    soft = torch.softmax((logits - torch.log(-torch.log(u))) / tau, dim=-1)
    hard = torch.nn.functional.one_hot(soft.argmax(-1), logits.shape[-1]).to(soft.dtype)
    return hard - soft.detach() + soft


def layer_of(names: Sequence[str], groups: Sequence[Sequence[str]]) -> dict[str, int]:
    """Map state entries to their layer index: a parameter to its group, a buffer (BatchNorm statistics) to
    the group of its module's parameters; entries of no layer are left out."""
    index = {p: i for i, g in enumerate(groups) for p in g}
    module = {p.rsplit(".", 1)[0]: i for p, i in index.items()}
    return {n: index[n] if n in index else module[n.rsplit(".", 1)[0]]
            for n in names if n in index or n.rsplit(".", 1)[0] in module}


def compose_by_layer(local: State, glob: State, layer: Mapping[str, int],
                     from_global: Sequence[bool]) -> dict[str, torch.Tensor]:
    """PartialFed's partial initialisation: every entry of layer l comes from ``glob`` if from_global[l],
    else from ``local``; entries of no layer come from ``glob``."""
    return {k: (glob[k] if k not in layer or from_global[layer[k]] else v).detach().clone()
            for k, v in local.items()}


def mix_by_layer(local: State, glob: State, layer: Mapping[str, int],
                 weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """PartialFed's relaxed composition: entry k of layer l is weights[l, 0] glob[k] + weights[l, 1] local[k]
    (``weights`` L x 2, e.g. straight-through Gumbel-softmax samples, so gradients reach them); entries
    of no layer come from ``glob``."""
    return {k: weights[layer[k], 0] * g + weights[layer[k], 1] * local[k] if k in layer else g
            for k, g in glob.items()}


def attentive_message(states: Sequence[State], xi_row: torch.Tensor, i: int) -> dict[str, torch.Tensor]:
    """FedAMP's cloud model u_i = Σ_j ξ_ij w_j = w_i + s (m - w_i), with s = Σ_{j≠i} ξ_ij and m the
    ξ-weighted mean of the other clients' models (u_i = w_i when no other client gets weight)."""
    others = [j for j in range(len(states)) if j != i]
    s = float(sum(xi_row[j] for j in others))
    if s <= 0:
        return {k: v.detach().clone() for k, v in states[i].items()}
    mean = weighted_average([states[j] for j in others], [float(xi_row[j]) for j in others])
    return lerp_state(states[i], mean, s)
