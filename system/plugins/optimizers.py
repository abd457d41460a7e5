"""Server optimizers (``--server_opt``, the plug-in plugins/server_opt.py): the server treats the round's
aggregate as a pseudo-gradient step.

Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan. "Adaptive Federated Optimization", ICLR
2021 (arXiv 2003.00295), Algorithm 2; FedAvgM: Hsu, Qi, Brown, "Measuring the Effects of Non-Identical
Data Distribution for Federated Visual Classification", 2019 (arXiv 1909.06335).

For every parameter entry x of the model the server averages (the whole model, or the shared part of a
split model), with x̄ the round's aggregate of the uploads (``--aggregator``), the pseudo-gradient is
g = x - x̄ and, entry-wise:

    sgd      x <- x - η g
    avgm     m <- β1 m + g;                                   x <- x - η m          (Hsu et al.: η 1, β1 0.9)
    adagrad  m <- β1 m + (1 - β1) g;  v <- v + g²;                                    x <- x - η m / (√v + τ)
    adam     m <- β1 m + (1 - β1) g;  v <- β2 v + (1 - β2) g²;                        x <- x - η m / (√v + τ)
    yogi     m <- β1 m + (1 - β1) g;  v <- v - (1 - β2) g² sign(v - g²);              x <- x - η m / (√v + τ)

with m = 0 and v = τ² before the first round (the paper's v_{-1} >= τ², taken at equality) and no bias
correction (as in the paper). sgd at η = 1 is FedAvg up to rounding. η = ``-slr``, β1 =
``--server_momentum``, β2 = ``--server_beta2``, τ = ``--server_tau``. The paper fixes β1 = 0.9 and
β2 = 0.99 in every experiment and tunes η and τ per task on grids 10^{-3..1} and 10^{-5..-1}; the defaults
here (η 0.1 for adagrad, 0.01 for adam and yogi, τ 10^-3) lie in the region its image-classification
tasks found best. BatchNorm running statistics and integer entries are not parameters: they take the
aggregate's value, never a step. The state (m, v) is kept per entry name and carries across rounds; it is
part of the server's checkpointed state (runtime/state.py saves this object's attributes).

Adding an optimizer is one function here, registered with ``@optimizer("name", lr=default η)``: it takes the
optimizer (its hyper-parameters and state ``m``, ``v``), an entry's name, its current value x and the
pseudo-gradient g, and returns the new value.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch

OPTIMIZERS: dict[str, Callable] = {}


def optimizer(name: str, *, lr: float):
    """Register the decorated step as ``--server_opt name`` (``lr``: its default -slr)."""
    def register(fn):
        OPTIMIZERS[name] = fn
        return fn
    return register


@optimizer("sgd", lr=1.0)
def sgd(o: "ServerOptimizer", k: str, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return x - o.lr * g


@optimizer("avgm", lr=1.0)
def avgm(o: "ServerOptimizer", k: str, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    o.m[k] = m = o.beta1 * o.m.get(k, torch.zeros_like(x)) + g
    return x - o.lr * m


def adaptive(o: "ServerOptimizer", k: str, x: torch.Tensor, g: torch.Tensor, second) -> torch.Tensor:
    """The first moment, the second by ``second(v, g²)``, and the step x - η m / (√v + τ)."""
    o.m[k] = m = o.beta1 * o.m.get(k, torch.zeros_like(x)) + (1 - o.beta1) * g
    v = o.v.get(k, torch.full_like(x, o.tau ** 2))
    o.v[k] = v = second(v, g * g)
    return x - o.lr * m / (v.sqrt() + o.tau)


@optimizer("adagrad", lr=0.1)
def adagrad(o: "ServerOptimizer", k: str, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return adaptive(o, k, x, g, lambda v, g2: v + g2)


@optimizer("adam", lr=0.01)
def adam(o: "ServerOptimizer", k: str, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return adaptive(o, k, x, g, lambda v, g2: o.beta2 * v + (1 - o.beta2) * g2)


@optimizer("yogi", lr=0.01)
def yogi(o: "ServerOptimizer", k: str, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return adaptive(o, k, x, g, lambda v, g2: v - (1 - o.beta2) * g2 * torch.sign(v - g2))


class ServerOptimizer:
    """One server optimizer's hyper-parameters and its per-entry state ``m`` and ``v``."""

    def __init__(self, name: str, lr: float, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3):
        if name not in OPTIMIZERS:
            raise ValueError(f"unknown server optimizer '{name}'; choose one of {', '.join(OPTIMIZERS)}")
        self.name, self.lr, self.beta1, self.beta2, self.tau = name, float(lr), float(beta1), float(beta2), float(tau)
        self.m: dict[str, torch.Tensor] = {}
        self.v: dict[str, torch.Tensor] = {}

    def step(self, current: Mapping[str, torch.Tensor], aggregate: Mapping[str, torch.Tensor],
             params: Iterable[str]) -> dict[str, torch.Tensor]:
        """``aggregate`` with each entry named in ``params`` replaced by its optimizer step from ``current``
        (the server's model before the round); the state of those entries is updated."""
        out = dict(aggregate)
        fn = OPTIMIZERS[self.name]
        for k in params:
            x = current[k].detach()
            out[k] = fn(self, k, x, x - aggregate[k].to(x.device, x.dtype))
        return out
