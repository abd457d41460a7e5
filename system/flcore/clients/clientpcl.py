"""FedPCL client: a feature extractor trained only by prototype-wise contrastive losses against the
global prototypes and every client's local prototypes; classifies by its nearest local prototype (see
servers/serverpcl.py)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from flcore.clients.clientbase import Client, ClientDeclares, Upload
from flcore.prototypes import NearestPrototype, class_prototypes, prototype_table, representations


def prototype_contrastive_loss(z: torch.Tensor, y: torch.Tensor, table: torch.Tensor, known: torch.Tensor,
                               tau: float) -> torch.Tensor:
    """Batch mean of -log(exp(z·P_y/τ) / Σ_{c known} exp(z·P_c/τ)) for prototypes ``table`` (C, d) whose
    rows ``known`` (C,) exist; samples whose class has no prototype add nothing (0 if none has one)."""
    valid = known[y]
    if not bool(valid.any()):
        return z.sum() * 0.0
    logits = (z @ table.T / tau).masked_fill(~known, float("-inf"))
    return F.cross_entropy(logits[valid], y[valid])


def pcl_loss(z: torch.Tensor, y: torch.Tensor, global_table: torch.Tensor, global_known: torch.Tensor,
             local_tables: list[torch.Tensor], local_known: list[torch.Tensor], tau: float) -> torch.Tensor:
    """FedPCL's L = L_g + L_p on L2-normalised representations ``z``: the contrastive loss against the global
    prototypes, plus its mean over the m clients' local prototype sets."""
    loss = prototype_contrastive_loss(z, y, global_table, global_known, tau)
    if local_tables:
        loss = loss + sum(prototype_contrastive_loss(z, y, t, k, tau)
                          for t, k in zip(local_tables, local_known)) / len(local_tables)
    return loss


class FedPCLClient(Client):
    declares = ClientDeclares(
        personal_keys=("",),  # no weight ever leaves the client: only prototypes cross the wire
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.global_protos: dict[int, torch.Tensor] = {}  # as last received
        self.client_protos: dict[int, dict] = {}  # every client's local prototypes, as last received
        self.protos: dict[int, torch.Tensor] | None = None  # this client's own, of its current model
        self.counts: dict[int, int] = {}
        self.tables: tuple | None = None  # this round's prototype tables (built once per round)

    def receive(self, payload: dict, participating: bool = True) -> None:
        """The global prototypes and the clients' local ones; the model stays the client's own."""
        self.global_protos, self.client_protos = dict(payload["global"]), dict(payload["locals"])
        self.tables = None
        if self.protos is None:  # never trained: the prototypes of the initial model (round 0's evaluation)
            self.collect_protos()

    def collect_protos(self) -> None:
        """This client's prototypes: class means of the L2-normalised representations of its training data."""
        z = F.normalize(representations(self.cfg, self.model, self.x_train), dim=1)
        self.protos, self.counts = class_prototypes(z, self.y_train, self.num_classes)

    def prototype_tables(self, dim: int) -> tuple:
        """The global table and each client's local table, a class it lacks padded with the global
        prototype (PFLlib and the official code)."""
        if self.tables is None:
            g_table, g_known = prototype_table(self.global_protos, self.num_classes, dim, self.device)
            local = [prototype_table({**self.global_protos, **p}, self.num_classes, dim, self.device)
                     for _, p in sorted(self.client_protos.items())]
            self.tables = (g_table, g_known, [t for t, _ in local], [k for _, k in local])
        return self.tables

    def loss(self, x, y):
        z = F.normalize(self.model(x), dim=1)
        return pcl_loss(z, y, *self.prototype_tables(z.shape[1]), self.cfg.tau)

    def local_update(self, round_idx: int) -> None:
        """``-ls`` epochs on the contrastive losses (none before any global prototype exists: the first
        round only collects prototypes, as in PFLlib and the official code), then this client's
        prototypes of the trained model."""
        if self.global_protos:
            super().local_update(round_idx)
        self.collect_protos()

    def upload(self) -> Upload:
        return Upload(self.id, self.train_samples, None, {"protos": self.protos, "counts": self.counts})

    def eval_model(self) -> nn.Module:
        """The nearest of this client's own prototypes (squared distance of the normalised representation,
        as the official code's evaluation)."""
        dim = next(iter(self.protos.values())).shape[0]
        table, known = prototype_table(self.protos, self.num_classes, dim, self.device)
        return NearestPrototype(self.model.base, table, known, normalize=True)
