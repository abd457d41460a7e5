"""FedMTL client: its own model w_t, trained on its loss plus its part of the task-relationship regulariser
R(W, Ω) (see servers/servermtl.py)."""
from __future__ import annotations

import torch

from flcore.clients.clientbase import Client


def mtl_penalty(params: dict, coupling: dict, omega_tt: float, lam1: float, lam2: float) -> torch.Tensor:
    """The terms of R(W, Ω) = λ1 tr(W Ω W^T) + λ2 ||W||_F^2 that involve column t, the others fixed:

        λ1 (Ω_tt ||w_t||^2 + 2 <w_t, c_t>) + λ2 ||w_t||^2,   c_t = Σ_{s≠t} Ω_ts w_s  (Ω symmetric),

    whose gradient is ∂R/∂w_t = 2 λ1 (W Ω)_t + 2 λ2 w_t. ``params`` and ``coupling`` map names to tensors."""
    sq = sum((p * p).sum() for p in params.values())
    cross = sum((p * coupling[k]).sum() for k, p in params.items())
    return lam1 * (omega_tt * sq + 2 * cross) + lam2 * sq


class FedMTLClient(Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.coupling: dict | None = None  # c_t, the last one received
        self.omega_tt = 0.0

    def receive(self, payload, participating: bool = True) -> None:
        """Only the coupling arrives: the model stays this client's own."""
        self.coupling, self.omega_tt = payload["coupling"], payload["omega_tt"]

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        penalty = mtl_penalty(dict(self.model.named_parameters()), self.coupling, self.omega_tt,
                              self.cfg.lamda, self.cfg.lamda2)
        return self.loss_fn(self.model(x), y) + penalty
