"""Privacy add-ons that run inside any algorithm: DP-SGD for local training (client side) and the DLG /
iDLG evaluation of what clients expose (server side).

DP-SGD -- Abadi, Chu, Goodfellow, McMahan, Mironov, Talwar, Zhang. "Deep Learning with Differential
Privacy". CCS 2016. https://arxiv.org/abs/1607.00133
    Each step clips every per-sample gradient to L2 norm C and adds N(0, sigma^2 C^2 I) to their sum:
    g = (sum_i g_i * min(1, C / ||g_i||) + N(0, sigma^2 C^2 I)) / B.
    Per-sample gradients come from ``torch.func.vmap(grad(...))`` over the client's own ``loss`` hook,
    evaluated with ``functional_call`` on a holder of the client's modules. That keeps the base training
    loop, the optimizer and every algorithm's loss (proximal or contrastive terms included) as they are,
    whereas opacus' GradSampleModule would wrap the model (renaming its state keys, which the server
    aggregates by name) and replace the optimizer and data loader. Models with BatchNorm are refused:
    it mixes the samples of a batch, so per-sample gradients are undefined.

Sampling and accounting, honestly: the base loop draws shuffled, fixed-size batches (each epoch a
permutation cut into batches of -lbs). Epsilon comes from opacus' RDPAccountant, which analyses the
Poisson-subsampled Gaussian mechanism (each sample in a batch independently with rate q) under add/remove-
one adjacency; we feed it q = B / n_i per step. This is the customary approximation (Abadi et al. train
on shuffled lots too), not a proof for shuffled batches: Chua et al. (ICML 2024, "How Private are DP-SGD
Implementations?") show shuffling can leak more than the Poisson figure. Each client is accounted
separately for record-level privacy of its own data, at q = B / (the samples its batches are drawn from,
``Client.train_count``). Only its DP-SGD steps are counted: an algorithm whose data-dependent steps lie
outside the DP path declares it in its server's ``dp_support`` (``DPSupport``: it refuses ``-dp``, or names
the steps its epsilon leaves out; with ``-ala``, ALA's weight learning on local data is added);
``uncovered_steps`` collects them, the monitor prints them as a warning at start-up and docs/privacy.md's
table is generated from the declarations (``coverage_table``).

The noise generator: by default each client's noise comes from a ``torch.Generator`` seeded from ``-seed``,
the run and the client id, so a run is reproducible. That is right for research and wrong for a
deployment: anyone who knows the seed can regenerate the noise and subtract it. ``--dp_secure_rng`` seeds
every client's noise generator from the operating system's entropy (``secrets``); results are then not
reproducible (two runs with the same flags differ). torch's generator itself is not a cryptographic PRNG
(opacus' ``secure_mode`` uses torchcsprng for that).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import secrets
import sys
from collections import Counter

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F
from tqdm import tqdm

from utils import dlg
from utils.errors import FLError
from utils.seeding import np_rng, torch_gen


# ---- DP-SGD ----------------------------------------------------------------------------------------
class _LossHolder(nn.Module):
    """Every module of a client under one root, so ``functional_call`` can swap in per-sample parameters
    while the client's own ``loss(x, y)`` runs unchanged."""

    def __init__(self, modules: dict[str, nn.Module], loss_fn):
        super().__init__()
        for name, module in modules.items():
            self.add_module(name, module)
        self._loss_fn = loss_fn

    def forward(self, x, y):
        return self._loss_fn(x, y)


def per_sample_gradients(holder: nn.Module, names: list[str], x: torch.Tensor, y: torch.Tensor):
    """({name: B x shape} per-sample gradients of ``holder(x_i, y_i)``, B losses) for the parameters in
    ``names``, with one vmapped backward pass."""
    params = {n: p.detach() for n, p in holder.named_parameters() if n in names}

    def one(p, xi, yi):
        loss = functional_call(holder, p, (xi[None], yi[None]))
        return loss, loss.detach()

    # randomness="different": a dropout layer draws each sample's own mask, as it does in a batch
    return vmap(grad(one, has_aux=True), in_dims=(None, 0, 0), randomness="different")(params, x, y)


