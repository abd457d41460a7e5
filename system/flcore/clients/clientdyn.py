"""FedDyn client: the dynamic regulariser's gradient added to every step, and the state ∇L_k(θ_k^t) updated
after training (see servers/serverdyn.py)."""
from __future__ import annotations

import torch

from flcore.clients.clientbase import Client


def dyn_penalty_grad(params: dict, grad_state: dict, anchor: dict, alpha: float) -> dict:
    """Gradient of the regulariser -<∇L_k(θ_k^{t-1}), θ> + (α/2) ||θ - θ^{t-1}||² (``grad_state``, ``anchor``):
    -∇L_k(θ_k^{t-1}) + α (θ - θ^{t-1}), per entry of ``params``."""
    return {k: alpha * (p.detach() - anchor[k]) - grad_state[k] for k, p in params.items()}


class FedDynClient(Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        params = dict(self.model.named_parameters())
        self.grad_state = {k: torch.zeros_like(p.detach()) for k, p in params.items()}  # ∇L_k(θ_k^{t-1})
        self.anchor = {k: p.detach().clone() for k, p in params.items()}  # θ^{t-1}, the last global model received

    def receive(self, payload, participating: bool = True) -> None:
        super().receive(payload, participating)
        self.anchor = {k: p.detach().clone() for k, p in payload.named_parameters()}

    def after_backward(self) -> None:
        # Added to the data gradient (with -dp: to its privatised release), see servers/serverdyn.py.
        params = {k: p for k, p in self.model.named_parameters() if p.grad is not None}
        for k, g in dyn_penalty_grad(params, self.grad_state, self.anchor, self.cfg.alpha).items():
            params[k].grad += g

    def local_update(self, round_idx: int) -> None:
        super().local_update(round_idx)
        alpha = self.cfg.alpha
        for k, p in self.model.named_parameters():  # ∇L_k(θ_k^t) = ∇L_k(θ_k^{t-1}) - α (θ_k^t - θ^{t-1})
            self.grad_state[k] = self.grad_state[k] - alpha * (p.detach() - self.anchor[k])
