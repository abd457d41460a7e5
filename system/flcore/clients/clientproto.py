"""FedProto client: cross-entropy plus the pull of each representation toward its class's global
prototype; uploads per-class mean representations, never weights (see servers/serverproto.py). The
prototype helpers it uses are shared with FedPCL, FedPAC, FedGH and FedAS (``flcore/prototypes.py``)."""
from __future__ import annotations

import torch
from torch import nn

from flcore.clients.clientbase import Client, ClientDeclares, Upload
from flcore.prototypes import NearestPrototype, class_prototypes, prototype_table, pulled_loss, representations


class FedProtoClient(Client):
    declares = ClientDeclares(
        personal_keys=("",),  # no weight ever leaves the client: only prototypes cross the wire
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.global_protos: dict[int, torch.Tensor] = {}  # as last received
        self.protos: dict[int, torch.Tensor] = {}  # C_i^(j): this client's after its last training
        self.counts: dict[int, int] = {}  # |D_ij|, sent with them (the server's weights)

    def receive(self, payload: dict, participating: bool = True) -> None:
        """The global prototypes {class: (d,)}; the model stays the client's own."""
        self.global_protos = dict(payload)

    def loss(self, x, y):
        """CE + λ · ``prototype_pull`` toward the global prototypes (none before the first aggregation)."""
        return pulled_loss(self, x, y)

    def local_update(self, round_idx: int) -> None:
        """FedAvg's epochs on ``loss``, then the prototypes of the trained body over all training data
        (the paper's Eq. 5, taken after the update)."""
        super().local_update(round_idx)
        self.protos, self.counts = class_prototypes(representations(self.cfg, self.model.base, self.x_train),
                                                    self.y_train, self.num_classes)

    def upload(self) -> Upload:
        return Upload(self.id, self.train_samples, None, {"protos": self.protos, "counts": self.counts})

    def eval_model(self) -> nn.Module:
        """The nearest global prototype (PFLlib's inference); before any prototype exists, the local head."""
        if not self.global_protos:
            return self.model
        dim = next(iter(self.global_protos.values())).shape[0]
        table, known = prototype_table(self.global_protos, self.num_classes, dim, self.device)
        return NearestPrototype(self.model.base, table, known)
