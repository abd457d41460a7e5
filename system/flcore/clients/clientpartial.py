"""PartialFed client: each round it leaves a random slice of its training data out of local training; at
its next round it learns, on that slice, per layer whether to load the global model's layer or keep its
own, composes its model accordingly and trains as FedAvg (see servers/serverpartial.py)."""
import copy
import math

import torch
from torch import nn
from torch.func import functional_call

from flcore.clients.clientbase import Client
from flcore.trainmodel.parts import layer_groups
from utils.batching import batch_bounds, batches_of
from utils.personal_aggregation import compose_by_layer, gumbel_straight_through, layer_of, mix_by_layer
from utils.seeding import torch_gen


class PartialFedClient(Client):
    def __init__(self, cfg, cid, data, model, run=0):
        super().__init__(cfg, cid, data, model, run)
        groups = layer_groups(self.model)
        self.layer = layer_of(list(self.model.state_dict()), groups)
        # Per layer the logits (load global, keep local), starting at the prior P(global) = --strategy_prior.
        prior = math.log(cfg.strategy_prior / (1 - cfg.strategy_prior))
        self.logits = torch.tensor([[prior, 0.0]] * len(groups), device=self.device)
        self.strategy_gen = torch_gen(cfg.seed, run, "partialfed", cid)
        # Indices the last local update trained on / left out (None before the first one).
        self.trained_on: torch.Tensor | None = None
        self.held_out: torch.Tensor | None = None
        self.scratch = copy.deepcopy(self.model)

    def from_global(self) -> list[bool]:
        """The current per-layer choice (ties load the global layer)."""
        return (self.logits[:, 0] >= self.logits[:, 1]).tolist()

    def receive(self, global_model, participating: bool = True) -> None:
        if participating and self.held_out is not None and len(self.held_out):
            self.learn_strategy(global_model)
        mix = compose_by_layer(self.model.state_dict(), global_model.state_dict(), self.layer, self.from_global())
        self.scratch.load_state_dict(mix)
        self.initialize_local(self.model, self.scratch, participating)

    def learn_strategy(self, global_model) -> None:
        """One pass of SGD on the logits over the held-out slice, in batches of ``-lbs``: each batch's loss
        is that of the model composed from the received global layers and this client's own layers by a
        straight-through Gumbel-softmax sample of the per-layer choice (the local model left these samples
        out of its last update, so it meets the global model on equal terms)."""
        tau = self.cfg.tau * self.cfg.tau_decay ** (len(self.train_time) - 1)  # 1st participation: --tau
        glob = {k: v.detach() for k, v in global_model.named_parameters()}
        local = {k: v.detach().clone() for k, v in self.model.named_parameters()}
        # BatchNorm normalises by each batch, as in training; the statistics it updates are a copy, dropped.
        buffers = {k: v.detach().clone() for k, v in self.model.named_buffers()}
        self.model.train()
        order = self.held_out[torch.randperm(len(self.held_out), generator=self.strategy_gen).to(self.device)]
        logits = self.logits.clone().requires_grad_(True)
        for idx in batches_of(order, self.cfg.batch_size, self.merge_single):
            a = gumbel_straight_through(logits, tau, self.strategy_gen)
            params = {**mix_by_layer(local, glob, self.layer, a), **buffers}
            loss = nn.functional.cross_entropy(functional_call(self.model, params, (self.x_train[idx],)),
                                               self.y_train[idx])
            (grad,) = torch.autograd.grad(loss, logits)
            logits = (logits - self.cfg.strategy_lr * grad).detach().requires_grad_(True)
        self.logits = logits.detach()

    def held_out_count(self) -> int:
        """Samples each local update leaves out: ceil(--strategy_percent * n), at most n - 1."""
        return min(math.ceil(self.cfg.strategy_percent * self.train_samples), self.train_samples - 1)

    def local_update(self, round_idx: int) -> None:
        perm = torch.randperm(self.train_samples, generator=self.strategy_gen).to(self.device)
        k = self.held_out_count()
        self.held_out, self.trained_on = perm[:k], perm[k:]
        self.run_epochs(self.cfg.local_epochs)

    def train_indices(self):
        """This round's update trains on all but the held-out slice (all samples before the first update)."""
        return self.trained_on

    def steps_per_round(self) -> int:
        """``-ls`` epochs over the n - k samples every update trains on (counted before the first one too,
        when ``train_indices`` still names them all)."""
        count = self.train_samples - self.held_out_count()
        return self.cfg.local_epochs * len(batch_bounds(count, self.cfg.batch_size, self.merge_single))
