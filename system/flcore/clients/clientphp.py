"""FedPHP client: distils from its inherited private model while training the global copy, then folds the
trained model into it by momentum (see servers/serverphp.py)."""
import copy

import torch
from torch import nn

from flcore.clients.clientbase import Client, ClientDeclares
from utils.personal_aggregation import lerp_state
from utils.selection import expected_count


class FedPHPClient(Client):
    declares = ClientDeclares(
        new_client_model="model",  # -nnc: the received model (the personal v_i never received one)
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.hpm = copy.deepcopy(self.model).eval().requires_grad_(False)  # v_i, a teacher: eval mode

    def eval_model(self):
        return self.hpm

    def momentum(self) -> float:
        """μ_τ = min(μ τ / (ρ R), μ) for the τ-th participation (τ = 0 the first time: v_i ← w)."""
        # ρ R: the expected participations, ρ the expected share of clients per round (-jr, -rjr).
        n = self.cfg.num_clients
        expected = max(1, round(expected_count(self.cfg, n) / n * self.cfg.global_rounds))
        return min(self.cfg.mu * len(self.train_time) / expected, self.cfg.mu)

    def loss(self, x, y):
        logits = self.model(x)
        with torch.no_grad():
            target = torch.softmax(self.hpm(x) / self.cfg.kd_temperature, dim=1)
        kd = -(target * nn.functional.log_softmax(logits, dim=1)).sum(1).mean()
        lam = self.cfg.lamda
        return (1 - lam) * self.loss_fn(logits, y) + lam * kd

    def local_update(self, round_idx: int) -> None:
        mu = self.momentum()
        super().local_update(round_idx)
        with torch.no_grad():  # v_i ← μ v_i + (1 - μ) w
            self.hpm.load_state_dict(lerp_state(self.model.state_dict(), self.hpm.state_dict(), mu))
