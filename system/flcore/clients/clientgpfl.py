"""GPFL client: a Conditional Valve turns each feature into a global one (guided by the Global Category
Embeddings) and a personalized one (fed to the client's own head); see servers/servergpfl.py."""
from __future__ import annotations

import itertools

import torch
from torch import nn
from torch.nn import functional as F

from flcore.clients.partsharing import PartSharingClient
from flcore.clients.clientbase import ClientDeclares


class CoV(nn.Module):
    """Conditional Valve: from a conditional input c (K), γ = LN(ReLU(Linear(c))) and β likewise; a feature f
    becomes ReLU((γ + 1) ⊙ f + β)."""

    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.LayerNorm(dim))
        self.beta = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.LayerNorm(dim))

    def forward(self, f: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return F.relu(f * (self.gamma(cond) + 1) + self.beta(cond))


class GPFLModel(nn.Module):
    """Feature extractor ``base``, personal head ``head``, ``cov`` (CoV) and ``gce`` (the Global Category
    Embeddings, C x K). ``cond_p`` is this client's personalized conditional input p_i; the prediction
    is head(CoV(base(x), p_i))."""

    def __init__(self, split: nn.Module):
        super().__init__()
        self.base, self.head = split.base, split.head
        k, c = split.head.in_features, split.head.out_features
        self.cov = CoV(k)
        self.gce = nn.Embedding(c, k)
        self.register_buffer("cond_p", torch.zeros(k))

    def forward(self, x):
        return self.head(self.cov(self.base(x), self.cond_p))


def angle_loss(f: torch.Tensor, emb: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Angle-level guidance: mean over samples of -log softmax_y(cos(f, e_u) for u in classes)."""
    return F.cross_entropy(F.normalize(f, dim=1) @ F.normalize(emb, dim=1).T, y)


def magnitude_loss(f: torch.Tensor, emb: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Magnitude-level guidance: mean over samples of ||f - ê_y||_2 (ê: the received, frozen embeddings)."""
    return torch.linalg.vector_norm(f - emb[y], dim=1).mean()


class GPFLClient(PartSharingClient):
    """Receives the global extractor, GCE and CoV; keeps its head and p_i; uploads extractor, GCE and CoV."""
    shared = ("base", "gce", "cov")
    declares = ClientDeclares(
        personal_keys=("head.", "cond_p"),
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        counts = torch.bincount(self.y_train, minlength=self.model.gce.num_embeddings).float()
        self.label_dist = counts / counts.sum()  # this client's label distribution, the weights of p_i
        self.gce_frozen = self.model.gce.weight.detach().clone()  # Ĉ: the round's received GCE
        self.cond_g = self.gce_frozen.mean(0)  # g: the global conditional input

    def receive(self, global_model, participating: bool = True) -> None:
        """The shared parts (plain copy, or ALA under the client's head), then the conditional inputs from
        the received GCE: g = mean of the embeddings, p_i = Σ_c (n_c / n) e_c."""
        super().receive(global_model, participating)
        emb = global_model.gce.weight.detach().to(self.device)
        self.gce_frozen = emb.clone()
        self.cond_g = emb.mean(0)
        with torch.no_grad():
            self.model.cond_p.copy_(self.label_dist @ emb)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Personalized task + angle-level + λ magnitude-level guidance + (μ/2)||(CoV, GCE)||²."""
        m = self.model
        f = m.base(x)
        f_global = m.cov(f, self.cond_g)
        task = self.loss_fn(m.head(m.cov(f, m.cond_p)), y)
        guide = angle_loss(f_global, m.gce.weight, y) + self.cfg.lamda * magnitude_loss(f_global, self.gce_frozen, y)
        decay = sum(p.pow(2).sum() for p in itertools.chain(m.cov.parameters(), m.gce.parameters()))
        return task + guide + 0.5 * self.cfg.mu * decay
