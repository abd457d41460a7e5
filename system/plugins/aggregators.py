"""Aggregation rules (``--aggregator``, the plug-in plugins/robust.py): pure functions on stacked flat
uploads, kept apart from the orchestration so tests can check them by hand.

Adding a rule is one function here, registered by name with ``@rule("name")``: ``--aggregator`` lists it
(read from this file's source, without torch: plugins/__init__.py ``registered``) and every algorithm whose
server averages through ``Server.average_uploads`` can use it. A rule takes the n uploads of a round as rows
of an n x d float64 matrix ``x`` (every floating entry the algorithm averages, parameters and BatchNorm
statistics alike, flattened in name order) and a ``RuleInputs`` (the sample weights, the number f of
Byzantine uploads assumed this round, ``--trim_frac``, the model the uploads are averaged into as a
d-vector, the centered rules' options, and ``note`` to say when the rule degenerates), and returns one
d-vector, or a list of row indices whose uploads are averaged with their sample weights (a selection rule:
Krum). Integer entries (BatchNorm's ``num_batches_tracked``) always get the rounded sample-weighted mean of
``weighted_average`` (of the selected uploads, for a selection rule). Which rules use the sample counts:

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
- ``bulyan`` (El Mhamdi, Guerraoui & Rouault, ICML 2018), unweighted: θ = n - 2f uploads chosen one at a time
  by Krum (each time the lowest score, over the n' - f - 2 nearest of the n' uploads still in the pool,
  floored at 0, ties to the lower index), then per coordinate the mean of the β = θ - 2f of their values
  closest to their median (ties to the earlier chosen). Its guarantee needs n >= 4f + 3 (β >= 3); below it
  the rule still runs with β = max(n - 4f, 1) (the server says so in one line), and it needs θ >= 1.
- ``cclip``, centered clipping (Karimireddy, He & Jaggi, ICML 2021), unweighted, on the updates x_i (upload
  - the model they are averaged into): from the center v (the previous round's aggregate update, zero at
  the first round), ``iters`` times v <- v + (1/n) sum_i (x_i - v) min(1, τ / ||x_i - v||); the aggregate
  is the model plus v, and v is kept as the next round's center (checkpointed with the server). Defaults
  τ = 10 and one iteration, as in the authors' code; their paper's analysis needs a single iteration.
- ``normclip``, norm bounding (Sun et al., "Can you really backdoor federated learning?", 2019): each
  update scaled to norm at most M, x_i <- x_i / max(1, ||x_i|| / M), then their sample-weighted mean (FedAvg
  on bounded updates); M = ``--norm_bound``, by default the median of the round's update norms.
f (Krum, Multi-Krum, Bulyan) is ``--krum_f`` when given (a misestimate is expressible), otherwise the count
of the round's uploads that come from malicious clients (0 without ``--attack``). A rule that degenerates in
a round says so once per run (the trimmed mean's k = 0, the median of two uploads, Multi-Krum with f = 0,
Bulyan below 4f + 3 uploads).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import torch

from utils.aggregate import squared_distances, weighted_average

RULES: dict[str, Callable] = {}


def rule(name: str, *, takes_f: bool = False):
    """Register the decorated function as ``--aggregator name``; ``takes_f``: it reads f (``--krum_f`` applies)."""
    def register(fn):
        RULES[name] = fn
        return fn
    return register


@dataclasses.dataclass
class RuleInputs:
    """What a rule may read besides the uploads: ``weights`` (n, float64, as sent), ``f`` (Byzantine uploads
    assumed this round), ``trim_frac``, ``reference`` (the model the uploads are averaged into, as a d-vector;
    None in a bare call), ``center`` / ``tau`` / ``iters`` (centered clipping), ``norm_bound`` (norm
    bounding) and ``note(text)``, which says once per run that the rule degenerates (a warning line)."""
    weights: torch.Tensor
    f: int
    trim_frac: float
    reference: torch.Tensor | None
    center: torch.Tensor | None
    tau: float
    iters: int
    norm_bound: float | None
    note: Callable[[str], None]


@rule("mean")
def mean(x: torch.Tensor, inputs: RuleInputs) -> torch.Tensor:
    """The sample-weighted mean (``aggregate`` computes it entry by entry, exactly as FedAvg)."""
    return inputs.weights / inputs.weights.sum() @ x


@rule("median")
def median(x: torch.Tensor, inputs: RuleInputs) -> torch.Tensor:
    if x.shape[0] <= 2:
        inputs.note(f"the median of {x.shape[0]} upload(s) is their unweighted mean")
    return coordinate_median(x)


@rule("trimmed_mean")
def trimmed(x: torch.Tensor, inputs: RuleInputs) -> torch.Tensor:
    n = x.shape[0]
    k = int(inputs.trim_frac * n)
    if k == 0:
        inputs.note(f"k = floor({inputs.trim_frac:g} x {n}) = 0: nothing is trimmed (the unweighted mean)")
    return trimmed_mean(x, k)


@rule("krum", takes_f=True)
def krum(x: torch.Tensor, inputs: RuleInputs) -> list[int]:
    return krum_select(x, inputs.f, 1)


@rule("multikrum", takes_f=True)
def multikrum(x: torch.Tensor, inputs: RuleInputs) -> list[int]:
    if inputs.f == 0:
        inputs.note("f = 0: Multi-Krum keeps every upload (the weighted mean)")
    return krum_select(x, inputs.f, x.shape[0] - inputs.f)


@rule("geomed")
def geomed(x: torch.Tensor, inputs: RuleInputs) -> torch.Tensor:
    return geometric_median(x, inputs.weights)


@rule("bulyan", takes_f=True)
def bulyan_rule(x: torch.Tensor, inputs: RuleInputs) -> torch.Tensor:
    n, f = x.shape[0], inputs.f
    if 2 * f < n < 4 * f + 3:
        inputs.note(f"{n} uploads, fewer than 4f + 3 = {4 * f + 3} (f = {f}); its guarantee is lost and it "
                    f"averages {max(n - 4 * f, 1)} value(s) per coordinate")
    return bulyan(x, f)


@rule("cclip")
def cclip(x: torch.Tensor, inputs: RuleInputs) -> torch.Tensor:
    ref = inputs.reference
    center = torch.zeros_like(ref) if inputs.center is None else inputs.center
    return ref + centered_clip(x - ref, center, inputs.tau, inputs.iters)


@rule("normclip")
def normclip(x: torch.Tensor, inputs: RuleInputs) -> torch.Tensor:
    ref = inputs.reference
    return ref + norm_clip(x - ref, inputs.weights, inputs.norm_bound)


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
    return squared_distances(x).sort(dim=1).values[:, :n - f - 2].sum(dim=1)


def krum_select(x: torch.Tensor, f: int, m: int) -> list[int]:
    """Indices of the m rows of lowest Krum score (ties: the lower index first)."""
    return torch.sort(krum_scores(x, f), stable=True).indices[:m].tolist()


def bulyan_sizes(n: int, f: int) -> tuple[int, int]:
    """Bulyan's (θ, β) for n uploads and f assumed Byzantine: θ = n - 2f, β = max(θ - 2f, 1)."""
    theta = n - 2 * f
    if theta < 1:
        raise ValueError(f"Bulyan keeps n - 2f = {theta} of {n} uploads with f = {f}; it needs n > 2f")
    return theta, max(theta - 2 * f, 1)