def privatize(grads: dict[str, torch.Tensor], clip: float, sigma: float,
              generator: torch.Generator) -> dict[str, torch.Tensor]:
    """DP-SGD's release from per-sample gradients (first dim = batch): clip each sample's whole gradient
    to L2 norm ``clip``, sum, add N(0, (sigma * clip)^2) per coordinate, divide by the batch size."""
    b = next(iter(grads.values())).shape[0]
    norms = torch.sqrt(sum(g.reshape(len(g), -1).pow(2).sum(1) for g in grads.values()))
    factor = (clip / (norms + 1e-6)).clamp(max=1.0)
    out = {}
    for n, g in grads.items():
        total = (g * factor.view(-1, *([1] * (g.dim() - 1)))).sum(0)
        noise = torch.randn(total.shape, generator=generator, device=generator.device).to(total.device)
        out[n] = (total + sigma * clip * noise) / b
    return out


def dp_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float, sigma: float,
                generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One DP-SGD release of the mean cross-entropy gradient of ``model`` on (x, y): what a DP client's
    single step reveals (the DP counterpart of ``dlg.model_gradient``)."""
    names = dlg.trainable_names(model)
    holder = _LossHolder({"m": model}, lambda a, b: F.cross_entropy(model(a), b))
    grads, _ = per_sample_gradients(holder, [f"m.{n}" for n in names], x, y)
    return {n[2:]: g for n, g in privatize(grads, clip, sigma, generator).items()}


def epsilon(history: list[tuple[float, float, int]], delta: float) -> float:
    """Epsilon at ``delta`` after DP-SGD steps given as (noise multiplier, sample rate, steps) triples,
    from opacus' RDP accountant (Mironov 2017 RDP of the subsampled Gaussian; conversion to (eps, delta)
    by Balle et al. 2020, tighter than the classic rdp + log(1/delta)/(alpha-1))."""
    return _epsilon(tuple(map(tuple, history)), delta) if history else 0.0


@functools.lru_cache(maxsize=4096)
def _epsilon(history: tuple, delta: float) -> float:
    """``epsilon``, memoised: every evaluation asks it for every client, mostly about the same histories."""
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = list(history)
    return float(acc.get_epsilon(delta))


class DPSGD:
    """One client's DP-SGD state: clip norm, noise multiplier, its own noise stream and its step history
    (the accountant's input). Built by ``Client.__init__`` with ``-dp``. The noise stream is seeded from
    (-seed, run, client id): reproducible, fine for research, not for deployment (the seed removes the
    noise); ``--dp_secure_rng`` seeds it from the OS instead (see the module docstring)."""

    def __init__(self, clip: float, sigma: float, n_samples: int, batch_size: int, generator: torch.Generator,
                 secure: torch.Generator | None = None):
        self.clip, self.sigma, self.n = clip, sigma, n_samples
        self.batch_size, self.generator = batch_size, generator
        # --dp_secure_rng: one OS-seeded stream for all of this client's noise (fine-tuning included); an
        # algorithm that swaps ``generator`` for a stream of its own then changes nothing.
        self.secure = secure
        self.history: list[tuple[float, float, int]] = []

    @classmethod
    def from_config(cls, cfg, cid: int, run: int, model: nn.Module, n_samples: int) -> "DPSGD | None":
        if not sample_level(cfg):  # --dp_level client: clients train as usual, the server privatises
            return None
        bn = [type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        if bn:
            raise FLError(f"-dp needs per-sample gradients, but the model has {bn[0]} layers, which mix the "
                          f"samples of a batch; use a model without BatchNorm (-m CNN or -m DNN)")
        secure = None
        if getattr(cfg, "dp_secure_rng", False):
            secure = torch.Generator(device=cfg.device)
            secure.manual_seed(secrets.randbits(63))
        return cls(cfg.dp_clip, cfg.dp_sigma, n_samples, cfg.batch_size,
                   torch_gen(cfg.seed, run, "dp-noise", cid, device=cfg.device), secure)

    def backward(self, client, objective, optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Set ``.grad`` of every parameter ``optimizer`` trains to the DP-SGD gradient of
        ``objective(x, y)`` (the client's ``loss`` hook, or the objective ``run_epochs`` was given), the
        per-sample parameters swapped into the client's modules; returns the batch's mean loss (detached).
        One accountant step at q = max(B, len(x)) / n, n the samples the client's batches are drawn from
        (``train_count``: FedFomo's training part, PartialFed's trained slice), at most its training set;
        an epoch's last, smaller batch counts at the full rate."""
        modules = {k: v for k, v in vars(client).items() if isinstance(v, nn.Module)}
        holder = _LossHolder(modules, objective)
        trained = {id(p) for g in optimizer.param_groups for p in g["params"] if p.requires_grad}
        named = dict(holder.named_parameters())
        names = [n for n, p in named.items() if id(p) in trained]
        grads, losses = per_sample_gradients(holder, names, x, y)
        noise = self.generator if self.secure is None else self.secure
        for n, g in privatize(grads, self.clip, self.sigma, noise).items():
            named[n].grad = g
        pool = min(self.n, client.train_count())
        q = min(1.0, max(self.batch_size, len(x)) / max(pool, 1))
        if self.history and self.history[-1][:2] == (self.sigma, q):
            self.history[-1] = (self.sigma, q, self.history[-1][2] + 1)
        else:
            self.history.append((self.sigma, q, 1))
        return losses.mean()

    def epsilon(self, delta: float) -> float:
        return epsilon(self.history, delta)


# ---- client-level DP (DP-FedAvg) --------------------------------------------------------------------
CLIP_LR = 0.2          # eta_C of adaptive clipping's geometric update (Andrew et al. 2021, their default)
COUNT_NOISE_DIVISOR = 20  # sigma_b = m / 20: the noise on the clipped-count estimate (Andrew et al. 2021)


def client_level(cfg) -> bool:
    """``-dp --dp_level client``: the server clips and noises model updates (no DP-SGD on the clients)."""
    return bool(cfg.privacy) and getattr(cfg, "dp_level", "sample") == "client"


def sample_level(cfg) -> bool:
    """``-dp`` with ``--dp_level sample`` (the default): DP-SGD on every client."""
    return bool(cfg.privacy) and getattr(cfg, "dp_level", "sample") == "sample"


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


def _aligned_names(model: nn.Module, state: dict) -> dict[str, str]:
    """{upload name: ``model``'s name} for an upload's state (``align_state``'s rule)."""
    own = set(model.state_dict())
    if set(state) <= own:
        return {k: k for k in state}
    for prefix, module in model.named_modules():
        if prefix and state and set(state) <= set(module.state_dict()):
            return {k: f"{prefix}.{k}" for k in state}
    return {}


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
    al. 2021), built by ``PrivacyMonitor`` with ``-dp --dp_level client``.

    Each round, for the m clients selected: every upload's update D_i = W_i - W (W: the global model the
    round started from, on the entries the upload holds) is clipped to L2 norm S (``--dp_clip``), and the
    server releases W' = W + (sum_i clip(D_i) + N(0, (z_D S)^2 I)) / m: the fixed-denominator estimator
    of the paper with equal weights (the m selected, not the sample counts, which would leak). Every
    upload is replaced by W' (weight 1) before the algorithm's ``aggregate`` runs, so whatever it does
    (a mean, FedRep's body, pFedMe's interpolation) is post-processing of the release. z_D = z (``-dps``)
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
        names = _aligned_names(reference, uploads[0].state)
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


