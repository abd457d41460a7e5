"""Local client: plain local SGD on its own model (see servers/serverlocal.py)."""
from flcore.clients.clientbase import Client


class LocalClient(Client):
    batched_training = True  # the base loop on cross-entropy (utils/engine.py)

    def upload(self) -> dict:
        """Nothing crosses the wire."""
        return {"id": self.id, "weight": self.train_samples}
