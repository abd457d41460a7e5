"""FedDBE client: a personal representation bias (PRBM) added to the shared body's features, and the mean
regulariser (MR) pulling this round's running mean of the features to the global mean (see
servers/serverdbe.py)."""
from __future__ import annotations

import copy

import torch
from torch import nn

from flcore.clients.partsharing import PartSharingClient
from flcore.clients.clientbase import ClientDeclares
from utils.errors import FLError
from utils.seeding import torch_gen


def running_mean_update(running: torch.Tensor, batch_mean: torch.Tensor, momentum: float) -> torch.Tensor:
    """One moving-average step, as BatchNorm keeps its running mean: (1 - μ) r + μ m (the batch's mean
    feature ``m``); ``running`` is a constant (detached), ``batch_mean`` keeps its graph."""
    return (1 - momentum) * running.detach() + momentum * batch_mean


def mean_regularizer(running: torch.Tensor, global_mean: torch.Tensor, kappa: float) -> torch.Tensor:
    """MR: κ · mean_k ½ (r_k − z̄^g_k)² over the K feature dimensions."""
    return kappa * (0.5 * (running - global_mean) ** 2).mean()


class DBEModel(nn.Module):
    """A split model (``base``, ``head``) with the PRBM z̄^p (``prbm``, one learnable vector of the
    feature size, zero at first) between them: ``head(base(x) + prbm)``."""

    def __init__(self, split: nn.Module):
        super().__init__()
        self.base, self.head = split.base, split.head
        width = getattr(self.head, "in_features", None)
        if not isinstance(width, int):
            raise FLError(f"FedDBE adds its bias to the classifier's input, but {type(self.head).__name__} has no "
                          f"in_features; use a model whose classifier is a Linear layer")
        self.prbm = nn.Parameter(torch.zeros(width))

    def forward(self, x):
        return self.head(self.base(x) + self.prbm)


class FedDBEClient(PartSharingClient):
    shared = ("base", "head")
    declares = ClientDeclares(
        personal_keys=("prbm",),
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.global_mean: torch.Tensor | None = None  # z̄^g, received once after the initialization period
        self.running_mean = torch.zeros_like(self.model.prbm.detach())  # this round's z̄^g_i

    def receive(self, payload, participating: bool = True) -> None:
        if payload["mean"] is not None:
            self.global_mean = payload["mean"].detach().clone().to(self.device)
        super().receive(payload["model"], participating)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """CE(head(z^g + z̄^p), y) + MR, with z^g = base(x) and this batch's step of the running mean."""
        rep = self.model.base(x)
        running = running_mean_update(self.running_mean, rep.mean(0), self.cfg.momentum)
        self.running_mean = running.detach()
        out = self.model.head(rep + self.model.prbm)
        return self.loss_fn(out, y) + mean_regularizer(running, self.global_mean, self.cfg.kl_weight)

    def local_update(self, round_idx: int) -> None:
        if self.global_mean is None:
            raise FLError(f"FedDBE client {self.id} trains before the global mean was received")
        self.running_mean = torch.zeros_like(self.running_mean)  # each round's mean starts afresh
        super().local_update(round_idx)

    def initial_mean(self) -> tuple[float, torch.Tensor]:
        """The initialization period: ``-ls`` epochs of plain SGD on a copy of the received model (no PRBM,
        no MR; the copy is dropped), tracking the running mean of its features. Returns (weight, z̄^g_i)."""
        model = copy.deepcopy(self.model)
        opt = torch.optim.SGD(model.parameters(), lr=self.learning_rate(0))
        running = torch.zeros_like(self.running_mean)

        def objective(x, y):
            nonlocal running
            rep = model.base(x)
            running = running_mean_update(running, rep.mean(0).detach(), self.cfg.momentum)
            return self.loss_fn(model.head(rep), y)

        gen = torch_gen(self.cfg.seed, self.run, "dbe-init", self.id)
        self.run_epochs(self.cfg.local_epochs, optimizer=opt, objective=objective, generator=gen)
        return float(self.train_samples), running
