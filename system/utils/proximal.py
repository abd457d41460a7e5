"""The proximal term shared by FedProx (to the global model) and Ditto (personal model to the global model)."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch


def anchor_of(model: torch.nn.Module) -> list[torch.Tensor]:
    """A detached copy of ``model``'s parameters, in ``parameters()`` order: the fixed point of the term."""
    return [p.detach().clone() for p in model.parameters()]


def proximal_term(params: Iterable[torch.Tensor], anchor: Sequence[torch.Tensor], mu: float) -> torch.Tensor:
    """(mu / 2) * sum_k ||w_k - a_k||^2; its gradient w.r.t. w_k is mu * (w_k - a_k)."""
    return 0.5 * mu * sum(((w - a) ** 2).sum() for w, a in zip(params, anchor, strict=True))