# ---- what each algorithm declares --------------------------------------------------------------------
ALA_UNCOVERED = "ALA's weight learning on local training data (-ala / FedALA)"


@dataclasses.dataclass(frozen=True)
class DPSupport:
    """An algorithm's one privacy declaration (its server's ``dp_support``), each field one line, "" for none:

    - ``refusal``: why it refuses ``-dp`` at every level (its data-dependent steps or uploads lie outside what
      DP-SGD and the update release can privatise);
    - ``client_refusal``: why it refuses ``--dp_level client`` only (the release needs one model update per
      client, averaged into one global model);
    - ``uncovered``: the data-dependent steps its DP-SGD epsilon does not cover (a warning at start-up).

    ``check_support`` enforces it at start-up, ``uncovered_steps`` reads it, and docs/privacy.md's coverage
    table is ``coverage_table`` of every registered algorithm's (tests/test_dp_registry.py)."""
    refusal: str = ""
    client_refusal: str = ""
    uncovered: str = ""


def check_support(cfg, server_cls) -> None:
    """Refuse ``-dp`` (any level) or ``--dp_level client`` where the algorithm's ``dp_support`` says why."""
    support = server_cls.dp_support
    if cfg.privacy and support.refusal:
        raise FLError(f"-dp: {cfg.algorithm} is refused: {support.refusal}; drop -dp")
    if client_level(cfg) and support.client_refusal:
        raise FLError(f"--dp_level client: {cfg.algorithm} is refused: {support.client_refusal}; "
                      f"use --dp_level sample")


