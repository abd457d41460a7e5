"""FedProx client: the FedAvg client plus the proximal term in its loss (see servers/serverprox.py)."""
from flcore.clients.clientbase import Client, ClientDeclares
from utils.proximal import anchor_of, proximal_term


class FedProxClient(Client):
    declares = ClientDeclares(
        batch_state=("anchor",),  # --executor batched: stacked per client for its loss (runtime/batched.py)
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.anchor = anchor_of(self.model)  # w^t: the last global model received

    def receive(self, payload, participating: bool = True) -> None:
        super().receive(payload, participating)
        self.anchor = anchor_of(payload)

    def loss(self, x, y):
        return super().loss(x, y) + proximal_term(self.model.parameters(), self.anchor, self.cfg.mu)
