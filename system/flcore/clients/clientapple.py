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

    def relationship_rate(self, round_idx: int) -> float:
        """p's rate: -dlr, with -ld decayed like -lr (the official code decays both)."""
        cfg = self.cfg
        return cfg.dr_learning_rate * (cfg.learning_rate_decay_gamma ** round_idx if cfg.learning_rate_decay else 1.0)

    def round_optimizer(self, round_idx: int) -> torch.optim.SGD:
        """A new momentum SGD on the core model and p for one round: the official code builds its optimizer
        inside the round, so the momentum starts from zero every round (and nothing of it is kept between
        rounds). p joins the optimizer so that fp16 loss scaling (--amp) unscales and checks its gradient
        too."""
        return torch.optim.SGD([{"params": list(self.model.parameters()), "lr": self.learning_rate(round_idx)},
                                {"params": [self.p], "lr": self.relationship_rate(round_idx)}],
                               momentum=self.cfg.sgd_momentum)

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
        prox = self.cfg.mu * self.lam * ((self.p - self.p0) ** 2).sum()  # the official code's μ λ(r) ||p - p^0||^2
        return self.loss_fn(logits, y) + prox

    def local_update(self, round_idx: int) -> None:
        self.lam = apple_lambda(round_idx, self.cfg.global_rounds, self.cfg.L, self.cfg.lambda_schedule)
        self.stack_others()
        self.p.requires_grad_(True)
        self.run_epochs(self.cfg.local_epochs, optimizer=self.round_optimizer(round_idx))  # not kept
        self.p.requires_grad_(False)
        self.p.grad = None
        self.cores, self.stacks = [], {}
