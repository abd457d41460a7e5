"""FedGC client: a shared body and the class embeddings of this client's own classes, trained with a softmax
over those classes only (see servers/servergc.py)."""
from __future__ import annotations

import torch
from torch import nn

from flcore.clients.clientbase import Upload
from flcore.clients.partsharing import PartSharingClient


class GCModel(nn.Module):
    """``base`` + class embeddings ``head`` (a bias-free C x K linear layer, the paper's W). ``classes`` (a
    per-model mask, not part of the state) says which classes this model scores: the logits of the others
    are -inf, so its softmax runs over its own classes only (all of them on the server)."""

    def __init__(self, split: nn.Module):
        super().__init__()
        fc = split.head
        self.base = split.base
        self.head = nn.Linear(fc.in_features, fc.out_features, bias=False)
        with torch.no_grad():
            self.head.weight.copy_(fc.weight)
        self.register_buffer("classes", torch.ones(fc.out_features, dtype=torch.bool), persistent=False)

    def forward(self, x):
        return self.head(self.base(x)).masked_fill(~self.classes, float("-inf"))


class FedGCClient(PartSharingClient):
    """Receives the global body (plain copy, or ALA under its own class embeddings) and its own corrected
    class embeddings; uploads the body and the embeddings of its classes, with their indices."""
    shared = ("base",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        present = torch.bincount(self.y_train, minlength=self.model.head.out_features) > 0
        self.model.classes.copy_(present)
        self.own = present.nonzero().flatten()  # this client's class indices, ascending

    def receive(self, payload, participating: bool = True) -> None:
        """``payload`` = (global model, this client's corrected embeddings or None before its first upload)."""
        global_model, rows = payload
        super().receive(global_model, participating)
        if rows is not None:
            with torch.no_grad():
                self.model.head.weight[self.own] = rows.to(self.device)

    def upload(self) -> Upload:
        rows = self.model.head.weight[self.own].detach().clone()
        return Upload(self.id, self.train_samples, self.shared_state(self.model),
                      {"classes": self.own.clone(), "embeddings": rows})
