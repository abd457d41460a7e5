"""FedProx client: the FedAvg client plus the proximal term in its loss (see servers/serverprox.py)."""
import functools

from flcore.clients.clientbase import Client
from utils.proximal import anchor_of, proximal_term


class FedProxClient(Client):
    batched_training = True  # cross-entropy + the proximal term, declared in batched_penalty

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.anchor = anchor_of(self.model)  # w^t: the last global model received

    def receive_global(self, global_model, participating: bool = True) -> None:
        super().receive_global(global_model, participating)
        self.anchor = anchor_of(global_model)

    def loss(self, x, y):
        return super().loss(x, y) + proximal_term(self.model.parameters(), self.anchor, self.cfg.mu)

    def batched_penalty(self):
        return functools.partial(proximal_penalty, mu=self.cfg.mu), self.anchor


def proximal_penalty(params: dict, anchor, mu: float):
    """``loss``'s extra term as a function of the parameters (``--engine batched``)."""
    return proximal_term(params.values(), anchor, mu)
