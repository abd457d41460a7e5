"""FedBABU client: the body trains under the fixed common head; evaluation fine-tunes a copy (see
servers/serverbabu.py)."""
from __future__ import annotations

from torch import nn

from flcore.clients.clientavgc import FineTunedEval
from flcore.clients.clientper import PartSharingClient
from flcore.trainmodel.parts import frozen
from utils.seeding import torch_gen


class FedBABUClient(FineTunedEval, PartSharingClient):
    shared = ("base",)  # the head is not personal: it is the common initial one, and never sent

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # -dp: the evaluation fine-tune's noise has its own stream, so evaluating never shifts training's.
        self.tune_noise = (torch_gen(self.cfg.seed, self.run, "fine-tune-noise", self.id, device=self.cfg.device)
                           if self.dp is not None else None)

    def local_update(self, round_idx: int) -> None:
        """Body update only: the head takes no gradient, so SGD leaves it (the paper's head learning rate 0)."""
        with frozen(self.model.head):
            self.run_epochs(self.cfg.local_epochs)

    def fine_tune(self, model: nn.Module) -> nn.Module:
        """The whole copy (body and head), ``-fte`` epochs. With ``-dp`` these steps are DP-SGD too and
        counted by this client's accountant: the copy is held as ``self.tuned`` while it trains, so the
        per-sample gradients reach it."""
        if self.dp is None:
            return super().fine_tune(model)
        self.tuned, noise = model, self.dp.generator
        self.dp.generator = self.tune_noise
        try:
            return super().fine_tune(model)
        finally:
            self.dp.generator = noise
