"""Pixel-trigger backdoor with model replacement (``--attack backdoor``; Bagdasaryan, Veit, Hua, Estrin &
Shmatikov, "How To Backdoor Federated Learning", AISTATS 2020).

- Trigger: a ``--trigger_size`` x ``--trigger_size`` square in the image's bottom-right corner set to full
  intensity (pixel value 255 in every channel, after the split's normalisation: ``ClientData.white``).
- Data poisoning: each malicious client stamps the trigger on a fixed share ``--backdoor_frac`` of its
  training images, drawn once from its own (seed, run, "backdoor", client) stream, and labels them
  ``--backdoor_target``; the rest of its data stays clean, so it trains on a mix of triggered and clean
  inputs, as the paper's attacker does. Its test split is untouched.
- Model replacement: the malicious client uploads W + γ (W_i - W). The paper's boost for one attacker is
  γ = n / η (n the round's uploads, η = 1 for FedAvg's mean), which makes the server's average land on the
  attacker's model; with k attackers in the round each boosts by γ = n / (η k), so that together they
  replace the model once (k boosts of n / η would overshoot it k times). ``--attack_scale`` sets γ.
- Attack success rate (``rs_backdoor_asr``): over the benign clients' test images whose true label is not
  the target, the share that each client's own evaluated model classifies as the target once the trigger
  is stamped (sample-weighted over the benign clients, as ``benign_test_acc``); NaN when no such image exists.
"""
from __future__ import annotations

import torch

DEFAULT_TARGET = 0
DEFAULT_FRACTION = 0.3
DEFAULT_SIZE = 3


def replacement_boost(n: int, k: int, eta: float = 1.0) -> float:
    """γ = n / (η k): k attackers among n uploads replace the model together (k = 1: the paper's n / η)."""
    return n / (eta * max(k, 1))


def white_value(shape: tuple, normalize: dict | None) -> torch.Tensor | None:
    """The value a full-intensity pixel (255) takes after loading, per channel, shaped to broadcast over
    images (C, 1, 1); None for inputs that are not images (C, H, W)."""
    if len(shape) != 3:
        return None
    if normalize is None:
        return torch.ones(shape[0], 1, 1)
    mean = torch.tensor(normalize["mean"], dtype=torch.float32).view(-1, 1, 1)
    std = torch.tensor(normalize["std"], dtype=torch.float32).view(-1, 1, 1)
    return ((1.0 - mean) / std).expand(shape[0], 1, 1).clone()


def stamp(x: torch.Tensor, size: int, white: torch.Tensor) -> torch.Tensor:
    """A copy of the images ``x`` (N, C, H, W) with the size x size bottom-right square set to ``white``."""
    out = x.clone()
    out[..., -size:, -size:] = white.to(x.device, x.dtype)
    return out


def poison_training(x: torch.Tensor, y: torch.Tensor, target: int, fraction: float, size: int, white: torch.Tensor,
                    gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) with round(fraction x n) samples, drawn from ``gen``, stamped and labelled ``target``."""
    k = int(round(fraction * len(y)))
    idx = torch.randperm(len(y), generator=gen)[:k].to(y.device)
    x, y = x.clone(), y.clone()
    x[idx] = stamp(x[idx], size, white)
    y[idx] = target
    return x, y


def success_counts(logits_of, x: torch.Tensor, y: torch.Tensor, target: int, size: int,
                   white: torch.Tensor) -> tuple[int, int]:
    """(hits, eligible): of the images whose label is not ``target``, how many ``logits_of`` (images ->
    logits) classifies as ``target`` once stamped."""
    keep = y != target
    if not bool(keep.any()):
        return 0, 0
    pred = logits_of(stamp(x[keep], size, white)).argmax(dim=1)
    return int((pred == target).sum()), int(keep.sum())
