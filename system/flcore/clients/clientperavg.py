"""Per-FedAvg client: first-order MAML steps in training, one local step before evaluation (see
servers/serverperavg.py)."""
from __future__ import annotations

import torch
from torch.func import functional_call

from flcore.clients.clientbase import Client
from flcore.clients.finetune import FineTunedEval
from utils import dp_sgd
from utils.batching import batches, batches_per_epoch


def halves(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A meta-step's two batches: the first and second half of ``t`` (a single sample serves both)."""
    half = len(t) // 2
    return (t[:half], t[half:]) if half else (t, t)


class PerFedAvgClient(FineTunedEval, Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.alpha = self.cfg.local_learning_rate  # inner step α of the current round (-lr, decayed by -ld)

    def beta(self, round_idx: int) -> float:
        """Outer step β of round ``round_idx``: ``-bt`` (``-lr`` without it, or with PFLlib's ``-bt 0``),
        decayed by ``-ld`` as α is."""
        base = self.cfg.beta or self.cfg.local_learning_rate
        return base * self.learning_rate(round_idx) / self.cfg.local_learning_rate

    def receive(self, payload, participating: bool = True) -> None:
        """The global model and its round, whose α the personalisation before evaluation uses."""
        self.alpha = self.learning_rate(payload["round"])
        super().receive(payload, participating)

    def meta_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Loss on the second half of the batch at w' = w - α ∇f(w; first half). The inner gradient is
        taken without a graph, so d(loss)/dw = ∇f(w'; second half): the FO-MAML gradient."""
        (x1, x2), (y1, y2) = halves(x), halves(y)
        params = dict(self.model.named_parameters())
        grads = torch.autograd.grad(self.loss_fn(self.model(x1), y1), list(params.values()))
        fast = {n: p - self.alpha * g for (n, p), g in zip(params.items(), grads)}
        return self.loss_fn(functional_call(self.model, fast, (x2,)), y2)

    def local_update(self, round_idx: int) -> None:
        """``-ls`` epochs of FO-MAML steps, each on two fresh batches of ``-lbs`` (drawn as one batch of
        2x``-lbs`` and halved; a single leftover sample serves both). The optimizer steps w with β."""
        self.alpha = self.learning_rate(round_idx)
        for group in self.optimizer.param_groups:
            group["lr"] = self.beta(round_idx)
        if self.dp is None:
            self.run_epochs(self.cfg.local_epochs, 2 * self.cfg.batch_size, objective=self.meta_loss)
        else:
            self.run_epochs(self.cfg.local_epochs, 2 * self.cfg.batch_size, step=self.dp_meta_step)

    def dp_meta_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``-dp``: the same FO-MAML step, each of its two gradients a DP-SGD release on its own half of the
        batch (two accountant steps per meta-step, each at the rate of a ``-lbs`` batch): the inner step
        w' = w - α g̃(w; D), then w ← w - β g̃(w'; D'). ``meta_loss`` cannot be privatised per sample, as
        its inner gradient mixes the samples of D."""
        params = list(self.model.parameters())
        (x1, x2), (y1, y2) = halves(x), halves(y)
        start = [p.detach().clone() for p in params]
        self.optimizer.zero_grad(set_to_none=True)
        dp_sgd.dp_backward(self, self.loss, self.optimizer, x1, y1)
        with torch.no_grad():
            for p in params:
                p.sub_(self.alpha * p.grad)
        self.optimizer.zero_grad(set_to_none=True)
        loss = dp_sgd.dp_backward(self, self.loss, self.optimizer, x2, y2)
        with torch.no_grad():
            for p, w in zip(params, start):
                p.copy_(w)
        self.optimizer.step()
        return loss

    def steps_per_round(self) -> int:
        """Each step takes a batch of 2 x ``-lbs`` samples."""
        return self.cfg.local_epochs * batches_per_epoch(self, 2 * self.cfg.batch_size)

    def fine_tune(self, model: torch.nn.Module) -> torch.nn.Module:
        """The paper's personalisation: one SGD step of size α (this round's, decayed by ``-ld`` as in
        training) on one local batch. With ``-dp`` that step is a DP-SGD release too (``private_tune_step``:
        noise from the fine-tune stream, one accountant step per evaluation)."""
        idx = next(batches(self, 1, generator=self.tune_gen))
        model.train()
        if self.dp is not None:
            opt = torch.optim.SGD(model.parameters(), lr=self.alpha)
            self.private_tune_step(model, opt, lambda a, b: self.loss_fn(model(a), b))(self.x_train[idx],
                                                                                      self.y_train[idx])
            return model
        grads = torch.autograd.grad(self.loss_fn(model(self.x_train[idx]), self.y_train[idx]),
                                    list(model.parameters()))
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads):
                p.sub_(self.alpha * g)
        return model
