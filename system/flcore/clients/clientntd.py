"""FedNTD client: cross-entropy plus not-true distillation from the received global model (see
servers/serverntd.py)."""
from __future__ import annotations

import copy

import torch
from torch.nn import functional as F

from flcore.clients.clientbase import Client


def not_true(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The logits of every class but the true one, in class order (B x C -> B x (C-1)). Index arithmetic
    rather than a boolean mask, so it also runs per sample under ``vmap`` (-dp)."""
    c = logits.shape[1]
    cols = torch.arange(c - 1, device=logits.device).unsqueeze(0)  # 1 x (C-1)
    idx = cols + (cols >= y.unsqueeze(1)).long()  # skip column y of each row
    return logits.gather(1, idx)


def ntd_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, y: torch.Tensor, tau: float) -> torch.Tensor:
    """τ² KL(q̃^τ(teacher) || q̃^τ(local)) over the not-true classes, averaged over the batch."""
    log_local = F.log_softmax(not_true(logits, y) / tau, dim=1)
    log_teacher = F.log_softmax(not_true(teacher_logits, y) / tau, dim=1)
    return tau ** 2 * F.kl_div(log_local, log_teacher, reduction="batchmean", log_target=True)


class FedNTDClient(Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher = None  # the round's global model, frozen; only while this client trains

    def receive(self, payload, participating: bool = True) -> None:
        super().receive(payload, participating)
        if participating:
            self.teacher = copy.deepcopy(payload).eval().requires_grad_(False)

    def loss(self, x, y):
        logits = self.model(x)
        teacher_logits = self.teacher(x)  # frozen (requires_grad off): no graph, no gradient
        return F.cross_entropy(logits, y) + self.cfg.beta * ntd_loss(logits, teacher_logits, y, self.cfg.tau)

    def local_update(self, round_idx: int) -> None:
        super().local_update(round_idx)
        self.teacher = None  # not needed until the next round's broadcast
