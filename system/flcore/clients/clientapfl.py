"""APFL client: the local copy w of the global model (trained as FedAvg's and uploaded), a personal model v
and a learned mixing weight α; the personalised model is α v + (1 - α) w (see servers/serverapfl.py)."""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.func import functional_call

from flcore.clients.clientbase import Client, ClientDeclares
from utils.batching import sgd_step


class MixingWeight(nn.Module):
    """α as a module parameter, so DP-SGD's per-sample gradients (utils/dp_sgd.py) reach it too; of shape
    (1,), as per-sample gradients need a dimension to flatten."""

    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor([float(alpha)]))


def mixture(v: dict, w: dict, alpha: torch.Tensor) -> dict:
    """v̄ = α v + (1 - α) w, entry by entry."""
    return {k: alpha * v[k] + (1 - alpha) * w[k] for k in v}


def projected_step(params: dict, grads: dict, lrs: dict) -> dict:
    """``after_backward`` and the SGD step in functional form (``--executor batched``): α lands on the
    projection of clamp(α, 0, 1) - lr ∇_α onto [0, 1], the rest takes plain SGD."""
    new = sgd_step(params, grads, lrs)
    if "mixer.alpha" in params:
        a, lr = params["mixer.alpha"], lrs["mixer.alpha"]
        new["mixer.alpha"] = (a.clamp(0.0, 1.0) - lr * grads["mixer.alpha"]).clamp(0.0, 1.0)
    return new


class APFLClient(Client):
    declares = ClientDeclares(
        dp_modules=("model", "vmodel", "mixer"),  # the one optimizer steps w, v and α
        batch_state=(),  # --executor batched: its loss reads its modules only; after_backward as batch_step
        batch_step=projected_step,
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.vmodel = copy.deepcopy(self.model)  # v_i, from the common initialisation; never uploaded
        self.mixer = MixingWeight(self.cfg.alpha).to(self.device)
        self.mixer.alpha.requires_grad_(self.cfg.adapt_alpha)
        self.mixed = copy.deepcopy(self.model)  # holds α v + (1 - α) w for evaluation (``eval_model``)
        # One optimizer, one step per batch for w, v and α together (the paper's Algorithm 1 updates all
        # three from the same sample ξ, v and α at the mixture built from the w before its step).
        self.optimizer.add_param_group({"params": list(self.vmodel.parameters())})
        if self.cfg.adapt_alpha:
            self.optimizer.add_param_group({"params": [self.mixer.alpha]})

    def mixed_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The personalised model's output, v̄ = α v + (1 - α) w with w held fixed: gradients reach v
        (α ∇f(v̄)) and α (<v - w, ∇f(v̄)>), not w. Buffers (BatchNorm statistics) are v's own."""
        w = {k: p.detach() for k, p in self.model.named_parameters()}
        v = dict(self.vmodel.named_parameters())
        return functional_call(self.vmodel, mixture(v, w, self.mixer.alpha), (x,))

    def joint_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """f(w) + f(v̄): w's term moves w (FedAvg's local step), the mixture's moves v and α."""
        return self.loss(x, y) + self.loss_fn(self.mixed_logits(x), y)

    def after_backward(self) -> None:
        """α stays in [0, 1]: its gradient is rewritten so that the optimizer's SGD step lands on the
        projection of α - lr ∇_α onto [0, 1] (the paper's α ∈ [0, 1])."""
        a = self.mixer.alpha
        if not self.cfg.adapt_alpha or a.grad is None:
            return
        lr = self.optimizer.param_groups[-1]["lr"]
        with torch.no_grad():
            a.clamp_(0.0, 1.0)  # the last step's rounding (a - lr * g can miss the bound by an ulp)
            target = (a - lr * a.grad).clamp(0.0, 1.0)
            a.grad.copy_((a - target) / lr)

    def local_update(self, round_idx: int) -> None:
        self.vmodel.train()
        self.run_epochs(self.cfg.local_epochs, objective=self.joint_loss)
        with torch.no_grad():
            self.mixer.alpha.clamp_(0.0, 1.0)

    def eval_model(self) -> nn.Module:
        """α v + (1 - α) w with this client's current w (after a broadcast: the global model)."""
        with torch.no_grad():
            mix = mixture(dict(self.vmodel.named_parameters()), dict(self.model.named_parameters()),
                          self.mixer.alpha)
            for k, p in self.mixed.named_parameters():
                p.copy_(mix[k])
            for b, vb in zip(self.mixed.buffers(), self.vmodel.buffers()):
                b.copy_(vb)
        return self.mixed

    def mixing_weight(self) -> float:
        return float(self.mixer.alpha.detach())
