"""pFedMe client: K inner steps on the personalised model θ per batch, then one step of w (see
servers/serverpfedme.py). With ``-dp`` every inner step's data gradient is a DP-SGD release (K accountant
steps per batch); w's step reads only θ and w."""
import copy

import torch

from flcore.clients.clientbase import Client, copy_state
from utils.errors import Diverged


class PFedMeClient(Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.theta = copy.deepcopy(self.model)  # θ_i, the personalised model; self.model is w
        self.theta_optimizer = torch.optim.SGD(self.theta.parameters(), lr=self.cfg.p_learning_rate)

    def eval_model(self):
        return self.theta

    def theta_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """f(θ; x, y), the data term of the inner problem (what ``-dp`` clips and noises per sample)."""
        return self.loss_fn(self.theta(x), y)

    def local_update(self, round_idx: int) -> None:
        """Per batch: K steps of θ on f(θ) + λ/2 ||θ - w||^2, then w ← w - η λ (w - θ) through the
        client optimizer (so -lr and its decay apply to η)."""
        lam = self.cfg.lamda
        copy_state(self.theta, self.model)
        self.theta.train()
        w, theta = list(self.model.parameters()), list(self.theta.parameters())
        total, steps = torch.zeros((), device=self.device), 0
        for idx in self.batches(self.cfg.local_epochs):
            x, y = self.x_train[idx], self.y_train[idx]
            for _ in range(self.cfg.K):
                self.theta_optimizer.zero_grad(set_to_none=True)
                if self.dp is None:
                    loss = self.loss_fn(self.theta(x), y)
                    loss.backward()
                else:  # -dp: each inner step is one DP-SGD release of ∇f(θ; batch), counted by the accountant
                    loss = self.dp.backward(self, self.theta_loss, self.theta_optimizer, x, y)
                with torch.no_grad():  # the proximal term's gradient reads no data: added after the release
                    for t, v in zip(theta, w):
                        t.grad.add_(t - v, alpha=lam)
                self.theta_optimizer.step()
            with torch.no_grad():
                for v, t in zip(w, theta):
                    v.grad = lam * (v - t)
            self.optimizer.step()
            total += loss.detach()
            steps += 1
        if not torch.isfinite(total):
            raise Diverged(f"client {self.id}: pFedMe loss became {float(total)}; lower -lrp "
                          f"({self.cfg.p_learning_rate}) or -lr ({self.cfg.local_learning_rate})")
        with torch.no_grad():  # BatchNorm statistics are only tracked by θ; w carries them to the server
            for (_, b), (_, bt) in zip(self.model.named_buffers(), self.theta.named_buffers()):
                b.copy_(bt)
