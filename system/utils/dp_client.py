"""Client-level DP (``-dp --dp_level client``): DP-FedAvg with fixed or adaptive clipping, a wrapper around the
server's aggregation step (``ClientLevelDP.aggregate``, held and applied by the plug-in plugins/dp_client.py);
its epsilon comes from the accountant DP-SGD uses (``utils/dp_sgd.py``'s ``epsilon``)."""
from __future__ import annotations

import dataclasses
import secrets

import numpy as np
import torch
from torch import nn

from utils.dp_sgd import epsilon
from utils.entries import aligned_names
from utils.errors import FLError
from utils.seeding import torch_gen


CLIP_LR = 0.2          # eta_C of adaptive clipping's geometric update (Andrew et al. 2021, their default)
COUNT_NOISE_DIVISOR = 20  # sigma_b = m / 20: the noise on the clipped-count estimate (Andrew et al. 2021)


def update_noise_multiplier(z: float, sigma_b: float) -> float:
    """Andrew et al.'s split of the privacy budget: the update noise z_D such that releasing the update
    sum with z_D and the clipped count (sensitivity 1/2 after centring the bits) with sigma_b is, together,
    one Gaussian mechanism of multiplier z:  z_D = (z^-2 - (2 sigma_b)^-2)^(-1/2). Needs z < 2 sigma_b."""
    if z >= 2 * sigma_b:
        raise FLError(f"--dp_quantile: adaptive clipping needs -dps < 2 sigma_b = m / {COUNT_NOISE_DIVISOR // 2} "
                      f"(here {2 * sigma_b:g} for m = {round(sigma_b * COUNT_NOISE_DIVISOR)} clients per round); "
                      f"lower -dps, raise -jr/-nc, or drop --dp_quantile")
    return (z ** -2 - (2 * sigma_b) ** -2) ** -0.5


def clip_update(delta: dict[str, torch.Tensor], clip: float) -> tuple[dict[str, torch.Tensor], float]:
    """(``delta`` scaled to L2 norm at most ``clip`` over all its entries together, its norm before)."""
    norm = float(torch.sqrt(sum(d.double().pow(2).sum() for d in delta.values())))
    factor = min(1.0, clip / norm) if norm > 0 else 1.0
    return {k: d * factor for k, d in delta.items()}, norm


def _leaves(payload) -> tuple:
    """Identity of a broadcast payload: the ids of the modules and tensors it holds, in order."""
    if isinstance(payload, (nn.Module, torch.Tensor)):
        return (id(payload),)
    if isinstance(payload, dict):
        return tuple(x for v in payload.values() for x in _leaves(v))
    if isinstance(payload, (list, tuple)):
        return tuple(x for v in payload for x in _leaves(v))
    if hasattr(payload, "__dict__"):
        return _leaves(vars(payload))
    return (payload,) if isinstance(payload, (int, float, str, bool, type(None))) else (id(payload),)


