"""Local client: plain local SGD on its own model (see servers/serverlocal.py)."""
from flcore.clients.clientbase import Client


class LocalClient(Client):
    def upload(self) -> dict:
        """Nothing crosses the wire."""
        return {"id": self.id, "weight": self.train_samples}
