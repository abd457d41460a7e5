"""FedProto client: cross-entropy plus the pull of each representation toward its class's global
prototype; uploads per-class mean representations, never weights (see servers/serverproto.py).

The prototype helpers here (``representations``, ``class_means``, ``class_prototypes``, ``prototype_table``,
``prototype_pull``, ``NearestPrototype``) are shared with FedPCL, FedPAC, FedGH and FedAS."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from flcore.clients.clientbase import Client, Upload
from utils.amp import autocast
from utils.metrics import predict

# A class without a prototype is never predicted: its score is the row's lowest known score minus this
# margin (probability below e^-30 of the farthest known class), finite so the recorded loss stays finite.
UNKNOWN_MARGIN = 30.0


def representations(cfg, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module``'s outputs on ``x`` in evaluation mode, without gradient (in ``--amp`` precision), as float;
    the module's mode is restored."""
    was_training = module.training
    with torch.no_grad(), autocast(cfg, x.device):
        z = predict(module, x, cfg.eval_batch_size)
    module.train(was_training)
    return z.float()


def class_means(features: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(means, classes): the mean row of ``features`` (n, d) over the samples of each class present in
    ``labels`` (n,), classes ascending ((k, d), (k,))."""
    counts = torch.bincount(labels, minlength=num_classes)
    sums = torch.zeros(num_classes, features.shape[1], dtype=features.dtype, device=features.device)
    sums.index_add_(0, labels, features)
    present = torch.nonzero(counts, as_tuple=True)[0]
    return sums[present] / counts[present, None].to(features.dtype), present


def class_prototypes(features: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[dict, dict]:
    """``class_means`` as ({class: mean (d,)}, {class: count}), only for the classes present; each mean owns
    its storage (a row view would cross the wire with the whole table)."""
    means, present = class_means(features, labels, num_classes)
    counts = torch.bincount(labels, minlength=num_classes)
    return ({int(c): m.clone() for c, m in zip(present, means)}, {int(c): int(counts[c]) for c in present})


def prototype_table(protos: dict, num_classes: int, dim: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``protos`` ({class: (d,)}) as a (C, d) table (zero rows where absent) and a (C,) mask of known rows."""
    table = torch.zeros(num_classes, dim, device=device)
    known = torch.zeros(num_classes, dtype=torch.bool, device=device)
    for c, p in protos.items():
        table[c], known[c] = p.to(device), True
    return table, known


def prototype_pull(z: torch.Tensor, y: torch.Tensor, protos: dict, num_classes: int) -> torch.Tensor:
    """mean over the batch and the d coordinates of (z - P_y)², a sample whose class has no prototype in
    ``protos`` ({class: (d,)}) adding nothing (PFLlib's MSELoss scale)."""
    table, known = prototype_table(protos, num_classes, z.shape[1], z.device)
    return F.mse_loss(z, torch.where(known[y].unsqueeze(1), table[y], z.detach()))


def pulled_loss(client, x, y):
    """CE of ``client.model``'s prediction + λ · ``prototype_pull`` of its body's features toward
    ``client.global_protos`` (FedProto's prototypes, FedPAC's centroids); plain CE while there are none."""
    z = client.model.base(x)
    loss = client.loss_fn(client.model.head(z), y)
    if not client.global_protos:
        return loss
    return loss + client.cfg.lamda * prototype_pull(z, y, client.global_protos, client.num_classes)


class NearestPrototype(nn.Module):
    """Classifies by the nearest prototype: scores -||f(x) - P_c||² (f = ``base``, the body of a split model,
    L2-normalised first when ``normalize``), classes without a prototype below every known one
    (``UNKNOWN_MARGIN``). Its entries keep the body's names (``base.*``)."""

    def __init__(self, base: nn.Module, table: torch.Tensor, known: torch.Tensor, normalize: bool = False):
        super().__init__()
        self.base, self.normalize = base, normalize
        self.register_buffer("prototypes", table)
        self.register_buffer("known", known)

    def forward(self, x):
        z = self.base(x)
        z = F.normalize(z, dim=1) if self.normalize else z
        scores = -torch.cdist(z.float(), self.prototypes).pow(2)
        floor = scores.masked_fill(~self.known, float("inf")).amin(1, keepdim=True) - UNKNOWN_MARGIN
        return torch.where(self.known, scores, floor)


class FedProtoClient(Client):
    personal_keys = ("",)  # no weight ever leaves the client: only prototypes cross the wire

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
