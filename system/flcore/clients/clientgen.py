"""FedGen client: cross-entropy on local data plus the head's cross-entropy on features drawn from the
server's generator (see servers/servergen.py). The generator arrives frozen: no client step changes it."""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from flcore.clients.clientbase import Client, Upload, copy_state
from utils.seeding import torch_gen

# The official code's schedule of the generated-sample weight: alpha * 0.98^t, floored at 1e-4.
ALPHA_DECAY, ALPHA_FLOOR = 0.98, 1e-4


class Generator(nn.Module):
    """G_w(eps, y): feature-space samples for labels ``y`` from noise ``eps`` (the official code's MLP:
    [eps, onehot(y)] -> Linear -> BatchNorm -> ReLU -> Linear to the classifier's input size)."""

    def __init__(self, noise_dim: int, num_classes: int, hidden_dim: int, feature_dim: int):
        super().__init__()
        self.noise_dim, self.num_classes = noise_dim, num_classes
        self.body = nn.Sequential(nn.Linear(noise_dim + num_classes, hidden_dim), nn.BatchNorm1d(hidden_dim),
                                  nn.ReLU())
        self.out = nn.Linear(hidden_dim, feature_dim)

    @classmethod
    def for_model(cls, cfg, model: nn.Module, sample: torch.Tensor, num_classes: int) -> "Generator":
        """A generator of ``model``'s classifier inputs (their size measured on one ``sample``)."""
        base = model.base
        was_training = base.training
        with torch.no_grad():
            feature_dim = base.eval()(sample.to(next(base.parameters()).device)).flatten(1).shape[1]
        base.train(was_training)
        return cls(cfg.noise_dim, num_classes, cfg.hidden_dim, feature_dim)

    def forward(self, eps: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.out(self.body(torch.cat([eps, F.one_hot(y, self.num_classes).to(eps.dtype)], 1)))

    def sample(self, label_dist: torch.Tensor, n: int, generator: torch.Generator):
        """(eps, y, G(eps, y)) for ``n`` labels y ~ ``label_dist`` and eps ~ U[0, 1)^d (the official
        code's and PFLlib's noise), all drawn from ``generator``."""
        y = torch.multinomial(label_dist, n, replacement=True, generator=generator).to(label_dist.device)
        eps = torch.rand(n, self.noise_dim, generator=generator, device=generator.device).to(label_dist.device)
        return eps, y, self(eps, y)


def generated_weight(alpha: float, round_idx: int) -> float:
    """Weight of the generated-sample term in round ``round_idx`` (the official code's decay)."""
    return max(ALPHA_FLOOR, alpha * ALPHA_DECAY ** round_idx)


class FedGenClient(Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # n_i(y): sent with every upload, the server's label shares and p(y) come from them.
        self.label_counts = torch.bincount(self.y_train, minlength=self.num_classes).float()
        self.generator: Generator | None = None  # a frozen copy of the server's, once it has trained one
        self.label_dist: torch.Tensor | None = None  # p(y) the generated labels are drawn from
        self.gen_stream = torch_gen(self.cfg.seed, self.run, "fedgen-samples", self.id, device=self.cfg.device)
        self.alpha = 0.0
        if self.cfg.localize_feature_extractor:
            self.personal_keys = ("base.",)

    def new_module(self, name: str) -> nn.Module:
        if name != "generator":
            return super().new_module(name)
        return Generator.for_model(self.cfg, self.model, self.x_train[:1], self.num_classes).to(self.device)

    def receive(self, payload, participating: bool = True) -> None:
        if self.cfg.localize_feature_extractor:  # only the classifier is shared
            copy_state(self.model.head, payload["model"].head)
        else:
            super().receive(payload["model"], participating)
        gen = payload["generator"]
        if gen is not None:
            self.generator = copy.deepcopy(gen).eval()
            self.generator.requires_grad_(False)
            self.label_dist = payload["label_dist"].to(self.device)

    def local_update(self, round_idx: int) -> None:
        self.alpha = generated_weight(self.cfg.generative_alpha, round_idx)
        super().local_update(round_idx)

    def loss(self, x, y):
        loss = super().loss(x, y)
        if self.generator is None:  # before the server has trained its generator (round 0)
            return loss
        with torch.no_grad():
            _, y_gen, z = self.generator.sample(self.label_dist, self.cfg.gen_batch_size, self.gen_stream)
        return loss + self.alpha * F.cross_entropy(self.model.head(z), y_gen)

    def upload(self) -> Upload:
        state = self.model.state_dict()
        if self.cfg.localize_feature_extractor:
            state = {k: v for k, v in state.items() if k.startswith("head.")}
        return Upload(self.id, self.train_samples, state, extras={"label_counts": self.label_counts})