class ClientLevelDP:
    """The server's side of client-level DP (DP-FedAvg, McMahan et al. 2018; adaptive clipping, Andrew et
    al. 2021), built by the plug-in plugins/dp_client.py with ``-dp --dp_level client``.

    Each round, for the m clients selected: every upload's update D_i = W_i - W (W: the global model the
    round started from, on the entries the upload holds) is clipped to L2 norm S (``--dp_clip``), and the
    server releases W' = W + (sum_i clip(D_i) + N(0, (z_D S)^2 I)) / m: the fixed-denominator estimator
    of the paper with equal weights (the m selected, not the sample counts, which would leak). Every
    upload is replaced by W' (weight 1) before the algorithm's ``aggregate`` runs, so whatever it does
    (a mean, FedRep's body, pFedMe's interpolation) is post-processing of the release: ``aggregate`` wraps
    the aggregation step as Flower's DP strategy wrappers wrap a strategy. z_D = z (``-dps``)
    with fixed clipping; with ``--dp_quantile`` gamma, S follows the gamma-quantile of the update norms:
    b = (sum_i 1[||D_i|| <= S] + N(0, sigma_b^2)) / m, S <- S exp(-eta_C (b - gamma)), sigma_b = m / 20,
    eta_C = 0.2, and z_D = (z^-2 - (2 sigma_b)^-2)^(-1/2) so that both releases together cost one Gaussian
    mechanism of multiplier z (the paper's Theorem 1), which is what the accountant counts.

    Accounting: one subsampled-Gaussian step per round at multiplier z and rate q = m / N in opacus' RDP
    accountant. The accountant assumes Poisson sampling of clients; the round's selection is a fixed-size
    draw without replacement (``-jr``), so q = m / N is the customary approximation, not a proof."""

    def __init__(self, cfg, run: int):
        self.clip, self.sigma = float(cfg.dp_clip), float(cfg.dp_sigma)
        self.quantile = getattr(cfg, "dp_quantile", None)
        if getattr(cfg, "dp_secure_rng", False):
            self.generator = torch.Generator(device=cfg.device)
            self.generator.manual_seed(secrets.randbits(63))
        else:
            self.generator = torch_gen(cfg.seed, run, "dp-client-noise", device=cfg.device)
        self.history: list[tuple[float, float, int]] = []
        self.last: dict = {}  # the last release: m, clip, update noise std, norms (tests and logs read it)

    def check_broadcast(self, algorithm: str, payloads: list) -> None:
        """Client-level DP releases one model per round: an algorithm that sends clients different
        models aggregates per client, not as one mean of updates, and is refused."""
        if len({_leaves(p) for p in payloads}) > 1:
            raise FLError(f"--dp_level client: {algorithm} sends each client its own model (its aggregation is "
                          f"not one mean of updates), which client-level DP does not cover; use --dp_level sample")

    def aggregate(self, aggregate, algorithm: str, uploads: list, reference: nn.Module, m: int,
                  n_clients: int) -> None:
        """The aggregation step ``aggregate(uploads)`` (the algorithm's) wrapped by DP-FedAvg: each upload's
        update against ``reference`` clipped, their mean over the ``m`` selected noised (``release``), then
        ``aggregate`` run on the release."""
        aggregate(self.release(algorithm, uploads, reference, m, n_clients))

    def release(self, algorithm: str, uploads: list, reference: nn.Module, m: int, n_clients: int) -> list:
        """The round's uploads, each replaced by the released model (see the class docstring)."""
        if not uploads:
            return uploads
        for u in uploads:
            if not u.state:
                raise FLError(f"--dp_level client: {algorithm}'s clients upload no model update, so there is "
                              f"nothing to clip and noise; use --dp_level sample")
            if u.extras:
                raise FLError(f"--dp_level client: {algorithm}'s clients upload {', '.join(sorted(u.extras))} "
                              f"beside their model, which client-level DP does not cover; use --dp_level sample")
        names = aligned_names(reference, uploads[0].state)
        if not names or any(set(u.state) != set(names) for u in uploads):
            raise FLError(f"--dp_level client: {algorithm}'s uploads are not entries of its global model, so "
                          f"they are no model update; use --dp_level sample")
        ref = reference.state_dict()
        floating = [k for k in names if ref[names[k]].is_floating_point()]
        total = {k: torch.zeros_like(ref[names[k]]) for k in floating}
        norms = []
        for u in uploads:
            delta = {k: u.state[k].to(ref[names[k]].device, ref[names[k]].dtype) - ref[names[k]] for k in floating}
            clipped, norm = clip_update(delta, self.clip)
            norms.append(norm)
            for k in floating:
                total[k] += clipped[k]
        z = self.sigma
        sigma_b = m / COUNT_NOISE_DIVISOR
        if self.quantile is not None:
            z = update_noise_multiplier(self.sigma, sigma_b)
        std = z * self.clip / m
        released = {}
        for k in names:
            if k in total:
                noise = torch.randn(total[k].shape, generator=self.generator, device=self.generator.device)
                released[k] = ref[names[k]] + total[k] / m + std * noise.to(total[k])
            else:  # integer entries (BatchNorm's batch count) stay the global model's
                released[k] = ref[names[k]].clone()
        self.last = {"m": m, "clip": self.clip, "std": std, "norms": norms}
        if self.quantile is not None:
            below = sum(n <= self.clip for n in norms)
            noisy = (below + sigma_b * float(torch.randn((), generator=self.generator,
                                                         device=self.generator.device))) / m
            self.last["fraction"] = noisy
            self.clip *= float(np.exp(-CLIP_LR * (noisy - self.quantile)))
        q = min(1.0, m / max(n_clients, 1))
        if self.history and self.history[-1][:2] == (self.sigma, q):
            self.history[-1] = (self.sigma, q, self.history[-1][2] + 1)
        else:
            self.history.append((self.sigma, q, 1))
        return [dataclasses.replace(u, weight=1.0, state=dict(released)) for u in uploads]

    def epsilon(self, delta: float) -> float:
        return epsilon(self.history, delta)
