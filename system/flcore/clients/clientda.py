"""PFL-DA client: a personal head regularised toward the global head, then a personal body trained under the
global head (see servers/serverda.py)."""
from __future__ import annotations

import copy

import torch
from torch import nn

from flcore.clients.partsharing import PartSharingClient
from flcore.clients.clientbase import ClientDeclares
from flcore.trainmodel.parts import frozen


def flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.reshape(-1) for p in module.parameters()])


def head_distance(personal: nn.Module, global_head: nn.Module) -> torch.Tensor:
    """||vec(h_i) − vec(h_g)||₂ (not squared), a function of the personal head only (h_g is a constant)."""
    return torch.linalg.vector_norm(flat(personal) - flat(global_head).detach())


class DAModel(nn.Module):
    """A split model (``base``, personal ``head``) and the global head ``ghead`` on the same features (a copy
    of the initial head). ``forward`` is the personal prediction head(base(x))."""

    def __init__(self, split: nn.Module):
        super().__init__()
        self.base, self.head = split.base, split.head
        self.ghead = copy.deepcopy(split.head)

    def forward(self, x):
        return self.head(self.base(x))


class PFLDAClient(PartSharingClient):
    shared = ("ghead",)
    declares = ClientDeclares(
        personal_keys=("base.", "head."),
    )

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The personal head's objective: CE(h_i(φ_i(x)), y) + λ ||h_i − h_g||₂."""
        return self.loss_fn(self.model(x), y) + self.cfg.lamda * head_distance(self.model.head, self.model.ghead)

    def global_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The body's and the global head's objective: CE(h_g(φ_i(x)), y)."""
        return self.loss_fn(self.model.ghead(self.model.base(x)), y)

    def local_update(self, round_idx: int) -> None:
        with frozen(self.model.base), frozen(self.model.ghead):
            self.run_epochs(self.cfg.local_epochs)
        with frozen(self.model.head):
            self.run_epochs(self.cfg.local_epochs, objective=self.global_loss)
