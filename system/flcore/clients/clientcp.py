"""FedCP client: a conditional policy splits each sample's feature between a frozen global head and a
personal head; an MMD term keeps the features near the global extractor's (see servers/servercp.py)."""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from flcore.clients.clientbase import ClientDeclares, Upload, copy_state
from flcore.clients.partsharing import PartSharingClient
from flcore.trainmodel.parts import frozen
from utils.seeding import torch_gen

MMD_BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)  # the official code's RBF kernel widths a: k = Σ_a exp(-d² / 2a)


def mmd(x: torch.Tensor, y: torch.Tensor, bandwidths=MMD_BANDWIDTHS) -> torch.Tensor:
    """Biased empirical MMD² between the rows of ``x`` and ``y`` (B x K each) under the sum of RBF kernels
    k(u, v) = Σ_a exp(-||u - v||² / (2a)): mean over pairs of k(x_i, x_j) + k(y_i, y_j) - 2 k(x_i, y_j)."""
    def kernel(u, v):
        d = (u * u).sum(1)[:, None] + (v * v).sum(1)[None, :] - 2 * u @ v.T  # squared distances
        return sum(torch.exp(-d / (2 * a)) for a in bandwidths)

    return (kernel(x, x) + kernel(y, y) - 2 * kernel(x, y)).mean()


class CPModel(nn.Module):
    """Feature extractor ``base``, conditional policy network ``cpn``, global head ``head`` and personal head
    ``phead``. For a feature h (K) and the client's context v: the CPN maps h ⊙ v/||v|| to 2K scores,
    read as K pairs (personal, global); a softmax over each pair gives the policies s, r (s + r = 1) and

        output = head(h ⊙ r) + phead(h ⊙ s).

    ``noise`` (B x 2 x K Gumbel draws) makes the policy the Gumbel-softmax of training; without it (evaluation)
    the policy is the plain softmax of the scores, so evaluation is deterministic."""

    def __init__(self, split: nn.Module):
        super().__init__()
        self.base, self.head = split.base, split.head
        self.phead = copy.deepcopy(split.head)
        k = split.head.in_features
        self.cpn = nn.Sequential(nn.Linear(k, 2 * k), nn.LayerNorm(2 * k), nn.ReLU())
        self.register_buffer("context", torch.zeros(k))  # v: this client's, set from phead each round

    def policy(self, h: torch.Tensor, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(r, s): the global and personal policies of each feature in ``h`` (B x K each)."""
        scores = self.cpn(h * F.normalize(self.context, dim=0)).view(len(h), 2, -1)
        if noise is not None:
            scores = scores + noise
        p = torch.softmax(scores, dim=1)  # temperature 1, soft (the official settings)
        return p[:, 1], p[:, 0]

    def heads(self, h: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        r, s = self.policy(h, noise)
        return self.head(h * r) + self.phead(h * s)

    def forward(self, x):
        return self.heads(self.base(x))


class FedCPClient(PartSharingClient):
    """Receives the global extractor, CPN and global head; trains extractor, CPN and personal head with the
    global head frozen; uploads extractor, CPN and personal head (the server's next global head)."""
    shared = ("base", "cpn", "head")
    declares = ClientDeclares(
        personal_keys=("context",),
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.global_base = copy.deepcopy(self.model.base).requires_grad_(False)  # the received extractor
        self.gumbel_gen = torch_gen(self.cfg.seed, self.run, "gumbel", self.id, device=self.device)

    def receive(self, global_model, participating: bool = True) -> None:
        """The shared parts (plain copy, or ALA under the personal head); the frozen reference extractor is
        the received one; the context v = Σ_rows of the personal head's weight, fixed for the round."""
        super().receive(global_model, participating)
        copy_state(self.global_base, global_model.base)
        with torch.no_grad():
            self.model.context.copy_(self.model.phead.weight.sum(0))

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """CE of the Gumbel-softmax-split output + λ MMD²(local features, global extractor's features)."""
        h = self.model.base(x)
        noise = -torch.empty(len(x), 2, h.shape[1], device=h.device).exponential_(generator=self.gumbel_gen).log()
        with torch.no_grad():
            ref = self.global_base(x)
        return self.loss_fn(self.model.heads(h, noise), y) + self.cfg.lamda * mmd(h, ref)

    def local_update(self, round_idx: int) -> None:
        with frozen(self.model.head):
            self.run_epochs(self.cfg.local_epochs)

    def upload(self) -> Upload:
        """Extractor and CPN by name, and the personal head under the global head's names."""
        state = {k: v for k, v in self.shared_state(self.model).items() if not k.startswith("head.")}
        state |= {f"head.{k}": v for k, v in self.model.phead.state_dict().items()}
        return Upload(self.id, self.train_samples, state)
