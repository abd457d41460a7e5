"""DP-SGD for local training (``-dp``, ``--dp_level sample``, client side): per-sample gradients, their clipped
and noised release, each client's ``DPSGD`` state and the epsilon accountant (also client-level DP's).

DP-SGD -- Abadi, Chu, Goodfellow, McMahan, Mironov, Talwar, Zhang. "Deep Learning with Differential
Privacy". CCS 2016. https://arxiv.org/abs/1607.00133
    Each step clips every per-sample gradient to L2 norm C and adds N(0, sigma^2 C^2 I) to their sum:
    g = (sum_i g_i * min(1, C / ||g_i||) + N(0, sigma^2 C^2 I)) / B.
    Per-sample gradients come from ``torch.func.vmap(grad(...))`` over the client's own ``loss`` hook,
    evaluated with ``functional_call`` on a holder of the modules the client trains (the one seam: the
    client's ``declares.dp_modules`` names them, ``dp_backward`` releases one step). That keeps the base training
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
``utils.batching.train_count``). Only its DP-SGD steps are counted: an algorithm whose data-dependent steps lie
outside the DP path declares it in its server's ``dp_support`` (``utils/dp_support.py``'s ``DPSupport``: it
refuses ``-dp``, or names the steps its epsilon leaves out; with ``-ala``, ALA's weight learning on local data
is added); ``uncovered_steps`` collects them, the monitor prints them as a warning at start-up and
docs/privacy.md's table is generated from the declarations (``coverage_table``).

The noise generator: by default each client's noise comes from a ``torch.Generator`` seeded from ``-seed``,
the run and the client id, so a run is reproducible. That is right for research and wrong for a
deployment: anyone who knows the seed can regenerate the noise and subtract it. ``--dp_secure_rng`` seeds
every client's noise generator from the operating system's entropy (``secrets``); results are then not
reproducible (two runs with the same flags differ). torch's generator itself is not a cryptographic PRNG
(opacus' ``secure_mode`` uses torchcsprng for that).
"""
from __future__ import annotations

import functools
import secrets

import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

from utils.batching import train_count
from utils.entries import trainable_names
from utils.dp_support import sample_level
from utils.errors import FLError
from utils.seeding import torch_gen


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
    single step reveals (the DP counterpart of ``utils/dlg.py``'s ``model_gradient``)."""
    names = trainable_names(model)
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
        # --dp_secure_rng: one OS-seeded stream for all of this client's noise (fine-tuning included), which
        # replaces any stream a caller names.
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

    def backward(self, modules: dict[str, nn.Module], objective, optimizer, x: torch.Tensor, y: torch.Tensor,
                 pool: int, noise: torch.Generator | None = None) -> torch.Tensor:
        """Set ``.grad`` of every parameter ``optimizer`` trains to the DP-SGD gradient of ``objective(x, y)``
        and return the batch's mean loss (detached). ``modules`` (the client's ``dp_modules``, or the modules
        a caller names) hold those parameters: their per-sample copies are swapped in while ``objective``
        runs; a trained parameter outside them is refused, as it would step without privacy. ``noise``: the
        stream the noise is drawn from (default this client's training stream; ``--dp_secure_rng``'s OS-seeded
        one replaces any). One accountant step at q = max(B, len(x)) / n, n the samples the batches are drawn
        from (``pool``: ``utils.batching.train_count``, FedFomo's training part, PartialFed's trained slice), at most
        the training set; an epoch's last, smaller batch counts at the full rate."""
        holder = _LossHolder(modules, objective)
        named = dict(holder.named_parameters())
        trained = {id(p) for g in optimizer.param_groups for p in g["params"] if p.requires_grad}
        names = [n for n, p in named.items() if id(p) in trained]
        if len(names) != len(trained):
            raise ValueError(f"-dp: the optimizer trains {len(trained) - len(names)} parameter(s) outside the "
                             f"modules named for DP-SGD ({', '.join(modules)}); name their module in the "
                             f"client's declares.dp_modules")
        grads, losses = per_sample_gradients(holder, names, x, y)
        noise = self.secure if self.secure is not None else self.generator if noise is None else noise
        for n, g in privatize(grads, self.clip, self.sigma, noise).items():
            named[n].grad = g
        q = min(1.0, max(self.batch_size, len(x)) / max(min(self.n, pool), 1))
        if self.history and self.history[-1][:2] == (self.sigma, q):
            self.history[-1] = (self.sigma, q, self.history[-1][2] + 1)
        else:
            self.history.append((self.sigma, q, 1))
        return losses.mean()

    def epsilon(self, delta: float) -> float:
        return epsilon(self.history, delta)


def dp_modules(client) -> dict[str, nn.Module]:
    """The modules, by name, whose parameters ``client``'s local training steps: the attributes its
    ``declares.dp_modules`` names (by default its model; Ditto's personal model, APFL's v and alpha, FML's
    local model and FedKD's mentor too). Under ``-dp`` every step of ``run_epochs`` releases the per-sample
    gradients of the parameters its optimizer trains, computed by swapping per-sample copies into these
    modules (a trained parameter outside them is refused); the batched executor stacks them."""
    return {name: getattr(client, name) for name in client.declares.dp_modules}


def dp_backward(client, objective, optimizer, x, y, modules: dict | None = None, noise=None):
    """``-dp``: set ``.grad`` of every parameter ``optimizer`` trains to the DP-SGD release of the gradient of
    ``objective(x, y)`` on this batch of ``client``'s, counted by its accountant (at the rate of a batch of
    its ``train_count``); returns the batch's mean loss. ``modules`` hold those parameters (default the
    client's ``dp_modules``; a fine-tuned copy names itself); ``noise`` is the stream the noise comes from
    (default the training stream; fine-tuning has its own, so evaluating never shifts training's noise). The
    base loop's every step goes through here under ``-dp`` (the client's ``dp`` is set up by the DP-SGD
    plug-in, plugins/dp_sample.py); a step rule of an algorithm's own calls it (pFedMe, Per-FedAvg)."""
    return client.dp.backward(dp_modules(client) if modules is None else modules, objective, optimizer, x, y,
                              train_count(client), noise)
