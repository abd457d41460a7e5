"""Local client: plain local SGD on its own model (see servers/serverlocal.py)."""
from flcore.clients.clientbase import Client, Upload


class LocalClient(Client):
    personal_keys = ("",)  # the whole model

    def upload(self) -> Upload:
        """Nothing crosses the wire."""
        return Upload(self.id, self.train_samples)
