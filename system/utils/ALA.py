"""Adaptive Local Aggregation (ALA), the core of FedALA.

Zhang, Hua, Wang, Song, Xue, Ma, Guan. "FedALA: Adaptive Local Aggregation for Personalized Federated
Learning". AAAI 2023. https://arxiv.org/abs/2212.01197  (official code: github.com/TsingZ0/FedALA)

Before local training, client i initialises its model element-wise from the global model Θ and its
previous local model Θ_i:

    Θ̂_i = Θ_i + (Θ − Θ_i) ⊙ [1 ; W_i^p]

The lower |Θ| − p layers take Θ as is; the top p layers get a learned weight W in [0, 1], initialised to
ones and trained with Θ and Θ_i frozen: W ← σ(W − η ∇_W L(Θ̂_i, D_i^s)), σ(w) = max(0, min(1, w)), on a
random s % sample D_i^s of the client's training data, drawn anew each round. In the client's first ALA
round (the paper's t = 2) W is trained until, after more than ``window`` epochs, the std of the last
``window`` epoch losses falls below ``threshold`` (PFLlib's rule), or for at most ``max_epochs`` epochs;
afterwards one epoch per round, reusing W. A client
that has never trained yet (the paper's t = 1) has no local model worth keeping and takes Θ as is.

What is adapted: ``-p`` counts parameter tensors from the top, as PFLlib's ``-p`` (its default 2 = the
classifier's weight and bias = the paper's p = 1 on every model here; ``-p 0`` = all), and
``--ala_layers`` counts the paper's layers and replaces it when given. A layer is a module that owns parameters (conv, linear), a normalisation layer joins the
layer below it, and a stage of residual blocks counts as one, so ResNet-18 has the paper's six (stem,
layer1-4, fc; p = 2 adapts layer4 + fc, 8.4M parameters) (``flcore.trainmodel.parts.adapted_names``
and ``ala_names`` give the names ALA is built with); ``--ala_layers 0`` adapts all layers.

Speed, same numbers up to float rounding: when only the classifier is adapted (p = 1 on a model with
the ``fc`` head contract and no batch-dependent layers, passed as ``head``), its inputs, the frozen lower
layers' outputs, are computed once per round in large no-grad batches instead of in every W step; and when every
round evaluates the train loss they are computed for all training samples and kept for that evaluation
(``keep_features`` / ``features_for``), which would otherwise run the same lower layers again.

Where this differs from PFLlib's ALA.py (which the official repository shares):
- D_i^s is a random subset drawn from the client's own generator, not a contiguous window at an
  unseeded random offset;
- the start phase has a cap (``--ala_max_epochs``; PFLlib's loop can run forever) and its threshold and
  window are flags (PFLlib hides them, default 0.1 and 10);
- convergence is judged on the mean loss of each epoch, not on the last batch's loss;
- buffers (BatchNorm statistics) are taken from the global model, like the lower layers (PFLlib's ALA
  touches parameters only; ``--bn_stats local`` does the same);
- the first-round skip is explicit (the client has not trained yet), not inferred from a zero
  difference between the first parameter tensors.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from utils.batching import batches_of, has_batch_norm, session
from utils.seeding import torch_gen

FEATURE_BATCH = 256  # samples per no-grad pass when the classifier's inputs are computed once (docs/performance.md)


def combine(local: torch.Tensor, glob: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Θ̂ = Θ_i + (Θ − Θ_i) ⊙ W  (element-wise)."""
    return local + (glob - local) * weight


def weight_step(weight: torch.Tensor, grad: torch.Tensor, eta: float, clip: bool = True) -> torch.Tensor:
    """W ← σ(W − η ∇_W L), σ clipping to [0, 1] (``clip=False`` gives the paper's unclipped analysis)."""
    w = weight - eta * grad
    return w.clamp(0.0, 1.0) if clip else w


def converged(losses: list[float], window: int, threshold: float) -> bool:
    """The start-phase stopping rule, PFLlib's: more than ``window`` losses so far, and the std of the
    last ``window`` of them below ``threshold``."""
    return len(losses) > window and float(np.std(losses[-window:])) < threshold


