"""FedAS client: aligns the received body to its own class prototypes before taking it, trains, and
weights its upload by the Fisher-information trace of its trained model (see servers/serveras.py)."""
from __future__ import annotations

import copy

import torch
from torch import nn

from flcore.clients.clientbase import ClientDeclares, Upload, copy_state
from flcore.clients.partsharing import PartSharingClient
from flcore.prototypes import class_means, representations
from utils.batching import batches


def fisher_trace(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batches) -> float:
    """Σ_b ||∇_θ (1/|b|) Σ_{n ∈ b} log p(y_n | x_n; θ)||² over the index batches ``batches`` and every
    parameter of ``model`` (eval mode): the trace of the Fisher information estimated from each batch's
    mean score, as the official code does."""
    was_training = model.training
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for idx in batches:
        nll = nn.functional.cross_entropy(model(x[idx]), y[idx])
        total += sum(g.double().pow(2).sum() for g in torch.autograd.grad(nll, params))
    model.train(was_training)
    return float(total)


class FedASClient(PartSharingClient):
    shared = ("base",)
    declares = ClientDeclares(
        personal_keys=("head.",),
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fisher: float | None = None  # Fisher trace of the model this client trained last

    def prototypes(self) -> torch.Tensor:
        """Each class's mean representation under this client's own body (eval mode), one row per class
        (rows of absent classes are never read: alignment batches hold only the client's classes)."""
        feats = representations(self.cfg, self.model.base, self.x_train)
        means, labels = class_means(feats, self.y_train, self.num_classes)
        protos = torch.zeros(self.num_classes, feats.shape[1], device=feats.device)
        protos[labels] = means
        return protos

    def align(self, body: nn.Module) -> float:
        """Parameter alignment: ``--align_epochs`` of SGD (rate ``--align_lr``, batches of
        ``--align_batch_size``) on ``body`` so that its representation of each local sample of class c
        moves to this client's prototype z_c; per batch, Σ_c mean_{i: y_i = c} mean_d (body(x_i) - z_c)²_d.
        Returns the mean batch loss."""
        protos = self.prototypes()

        def objective(x, y):
            feats, target = body(x), protos[y]
            loss = feats.new_zeros(())
            for c in y.unique():
                sel = y == c
                loss = loss + nn.functional.mse_loss(feats[sel], target[sel])
            return loss

        body.train()
        opt = torch.optim.SGD(body.parameters(), lr=self.cfg.align_lr)
        return self.run_epochs(self.cfg.align_epochs, self.cfg.align_batch_size, optimizer=opt, objective=objective)

    def receive(self, global_model, participating: bool = True) -> None:
        """A participant aligns the received body under its own head, then takes it (a plain copy, or ALA
        with -ala); the others keep their model (the server sends them nothing)."""
        if not participating:
            return
        received = copy.deepcopy(self.model)
        copy_state(received.base, global_model.base, buffers=self.cfg.bn_stats == "shared")
        self.align(received.base)
        self.initialize_local(self.model, received, participating)

    def local_update(self, round_idx: int) -> None:
        """FedAvg's epochs on the whole model, then the Fisher trace of the trained model: one more pass
        over the training data, in this client's shuffled batches of ``-lbs``."""
        super().local_update(round_idx)
        self.fisher = fisher_trace(self.model, self.x_train, self.y_train, batches(self, 1))

    def upload(self) -> Upload:
        """The body, weighted by the Fisher trace."""
        return Upload(self.id, self.fisher, self.shared_state(self.model))
