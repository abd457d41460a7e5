"""FedAMP client: starts from its cloud model u_i and trains with a proximal term toward it (see
servers/serveramp.py)."""
from flcore.clients.clientbase import Client
from utils.proximal import anchor_of, proximal_term


class FedAMPClient(Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cloud = anchor_of(self.model)  # u_i, the last cloud model received

    def receive(self, cloud_model, participating: bool = True) -> None:
        """The cloud model u_i the server built for this client (``FedAMPServer.broadcast``)."""
        self.cloud = anchor_of(cloud_model)
        self.initialize_local(self.model, cloud_model, participating)

    def loss(self, x, y):
        mu = self.cfg.lamda / self.cfg.alphaK  # (λ / (2 α_k)) ||w - u_i||^2
        return super().loss(x, y) + proximal_term(self.model.parameters(), self.cloud, mu)
