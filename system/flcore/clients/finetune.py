"""Fine-tuned evaluation, the mixin of every algorithm whose clients are evaluated on a locally fine-tuned copy
of the received model (FedAvg-C, FedProx-C, FedBABU, Per-FedAvg); the server side is servers/finetune.py."""
from __future__ import annotations

import copy

import torch
from torch import nn

from utils import dp_sgd
from utils.seeding import torch_gen


class FineTunedEval:
    """Evaluates a fine-tuned copy of the received model instead of the model itself.

    The copy is made lazily, once per broadcast, when the client is first evaluated after receiving (so
    rounds without evaluation cost nothing), and its batches come from the client's own "fine-tune"
    stream: the federated model, the batch stream of training and the upload are exactly the base
    algorithm's. The fine-tune stream runs on from one evaluation to the next, so a round's figure depends
    on how many evaluations came before it (``-eg``; the README's evaluation paragraph gives a measured
    example)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tune_gen = torch_gen(self.cfg.seed, self.run, "fine-tune", self.id)
        # -dp: the fine-tune's noise has its own stream, so evaluating never shifts training's.
        self.tune_noise = (torch_gen(self.cfg.seed, self.run, "fine-tune-noise", self.id, device=self.cfg.device)
                           if self.dp is not None else None)
        self.tuned: nn.Module | None = None
        self.tune_round = 0  # the round the last broadcast opened: its (-ld decayed) rate fine-tunes

    def receive(self, payload, participating: bool = True) -> None:
        super().receive(payload["model"], participating)
        self.tune_round = payload["round"]
        self.tuned = None

    def eval_model(self) -> nn.Module:
        if self.tuned is None:
            with torch.enable_grad():  # evaluation calls this under no_grad
                self.tuned = self.fine_tune(copy.deepcopy(self.model))
        return self.tuned

    def fine_tune(self, model: nn.Module) -> nn.Module:
        """``-fte`` epochs of plain SGD (batch ``-lbs``, cross-entropy) on the local data, at the rate local
        training has in the round being evaluated (``-lr``, decayed with ``-ld``). With ``-dp`` these steps
        are DP-SGD too (``private_tune_step``), counted by this client's accountant (epsilon grows with every
        evaluation)."""
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=self.learning_rate(self.tune_round))
        objective = lambda x, y: self.loss_fn(model(x), y)  # noqa: E731
        step = None if self.dp is None else self.private_tune_step(model, opt, objective)
        self.run_epochs(self.cfg.fine_tuning_epochs, optimizer=opt, objective=objective, generator=self.tune_gen,
                        step=step)
        return model

    def private_tune_step(self, model: nn.Module, optimizer, objective):
        """``-dp``: one step of fine-tuning ``model`` as a DP-SGD release, a ``run_epochs`` step: the copy is
        the module it privatises and the noise comes from the fine-tune stream."""
        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)
            loss = dp_sgd.dp_backward(self, objective, optimizer, x, y, modules={"tuned": model}, noise=self.tune_noise)
            optimizer.step()
            return loss
        return step
