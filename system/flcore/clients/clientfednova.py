"""FedNova client: the base SGD loop (with momentum ρ and the proximal term μ when set), then ||a_i||_1
uploaded beside the model (see servers/serverfednova.py)."""
import torch

from flcore.clients.clientbase import Client, Upload
from utils.proximal import anchor_of, proximal_term


def a_norm(steps: int, lr: float, rho: float = 0.0, mu: float = 0.0) -> float:
    """||a_i||_1 of ``steps`` local steps of SGD at rate ``lr`` with momentum ``rho`` (PyTorch's heavy ball:
    buf ← ρ buf + g̃, x ← x − η buf, the buffer empty at the round's start) on a loss with the proximal term
    (μ/2)||x − x^t||² (g̃ = g + μ (x − x^t)), the local model starting at x^t. After k steps
    x^t − x_k = η Σ_j c_kj g_j; the sums s_k = Σ_j c_kj and m_k (the buffer's) follow
    m_k = ρ m_{k−1} + 1 − ημ s_k, s_{k+1} = s_k + m_k, and ||a_i||_1 = s_steps. Alone, momentum gives the
    paper's [τ − ρ(1 − ρ^τ)/(1 − ρ)]/(1 − ρ) and the proximal term [1 − (1 − ημ)^τ]/(ημ); plain SGD gives τ."""
    alpha = lr * mu
    s = m = 0.0
    for _ in range(steps):
        m = rho * m + 1.0 - alpha * s
        s += m
    return s


class FedNovaClient(Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.anchor = None  # with -mu: x^t, the last global model received (the proximal term's centre)
        self.a_norm = 0.0  # ||a_i||_1 of the last local update

    def receive(self, payload, participating: bool = True) -> None:
        super().receive(payload, participating)
        if self.cfg.mu > 0:
            self.anchor = anchor_of(payload)

    def loss(self, x, y):
        loss = super().loss(x, y)
        return loss if self.cfg.mu == 0 else loss + proximal_term(self.model.parameters(), self.anchor, self.cfg.mu)

    def local_update(self, round_idx):
        lr = self.learning_rate(round_idx)
        if self.cfg.rho > 0:  # a fresh buffer every round, as a_i's formula assumes (no momentum: plain SGD, no state)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=self.cfg.rho)
        super().local_update(round_idx)
        self.a_norm = a_norm(self.steps_per_round(), lr, self.cfg.rho, self.cfg.mu)

    def upload(self):
        return Upload(self.id, self.train_samples, self.model.state_dict(), extras={"a_norm": self.a_norm})