def uncovered_steps(cfg, cls) -> list[str]:
    """The data-dependent steps of this configuration (``cls``: its server class) that the reported
    epsilon does not cover: its ``dp_support.uncovered`` and, with ALA, its weight learning. The one list
    the start-up warning and docs/privacy.md's table are built from. With ``--dp_level client`` every local
    step is covered (the clipped update bounds a client's whole contribution): nothing is listed."""
    if client_level(cfg):
        return []
    steps = [cls.dp_support.uncovered] if cls.dp_support.uncovered else []
    client_ala = getattr(cls.client_class, "use_ala", False)
    if (cfg.ala or client_ala) and ALA_UNCOVERED not in steps:
        steps.append(ALA_UNCOVERED)
    return steps


def coverage_table(servers: dict) -> str:
    """docs/privacy.md's per-algorithm table, from the declarations of ``servers`` (-algo name -> server
    class, in registry order): every algorithm that refuses a level or whose epsilon leaves a step out, and
    ``-ala`` (any algorithm)."""
    rows = ["| algorithm | `-dp` (DP-SGD) | `-dp --dp_level client` (DP-FedAvg) |", "|---|---|---|"]
    for name, cls in servers.items():
        s = cls.dp_support
        uncovered = s.uncovered or (ALA_UNCOVERED if getattr(cls.client_class, "use_ala", False) else "")
        if not (s.refusal or s.client_refusal or uncovered):
            continue
        sample = f"refused: {s.refusal}" if s.refusal else (
            f"not covered by the reported epsilon: {uncovered}" if uncovered else "covered")
        client = ("refused (as `-dp`)" if s.refusal else f"refused: {s.client_refusal}" if s.client_refusal
                  else "covered")
        rows.append(f"| {name} | {sample} | {client} |")
    rows.append(f"| -ala | not covered by the reported epsilon: {ALA_UNCOVERED} | covered |")
    return "\n".join(rows) + "\n"


# ---- the server-side monitor -----------------------------------------------------------------------
def attacked_positions(seed: int, run: int, round_idx: int, n_active: int, k: int) -> np.ndarray:
    """Positions (in the round's active list) of the clients attacked in a round: ``k`` drawn without
    replacement from the round's own stream, so the choice never depends on the algorithm."""
    rng = np_rng(seed, run, "dlg-clients", round_idx)
    return np.sort(rng.choice(n_active, size=min(k, n_active), replace=False))


def attacked_batch(seed: int, run: int, round_idx: int, cid: int, b: int, n: int, batch: int) -> torch.Tensor:
    """Indices (into the client's training data) of its ``b``-th attacked batch in a round."""
    return torch.randperm(n, generator=torch_gen(seed, run, "dlg-batch", round_idx, cid, b))[:batch]


