"""Ditto client: FedAvg's local model w plus a personal model v pulled toward the global model (see
servers/serverditto.py)."""
from __future__ import annotations

import copy

import torch

from flcore.clients.clientbase import Client, ClientDeclares
from utils.metrics import predict
from utils.proximal import anchor_of, proximal_term


class DittoClient(Client):
    declares = ClientDeclares(
        dp_modules=("model", "pmodel"),  # -dp: the global model's epochs and the personal model's are DP-SGD
        batch_state=("anchor",),  # --executor batched: stacked per client for its loss (runtime/batched.py)
        new_client_model="model",  # -nnc: the received model (the personal v never received one)
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pmodel = copy.deepcopy(self.model)  # v_i, from the common initialisation
        self.poptimizer = torch.optim.SGD(self.pmodel.parameters(), lr=self.cfg.local_learning_rate)
        self.anchor = anchor_of(self.model)  # w^t: the last global model received

    def receive(self, payload, participating: bool = True) -> None:
        super().receive(payload, participating)
        self.anchor = anchor_of(payload)

    def personal_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.pmodel(x), y) + proximal_term(self.pmodel.parameters(), self.anchor, self.cfg.mu)

    def local_update(self, round_idx: int) -> None:
        super().local_update(round_idx)  # w: FedAvg's local epochs, the model that is uploaded
        for group in self.poptimizer.param_groups:
            group["lr"] = self.learning_rate(round_idx)
        self.pmodel.train()
        self.run_epochs(self.cfg.plocal_epochs, optimizer=self.poptimizer, objective=self.personal_loss)

    def eval_model(self) -> torch.nn.Module:
        return self.pmodel

    @torch.no_grad()
    def received_test_metrics(self) -> tuple[int, int]:
        """(correct, samples) of w, the received model, on this client's test split."""
        was_training = self.model.training
        logits = predict(self.model, self.x_test, self.cfg.eval_batch_size)
        self.model.train(was_training)
        return int((logits.argmax(1) == self.y_test).sum()), self.test_samples
