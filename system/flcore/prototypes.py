"""The prototype family's helpers: per-class mean representations of a split model's body (``base``), the
pull toward global prototypes, nearest-prototype classification and the server's count-weighted mean.
Used by FedProto, FedPCL, FedPAC, FedGH and FedAS."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from utils.amp import autocast
from utils.errors import FLError
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


def aggregate_prototypes(protos: list[dict], counts: list[dict]) -> dict[int, torch.Tensor]:
    """Per class, the count-weighted mean of the clients' prototypes: P̄_j = Σ_i n_ij C_ij / Σ_i n_ij
    over the clients i that hold class j."""
    sums: dict[int, torch.Tensor] = {}
    totals: dict[int, int] = {}
    for p, n in zip(protos, counts):
        for c, v in p.items():
            sums[c] = sums.get(c, 0) + n[c] * v.double()
            totals[c] = totals.get(c, 0) + n[c]
    return {c: (sums[c] / totals[c]).float() for c in sorted(sums)}


def refuse_ala(cfg, name: str) -> None:
    """The prototype family has no global model for -ala to initialise from."""
    if cfg.ala:
        raise FLError(f"{name} has no global model for -ala to initialise from (clients share prototypes only); "
                      f"drop -ala")
