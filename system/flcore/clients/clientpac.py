"""FedPAC client: the head trained on the frozen body, then the body with the pull of each representation
toward its class's global centroid; uploads body, head, class centroids and the feature statistics the
server's classifier combination needs (see servers/serverpac.py)."""
from __future__ import annotations

import torch

from flcore.clients.clientbase import ClientDeclares, Upload
from flcore.clients.partsharing import PartSharingClient
from flcore.prototypes import class_prototypes, pulled_loss, representations
from flcore.trainmodel.parts import frozen
from utils.batching import batches_per_epoch


def feature_statistics(features: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(v, H) of one client, as the official code computes them from representations (n, d): with
    p_k = n_k / n and μ_k the class means,

        H[k] = p_k μ_k   (C, d; zero rows for absent classes),
        v = (Σ_k p_k · mean_{y=k} ||f(x)||² - Σ_k p_k² ||μ_k||²) / n."""
    n = len(labels)
    counts = torch.bincount(labels, minlength=num_classes).to(features.dtype)
    p = counts / n
    sums = torch.zeros(num_classes, features.shape[1], dtype=features.dtype, device=features.device)
    sums.index_add_(0, labels, features)
    sq = torch.zeros(num_classes, dtype=features.dtype, device=features.device)
    sq.index_add_(0, labels, features.pow(2).sum(1))
    seen = counts > 0
    mu = torch.where(seen.unsqueeze(1), sums / counts.clamp(min=1).unsqueeze(1), 0.0)
    second = torch.where(seen, sq / counts.clamp(min=1), 0.0)
    v = ((p * second).sum() - (p.pow(2) * mu.pow(2).sum(1)).sum()) / n
    return v, p.unsqueeze(1) * mu


class FedPACClient(PartSharingClient):
    shared = ("base",)  # received from the server (plain copy, or ALA under this client's head)
    declares = ClientDeclares(
        personal_keys=(),  # the head is uploaded too: the server combines heads across clients
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.global_protos: dict[int, torch.Tensor] = {}  # global centroids c_k, as last received
        self.protos: dict[int, torch.Tensor] = {}
        self.counts: dict[int, int] = {}
        self.stats: tuple[torch.Tensor, torch.Tensor] | None = None  # (v, H) at the start of the round

    def receive(self, payload: dict, participating: bool = True) -> None:
        """The combined head from the last aggregation (if any) first, then the global body (so ALA, with
        ``-ala``, judges the body under the new head) and the global centroids."""
        if payload["head"] is not None:
            self.model.head.load_state_dict(payload["head"])
        super().receive(payload["model"], participating)
        self.global_protos = dict(payload["protos"])

    def features(self) -> torch.Tensor:
        """The body's representations of the training data (evaluation mode, no grad)."""
        return representations(self.cfg, self.model.base, self.x_train)

    def loss(self, x, y):
        """CE + λ · mean (f(x) - c_y)² over the batch and the d coordinates (``prototype_pull``: classes
        without a global centroid add nothing)."""
        return pulled_loss(self, x, y)

    def local_update(self, round_idx: int) -> None:
        """Statistics of the received body, ``-pls`` head epochs (body frozen), ``-ls`` body epochs (head
        frozen), then the class centroids of the trained body."""
        self.stats = feature_statistics(self.features(), self.y_train, self.num_classes)
        with frozen(self.model.base):
            self.run_epochs(self.cfg.plocal_epochs)
        with frozen(self.model.head):
            self.run_epochs(self.cfg.local_epochs)
        self.protos, self.counts = class_prototypes(self.features(), self.y_train, self.num_classes)

    def steps_per_round(self) -> int:
        return (self.cfg.plocal_epochs + self.cfg.local_epochs) * batches_per_epoch(self)

    def upload(self) -> Upload:
        """Body and head, the centroids with their counts, and (v, H)."""
        v, h = self.stats
        return Upload(self.id, self.train_samples, self.model.state_dict(),
                      {"protos": self.protos, "counts": self.counts, "v": v, "H": h})