def guess_scores(originals: torch.Tensor, k: int, mean, std) -> tuple[torch.Tensor, torch.Tensor]:
    """PSNR and SSIM that ``k`` know-nothing guesses reach under the same matching: images at the
    normalisation mean (mid-grey), matched to ``originals`` as reconstructions are. The floor to read
    scores against: best-of-N matching against a whole training set (the update target) or a smooth,
    low-contrast image can score well above a random image without revealing anything."""
    shape = (k, *originals.shape[1:])
    grey = dlg.denormalize(torch.zeros(shape, device=originals.device), mean, std)
    order, psnr = dlg.match(originals, grey)
    return psnr, dlg.ssim(originals[order.to(originals.device)], grey)


def align_state(model: nn.Module, state: dict) -> dict:
    """An upload's state keyed by ``model``'s own names. Uploads of a part of the model (FedRep's body:
    ``model.base.state_dict()``) carry names relative to that part; they are prefixed with the submodule
    whose state they match. Empty when nothing matches."""
    if set(state) <= set(model.state_dict()):
        return dict(state)
    for prefix, module in model.named_modules():
        if prefix and state and set(state) <= set(module.state_dict()):
            return {f"{prefix}.{k}": v for k, v in state.items()}
    return {}


class PrivacyMonitor:
    """Runs the DLG/iDLG evaluation (``-dlg``) and reports DP epsilon (``-dp``) for any algorithm.

    The server calls ``before_training`` (snapshot of the models the attacked clients start the round
    from), ``after_upload`` (the attack, before aggregation) and ``metrics`` (each evaluation). The
    attacker is the server, given each attacked client's starting model: for FedAvg that is the global
    model it sent; for personalised methods (FedALA's ALA-initialised model, private heads) it is more
    than a real server knows, so the scores are an upper bound on what leaks."""

    def __init__(self, cfg, run: int, data, recorder=None, server_cls=None):
        self.cfg, self.run, self.recorder = cfg, run, recorder
        self.input_shape, self.num_classes = tuple(data.input_shape), data.num_classes
        norm = data.config.get("normalize") or {}
        channels = self.input_shape[0] if len(self.input_shape) == 3 else 1
        self.mean, self.std = norm.get("mean", [0.0] * channels), norm.get("std", [1.0] * channels)
        self.starts: dict[int, nn.Module] = {}
        self.trained: set[int] = set()  # ids of the clients that have trained in this run (-dp's guard)
        # --dp_level client: the server's clipping, noise and accountant
        self.client_dp = ClientLevelDP(cfg, run) if client_level(cfg) else None
        if cfg.dlg_eval and len(self.input_shape) != 3:
            raise FLError(f"-dlg reconstructs images, but split '{data.name}' holds inputs of shape "
                          f"{list(self.input_shape)}; use an image split (Digits, MNIST, Cifar10, ...)")
        if cfg.privacy and run == cfg.prev and server_cls is not None:
            steps = uncovered_steps(cfg, server_cls)
            if steps:
                print(f"warning: -dp: {cfg.algorithm}'s epsilon does not cover: {'; '.join(steps)} "
                      f"(see docs/privacy.md)", file=sys.stderr)

    @classmethod
    def from_config(cls, cfg, run: int, data, recorder=None, server_cls=None) -> "PrivacyMonitor | None":
        return cls(cfg, run, data, recorder, server_cls) if (cfg.dlg_eval or cfg.privacy) else None

    def attacks(self, round_idx: int) -> bool:
        return self.cfg.dlg_eval and round_idx % self.cfg.dlg_gap == 0

    def before_training(self, round_idx: int, active: list) -> None:
        """Pick this round's attacked clients (own stream) and keep a copy of the model each starts from;
        note who trains (``metrics`` checks that each of them has a DP history)."""
        self.starts = {}
        self.trained.update(c.id for c in active)
        if not self.attacks(round_idx) or not active:
            return
        for i in attacked_positions(self.cfg.seed, self.run, round_idx, len(active), self.cfg.dlg_clients):
            self.starts[active[i].id] = copy.deepcopy(active[i].model)

    def check_broadcast(self, payloads: list) -> None:
        """``--dp_level client``: refuse a broadcast that sends clients different models (before any training)."""
        if self.client_dp is not None:
            self.client_dp.check_broadcast(self.cfg.algorithm, payloads)

    def release(self, uploads: list, reference: nn.Module, m: int, n_clients: int) -> list:
        """``--dp_level client``: the uploads replaced by the clipped, noised mean update applied to
        ``reference`` (``ClientLevelDP.release``); unchanged otherwise."""
        if self.client_dp is None:
            return uploads
        return self.client_dp.release(self.cfg.algorithm, uploads, reference, m, n_clients)

    def after_upload(self, round_idx: int, active: list, uploads: list) -> None:
        """Attack each snapshotted client ``-bnpc`` times; record and print the round's scores."""
        if not self.starts:
            return
        by_id = {u.id: u for u in uploads}
        rows = []
        for c in active:
            if c.id in self.starts:
                rows += self._attack_client(round_idx, c, self.starts[c.id], by_id.get(c.id))
        self.starts = {}
        self._report(round_idx, rows)

    def _attack_client(self, round_idx: int, client, start: nn.Module, upload) -> list[dict]:
        cfg = self.cfg
        names = dlg.trainable_names(start)
        batch = min(cfg.dlg_batch, client.train_samples)
        if cfg.dlg_target == "update":
            state = align_state(start, (upload.state if upload is not None else None) or {})
            names = [n for n in names if n in state]
            if not names:
                raise FLError(f"--dlg_target update: {cfg.algorithm}'s upload holds no model parameters to "
                              f"attack; use --dlg_target gradient")
            steps = client.steps_per_round()
            target = dlg.pseudo_gradient(start.state_dict(), state, client.learning_rate(round_idx), steps, names)
        rows = []
        for b in range(cfg.batch_num_per_client):
            if cfg.dlg_target == "gradient":
                idx = attacked_batch(cfg.seed, self.run, round_idx, client.id, b, client.train_samples, batch)
                x, y = client.x_train[idx.to(client.x_train.device)], client.y_train[idx.to(client.x_train.device)]
                if sample_level(cfg):
                    noise = torch_gen(cfg.seed, self.run, "dlg-dp", round_idx, client.id, b, device=cfg.device)
                    target = dp_gradient(start, x, y, cfg.dp_clip, cfg.dp_sigma, noise)
                else:
                    target = dlg.model_gradient(start, x, y, names)
            else:
                x, y = client.x_train, client.y_train  # the update mixes every local batch
            gen = torch_gen(cfg.seed, self.run, "dlg-init", round_idx, client.id, b, device=cfg.device)
            clip = cfg.dp_clip if sample_level(cfg) and cfg.dlg_target == "gradient" else None  # a DP-aware attacker
            if cfg.dlg_attack == "ig":
                rec = dlg.invert_gradients(start, target, self.input_shape, batch, self.num_classes,
                                           iters=cfg.ig_iters, tv=cfg.ig_tv, generator=gen, bounds=self.box(),
                                           clip=clip)
            else:
                rec = dlg.reconstruct(start, target, self.input_shape, batch, self.num_classes,
                                      method=cfg.dlg_attack, iters=cfg.dlg_iters, generator=gen, clip=clip)
            rows.append(self._score(x, y, rec, exact_batch=cfg.dlg_target == "gradient"))
        return rows

    def box(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalised images of pixels 0 and 1 per channel (C x 1 x 1): IG's box constraint."""
        m = torch.as_tensor(self.mean, dtype=torch.float32).view(-1, 1, 1)
        s = torch.as_tensor(self.std, dtype=torch.float32).view(-1, 1, 1)
        return (0 - m) / s, (1 - m) / s

    def _score(self, x, y, rec, exact_batch: bool) -> dict:
        orig = dlg.denormalize(x.float(), self.mean, self.std)
        recon = dlg.denormalize(rec.x.float(), self.mean, self.std)
        order, psnr = dlg.match(orig, recon)
        order = order.to(orig.device)
        ssim = dlg.ssim(orig[order], recon)
        base_psnr, base_ssim = guess_scores(orig, len(recon), self.mean, self.std)
        true = y[order].cpu()
        if exact_batch:  # label recovery as a multiset: the attacker does not know the batch order
            hits = sum((Counter(rec.labels.cpu().tolist()) & Counter(y.cpu().tolist())).values())
        else:  # an update mixes many images: a label counts if it is that of the image matched
            hits = int((rec.labels.cpu() == true).sum())
        return {"orig": orig[order].cpu(), "recon": recon.cpu(), "psnr": psnr.cpu(), "ssim": ssim.cpu(),
                "base_psnr": base_psnr.cpu(), "base_ssim": base_ssim.cpu(), "label_hits": hits, "n": len(recon),
                "loss": rec.loss}

    def _report(self, round_idx: int, rows: list[dict]) -> None:
        psnr = torch.cat([r["psnr"] for r in rows])
        ssim = torch.cat([r["ssim"] for r in rows])
        n = sum(r["n"] for r in rows)
        values = {"psnr": float(psnr.mean()), "psnr_max": float(psnr.max()), "ssim": float(ssim.mean()),
                  "label_acc": sum(r["label_hits"] for r in rows) / n, "images": n,
                  "psnr_guess": float(torch.cat([r["base_psnr"] for r in rows]).mean()),
                  "ssim_guess": float(torch.cat([r["base_ssim"] for r in rows]).mean())}
        tqdm.write(f"round {round_idx:4d} | {self.cfg.dlg_attack.upper()} on {self.cfg.dlg_target} | "
                   f"PSNR {values['psnr']:.2f} dB (max {values['psnr_max']:.2f}; grey guess "
                   f"{values['psnr_guess']:.2f}) | SSIM {values['ssim']:.3f} (guess {values['ssim_guess']:.3f}) | "
                   f"labels {values['label_acc']:.2f} | {n} image(s)")
        if self.recorder is None:
            return
        self.recorder.add_series("dlg", round_idx, values)
        self.recorder.save()
        self.recorder.out_dir.mkdir(parents=True, exist_ok=True)
        dlg.save_grid(torch.cat([r["orig"] for r in rows]), torch.cat([r["recon"] for r in rows]),
                      self.recorder.out_dir / f"{self.recorder.stem}_dlg_r{round_idx}.png",
                      [f"{p:.1f} dB" for p in psnr.tolist()])

    def metrics(self, clients: list) -> dict:
        """Per-evaluation DP figures: epsilon of every client at ``--dp_delta`` (0 before it trains); the
        server prints the maximum with the round's accuracy. A client that trained under ``-dp`` without a
        single DP-SGD step (an algorithm whose training bypasses the DP path) is an error: its epsilon of 0
        would claim privacy the run did not give."""
        if not self.cfg.privacy:
            return {}
        if self.client_dp is not None:  # one client-level epsilon, the same for every client
            e = self.client_dp.epsilon(self.cfg.dp_delta)
            return {"dp_epsilon_max": e, "dp_epsilon_mean": e, "dp_client_epsilon": np.full(len(clients), e),
                    "dp_clip_norm": self.client_dp.clip}
        eps = np.array([c.dp_epsilon(self.cfg.dp_delta) for c in clients])
        bare = [c.id for c, e in zip(clients, eps) if c.id in self.trained and not e > 0]
        if bare:
            raise FLError(f"-dp: client {bare[0]} trained but its DP accountant is empty: {self.cfg.algorithm}'s "
                          f"training bypassed DP-SGD, so the run is not private (a bug: refuse -dp in its check_config)")
        return {"dp_epsilon_max": float(eps.max()), "dp_epsilon_mean": float(eps.mean()), "dp_client_epsilon": eps}
