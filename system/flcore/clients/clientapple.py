"""APPLE client: trains its core model and relationship vector through the personalised mix of all
core models (see servers/serverapple.py)."""
import copy

import torch
from torch.func import functional_call

from flcore.clients.clientbase import Client
from utils.personal_aggregation import apple_lambda


class APPLEClient(Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.personal = copy.deepcopy(self.model)  # θ̃_i, rebuilt whenever cores arrive
        self.keys = [n for n, _ in self.model.named_parameters()]
        self.p = self.p0 = None
        self.cores, self.stacks, self.lam = [], {}, 0.0

    def eval_model(self):
        return self.personal

    def learning_rate(self, round_idx: int) -> float:
        """The core model's rate: -lr (with its decay) times --core_lr_scale."""
        return super().learning_rate(round_idx) * self.cfg.core_lr_scale

    def receive(self, payload: dict, participating: bool = True) -> None:
        """``payload["cores"]``: all clients' core models; ``payload["p0"]``: p^0 (the clients' sample
        shares, also where p_i starts)."""
        cores, p0 = payload["cores"], payload["p0"]
        if self.p is None:
            self.p0 = p0.to(self.device, torch.float32)
            self.p = self.p0.clone()
        self.cores = cores  # only read (the sequential executor passes the server's own copies)
        self.stack_others()
        with torch.no_grad():
            self.personal.load_state_dict({**self.model.state_dict(), **self.mixed()})
        # Kept until training only: N clients holding N-1 cores each between rounds would be N^2 models.
        self.stacks = {}
        if not participating:
            self.cores = []

    def stack_others(self) -> None:
        """The other clients' cores per parameter, (N-1, *shape): fixed during local training."""
        others = [c for j, c in enumerate(self.cores) if j != self.id]
        self.stacks = {k: torch.stack([c[k] for c in others]).to(self.device) for k in self.keys} if others else {}

    def mixed(self) -> dict:
        """θ̃ = p_ii θ_i + Σ_{j≠i} p_ij θ_j over the parameters (buffers stay the client's own)."""
        own = dict(self.model.named_parameters())
        mask = torch.arange(len(self.p), device=self.device) != self.id
        rest = self.p[mask]
        return {k: self.p[self.id] * own[k] + (torch.tensordot(rest, self.stacks[k], dims=1) if self.stacks else 0)
                for k in self.keys}

    def loss(self, x, y):
        logits = functional_call(self.model, self.mixed(), (x,))
        prox = 0.5 * self.cfg.mu * self.lam * ((self.p - self.p0) ** 2).sum()
        return self.loss_fn(logits, y) + prox

    def after_backward(self) -> None:
        with torch.no_grad():
            self.p -= self.cfg.dr_learning_rate * self.p.grad
        self.p.grad = None

    def local_update(self, round_idx: int) -> None:
        self.lam = apple_lambda(round_idx, self.cfg.global_rounds, self.cfg.L, self.cfg.lambda_schedule)
        self.stack_others()
        self.p.requires_grad_(True)
        super().local_update(round_idx)
        self.p.requires_grad_(False)
        self.cores, self.stacks = [], {}
