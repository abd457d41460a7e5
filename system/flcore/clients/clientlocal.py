"""Local client: plain local SGD on its own model (see servers/serverlocal.py)."""
from flcore.clients.clientbase import Client, Upload


class LocalClient(Client):
    def upload(self) -> Upload:
        """Nothing crosses the wire."""
        return Upload(self.id, self.train_samples)