def bulyan(x: torch.Tensor, f: int) -> torch.Tensor:
    """Bulyan of the rows of ``x`` (see the module docstring)."""
    theta, beta = bulyan_sizes(x.shape[0], f)
    d2 = squared_distances(x)  # computed once; each Krum step reads the pool's sub-matrix
    pool, chosen = list(range(x.shape[0])), []
    for _ in range(theta):
        k = max(len(pool) - f - 2, 0)
        scores = d2[pool][:, pool].sort(dim=1).values[:, :k].sum(dim=1)
        chosen.append(pool.pop(int(torch.sort(scores, stable=True).indices[0])))
    s = x[chosen]
    near = (s - coordinate_median(s)).abs().sort(dim=0, stable=True).indices[:beta]
    return s.gather(0, near).mean(dim=0)


def centered_clip(x: torch.Tensor, center: torch.Tensor, tau: float, iters: int) -> torch.Tensor:
    """Centered clipping of the rows of ``x`` around ``center`` (see the module docstring)."""
    v = center
    for _ in range(iters):
        diff = x - v
        norm = diff.norm(dim=1)
        scale = torch.where(norm > tau, tau / norm.clamp_min(1e-300), torch.ones_like(norm))
        v = v + (diff * scale[:, None]).mean(dim=0)
    return v


def norm_clip(x: torch.Tensor, weights: torch.Tensor, bound: float | None = None) -> torch.Tensor:
    """The weighted mean of the rows of ``x`` each scaled to norm at most ``bound`` (default: the median of
    the row norms, for even n the mean of the two middle ones)."""
    norm = x.norm(dim=1)
    m = float(coordinate_median(norm[:, None])[0]) if bound is None else bound
    scale = torch.where(norm > m, m / norm.clamp_min(1e-300), torch.ones_like(norm))
    w = weights / weights.sum()
    return w @ (x * scale[:, None])


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
              keys=None, trim_frac: float = 0.2, krum_f: int = 0, reference: Mapping | None = None,
              center: torch.Tensor | None = None, tau: float = 10.0, iters: int = 1,
              norm_bound: float | None = None, note: Callable[[str], None] | None = None) -> dict[str, torch.Tensor]:
    """The ``rule`` aggregate of the entries ``keys`` (default: all) of ``states`` (see the module
    docstring); ``mean`` is ``weighted_average`` itself. ``reference``: the state the uploads are averaged
    into (by the same names), which ``cclip`` and ``normclip`` need; ``cclip`` also takes its ``center``
    update (the flat floating entries; None: zero), ``tau`` and ``iters``, ``normclip`` its ``norm_bound``."""
    if rule == "mean":
        return weighted_average(states, weights, keys)
    if rule not in RULES:
        raise ValueError(f"unknown aggregator '{rule}'; choose one of {', '.join(RULES)}")
    keys = list(keys if keys is not None else states[0].keys())
    floating = [k for k in keys if states[0][k].is_floating_point()]
    if not floating:
        return weighted_average(states, weights, keys)
    x = flatten(states, floating)
    inputs = RuleInputs(torch.as_tensor([float(w) for w in weights], dtype=torch.float64), krum_f, trim_frac,
                        None if reference is None else flatten([reference], floating)[0], center, tau, iters,
                        norm_bound, note or (lambda text: None))
    result = RULES[rule](x, inputs)
    if isinstance(result, list):  # a selection: its uploads' weighted mean, every entry
        return weighted_average([states[i] for i in result], [weights[i] for i in result], keys)
    out = weighted_average(states, weights, [k for k in keys if not states[0][k].is_floating_point()])
    out.update(unflatten(result, states[0], floating))
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
