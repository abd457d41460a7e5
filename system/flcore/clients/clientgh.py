"""FedGH client: its own body under the received global header, trained together; uploads the per-class
means of its body's representations, never a model entry (see servers/servergh.py)."""
from __future__ import annotations

import torch

from flcore.clients.clientbase import ClientDeclares, Upload
from flcore.clients.partsharing import PartSharingClient
from flcore.prototypes import class_means, representations


class FedGHClient(PartSharingClient):
    # The header arrives from the server (ALA, with -ala, adapts it under the client's own body); nothing of
    # the model is ever uploaded, body or trained header.
    shared = ("head",)
    declares = ClientDeclares(
        personal_keys=("",),
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reps: tuple[torch.Tensor, torch.Tensor] | None = None  # this round's (class means, labels)

    def local_update(self, round_idx: int) -> None:
        """FedAvg's epochs on body and header together, then the class-averaged representations of the
        trained body over every training sample (eval mode, as at test time)."""
        super().local_update(round_idx)
        self.reps = class_means(representations(self.cfg, self.model.base, self.x_train), self.y_train,
                                self.num_classes)

    def upload(self) -> Upload:
        """The class means and their labels only (the weight is unused by the server)."""
        means, labels = self.reps
        return Upload(self.id, self.train_samples, None, extras={"reps": means, "labels": labels})
