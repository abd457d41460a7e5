"""pFedMe client: K inner steps on the personalised model θ per batch, then one step of w (see
servers/serverpfedme.py). With ``-dp`` every inner step's data gradient is a DP-SGD release (K accountant
steps per batch); w's step reads only θ and w."""
import copy

import torch

from flcore.clients.clientbase import Client, ClientDeclares, copy_state
from utils import dp_sgd


class PFedMeClient(Client):
    declares = ClientDeclares(
        dp_modules=("theta",),  # -dp: only θ's inner steps read data; w moves from θ (after the release)
        new_client_model="model",  # -nnc: the received model (the personal θ never received one)
    )

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
        copy_state(self.theta, self.model)
        self.theta.train()
        self.run_epochs(self.cfg.local_epochs, step=self.pfedme_step)
        with torch.no_grad():  # BatchNorm statistics are only tracked by θ; w carries them to the server
            for (_, b), (_, bt) in zip(self.model.named_buffers(), self.theta.named_buffers()):
                b.copy_(bt)

    def pfedme_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One batch: θ's K inner steps, then w's step; returns the last inner data loss."""
        lam = self.cfg.lamda
        w, theta = list(self.model.parameters()), list(self.theta.parameters())
        for _ in range(self.cfg.K):
            self.theta_optimizer.zero_grad(set_to_none=True)
            if self.dp is None:
                loss = self.loss_fn(self.theta(x), y)
                loss.backward()
            else:  # -dp: each inner step is one DP-SGD release of ∇f(θ; batch), counted by the accountant
                loss = dp_sgd.dp_backward(self, self.theta_loss, self.theta_optimizer, x, y)
            with torch.no_grad():  # the proximal term's gradient reads no data: added after the release
                for t, v in zip(theta, w):
                    t.grad.add_(t - v, alpha=lam)
            self.theta_optimizer.step()
        with torch.no_grad():
            for v, t in zip(w, theta):
                v.grad = lam * (v - t)
        self.optimizer.step()
        return loss
