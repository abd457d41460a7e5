"""FedLC client: cross-entropy of the logits calibrated by the client's label counts (see servers/serverlc.py)."""
from __future__ import annotations

import torch
from torch.nn import functional as F

from flcore.clients.clientbase import Client


def calibration(counts: torch.Tensor, tau: float) -> torch.Tensor:
    """τ n_c^{-1/4} per class from the label counts n_c; +inf for a class with no sample (τ > 0), 0 with τ = 0."""
    counts = counts.to(torch.float32)
    if tau == 0:
        return torch.zeros_like(counts)
    return tau * counts.pow(-0.25)  # 0 ** -0.25 = inf


def calibrated_logits(logits: torch.Tensor, counts: torch.Tensor, tau: float) -> torch.Tensor:
    """z_c - τ n_c^{-1/4} for every class c (B x C): -inf for the classes the client has no sample of."""
    return logits - calibration(counts, tau).to(logits.device, logits.dtype)


class FedLCClient(Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.label_counts = torch.bincount(self.y_train, minlength=self.num_classes)  # n_{k,c}

    def loss(self, x, y):
        return F.cross_entropy(calibrated_logits(self.model(x), self.label_counts, self.cfg.tau), y)
