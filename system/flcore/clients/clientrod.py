"""FedRoD client: a generic head trained with the balanced softmax, a personal head on top of it (see
servers/serverrod.py)."""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from flcore.clients.partsharing import PartSharingClient
from flcore.clients.clientbase import ClientDeclares


def balanced_softmax_loss(logits: torch.Tensor, y: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits + log n_c`` (Ren et al., NeurIPS 2020, the balanced softmax):
    p(y|x) = n_y e^{z_y} / Σ_c n_c e^{z_c}. A class with n_c = 0 has log n_c = -inf: it takes no
    probability and no gradient, which is the formula's own limit (such a client says nothing about it)."""
    return F.cross_entropy(logits + log_prior, y)


class RoDModel(nn.Module):
    """``base`` + generic ``head`` (a split model) and a personal head ``phead`` on the same features.
    ``forward`` is the personalized prediction: generic logits + personal logits."""

    def __init__(self, split: nn.Module):
        super().__init__()
        self.base, self.head = split.base, split.head
        self.phead = copy.deepcopy(split.head)  # PFLlib's start: a copy of the initial head

    def forward(self, x):
        f = self.base(x)
        return self.head(f) + self.phead(f)


class FedRoDClient(PartSharingClient):
    shared = ("base", "head")
    declares = ClientDeclares(
        personal_keys=("phead.",),
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        counts = torch.bincount(self.y_train, minlength=self.num_classes).float()
        self.log_prior = counts.log()  # log n_c of this client's training labels (-inf where n_c = 0)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Both heads' objectives in one: the body and generic head get the balanced-softmax gradient
        only; the personal head gets that of the cross-entropy of the summed logits, with the features
        and the generic logits detached. One SGD step on the sum is the paper's two simultaneous
        updates (disjoint parameters, same batch)."""
        f = self.model.base(x)
        generic = self.model.head(f)
        personal = generic.detach() + self.model.phead(f.detach())
        return balanced_softmax_loss(generic, y, self.log_prior) + self.loss_fn(personal, y)
