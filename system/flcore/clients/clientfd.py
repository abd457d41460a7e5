"""FD client: a personal model trained with a distillation term toward the other clients' per-label mean
logits; it uploads its own per-label mean logits of the round, never weights (see servers/serverfd.py)."""
from __future__ import annotations

import torch
from torch.nn import functional as F

from flcore.clients.clientbase import Client, ClientDeclares, Upload


def label_means(sums: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels seen, their mean logit vectors) from per-label logit sums (C x C) and sample counts (C)."""
    present = counts.nonzero().flatten()
    return present, sums[present] / counts[present, None].to(sums.dtype)


def distillation(logits: torch.Tensor, y: torch.Tensor, teacher: torch.Tensor, has: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of the soft-target cross-entropy H(softmax(teacher[y_b]), softmax(logits_b)); samples
    whose label has no teacher vector (``has[y_b]`` False) add 0."""
    target = F.softmax(teacher[y], dim=1)
    return (has[y].to(logits.dtype) * -(target * F.log_softmax(logits, dim=1)).sum(1)).mean()


class FDClient(Client):
    declares = ClientDeclares(
        personal_keys=("",),  # the whole model stays on the client: only logits cross the wire
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        c = self.num_classes
        self.logit_sum = torch.zeros(c, c, device=self.device)  # this round's per-label sums of F(w, x)
        self.logit_count = torch.zeros(c, dtype=torch.long, device=self.device)
        self.teacher = torch.zeros(c, c, device=self.device)  # \hat F^{(i)}_l: the others' mean logits
        self.has_teacher = torch.zeros(c, dtype=torch.bool, device=self.device)

    def receive(self, payload, participating: bool = True) -> None:
        """The global per-label logits (no model: the personal model is kept as it is)."""
        self.teacher.zero_()
        self.has_teacher.zero_()
        self.teacher[payload["labels"]] = payload["logits"].to(self.teacher)
        self.has_teacher[payload["labels"]] = True

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        self.logit_sum.index_add_(0, y, out.detach().to(self.logit_sum.dtype))
        self.logit_count += torch.bincount(y, minlength=self.num_classes)
        kd = distillation(out.float(), y, self.teacher, self.has_teacher)
        return self.loss_fn(out, y) + self.cfg.lamda * kd

    def local_update(self, round_idx: int) -> None:
        self.logit_sum.zero_()
        self.logit_count.zero_()
        super().local_update(round_idx)

    def upload(self) -> Upload:
        labels, means = label_means(self.logit_sum, self.logit_count)
        return Upload(self.id, self.train_samples, None, extras={"labels": labels, "logits": means})
