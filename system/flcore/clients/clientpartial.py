"""PartialFed client: learns per layer whether to load the global model's layer or keep its own, then
trains as FedAvg (see servers/serverpartial.py)."""
import copy
import itertools
import math

import torch
from torch import nn
from torch.func import functional_call

from flcore.clients.clientbase import Client
from flcore.trainmodel.parts import layer_groups
from utils.personal_aggregation import compose_by_layer, gumbel_straight_through, layer_of
from utils.seeding import torch_gen


class PartialFedClient(Client):
    def __init__(self, cfg, cid, data, model, run=0):
        super().__init__(cfg, cid, data, model, run)
        self.layer = layer_of(list(self.model.state_dict()), layer_groups(self.model))
        n_layers = len(layer_groups(self.model))
        self.logits = torch.zeros(n_layers, 2, device=self.device)  # per layer: (load global, keep local)
        self.strategy_gen = torch_gen(cfg.seed, run, "partialfed", cid)
        self.scratch = copy.deepcopy(self.model)

    def from_global(self) -> list[bool]:
        """The current per-layer choice (ties load the global layer)."""
        return (self.logits[:, 0] >= self.logits[:, 1]).tolist()

    def receive(self, global_model, participating: bool = True) -> None:
        if participating and self.train_time:  # before its first training the local model is the init
            self.learn_strategy(global_model)
        mix = compose_by_layer(self.model.state_dict(), global_model.state_dict(), self.layer, self.from_global())
        self.scratch.load_state_dict(mix)
        self.initialize_local(self.model, self.scratch, participating)

    def learn_strategy(self, global_model) -> None:
        """SGD on the logits through straight-through Gumbel-softmax samples of the per-layer choice."""
        tau = self.cfg.tau * self.cfg.tau_decay ** len(self.train_time)
        glob = {k: v.detach() for k, v in global_model.named_parameters()}
        local = {k: v.detach().clone() for k, v in self.model.named_parameters()}
        n = math.ceil(self.cfg.strategy_percent * self.batches_per_epoch())
        logits = self.logits.clone().requires_grad_(True)
        for idx in itertools.islice(self.batches(1, generator=self.strategy_gen), n):
            a = gumbel_straight_through(logits, tau, self.strategy_gen)
            params = {k: a[self.layer[k], 0] * glob[k] + a[self.layer[k], 1] * local[k] for k in glob}
            params.update({k: v.detach().clone() for k, v in self.model.named_buffers()})
            loss = nn.functional.cross_entropy(functional_call(self.model, params, (self.x_train[idx],)),
                                               self.y_train[idx])
            (grad,) = torch.autograd.grad(loss, logits)
            logits = (logits - self.cfg.strategy_lr * grad).detach().requires_grad_(True)
        self.logits = logits.detach()
