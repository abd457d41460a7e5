"""MOON client: cross-entropy plus the model-contrastive loss on the classifier's input (see
servers/servermoon.py)."""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from flcore.clients.clientbase import Client, copy_state


def contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """MOON's l_con, the batch mean of -log(e^{s+/tau} / (e^{s+/tau} + e^{s-/tau})), s+ = cos(z, z_glob)
    and s- = cos(z, z_prev); representations of shape (B, ...) are compared flattened."""
    pos = F.cosine_similarity(z.flatten(1), z_glob.flatten(1), dim=1) / tau
    neg = F.cosine_similarity(z.flatten(1), z_prev.flatten(1), dim=1) / tau
    return (torch.logaddexp(pos, neg) - pos).mean()


def frozen_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` that takes no gradient and runs in evaluation mode (BatchNorm statistics fixed)."""
    clone = copy.deepcopy(model).eval()
    clone.requires_grad_(False)
    return clone


class MOONClient(Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.global_model = frozen_copy(self.model)  # w^t, as last received
        self.prev_model: nn.Module | None = None  # w_i^{t-1}: this client's model after its last training

    def receive(self, payload, participating: bool = True) -> None:
        super().receive(payload, participating)
        copy_state(self.global_model, payload)

    def loss(self, x, y):
        z = self.model.base(x)
        loss = self.loss_fn(self.model.head(z), y)
        if self.prev_model is None:  # no negative pair yet: l_con = 0 (see servers/servermoon.py)
            return loss
        z_glob, z_prev = self.global_model.base(x).detach(), self.prev_model.base(x).detach()
        return loss + self.cfg.mu * contrastive_loss(z, z_glob, z_prev, self.cfg.tau)

    def local_update(self, round_idx: int) -> None:
        super().local_update(round_idx)
        if self.prev_model is None:
            self.prev_model = frozen_copy(self.model)
        else:
            copy_state(self.prev_model, self.model)