class Forward:
    """The logits ALA's loss reads, as a function of the adapted tensors ``top`` (named as in the model):
    ``module`` run with its parameters ``frozen`` + ``top``, the names cut by ``cut`` characters (the
    classifier run alone on its precomputed inputs: ``cut`` = len("head.")). Data, not a closure, so the
    batched executor can stack it over clients."""

    def __init__(self, module: nn.Module, frozen: dict, cut: int):
        self.module, self.frozen, self.cut = module, frozen, cut

    def __call__(self, top: dict, xb: torch.Tensor) -> torch.Tensor:
        return functional_call(self.module, {**self.frozen, **{k[self.cut:]: v for k, v in top.items()}}, (xb,))


class ALA:
    """One client's ALA state: its weights W (created on first use), whether the start phase is over,
    and its own sampling stream."""

    def __init__(self, names: list[str], eta: float = 1.0, rand_percent: int = 80, threshold: float = 0.1,
                 window: int = 10, max_epochs: int = 100, batch_size: int = 10,
                 generator: torch.Generator | None = None, keep_features: bool = False, head: str | None = None,
                 global_buffers: bool = True):
        self.names = list(names)
        # global_buffers: Θ̂ takes the global model's buffers (BatchNorm statistics) with its lower layers;
        # False (--bn_stats local, PFLlib) leaves the local model's own, in the forward passes and in Θ̂.
        self.global_buffers = global_buffers
        # head: the model's classifier attribute when no layer of the model depends on the batch (the
        # caller checks): if ``names`` are exactly its parameters, its inputs are computed once per round.
        self.head = head
        # keep_features: when only the classifier is adapted, compute its inputs on *all* the client's
        # training samples (ALA uses its s % of them) and keep them with a copy of the lower layers they
        # came from, so that this round's train-loss evaluation of the same lower layers reads them
        # instead of running them again (``features_for``). Set when every round evaluates the train loss.
        self.keep_features = keep_features
        self.features: tuple[dict, torch.Tensor] | None = None
        self.eta, self.rand_percent, self.batch_size = eta, rand_percent, batch_size
        self.threshold, self.window, self.max_epochs = threshold, window, max_epochs
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)
        self.weights: dict[str, torch.Tensor] | None = None
        self.start_phase = True
        self.last_epochs = 0
        self.last_losses: list[float] = []

    @classmethod
    def from_config(cls, cfg, cid: int, run: int, names: list[str], head: str | None = None) -> "ALA":
        keep = cfg.train_loss_eval != "off" and cfg.eval_gap == 1 and cfg.amp == "off"
        return cls(names, cfg.eta, cfg.rand_percent, cfg.ala_threshold, cfg.ala_window, cfg.ala_max_epochs,
                   cfg.batch_size, torch_gen(cfg.seed, run, "ala", cid), keep, head, cfg.bn_stats == "shared")

    def sample(self, n: int) -> torch.Tensor:
        """A random s % subset of the n training indices (at least one)."""
        k = max(1, int(n * self.rand_percent / 100))
        return torch.randperm(n, generator=self.generator)[:k]

    def adaptive_local_aggregation(self, global_model: nn.Module, local_model: nn.Module,
                                   x: torch.Tensor, y: torch.Tensor) -> None:
        """Overwrite ``local_model`` in place with Θ̂ (lower layers and, unless ``global_buffers`` is
        False, buffers from ``global_model``; top layers blended with the learned W), after training W on a
        fresh s % sample of (x, y)."""
        g_state = global_model.state_dict()
        l_params = dict(local_model.named_parameters())
        top = set(self.names)
        buffers = dict(local_model.named_buffers())
        source = g_state if self.global_buffers else {**g_state, **buffers}
        # Buffers are cloned: a train-mode forward updates BatchNorm statistics in place.
        frozen = {k: v.detach().clone() if k in buffers else v.detach() for k, v in source.items() if k not in top}
        local_top = {k: l_params[k].detach().clone() for k in self.names}
        glob_top = {k: g_state[k].detach() for k in self.names}
        if self.weights is None:
            self.weights = {k: torch.ones_like(v) for k, v in local_top.items()}

        idx = self.sample(len(y)).to(y.device)
        xs, ys = x[idx], y[idx]
        all_feats = self.head_inputs(global_model, x) if self.keep_features else None
        feats = all_feats[idx] if all_feats is not None else self.head_inputs(global_model, xs)
        if feats is None:  # every batch runs the whole model, its lower layers frozen at Θ
            inputs, forward = xs, Forward(local_model, frozen, 0)
        else:  # only the classifier is adapted: its inputs were computed once
            inputs, forward = feats, Forward(getattr(local_model, self.head), {}, len(self.head) + 1)
        epochs = self.max_epochs if self.start_phase else 1
        merge = feats is None and has_batch_norm(local_model)  # no 1-sample batch through BatchNorm
        losses: list[float] = []
        for _ in range(epochs):
            losses.append(self._epoch(forward, local_top, glob_top, inputs, ys, merge))
            if self.start_phase and converged(losses, self.window, self.threshold):
                break
        self.start_phase = False
        self.last_epochs, self.last_losses = len(losses), losses

        with torch.no_grad():
            dst = local_model.state_dict()
            for k, v in g_state.items():
                if k not in top and (self.global_buffers or k not in buffers):
                    dst[k].copy_(v)
            for k in self.names:
                dst[k].copy_(combine(local_top[k], glob_top[k], self.weights[k]))
        self.features = None
        if all_feats is not None:
            self.features = ({k: v.detach().clone() for k, v in local_model.named_parameters() if k not in top},
                             all_feats)

    def features_for(self, model: nn.Module) -> torch.Tensor | None:
        """The classifier's inputs on all training samples kept by the last ALA (``keep_features``), if
        ``model``'s lower layers are still exactly those they came from; None otherwise."""
        if self.features is None:
            return None
        base, feats = self.features
        params = dict(model.named_parameters())
        if all(k in params and torch.equal(params[k], v) for k, v in base.items()):
            return feats
        return None

    def head_inputs(self, global_model: nn.Module, xs: torch.Tensor) -> torch.Tensor | None:
        """The classifier's inputs on the sample, when they are the same in every batch and epoch: only
        the classifier ``head`` is adapted (the paper's default p = 1) and no layer of the model depends
        on the batch or draws randomness (``head`` is None otherwise). The frozen lower layers then run
        once per round, in large no-grad batches, instead of once per batch and epoch (the start phase
        runs up to ``max_epochs`` epochs). Same numbers up to float rounding. None when that does not hold."""
        module = getattr(global_model, self.head, None) if self.head else None
        if not isinstance(module, nn.Module) or \
                set(self.names) != {f"{self.head}.{n}" for n, _ in module.named_parameters()}:
            return None
        captured: list[torch.Tensor] = []
        hook = module.register_forward_hook(lambda m, args, out: captured.append(args[0]))
        try:
            with torch.no_grad():
                for i in range(0, len(xs), FEATURE_BATCH):
                    global_model(xs[i:i + FEATURE_BATCH])
        finally:
            hook.remove()
        return torch.cat(captured)

    def _epoch(self, forward, local_top, glob_top, inputs, ys, merge_single: bool = False) -> float:
        """One pass of W updates over the sample in batches (``utils.batching``: with ``merge_single`` a
        last batch of one sample joins the one before); returns the mean batch loss.
        ``forward(top, inputs[b])``: logits with the top layers' parameters ``top``."""
        batched = session()  # --executor batched: this epoch runs stacked with the other clients' ALA
        if batched is not None:
            return batched.ala_epoch(self, forward, local_top, glob_top, inputs, ys, merge_single)
        total, steps = 0.0, 0
        perm = torch.randperm(len(ys), generator=self.generator).to(ys.device)
        for b in batches_of(perm, self.batch_size, merge_single):
            w = {k: v.requires_grad_(True) for k, v in self.weights.items()}
            top = {k: combine(local_top[k], glob_top[k], w[k]) for k in self.names}
            loss = nn.functional.cross_entropy(forward(top, inputs[b]), ys[b])
            grads = torch.autograd.grad(loss, [w[k] for k in self.names])
            with torch.no_grad():
                self.weights = {k: weight_step(w[k].detach(), g, self.eta) for k, g in zip(self.names, grads)}
            total += float(loss.detach())
            steps += 1
        return total / max(steps, 1)
