"""FML client: a private local model and the shared meme model trained together by deep mutual learning;
the meme model (``self.model``) is what crosses the wire (see servers/serverfml.py)."""
from __future__ import annotations

import copy

import torch
from torch.nn import functional as F

from flcore.clients.clientbase import Client, ClientDeclares


def mutual_losses(local_logits: torch.Tensor, meme_logits: torch.Tensor, y: torch.Tensor, alpha: float,
                  beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(L_local, L_meme) of deep mutual learning, each model's KL target the other's detached prediction:
    L_local = α CE(local) + (1-α) KL(p_meme || p_local),  L_meme = β CE(meme) + (1-β) KL(p_local || p_meme),
    KL averaged over the batch."""
    log_local, log_meme = F.log_softmax(local_logits, 1), F.log_softmax(meme_logits, 1)
    kl_to_meme = F.kl_div(log_local, log_meme.detach(), reduction="batchmean", log_target=True)
    kl_to_local = F.kl_div(log_meme, log_local.detach(), reduction="batchmean", log_target=True)
    local = alpha * F.cross_entropy(local_logits, y) + (1 - alpha) * kl_to_meme
    meme = beta * F.cross_entropy(meme_logits, y) + (1 - beta) * kl_to_local
    return local, meme


class FMLClient(Client):
    declares = ClientDeclares(
        dp_modules=("model", "local"),  # -dp: the mutual optimizer steps the meme and the local model together
        new_client_model="model",  # -nnc: the received model (the personal local model never received one)
    )

    def __init__(self, *args, own_model: torch.nn.Module | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        # The meme model is self.model (received, uploaded; ALA initialises it with -ala). The local model
        # never leaves the client: with --client_models it is this client's own architecture (``own_model``),
        # else the meme's architecture with its own initialisation (drawn from this client's seeded
        # construction stream): started equal to the meme, with α = β the two would stay equal for a round.
        if own_model is not None:
            self.local = copy.deepcopy(own_model)
        else:
            self.local = copy.deepcopy(self.model)
            for module in self.local.modules():
                if hasattr(module, "reset_parameters"):
                    module.reset_parameters()
        self.mutual_optimizer = torch.optim.SGD([*self.local.parameters(), *self.model.parameters()],
                                                lr=self.cfg.local_learning_rate)

    def mutual_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """L_local + L_meme: each model's gradient is that of its own loss (the KL targets are detached)."""
        local, meme = mutual_losses(self.local(x), self.model(x), y, self.cfg.alpha, self.cfg.beta)
        return local + meme

    def local_update(self, round_idx: int) -> None:
        for group in self.mutual_optimizer.param_groups:
            group["lr"] = self.learning_rate(round_idx)
        self.local.train()
        self.run_epochs(self.cfg.local_epochs, optimizer=self.mutual_optimizer, objective=self.mutual_loss)

    def eval_model(self) -> torch.nn.Module:
        return self.local
